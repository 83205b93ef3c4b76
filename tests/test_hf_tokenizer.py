"""The tokenizer is loaded once per process and folder version: the engine, the structured-output compiler
and the reasoning/pooling configs share it, and a folder rewritten in place is read afresh."""

import os
import shutil

from conftest import _tokenizer_folder

from pagedserve.utils.hf_tokenizer import load_hf_tokenizer


def test_one_load_per_folder_version(tmp_path) -> None:
    folder = shutil.copytree(_tokenizer_folder(), str(tmp_path / "tok"))
    first = load_hf_tokenizer(folder)
    assert load_hf_tokenizer(folder + "/") is first  # the same folder by another spelling
    assert first.encode("hello world", add_special_tokens=False)
    config = os.path.join(folder, "tokenizer_config.json")
    os.utime(config, ns=(os.stat(config).st_atime_ns, os.stat(config).st_mtime_ns + 10**9))
    assert load_hf_tokenizer(folder) is not first
