"""Command lines: vLLM's flags parse as written, both commands share them, startup errors are clear."""

import argparse
import dataclasses
import socket
import subprocess
import sys

import pytest

from pagedserve.config import EngineArgs
from pagedserve.engine.admission import ServingLimits
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.entrypoints.openai.api_server import _bind_socket
from pagedserve.entrypoints.openai.cli_args import ServerArgs, args_from_namespace, make_arg_parser
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.errors import ConfigError, PagedServeError

VLLM_LINE = (
    "--model PATH --dtype float16 --gpu-memory-utilization 0.90 --max-model-len 4096 --port 8000"
).split()


def parse(argv: list[str]) -> tuple[EngineArgs, ServerArgs]:
    return args_from_namespace(make_arg_parser(argparse.ArgumentParser()).parse_args(argv))[:2]


def test_vllm_command_line_parses_as_written() -> None:
    engine, server = parse(VLLM_LINE)
    assert (engine.model, engine.dtype, engine.gpu_memory_utilization, engine.max_model_len) == (
        "PATH",
        "float16",
        0.9,
        4096,
    )
    assert (server.host, server.port, server.api_key) == ("0.0.0.0", 8000, None)


def test_every_setting_has_a_documented_flag() -> None:
    parser = make_arg_parser(argparse.ArgumentParser())
    flags = {option for action in parser._actions for option in action.option_strings}
    for cls in (EngineArgs, ServerArgs, ServingLimits, RequestBounds):
        for field in dataclasses.fields(cls):
            assert "--" + field.name.replace("_", "-") in flags and field.metadata["help"]
    engine, server = parse(
        "--kv-cache-memory 1GiB --block-size 32 --max-num-seqs 8 --seed 3 "
        "--max-logprobs 2 --served-model-name m --api-key k --chat-template t.jinja "
        "--disable-log-stats --disable-log-requests --uvicorn-log-level debug "
        "--host 127.0.0.1".split()
    )
    assert (engine.kv_cache_memory, engine.block_size, engine.served_model_name) == ("1GiB", 32, "m")
    assert server.disable_log_stats and server.disable_log_requests and server.uvicorn_log_level == "debug"


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_API_KEY", "from-env")
    assert parse([])[1].resolved_api_key() == "from-env"
    assert parse(["--api-key", "flag"])[1].resolved_api_key() == "flag"


def test_request_bounds_flags() -> None:
    bounds = args_from_namespace(
        make_arg_parser(argparse.ArgumentParser()).parse_args(
            "--max-stop-strings 3 --max-request-body-bytes 1000 --metrics-require-api-key".split()
        )
    )[3]
    assert (bounds.max_stop_strings, bounds.max_request_body_bytes, bounds.max_chat_messages) == (
        3,
        1000,
        1024,
    )
    assert parse(["--metrics-require-api-key"])[1].metrics_require_api_key
    with pytest.raises(
        ConfigError, match=r"max_logit_bias_entries=0 must be at least 1 \(--max-logit-bias-entries\)"
    ):
        RequestBounds(max_logit_bias_entries=0)


def test_serve_rejects_two_different_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["serve", "model-a", "--model", "model-b"])
    assert exit_info.value.code == 2 and "Two models given" in capsys.readouterr().err


def test_taken_port_fails_fast_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(PagedServeError, match="--port"):
            _bind_socket("127.0.0.1", taken.getsockname()[1])


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "pagedserve.entrypoints.openai.api_server"],
        ["-m", "pagedserve.entrypoints.cli", "serve"],
        ["-m", "pagedserve", "serve"],
    ],
)
def test_help_lists_the_same_flags(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, *command, "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for flag in ("--max-model-len", "--gpu-memory-utilization", "--api-key", "--chat-template", "--port"):
        assert flag in result.stdout
