"""--cpu-offload-gb on CPU, the copy engine's device being the CPU: the last decoder layers' bytes live in a
host tensor and are copied into two alternating buffers one layer ahead of their use. Greedy tokens and
their logprobs equal the engine's without offload bit for bit (float32 and online int8, whose packed rows
travel); the right layers and bytes are host-resident; the engine counts the device bytes."""

import math

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.errors import ConfigError

PROMPTS = ["The quick brown fox", "Paged attention keeps"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, logprobs=2)
ENGINE = dict(kv_cache_memory="1MiB", max_model_len=256, dtype="float32")


def _outputs(llm: LLM) -> list[tuple[list[int], list[dict[int, float]]]]:
    results = llm.generate(PROMPTS, GREEDY)
    return [
        (
            list(r.outputs[0].token_ids),
            [dict(step) for step in r.outputs[0].logprobs or []],
        )
        for r in results
    ]


def _worker(llm: LLM):
    return llm.llm_engine.engine_core.executor.worker


@pytest.fixture(scope="module")
def five_layers(tiny_model_factory) -> str:
    return tiny_model_factory("llama-5l-tied")


def _layer_bytes(worker) -> int:
    layer = worker.runner.model.model.layers[0]
    return sum(p.numel() * p.element_size() for p in layer.parameters())


@pytest.mark.sampled
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_offloaded_layers_compute_the_same_bits(five_layers: str, quantization: str | None) -> None:
    reference = LLM(five_layers, quantization=quantization, **ENGINE)
    expected, whole = _outputs(reference), _worker(reference).weights_bytes
    layer = _layer_bytes(_worker(reference))
    del reference
    # 2.5 layers' bytes: whole layers from the last until at least that much is host-resident -> 3 layers
    llm = LLM(five_layers, quantization=quantization, cpu_offload_gb=2.5 * layer / 2**30, **ENGINE)
    worker = _worker(llm)
    offloader = worker.runner.model.cpu_offloader
    assert sorted(offloader.layers) == [2, 3, 4]
    assert offloader.parameter_bytes == 3 * layer and offloader.plan.host_bytes >= 3 * layer
    assert all(entry.host.numel() == offloader.plan.host_bytes // 3 for entry in offloader.layers.values())
    # the device keeps the other layers, the embedding and two layers' buffers
    assert worker.weights_bytes == whole - 3 * layer + offloader.plan.buffer_bytes
    offloader.copier.log.clear()
    assert _outputs(llm) == expected
    # each forward: layer 2's copy starts as layer 1 starts, layer k + 1's as layer k starts
    forward = [
        ("run", 0),
        ("copy", 2),
        ("run", 1),
        ("copy", 3),
        ("run", 2),
        ("copy", 4),
        ("run", 3),
        ("run", 4),
    ]
    log = offloader.copier.log
    assert len(log) % len(forward) == 0 and log == forward * (len(log) // len(forward))


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_bad_values_name_the_flag(five_layers: str, value: float) -> None:
    with pytest.raises(ConfigError, match="--cpu-offload-gb"):
        LLM(five_layers, cpu_offload_gb=value, **ENGINE)


def test_more_than_the_layers_hold_is_refused(five_layers: str) -> None:
    with pytest.raises(ConfigError, match="--cpu-offload-gb 1.0 is more than the .* decoder layer weights"):
        LLM(five_layers, cpu_offload_gb=1.0, **ENGINE)
