"""The input batch's persistent state (token arrays, block tables, sampling columns), updated from each
step's scheduler diff, against a batch and sampling metadata rebuilt from scratch from plain per-request
lists, through random sequences of new, growing, drafting, finished and resumed requests that outgrow
the initial rows and widths."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.layers.sampler import SamplingMetadata
from pagedserve.sampling_params import SamplingParams
from pagedserve.worker.block_table import BlockTables
from pagedserve.worker.decode_inputs import DecodeInputs, decode_inputs_for
from pagedserve.worker.input_batch import BatchInputs, InputBatch
from pagedserve.worker.request_state import CachedRequestState
from pagedserve.worker.sampling_inputs import SamplingState, build_sampling_metadata

BLOCK, VOCAB = 4, 40


@dataclasses.dataclass
class Plain:
    """What the scheduler knows of one request: every token, computed tokens, block ids."""

    params: SamplingParams
    tokens: list[int]
    num_prompt: int
    computed: int = 0
    blocks: list[int] = dataclasses.field(default_factory=list)
    sent: int = 0  # tokens the worker has


def random_params(rng: random.Random, per_token: bool = True) -> SamplingParams:
    """`per_token`: may also take the settings whose inputs change with every token (penalties, a seed,
    a bias, min_tokens), which keep a step off the decode layout."""
    return SamplingParams(
        temperature=rng.choice([0.0, 0.0, 0.8]),
        top_k=rng.choice([0, 0, 5, 2**63 - 1]),
        top_p=rng.choice([1.0, 0.9]),
        min_p=rng.choice([0.0, 0.1]),
        presence_penalty=rng.choice([0.0, 0.5]) if per_token else 0.0,
        repetition_penalty=rng.choice([1.0, 1.2]) if per_token else 1.0,
        seed=rng.choice([None, -(2**63), 2**63 - 1]) if per_token else None,
        logit_bias=rng.choice([None, {3: 1.5}]) if per_token else None,
        min_tokens=rng.choice([0, 3]) if per_token else 0,
        stop_token_ids=[7],
        logprobs=rng.choice([None, 2]),
        max_tokens=None,
    )


def assert_same_metadata(got: SamplingMetadata | None, expected: SamplingMetadata) -> None:
    assert got is not None
    for field in dataclasses.fields(SamplingMetadata):
        a, b = getattr(got, field.name), getattr(expected, field.name)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype, field.name
            assert torch.equal(a, b), field.name
        else:
            assert a == b, field.name


def decode_helpers(kind: str) -> DecodeInputs:
    """The steady decode helpers of `kind`: "numpy", or "native" (the CPU kernels'; skipped without them)."""
    if kind == "numpy":
        return DecodeInputs()
    if load_cpu_kernels().module is None:
        pytest.skip(f"native CPU kernels unavailable: {load_cpu_kernels().error}")
    helpers = decode_inputs_for(torch.device("cpu"))
    assert not isinstance(helpers, DecodeInputs)
    return helpers


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 24), pack=st.booleans(), native=st.booleans())
def test_diff_updates_match_a_rebuild(seed: int, steps: int, pack: bool, native: bool) -> None:
    """`pack`: through the one-copy staging buffer that CUDA uses, or the CPU's arrays as they are."""
    run_steps(random.Random(seed), steps, pack, decode=decode_helpers("native" if native else "numpy"))


@pytest.mark.parametrize("kind", ["numpy", "native"])
@pytest.mark.parametrize("pack", [False, True])
def test_repeated_decode_steps_reuse_the_layout(pack: bool, kind: str) -> None:
    """Runs of quiet steps (the same requests decode one token each) take the decode fast path, which
    gives what a rebuild gives, also across block boundaries and after the set changes, with either
    implementation of its helpers; once a layout's buffers exist, its steps rewrite the same tensors."""
    reused, in_place = run_steps(
        random.Random(7), 60, pack=pack, quiet=0.8, per_token=False, decode=decode_helpers(kind)
    )
    assert reused > 10 and in_place > 5


def run_steps(
    rng: random.Random,
    steps: int,
    pack: bool,
    quiet: float = 0.0,
    per_token: bool = True,
    decode: DecodeInputs | None = None,
) -> tuple[int, int]:
    """Random steps (a `quiet` fraction of them: nothing finishes, arrives, is preempted or drafts, every
    request computes one token), each build checked; returns how many (with requests) reused the previous
    layout, and how many of those rewrote the previous step's input tensors. `per_token`: requests may
    have per-token sampling settings (`random_params`); `decode`: the steady decode helpers (numpy's by
    default)."""
    reused, in_place, previous = 0, 0, None
    batch = InputBatch(BLOCK, torch.device("cpu"), VOCAB, decode=decode, pack=pack)
    # Everything tiny, so that the steps grow every array.
    batch.block_tables, batch.sampling = BlockTables(1, rows=1, width=1), SamplingState(rows=1)
    batch.token_ids = np.zeros((1, 2), dtype=np.int64)
    batch.num_tokens = np.zeros(1, dtype=np.int64)
    batch.num_computed = np.zeros(1, dtype=np.int64)
    held: dict[str, Plain] = {}
    next_id, next_block = 0, 1
    for _ in range(steps):
        calm = rng.random() < quiet
        finished = set() if calm else {r for r in held if rng.random() < 0.2}
        for request_id in finished:
            del held[request_id]
        new, cached, scheduled, spec = [], [], {}, {}
        for _ in range(0 if calm else rng.randint(0, 3)):
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
            held[f"r{next_id}"] = Plain(random_params(rng, per_token), prompt, len(prompt), sent=-1)
            next_id += 1
        for request_id, plain in held.items():
            if plain.computed == len(plain.tokens) and plain.sent >= 0:  # it sampled: one more token
                plain.tokens.append(rng.randrange(VOCAB))
            if not calm and rng.random() < 0.1 and plain.sent >= 0:  # preempted: it comes back whole, as new
                plain.sent, plain.blocks, plain.computed = -1, [], 0
            remaining = len(plain.tokens) - plain.computed
            num = 1 if calm else rng.randint(1, remaining) if remaining > 1 else 1
            if not calm and num == remaining == 1 and rng.random() < 0.4:
                spec[request_id] = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))]
            scheduled[request_id] = num + len(spec.get(request_id, []))
            needed = -(-(plain.computed + scheduled[request_id]) // BLOCK) - len(plain.blocks)
            added = list(range(next_block, next_block + needed))
            next_block += needed
            plain.blocks += added
            if plain.sent < 0:
                finished.add(request_id)  # a resumed request is forgotten, then sent anew
                new.append(
                    NewRequestData(
                        request_id,
                        list(plain.tokens),
                        plain.num_prompt,
                        plain.params,
                        2,
                        list(plain.blocks),
                        plain.computed,
                        beam=request_id.endswith("3"),
                    )
                )
            else:
                cached.append(
                    CachedRequestData(
                        request_id, plain.tokens[plain.sent :], plain.sent, added, plain.computed
                    )
                )
            plain.sent = len(plain.tokens)
        out = SchedulerOutput(
            new, cached, scheduled, sum(scheduled.values()), finished, scheduled_spec_decode_tokens=spec
        )
        batch.update(out)
        got = batch.build(out)
        check_batch(got, held, scheduled, spec)
        assert all(batch.known_tokens(r).tolist() == plain.tokens for r, plain in held.items())
        layout_held = (
            bool(scheduled) and previous is not None and got.logits_indices is previous.logits_indices
        )
        reused += layout_held
        in_place += layout_held and previous is not None and got.input_ids is previous.input_ids
        previous = got
        for request_id, num in scheduled.items():
            held[request_id].computed += num - len(spec.get(request_id, []))
    return reused, in_place


def check_batch(
    got: BatchInputs, held: dict[str, Plain], scheduled: dict[str, int], spec: dict[str, list[int]]
) -> None:
    """The step's tensors and sampling metadata as a from-scratch build of the plain lists gives them."""
    order = got.request_ids
    assert sorted(order) == sorted(scheduled)
    input_ids, positions, slots, logits_indices, sample_ids = [], [], [], [], []
    query_start_loc, seq_lens = [0], []
    for request_id in order:
        plain, draft = held[request_id], spec.get(request_id, [])
        start, end = plain.computed, plain.computed + scheduled[request_id]
        query_start_loc.append(query_start_loc[-1] + end - start)
        seq_lens.append(end)
        input_ids += (plain.tokens + draft)[start:end]
        positions += range(start, end)
        slots += [plain.blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, end)]
        if end == len(plain.tokens) + len(draft):
            sample_ids.append(request_id)
            logits_indices += range(len(input_ids) - 1 - len(draft), len(input_ids))
    common = got.attention[0]
    assert got.input_ids.tolist() == input_ids and got.positions.tolist() == positions
    assert common.slot_mapping.tolist() == slots and got.logits_indices.tolist() == logits_indices
    assert common.query_start_loc == common.query_start_loc_tensor.tolist() == query_start_loc
    assert common.seq_lens == common.seq_lens_tensor.tolist() == seq_lens
    assert [order[row] for row in got.sample_rows] == sample_ids
    for row, request_id in enumerate(order):
        blocks = held[request_id].blocks
        assert common.block_tables[row, : len(blocks)].tolist() == blocks
    if not sample_ids:
        assert got.sampling is None
        return
    repeated = [r for r in sample_ids for _ in range(len(spec.get(r, [])) + 1)]
    states = [
        CachedRequestState(r, held[r].num_prompt, held[r].params, 2, beam=r.endswith("3")) for r in repeated
    ]
    tokens = [held[r].tokens for r in repeated]
    drafted = [spec.get(r, [])[:j] for r in sample_ids for j in range(len(spec.get(r, [])) + 1)]
    expected = build_sampling_metadata(states, tokens, VOCAB, torch.device("cpu"), drafted)
    assert_same_metadata(got.sampling, expected)
