"""OutputProcessor: deltas for streaming (with the stop-string hold-back), final-only outputs, stats."""

import pytest

from pagedserve.engine.output_processor import OutputProcessor
from pagedserve.metrics.stats import IterationStats
from pagedserve.protocol import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from pagedserve.sampling_params import RequestOutputKind, SamplingParams

TEXT = "Hello world, this is a test of streaming"


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def run(tokenizer, params: SamplingParams, token_ids: list[int]) -> tuple[list, list[str], IterationStats]:
    """Feed `token_ids` one per step; returns the outputs, the ids to abort and the stats."""
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, [1, 2], params, arrival_time=0.0)
    results, aborts, stats = [], [], IterationStats()
    processor.process_outputs(EngineCoreOutputs([], None, 0.5, ["r"]), stats)
    for index, token in enumerate(token_ids):
        last = index == len(token_ids) - 1
        output = EngineCoreOutput("r", [token], finish_reason=FinishReason.LENGTH if last else None)
        outputs, to_abort = processor.process_outputs(EngineCoreOutputs([output]), stats)
        results += outputs
        aborts += to_abort
        if to_abort:
            break
    assert processor.num_unfinished == 0 and "r" not in processor
    return results, aborts, stats


def test_deltas_never_show_a_stop_string(tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    stop = "o world"  # spans two tokens
    params = SamplingParams(stop=stop, output_kind=RequestOutputKind.DELTA)
    results, aborts, _ = run(tokenizer, params, tokens)
    deltas = [r.outputs[0].text for r in results]
    assert "".join(deltas) == "Hell" and aborts == ["r"]
    assert results[-1].finished and results[-1].outputs[0].stop_reason == stop
    assert all(len(r.outputs[0].token_ids) == 1 for r in results)  # tokens are never held back


def test_deltas_add_up_to_the_cumulative_text(tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    cumulative = run(tokenizer, SamplingParams(stop="zzz"), tokens)[0][-1].outputs[0].text
    deltas = run(tokenizer, SamplingParams(stop="zzz", output_kind=RequestOutputKind.DELTA), tokens)[0]
    assert cumulative == TEXT == "".join(r.outputs[0].text for r in deltas)
    included = run(
        tokenizer,
        SamplingParams(stop="world", include_stop_str_in_output=True, output_kind=RequestOutputKind.DELTA),
        tokens,
    )[0]
    assert "".join(r.outputs[0].text for r in included) == "Hello world"


def test_final_only_and_stats(tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    results, _, stats = run(tokenizer, SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY), tokens)
    assert len(results) == 1 and results[0].finished and results[0].outputs[0].text == TEXT
    assert results[0].outputs[0].token_ids == tokens
    assert stats.queue_times == [0.5] and len(stats.time_to_first_tokens) == 1
    assert len(stats.inter_token_latencies) == len(tokens) - 1
    assert (stats.num_prompt_tokens, stats.num_generation_tokens) == (2, len(tokens))
    assert [f.finish_reason for f in stats.finished_requests] == ["length"]


class _NoScan(dict):
    """A dict that refuses to be iterated: aborting one request must not scan the others."""

    def items(self):  # type: ignore[override]
        raise AssertionError("scanned every request in flight")

    def __iter__(self):
        raise AssertionError("scanned every request in flight")


def test_aborting_a_request_touches_only_its_own_samples(tokenizer) -> None:
    """Finishing N aborted requests is O(N), not O(N^2): each abort looks up its own samples."""
    processor = OutputProcessor(tokenizer)
    for i in range(50):
        processor.add_request(f"r{i}", None, [1, 2], SamplingParams(n=2, max_tokens=4), arrival_time=0.0)
    processor._child_to_parent = _NoScan(processor._child_to_parent)
    aborted = [processor.abort_request(f"r{i}") for i in range(50)]
    assert all(len(child_ids) == 2 for child_ids in aborted)
    assert processor.num_unfinished == 0 and not dict.__len__(processor._child_to_parent)


@pytest.mark.parametrize(
    ("settings", "final_only"),
    [
        (dict(output_kind=RequestOutputKind.FINAL_ONLY), True),
        (dict(output_kind=RequestOutputKind.FINAL_ONLY, n=3), True),
        (dict(output_kind=RequestOutputKind.CUMULATIVE), False),
        (dict(output_kind=RequestOutputKind.DELTA), False),
        (dict(output_kind=RequestOutputKind.FINAL_ONLY, stop="x"), False),  # its text is watched
        (dict(output_kind=RequestOutputKind.FINAL_ONLY, logprobs=0), False),
        (dict(output_kind=RequestOutputKind.FINAL_ONLY, prompt_logprobs=0), False),
        (dict(output_kind=RequestOutputKind.FINAL_ONLY, n=2, best_of=3, temperature=1.0), False),  # picked
    ],
)
def test_only_an_engine_that_measures_nothing_makes_requests_final_only(
    tokenizer, settings, final_only
) -> None:
    """`final_only` (the engine core reports the first token and the end) for the offline engine's final-only
    requests without stop strings or logprobs (best_of picks by logprobs); never for a server's, whose
    metrics time every token."""
    request = EngineCoreRequest("r", [1, 2], SamplingParams(max_tokens=4, **settings), None, 0.0)
    for measures in (False, True):
        children = OutputProcessor(tokenizer, measures=measures).register("r", None, request)
        assert [child.final_only for child in children] == [final_only and not measures] * len(children)
