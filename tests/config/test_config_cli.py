"""Flags come from the config dataclasses: types and choices from annotations, help from each field;
each config validates itself, naming the flag to change."""

import argparse
import dataclasses
import logging
from dataclasses import dataclass
from typing import Literal

import pytest

from pagedserve.config import (
    CacheConfig,
    EngineArgs,
    ParallelConfig,
    SchedulerConfig,
    add_dataclass_cli_args,
    config_field,
)
from pagedserve.config.cli import cli_type
from pagedserve.errors import ConfigError


def engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    EngineArgs.add_cli_args(parser)
    return parser


def test_literal_fields_become_typed_choices() -> None:
    args = engine_parser().parse_args(
        ["--block-size", "32", "--dtype", "bfloat16", "--preemption-mode", "swap"]
    )
    assert (args.block_size, args.dtype, args.preemption_mode) == (32, "bfloat16", "swap")
    for argv in (["--block-size", "12"], ["--dtype", "float64"], ["--distributed-executor-backend", "slurm"]):
        with pytest.raises(argparse.ArgumentError, match="invalid choice"):
            engine_parser().parse_args(argv)


def test_every_field_help_is_shown() -> None:
    text = " ".join(engine_parser().format_help().split())
    for f in dataclasses.fields(EngineArgs):
        assert " ".join(f.metadata["help"].split())[:40] in text


def test_the_model_is_engine_args_first_positional_argument() -> None:
    """The parallelism flags live in a base class (their own --help group) but come after the model."""
    assert EngineArgs("some/model", "some/tokenizer").model == "some/model"
    assert EngineArgs("some/model", tensor_parallel_size=2).tensor_parallel_size == 2
    assert "parallelism" in engine_parser().format_help()


def test_optional_and_bool_fields() -> None:
    args = engine_parser().parse_args(["--max-model-len", "64", "--no-enable-prefix-caching"])
    assert args.max_model_len == 64 and args.enable_prefix_caching is False and args.kv_cache_memory is None


def test_unexpressible_field_type_is_refused() -> None:
    @dataclass
    class Bad:
        sizes: list[int] = config_field(None, "Sizes.")

    with pytest.raises(TypeError, match="cannot be a command-line flag"):
        add_dataclass_cli_args(Bad, argparse.ArgumentParser())
    assert cli_type(Literal[1, 2] | None) == (int, (1, 2))


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: SchedulerConfig(0, 64, 64), r"max_num_seqs=0 must be at least 1 \(--max-num-seqs\)"),
        (
            lambda: SchedulerConfig(8, 0, 64),
            r"max_num_batched_tokens=0 must be at least 1 \(--max-num-batched-tokens\)",
        ),
        (lambda: SchedulerConfig(8, 64, 64, "later"), "--preemption-mode must be one of recompute, swap"),
        (lambda: CacheConfig(12, 0.9, None, None), "--block-size must be one of 8, 16, 32"),
        (lambda: CacheConfig(16, 1.5, None, None), r"must be in \(0, 1\] \(--gpu-memory-utilization\)"),
        (lambda: CacheConfig(16, 0.9, None, 1), "num_gpu_blocks_override must be at least 2"),
        (lambda: CacheConfig(16, 0.9, None, None, swap_space=-1), r"must not be negative \(--swap-space\)"),
        (lambda: ParallelConfig(2, "uni"), "--distributed-executor-backend uni runs one rank"),
        (lambda: ParallelConfig(1, "uni", 0.0), r"must be positive \(--distributed-timeout"),
        (lambda: ParallelConfig(1, "uni", 1.0, 0), r"must be at least 1 \(--pipeline-parallel-size\)"),
        (
            lambda: ParallelConfig(1, "uni", 1.0, 2),
            "uni runs one rank, but tensor_parallel_size=1 x pipeline",
        ),
        (
            lambda: ParallelConfig(1, "mp", 1.0, 1, 2, data_parallel_backend="pp"),  # type: ignore[arg-type]
            "--data-parallel-backend must be one of mp, ray",
        ),
    ],
)
def test_each_config_validates_itself(build, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


def test_cross_config_checks(tiny_llama: str) -> None:
    with pytest.raises(ConfigError, match="--preemption-mode swap needs host memory to swap to"):
        EngineArgs(model=tiny_llama, preemption_mode="swap", swap_space=0).create_engine_config()
    with pytest.raises(ConfigError, match="--attention-backend must be one of auto, torch, cpu"):
        EngineArgs(model=tiny_llama, attention_backend="flash").create_engine_config()


@pytest.mark.parametrize("cache_dtype", ["auto", "bfloat16", "fp8_e5m2"])
def test_calculate_kv_scales_without_fp8_is_reported(
    cache_dtype: str, caplog: pytest.LogCaptureFixture
) -> None:
    package_logger = logging.getLogger("pagedserve")  # NOTE: it does not propagate to the root logger
    package_logger.addHandler(caplog.handler)
    try:
        CacheConfig(16, 0.9, None, None, cache_dtype=cache_dtype, calculate_kv_scales=True)  # type: ignore[arg-type]
    finally:
        package_logger.removeHandler(caplog.handler)
    reported = "--calculate-kv-scales has no effect with --kv-cache-dtype" in caplog.text
    assert reported == (not cache_dtype.startswith("fp8"))


def test_device_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """--device cuda resolves to cuda where a GPU is visible (it was refused everywhere: the first GPU
    run found it); the GPU's presence (the torch-free probe's count) is the one thing this CPU machine
    must pretend."""
    from pagedserve.config import engine_config
    from pagedserve.config.engine_config import resolve_device

    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, cuda"):
        resolve_device("tpu")
    monkeypatch.setattr(engine_config, "visible_gpu_count", lambda: 0)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        resolve_device("cuda")
    monkeypatch.setattr(engine_config, "visible_gpu_count", lambda: 1)
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("auto") == "cuda"
