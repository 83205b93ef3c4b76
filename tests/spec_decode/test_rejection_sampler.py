"""Draft verification (sample every verified row, keep the drafts up to the first disagreement) keeps the
model's distribution exactly (temperature > 0), is greedy decoding itself at temperature 0, and gives a
seeded position the token a plain step gives it, on random logits."""

import dataclasses

import pytest
import torch

from pagedserve.layers.rejection_sampler import accept_drafts
from pagedserve.layers.sampler import Sampler, SamplingMetadata

VOCAB = 6


def metadata(rows: int, temperature: float, seeds: dict[int, int] | None = None) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=torch.full((rows,), temperature),
        all_greedy=temperature == 0,
        top_k=None,
        top_p=None,
        min_p=None,
        seeds=seeds or {},
        max_num_logprobs=None,
    )


def rejection_sample(
    sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata, drafts: list[list[int]]
) -> list[list[int]]:
    return accept_drafts(sampler(logits, meta).sampled_token_ids.tolist(), drafts)


# Chi-square critical value for VOCAB - 1 = 5 degrees of freedom at significance 0.001.
CHI2_CRITICAL = 20.52


def chi_square(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of `samples` against the distribution `probs`."""
    counts = torch.bincount(samples, minlength=len(probs)).double()
    expected = probs.double() * len(samples)
    return ((counts - expected) ** 2 / expected).sum().item()


def test_outputs_follow_the_target_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 1.5  # positions: after the last token, after draft 0, after draft 1
    drafts = [2, 1]  # a likely-rejected first draft (p = 0.27), a likely-accepted second (p = 0.75)
    probs = logits.softmax(dim=-1)
    trials = 60_000
    tokens = rejection_sample(
        Sampler(), logits.repeat(trials, 1), metadata(3 * trials, 1.0), [drafts] * trials
    )
    first = torch.tensor([t[0] for t in tokens])
    assert chi_square(first, probs[0]) < CHI2_CRITICAL
    # Given the first draft was taken, the next token follows the distribution after it.
    second = torch.tensor([t[1] for t in tokens if t[0] == drafts[0]])
    assert len(second) > 0.5 * trials * probs[0, drafts[0]].item()
    assert chi_square(second, probs[1]) < CHI2_CRITICAL
    # And after both drafts, the bonus token follows the last row.
    third = torch.tensor([t[2] for t in tokens if t[:2] == drafts])
    assert len(third) > 100
    assert chi_square(third, probs[2]) < CHI2_CRITICAL


@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_rows_are_greedy_decoding(all_greedy: bool) -> None:
    """An all-greedy batch (argmax only), and greedy rows in a batch that also samples (one-hot rows
    through the general rule)."""
    torch.manual_seed(1)
    logits = torch.randn(40 * 4, VOCAB)
    argmax = logits.argmax(dim=-1).view(40, 4).tolist()
    # Drafts that agree with the argmax for a random number of positions, then disagree.
    drafts, expected = [], []
    for row, agree in zip(argmax, torch.randint(0, 4, (40,)).tolist()):
        draft = row[:agree] + [(row[agree] + 1) % VOCAB] * (3 - agree) if agree < 3 else row[:3]
        drafts.append(draft)
        expected.append(row[: agree + 1])
    meta = dataclasses.replace(metadata(160, 0.0), all_greedy=all_greedy)
    assert rejection_sample(Sampler(), logits, meta, drafts) == expected


def test_seeded_rows_repeat() -> None:
    logits = torch.randn(4, VOCAB)
    seeds = {row: 1234 + row for row in range(4)}
    runs = [rejection_sample(Sampler(), logits, metadata(4, 1.0, seeds), [[0, 1, 2]]) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_seeded_rows_draw_what_a_plain_step_draws() -> None:
    """A seeded position samples the same token verified after drafts as sampled alone: whether a step
    had drafts does not change a seeded request's output."""
    torch.manual_seed(3)
    logits = torch.randn(4, VOCAB)
    seeds = {row: 99 + row for row in range(4)}
    verified = Sampler()(logits, metadata(4, 1.0, seeds)).sampled_token_ids.tolist()
    for row in range(4):
        alone = Sampler()(logits[row : row + 1], metadata(1, 1.0, {0: seeds[row]})).sampled_token_ids
        assert alone.tolist() == [verified[row]]
    # Drafts equal to the samples are all accepted, with the last row's sample as the bonus token.
    assert rejection_sample(Sampler(), logits, metadata(4, 1.0, seeds), [verified[:3]]) == [verified]
