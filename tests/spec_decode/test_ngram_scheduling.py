"""N-gram speculation in the scheduler (no torch): proposals, which requests get drafts, and the release
of rejected drafts' KV blocks."""

import pytest
from core.utils import make_request, make_scheduler

from pagedserve.config import SpeculativeConfig
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.core.spec_decode import NgramProposer
from pagedserve.errors import ConfigError

SPEC = SpeculativeConfig("ngram", num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)


def test_prompt_lookup_takes_the_longest_suffix_and_latest_occurrence() -> None:
    proposer = NgramProposer(SPEC)
    assert proposer.propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 4) == [7, 8, 1, 2]
    assert proposer.propose([5, 1, 6, 2, 1], 3) == [6, 2, 1]  # one-token match, latest occurrence
    assert proposer.propose([1, 2, 3, 4], 4) == []  # nothing repeats
    assert proposer.propose([4, 4], 4) == [4]  # the continuation is what exists


def request(rid: str, prompt: list[int], max_tokens: int = 32, **params) -> Request:
    return make_request(rid, prompt, max_tokens, eos_token_id=0, **params)


def scheduler_with_spec(num_blocks: int = 32, block_size: int = 4) -> Scheduler:
    return make_scheduler(num_blocks, block_size, speculative=SPEC)


def test_rejected_drafts_release_their_blocks_and_the_workers_hear_of_it() -> None:
    scheduler = scheduler_with_spec()
    kv = scheduler.kv_cache_manager
    scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 1, 2]))  # 8 tokens: 2 blocks of 4
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({"a": 3}))  # ... 1 2 3: lookup proposes 4 5 6 1
    assert scheduler.requests["a"].spec_token_ids == [4, 5, 6, 1]
    free_before = kv.num_free_blocks()
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 5} and out.scheduled_spec_decode_tokens == {"a": [4, 5, 6, 1]}
    assert free_before - kv.num_free_blocks() == 2  # 9 + 4 tokens need 4 blocks: 2 more
    # The model agrees with the first draft only: tokens 4 then 9.
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": 4}, extra_token_ids={"a": [9]}))
    assert outputs[0].new_token_ids == [4, 9]
    a = scheduler.requests["a"]
    assert a.num_tokens == 11 and a.num_computed_tokens == 10  # the last token is computed next step
    assert len(kv.get_block_ids("a")) == 3 and kv.num_free_blocks() == free_before - 1
    assert (
        scheduler.get_stats().spec_decode_num_drafts,
        scheduler.get_stats().spec_decode_num_draft_tokens,
        scheduler.get_stats().spec_decode_num_accepted_tokens,
    ) == (1, 4, 1)
    out = scheduler.schedule()
    cached = out.scheduled_cached_reqs[0]
    assert cached.num_dropped_blocks == 1 and cached.new_token_ids == [4, 9]
    assert cached.num_computed_tokens == 10


def test_drafts_stop_at_max_tokens_and_a_stop_token_ends_the_step() -> None:
    scheduler = scheduler_with_spec()
    scheduler.add_request(request("a", [7, 8, 9, 7, 8], max_tokens=3, stop_token_ids=[9]))
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({"a": 5}))
    assert scheduler.requests["a"].spec_token_ids == []  # nothing after 8 5 ... but '5' never occurred
    scheduler.requests["a"].spec_token_ids = [7, 8]  # as if proposed: two drafts, max_tokens leaves 2
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": 7}, extra_token_ids={"a": [9]}))
    assert outputs[0].new_token_ids == [7, 9] and outputs[0].finish_reason is not None
    assert "a" not in scheduler.requests


@pytest.mark.parametrize(
    "params, speculates",
    [
        (dict(logprobs=2), False),  # reported per sampled position: one token a step
        (dict(repetition_penalty=1.2), True),  # each verified position counts the drafts before it
        (dict(presence_penalty=0.5, frequency_penalty=0.5), True),
        (dict(min_tokens=20), True),
    ],
)
def test_which_requests_get_drafts(params: dict, speculates: bool) -> None:
    scheduler = scheduler_with_spec()
    scheduler.add_request(request("a", [1, 2, 3, 1, 2], **params))
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({"a": 3}))
    assert (scheduler.requests["a"].spec_token_ids != []) == speculates


@pytest.mark.parametrize(
    "value, message",
    [
        ("{not json", "not valid JSON"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens=0"),
        ({"method": "ngram", "num_speculative_tokens": 2**63}, "must be an integer in"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "larger than",
        ),
        ({"method": "eagle", "num_speculative_tokens": 2}, "not supported"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"method": "ngram", "model": "/some/draft", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "Unknown speculative_config key"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_speculative_configs_are_refused(value, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeculativeConfig.from_user(value)


def test_vllm_defaults() -> None:
    spec = SpeculativeConfig.from_user('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)
    spec = SpeculativeConfig.from_user(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (4, 4)


def test_draft_length_adapts_to_what_verification_accepts() -> None:
    scheduler = scheduler_with_spec(num_blocks=64)
    scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]))
    scheduler.update_from_output(scheduler.schedule(), ModelRunnerOutput({"a": 3}))
    a = scheduler.requests["a"]
    assert a.spec_token_ids == [4, 5, 6, 7]
    # The model rejects the first draft (it says 1): next step one draft only, 2 (after the latest 1).
    scheduler.update_from_output(scheduler.schedule(), ModelRunnerOutput({"a": 1}))
    assert a.num_spec_tokens == 1 and a.spec_token_ids == [2]
    # It accepts it and says 3: one more draft next time.
    scheduler.update_from_output(
        scheduler.schedule(), ModelRunnerOutput({"a": 2}, extra_token_ids={"a": [3]})
    )
    assert a.num_spec_tokens == 2 and a.spec_token_ids == [1, 2]  # ... 1 2 3 [1 2] 3: the latest match
