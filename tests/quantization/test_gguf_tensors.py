"""The loader's GGUF reader (utils/gguf_tensors.py, which skips the metadata's arrays unless asked) against
gguf's own GGUFReader: every tensor's name, type, shape and bytes (float and quantized), and the metadata,
arrays included, on the embedded model's file (the other GGUF tests load their files through it); and the
header digest the conversion cache keys on."""

import shutil

import numpy as np
from gguf import GGUFReader, GGUFValueType

from pagedserve.utils.default_model import default_model_path
from pagedserve.utils.gguf_tensors import read_gguf


def test_tensors_and_metadata_as_ggufs_own_reader() -> None:
    path = default_model_path()
    ours, with_arrays, theirs = read_gguf(path), read_gguf(path, arrays=True), GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(b.shape.tolist()), a.name
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
    assert len({t.tensor_type for t in ours.tensors}) > 1  # float and quantized tensors both checked
    for key, field in theirs.fields.items():
        kind = field.types[0] if field.types else None
        if key.startswith("GGUF."):
            assert key not in with_arrays.metadata
            continue
        if kind == GGUFValueType.ARRAY:
            assert key not in ours.metadata and with_arrays.metadata[key] == field.contents(), key
            continue
        expected = bytes(field.parts[-1]).decode() if kind == GGUFValueType.STRING else field.parts[-1][0]
        assert ours.metadata[key] == with_arrays.metadata[key] == expected, key
    assert len(with_arrays.metadata["tokenizer.ggml.tokens"]) == 49152  # type: ignore[arg-type]


def test_header_digest_covers_the_header_not_the_tensor_data(tmp_path) -> None:
    """Equal for a copy and for other tensor values; another header (one metadata byte) differs."""
    path = default_model_path()
    digest = read_gguf(path).header_digest
    copy = shutil.copy(path, tmp_path / "copy.gguf")
    data = np.memmap(copy, mode="r+")
    data[-1] ^= 0xFF  # the last tensor's last byte
    data.flush()
    assert read_gguf(str(copy)).header_digest == digest
    name_at = bytes(data[:4096]).index(b"general.architecture")
    data[name_at] = ord("G")  # a key renamed: the header differs
    data.flush()
    assert read_gguf(str(copy)).header_digest != digest
