"""The API server's process imports neither torch nor transformers: importing the server and its command
line, resolving each model's settings (in a child process) and reading its tokenizer (LightTokenizer, on
`tokenizers` and jinja2), as the server does before serving it; and a pool (--model NAME=PATH) serving
its listings and refusals before any model is loaded. The tokenizer's answers equal transformers'."""

import inspect
import json
import os
import pickle
import subprocess
import sys

import httpx
import psutil
import pytest
from server_utils import API_SERVER, RemoteServer

from pagedserve.utils.hf_tokenizer import tokenizer_source

TEXT = "Héllo <b>wörld</b> 🙂<|im_end|>\n  x  . ,"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": TEXT, "name": None},
    {"role": "assistant", "content": "Sure, ", "reasoning_content": "Why not."},
]
with open(os.path.join(os.path.dirname(__file__), "tool_template.jinja")) as file:
    TOOL_TEMPLATE = file.read()
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
# What templates on the Hub use: namespaces, generation blocks, tojson's options, the special tokens,
# strftime_now, documents, reasoning under its names, raise_exception.
HELPERS_TEMPLATE = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% generation %}{{ m | tojson(indent=1) }}{{ m.thinking }}{% endgeneration %}{% endfor %}"
    "{{ ns.n }} {{ strftime_now('%Y') }} {{ bos_token }}{{ eos_token }}{{ documents | tojson }}"
    "{% if messages | length > 3 %}{{ raise_exception('at most 3 messages') }}{% endif %}"
)

INPUTS = dict(
    text=TEXT, messages=MESSAGES, tool_template=TOOL_TEMPLATE, tools=TOOLS, helpers_template=HELPERS_TEMPLATE
)


def tokenizer_views(tokenizer, text, messages, tool_template, tools, helpers_template) -> dict:
    """What the frontend asks of a tokenizer (run by the fresh interpreter too: no names from outside)."""
    ids = tokenizer.encode(text)

    def chat(conversation, **kwargs):
        try:
            return tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 (the template's error, compared)
            return f"{type(exc).__name__}: {exc}"

    asked = messages[:2]
    return {
        "ids": ids,
        "plain": tokenizer.encode(text, add_special_tokens=False),
        "cut": tokenizer.encode(text, truncation=True, max_length=4),
        "pair": dict(tokenizer(text, "second")),
        "text": [tokenizer.decode(ids), tokenizer.decode(ids, skip_special_tokens=True)],
        "tokens": tokenizer.convert_ids_to_tokens(ids),
        "special": [tokenizer.bos_token_id, tokenizer.eos_token_id, sorted(tokenizer.all_special_ids)],
        "chat": chat(asked, add_generation_prompt=True),
        "chat ids": tokenizer.apply_chat_template(asked, add_generation_prompt=True, return_dict=False),
        "continued": chat(messages, continue_final_message=True),
        "tools": chat(asked, chat_template=tool_template, tools=tools, add_generation_prompt=True),
        "no thinking": chat(asked, add_generation_prompt=True, enable_thinking=False),
        "helpers": chat(messages, chat_template=helpers_template, documents=[{"title": "t", "text": "x"}]),
        "refused": chat(messages * 2, chat_template=helpers_template),
    }


# A fresh interpreter as the API server: the server imported, its flags read, then for each model its
# settings resolved (in a child process) and its tokenizer read, as the server does before serving it.
_AS_THE_SERVER = """
import argparse, dataclasses, json, pickle, sys
from pagedserve.entrypoints import cli
from pagedserve.entrypoints.openai import api_server
from pagedserve.entrypoints.openai.cli_args import args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.pool_server import pool_models, resident_bytes_beside_weights
from pagedserve.config.frontend_config import resolve_frontend_config
from pagedserve.structured_output.grammar import make_ll_tokenizer
from pagedserve.utils.light_tokenizer import LightTokenizer
parser = make_arg_parser(argparse.ArgumentParser())
engine_args, server_args, _, _ = args_from_namespace(parser.parse_args(sys.argv[1:]))
seen = {}
for name, model in sorted(pool_models(server_args).items()):
    resolved = resolve_frontend_config(dataclasses.replace(engine_args, model=model.path))
    tokenizer = LightTokenizer(resolved.tokenizer)
    seen[name] = {
        "model": [resolved.config.model.hf_config.model_type, resolved.config.model.max_model_len],
        "tokenizer": tokenizer_views(tokenizer, **INPUTS),
        "sent to the engine": pickle.dumps(resolved.config).hex(),
    }
make_ll_tokenizer(tokenizer, resolved.config.model.vocab_size)  # structured outputs' check, built here
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers"))
print(json.dumps({"models": seen, "budget": resident_bytes_beside_weights(engine_args), "heavy": heavy}))
"""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> str:
    """A HF folder as the pool lists it (its config.json); no test here loads it."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return str(folder)


def test_the_server_reads_its_flags_configs_and_tokenizers_without_torch_or_transformers(
    default_model: str, tiny_model_factory
):
    """The settings the server gets are transformers' (resolved here directly), its tokenizer answers as
    AutoTokenizer's does, its process never imports torch nor transformers, and what it sends the engine
    process is transformers' config again: the default GGUF (its vocabulary from the file's metadata), a
    HF folder whose tokenizer class comes from its config.json's model type (Qwen2's), and a thinking
    model's (added tokens, a template with enable_thinking)."""
    from transformers import AutoTokenizer, PretrainedConfig

    from pagedserve.config import EngineArgs

    models = {
        "smol": default_model,
        "qwen2": tiny_model_factory("qwen2"),
        "think": tiny_model_factory("qwen3-think"),
    }
    flags = [arg for name, path in models.items() for arg in ("--model", f"{name}={path}")]
    code = f"INPUTS = {INPUTS!r}\n" + inspect.getsource(tokenizer_views) + _AS_THE_SERVER
    run = subprocess.run(
        [sys.executable, "-c", code, *flags, "--kv-cache-memory", "1MiB", "--swap-space", "0"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["heavy"] == [] and seen["budget"] == 2**20
    for name, path in models.items():
        model = EngineArgs(model=path, kv_cache_memory="1MiB").create_engine_config().model
        engine_side = pickle.loads(
            bytes.fromhex(seen["models"][name].pop("sent to the engine"))
        ).model.hf_config
        assert (
            isinstance(engine_side, PretrainedConfig) and engine_side.to_dict() == model.hf_config.to_dict()
        )
        reference = AutoTokenizer.from_pretrained(
            tokenizer_source(model.model, model.tokenizer, model.gguf_file)
        )
        expected = tokenizer_views(reference, **INPUTS)
        assert seen["models"][name] == {
            "model": [model.hf_config.model_type, model.max_model_len],
            "tokenizer": json.loads(json.dumps(expected)),
        }


def test_the_smol_server_holds_no_torch(smol_server):
    """The real server of the default model (shared with other modules): its API server process has not
    loaded torch (libtorch is not mapped), its engine process has."""
    frontend = psutil.Process(smol_server.proc.pid)
    assert not [m.path for m in frontend.memory_maps() if "libtorch" in m.path]
    engine = psutil.Process(smol_server.engine_pid())
    assert [m.path for m in engine.memory_maps() if "libtorch" in m.path]


def test_a_pool_serves_its_listings_without_torch(model_folder: str):
    server = RemoteServer(API_SERVER, ["--model", f"tiny={model_folder}"])
    try:
        assert [card.id for card in server.client().models.list().data] == ["tiny"]
        tags = httpx.get(f"{server.base_url}/api/tags", timeout=10).json()["models"]
        assert [tag["name"] for tag in tags] == ["tiny"]
        unknown = httpx.post(f"{server.base_url}/v1/completions", json={"model": "../tiny", "prompt": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        mapped = {m.path for m in psutil.Process(server.proc.pid).memory_maps()}
        assert not [path for path in mapped if "libtorch" in path], "the pool's frontend loaded torch"
        assert server.proc.poll() is None
    finally:
        server.stop()
