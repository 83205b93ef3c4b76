"""The batched sampler against a plain per-row reference on random logits."""

from typing import Any

import torch

from pagedserve.layers.sampler import Sampler, SamplingMetadata, gather_logprobs, top_tokens

VOCAB = 64


def _meta(temperature: torch.Tensor, **settings: Any) -> SamplingMetadata:
    """Rows of these temperatures with every other setting off but `settings`."""
    off: dict[str, Any] = dict(top_k=None, top_p=None, min_p=None, seeds={}, max_num_logprobs=None)
    return SamplingMetadata(
        temperature=temperature, all_greedy=not bool((temperature > 0).any()), **(off | settings)
    )


def reference_row(
    logits: torch.Tensor,
    prompt: list[int],
    output: list[int],
    presence: float,
    frequency: float,
    repetition: float,
    bias: dict[int, float],
) -> torch.Tensor:
    logits = logits.clone()
    for token, value in bias.items():  # first, as vLLM's sampler and HF's processors (sequence_bias)
        logits[token] += value
    for token in set(prompt) | set(output):
        logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
    for token in set(output):
        logits[token] -= frequency * output.count(token) + presence
    return logits


def test_penalties_and_bias_match_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 3
    prompts, outputs = [[1, 2, 3], [4, 4], [5]], [[2, 2, 9], [], [5, 6, 6, 6]]
    presence, frequency, repetition = [0.5, 0.0, 1.0], [0.3, 0.0, 0.7], [1.2, 1.0, 2.0]
    biases = [{7: 5.0, 2: 4.0}, {}, {8: -3.0, 5: 2.0}]  # 2 and 5 are penalized too
    counts = torch.zeros(3, VOCAB)
    prompt_mask = torch.zeros(3, VOCAB, dtype=torch.bool)
    bias = torch.zeros(3, VOCAB)
    for i in range(3):
        for t in outputs[i]:
            counts[i, t] += 1
        prompt_mask[i, prompts[i]] = True
        for t, v in biases[i].items():
            bias[i, t] = v
    meta = _meta(
        torch.zeros(3),
        presence_penalty=torch.tensor(presence),
        frequency_penalty=torch.tensor(frequency),
        repetition_penalty=torch.tensor(repetition),
        output_token_counts=counts,
        prompt_token_mask=prompt_mask,
        logit_bias=bias,
    )
    processed = Sampler().apply_penalties_and_bias(logits, meta)
    for i in range(3):
        expected = reference_row(
            logits[i], prompts[i], outputs[i], presence[i], frequency[i], repetition[i], biases[i]
        )
        torch.testing.assert_close(processed[i], expected)
    assert torch.equal(Sampler()(logits, meta).sampled_token_ids, processed.argmax(dim=-1))


def test_top_k_top_p_min_p_restrict_the_support() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, VOCAB)
    meta = _meta(
        torch.ones(4),
        top_k=torch.tensor([3, VOCAB, VOCAB, 2]),
        top_p=torch.tensor([1.0, 0.3, 1.0, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.5, 0.0]),
    )
    probs = logits.softmax(-1)
    allowed = [
        set(logits[0].topk(3).indices.tolist()),
        None,
        {t for t in range(VOCAB) if probs[2, t] >= 0.5 * probs[2].max()},
        set(logits[3].topk(2).indices.tolist()),
    ]
    order = probs[1].sort(descending=True)
    cumulative, nucleus = 0.0, set()
    for p, t in zip(order.values.tolist(), order.indices.tolist()):
        nucleus.add(t)
        cumulative += p
        if cumulative >= 0.3:
            break
    allowed[1] = nucleus
    sampler = Sampler()
    for _ in range(200):
        sampled = sampler(logits, meta).sampled_token_ids.tolist()
        for row, token in enumerate(sampled):
            assert token in allowed[row], (row, token)


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    meta = _meta(torch.ones(1))
    counts = torch.zeros(3)
    torch.manual_seed(0)
    for _ in range(3000):
        counts[Sampler()(logits, meta).sampled_token_ids[0]] += 1
    torch.testing.assert_close(counts / 3000, torch.tensor([0.7, 0.2, 0.1]), atol=0.03, rtol=0)


def test_top_tokens_break_ties_by_token_id_whatever_the_batch() -> None:
    """Equal logprobs (a grammar's -inf mask, repeated values) come largest first, then by ascending id,
    the same for a row alone and in any batch (torch.topk alone orders ties as its kernel happens to)."""
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randint(-3, 3, (6, 4000), generator=generator).float()
    logprobs[logprobs < -2] = float("-inf")
    logprobs[0, :3999] = float("-inf")  # one allowed token, as a grammar leaves it
    for k in (1, 2, 5, 20):
        values, ids = top_tokens(logprobs, k)
        for row in range(logprobs.shape[0]):
            expected = sorted(range(logprobs.shape[1]), key=lambda i: (-logprobs[row, i].item(), i))[:k]
            assert ids[row].tolist() == expected and torch.equal(values[row], logprobs[row, expected])
            alone_values, alone_ids = top_tokens(logprobs[row : row + 1], k)
            assert torch.equal(alone_ids[0], ids[row]) and torch.equal(alone_values[0], values[row])


def test_gather_logprobs_gives_the_chosen_tokens_rank_among_the_vocabulary() -> None:
    """The chosen token's rank counts the tokens at least as likely, itself included (vLLM's count: 1
    for the most likely), ties and -inf included; its value and the top-k follow it."""
    generator = torch.Generator().manual_seed(2)
    logprobs = torch.randint(-4, 4, (8, 300), generator=generator).float()
    logprobs[logprobs < -3] = float("-inf")
    chosen = torch.randint(0, 300, (8,), generator=generator)
    chosen[0] = int(logprobs[0].argmax())
    for k in (0, 3):
        ids, values, ranks = gather_logprobs(logprobs, k, chosen)
        for row in range(8):
            value = logprobs[row, chosen[row]].item()
            assert ranks[row].item() == sum(v >= value for v in logprobs[row].tolist())
            assert ids[row, 0] == chosen[row] and values[row, 0].item() == value
            top_ids = top_tokens(logprobs[row : row + 1], k)[1][0].tolist() if k else []
            assert ids[row, 1:].tolist() == top_ids
    assert ranks[0].item() == int((logprobs[0] == logprobs[0].max()).sum())


def test_the_heads_argmax_is_taken_unless_a_processor_changes_the_logits() -> None:
    """The LM head's argmax (`greedy_tokens`, folded into its kernel) stands for the greedy rows' pick as
    given: the sampler does not read the logits again; a row that samples still draws; with a bias (or a
    penalty) the logits change first, so the sampler takes its own argmax of the processed logits."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    head = (logits.argmax(dim=-1) + 1) % VOCAB  # not the argmax: shows which one the sampler took
    greedy = _meta(torch.zeros(3), max_num_logprobs=1)
    out = Sampler()(logits, greedy, head)
    assert torch.equal(out.sampled_token_ids, head)
    assert out.logprob_token_ids is not None and torch.equal(out.logprob_token_ids[:, 0], head)
    mixed = _meta(torch.tensor([0.0, 1.0, 0.0]), top_k=torch.tensor([1, 1, 1]))
    sampled = Sampler()(logits, mixed, head).sampled_token_ids
    assert sampled[[0, 2]].tolist() == head[[0, 2]].tolist() and sampled[1] == logits[1].argmax()
    bias = torch.zeros(3, VOCAB)
    bias[:, 5] = 100.0
    biased = _meta(torch.zeros(3), logit_bias=bias)
    assert Sampler()(logits, biased, head).sampled_token_ids.tolist() == [5, 5, 5]
