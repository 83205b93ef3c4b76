"""Command lines: vLLM's flags parse as written, both commands share them, startup errors are clear."""

import argparse
import dataclasses
import logging
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
from pagedserve.logger import logging_level

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
            if (cls, field.name) == (ServerArgs, "named_models"):  # NOTE: --model NAME=PATH fills it
                continue
            assert "--" + field.name.replace("_", "-") in flags and field.metadata["help"]
    engine, server = parse(
        "--kv-cache-memory 1GiB --block-size 32 --max-num-seqs 8 --seed 3 "
        "--max-logprobs 2 --served-model-name m --api-key k --chat-template t.jinja "
        "--disable-log-stats --disable-log-requests --uvicorn-log-level debug "
        "--host 127.0.0.1".split()
    )
    assert (engine.kv_cache_memory, engine.block_size, engine.served_model_name) == ("1GiB", 32, ["m"])
    assert server.disable_log_stats and server.disable_log_requests and server.uvicorn_log_level == "debug"


def test_model_name_equals_path_repeats_beside_one_model(tmp_path) -> None:
    (tmp_path / "a=b.gguf").write_bytes(b"")  # an existing path with '=' is one model, not NAME=PATH
    engine, server = parse(
        ["--model", "x=/m/x.gguf", "--model", str(tmp_path / "a=b.gguf"), "--model", "y=z"]
    )
    assert engine.model == str(tmp_path / "a=b.gguf")
    assert server.named_models == ("x=/m/x.gguf", "y=z")
    assert parse(["--model", "PATH"])[1].named_models == ()


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_API_KEY", "from-env")
    assert parse([])[1].resolved_api_key() == "from-env"
    assert parse(["--api-key", "flag"])[1].resolved_api_key() == "flag"


def test_api_key_precedence_flag_then_pagedserve_then_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDSERVE_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "vllm")
    assert parse([])[1].resolved_api_key() == "vllm"
    monkeypatch.setenv("PAGEDSERVE_API_KEY", "pagedserve")
    assert parse([])[1].resolved_api_key() == "pagedserve"
    assert parse(["--api-key", "flag"])[1].resolved_api_key() == "flag"
    assert "VLLM_API_KEY" in make_arg_parser(argparse.ArgumentParser()).format_help()


VLLM_FLAGS = (
    "--model PATH -tp 2 --trust-remote-code --enable-chunked-prefill --enable-log-requests "
    "--kv-cache-memory-bytes 1048576 --served-model-name a b --disable-log-stats "
    "--uvicorn-log-level warning".split()
)


@pytest.mark.parametrize("prog", ["serve", "api_server"])
def test_vllm_flags_parse_on_both_commands(prog: str) -> None:
    if prog == "serve":  # `pagedserve serve` shares the parser: its subcommand adds the same flags
        parser = argparse.ArgumentParser()
        make_arg_parser(parser.add_subparsers().add_parser("serve"))
        namespace = parser.parse_args(["serve", *VLLM_FLAGS, "--allowed-origins", '["*"]'])
    else:
        namespace = make_arg_parser(argparse.ArgumentParser()).parse_args(
            [*VLLM_FLAGS, "--allowed-origins", '["*"]']
        )
    engine, server = args_from_namespace(namespace)[:2]
    assert (engine.tensor_parallel_size, engine.trust_remote_code, engine.enable_chunked_prefill) == (
        2,
        True,
        True,
    )
    assert (engine.kv_cache_memory_bytes, engine.served_model_name) == (1048576, ["a", "b"])
    assert server.log_requests and server.disable_log_stats and server.uvicorn_log_level == "warning"
    assert server.cors_origins() == ["*"] and parse([])[1].cors_origins() == []
    assert parse(["--no-enable-chunked-prefill"])[0].enable_chunked_prefill is False
    short = parse(["-pp", "2", "-dp", "3"])[0]
    assert (short.pipeline_parallel_size, short.data_parallel_size) == (2, 3)


def test_serve_help_lists_the_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "-tp",
        "-pp",
        "-dp",
        "--trust-remote-code",
        "--no-enable-chunked-prefill",
        "--kv-cache-memory-bytes",
    ):
        assert flag in help_text
    assert "always on" in help_text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--allowed-origins", "*"], "must be a JSON list of origins"),
        (["--allowed-origins", '{"a": 1}'], "must be a JSON list of origins"),
        (["--enable-log-requests", "--disable-log-requests"], "contradict"),
    ],
)
def test_bad_server_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(argv)


def test_vllm_engine_settings_resolve(tiny_llama: str, caplog: pytest.LogCaptureFixture) -> None:
    config = parse(
        ["--model", tiny_llama, "--kv-cache-memory-bytes", "4194304", "--served-model-name", "a", "b"]
    )[0].create_engine_config()
    assert config.cache.kv_cache_memory == 4194304 and config.model.served_model_names == ("a", "b")
    with pytest.raises(ConfigError, match="give one"):
        EngineArgs(model=tiny_llama, kv_cache_memory="4MiB", kv_cache_memory_bytes=4).create_engine_config()
    for flags, words in (
        (["-pp", "3"], "exceeds the model's 2 layers; lower --pipeline-parallel-size"),
        (["-dp", "65"], "between 1 and 64 \\(--data-parallel-size"),
        (["-dp", "0"], "between 1 and 64 \\(--data-parallel-size"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse(["--model", tiny_llama, *flags])[0].create_engine_config()
    # A local path is read as it is: a hub revision or cache folder does not apply to it (as in vLLM).
    assert EngineArgs(model=tiny_llama, revision="v1", download_dir="/tmp/x").create_engine_config()
    package_logger = logging.getLogger("pagedserve")
    package_logger.addHandler(caplog.handler)
    try:
        EngineArgs(
            model=tiny_llama, enable_chunked_prefill=False, trust_remote_code=True
        ).create_engine_config()
    finally:
        package_logger.removeHandler(caplog.handler)
    assert "never runs a model's own Python code" in caplog.text and "always on" in caplog.text


def test_offline_llm_accepts_vllm_arguments(tiny_llama: str) -> None:
    from pagedserve import LLM

    llm = LLM(tiny_llama, kv_cache_memory="4MiB", trust_remote_code=True, revision=None, download_dir=None)
    assert llm.generate("hi", use_tqdm=False)[0].outputs


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


def test_headless_refuses_a_pool(caplog: pytest.LogCaptureFixture) -> None:
    """--headless runs one model's replicas for a head node: a pool's flags are refused by name (exit 1),
    before any model is read."""
    package_logger = logging.getLogger("pagedserve")
    package_logger.addHandler(caplog.handler)
    try:
        for pool in (["--model", "a=/no/such/model"], ["--models-dir", "/no/such/dir"]):
            assert cli_main(["serve", *pool, "--headless"]) == 1
    finally:
        package_logger.removeHandler(caplog.handler)
    refusals = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(refusals) == 2 and all("--headless" in refusal for refusal in refusals)
    assert "drop --model NAME=PATH" in refusals[0] and "drop --models-dir" in refusals[1]


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


@pytest.mark.parametrize("value", ["bogus", "", "10", "INFO; rm"])
def test_a_bad_logging_level_names_the_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_LOGGING_LEVEL", value)
    with pytest.raises(ValueError, match="PAGEDSERVE_LOGGING_LEVEL"):
        logging_level()


def test_logging_level_takes_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_LOGGING_LEVEL", "debug")
    assert logging_level() == "DEBUG"
