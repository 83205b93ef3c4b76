"""What crosses the process line survives msgspec encoding, SamplingParams (a dataclass) included."""

import msgspec

from pagedserve.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    PositionLogprobs,
    SchedulerStats,
)
from pagedserve.sampling_params import RequestOutputKind, SamplingParams


def test_engine_core_request_roundtrip() -> None:
    params = SamplingParams(
        n=2,
        temperature=0.7,
        seed=5,
        stop=["x", "yz"],
        stop_token_ids=[7],
        logit_bias={11: -3.5},
        max_tokens=9,
        logprobs=2,
        output_kind=RequestOutputKind.DELTA,
    )
    request = EngineCoreRequest("r1", [1, 2, 3], params, 2, 123.5)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode([request]), type=list[EngineCoreRequest])[0]
    assert decoded == request
    assert decoded.sampling_params.stop_strings == ["x", "yz"]  # init=False, rebuilt by __post_init__
    assert decoded.sampling_params.logit_bias == {11: -3.5}
    assert decoded.sampling_params.output_kind is RequestOutputKind.DELTA


def test_engine_core_outputs_roundtrip() -> None:
    logprobs = [PositionLogprobs([5, 6], [-0.1, -2.0], 2)]
    prompt_logprobs = [None, PositionLogprobs([3], [-1.5], 7)]
    output = EngineCoreOutput("r1", [5], logprobs, prompt_logprobs, FinishReason.STOP, "x")
    outputs = EngineCoreOutputs([output], SchedulerStats(1, 2, 0.25, 3), 99.0, ["r1"])
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(outputs), type=EngineCoreOutputs)
    assert decoded == outputs and decoded.outputs[0].finish_reason is FinishReason.STOP
