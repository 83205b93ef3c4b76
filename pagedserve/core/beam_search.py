"""Beam search in the engine core, with HF transformers' selection rules.

Each beam is a request that computes one token per step and reports the top 2 * beam_width logprobs
of its last position (its own sampled token is ignored), processed as HF's beam search processes them:
logit_bias and the penalties applied to the log-softmax (layers/sampler.py). Once every live beam of a
search reported, the search picks the 2 * beam_width best continuations by cumulative logprob: the ones among the top
beam_width that end (EOS, a stop_token_ids token, or max_tokens) become hypotheses, and the best
beam_width others live on. Before min_tokens, EOS and stop tokens are no continuations (HF's
min_new_tokens: their scores are -inf), so every beam goes on.
A beam continued k times forks k - 1 new beams, which share its KV blocks (copy-on-write for the
partly filled last one); a beam not continued is pruned and its blocks freed.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from pagedserve.core.request import Request
from pagedserve.protocol import EngineCoreOutput, FinishReason, PositionLogprobs, child_request_id

Fork = Callable[[Request, str], Request]  # (parent beam, new id) -> a running beam sharing its blocks


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # generated tokens, the final one included
    cumulative_logprob: float
    score: float  # cumulative_logprob / len(token_ids) ** length_penalty
    finish_reason: FinishReason
    stop_reason: int | None = None  # the stop_token_ids token that ended it


@dataclass(slots=True)
class _Candidate:
    cumulative_logprob: float
    beam: int  # index into the live beams
    token_id: int


class BeamSearchGroup:
    """One beam search. Its beams share `group_id` (the frontend's request id), so a preemption
    takes them all (swap keeps their shared blocks shared)."""

    def __init__(self, request: Request) -> None:
        assert request.beam_search is not None
        self.params = request.beam_search
        self.request_id = request.request_id
        sampling = request.sampling_params
        self.output_ids = [child_request_id(self.request_id, i, sampling.n) for i in range(sampling.n)]
        self.eos_token_id = None if self.params.ignore_eos else request.eos_token_id
        self.stop_token_ids = frozenset(sampling.stop_token_ids or ())
        eos = () if self.eos_token_id is None else (self.eos_token_id,)
        self.ending_tokens = self.stop_token_ids.union(eos)
        self.min_tokens = sampling.min_tokens
        # NOTE: under min_tokens the ending tokens are dropped from a beam's report: it reports that many
        # more, so that its best 2 * beam_width others are still there.
        num_enders = len(self.ending_tokens) if self.min_tokens else 0
        # NOTE: every beam computes greedily and reports the processed logprobs HF's beam search ranks.
        request.sampling_params = replace(
            sampling,
            n=1,
            best_of=None,
            temperature=0.0,
            logprobs=2 * self.params.beam_width + num_enders,
            prompt_logprobs=None,
        )
        request.request_id, request.group_id = self._beam_id(0), self.request_id
        self.live: list[Request] = [request]
        self.first_beam = request  # admitted first: its prefix-cache hit is the search's
        self.scores: dict[str, float] = {request.request_id: 0.0}  # cumulative logprob per live beam
        self.reports: dict[str, dict[int, float]] = {}
        self.hypotheses: list[Hypothesis] = []  # the best beam_width, best first
        self._num_beams = 1

    def report(self, beam: Request, logprobs: PositionLogprobs) -> bool:
        """Record a beam's next-token logprobs; True once every live beam has reported."""
        # NOTE: a dict: the sampled (greedy) token is also among the top-k, and is one candidate.
        self.reports[beam.request_id] = dict(zip(logprobs.token_ids, logprobs.logprobs))
        return len(self.reports) == len(self.live)

    def advance(self, fork: Fork) -> tuple[list[Request], bool]:
        """Select this step's continuations (all live beams reported). Returns the beams to free (the
        pruned ones; every live one when the search is done) and whether it is done."""
        width, params = self.params.beam_width, self.params
        num_generated = self.live[0].num_output_tokens + 1
        at_max = num_generated >= params.max_tokens
        under_min = num_generated <= self.min_tokens  # the tokens before this one are fewer than min_tokens
        candidates = sorted(
            (
                _Candidate(self.scores[beam.request_id] + logprob, index, token_id)
                for index, beam in enumerate(self.live)
                for token_id, logprob in self.reports[beam.request_id].items()
                if not (under_min and self._ends_beam(token_id))
            ),
            key=lambda c: -c.cumulative_logprob,
        )[: 2 * width]
        ends = [at_max or self._ends_beam(c.token_id) for c in candidates]
        # NOTE: as in HF, only an ending candidate among the top `width` becomes a hypothesis.
        for candidate, end in zip(candidates[:width], ends):
            if end:
                self._add_hypothesis(candidate, num_generated)
        running = [c for c, end in zip(candidates, ends) if not end][:width]
        self.reports = {}
        if at_max or not running or self._finished(running[0].cumulative_logprob, num_generated):
            return self.live, True
        return self._continue(running, fork), False

    def outputs(self) -> list[EngineCoreOutput]:
        """The final outputs: the best hypotheses, best first, one per output id."""
        num_cached = self.first_beam.num_cached_tokens
        return [
            EngineCoreOutput(
                output_id,
                h.token_ids,
                finish_reason=h.finish_reason,
                stop_reason=h.stop_reason,
                cumulative_logprob=h.cumulative_logprob,
                num_cached_tokens=num_cached if num_cached >= 0 else None,
            )
            for output_id, h in zip(self.output_ids, self.hypotheses)
        ]

    def _ends_beam(self, token_id: int) -> bool:
        return token_id in self.ending_tokens

    def _add_hypothesis(self, candidate: _Candidate, num_generated: int) -> None:
        beam, token_id = self.live[candidate.beam], candidate.token_id
        reason = FinishReason.STOP if self._ends_beam(token_id) else FinishReason.LENGTH
        # As Request.check_stop: EOS has no stop_reason, a stop token is its own.
        stop_reason = token_id if token_id != self.eos_token_id and token_id in self.stop_token_ids else None
        score = length_normalized(candidate.cumulative_logprob, num_generated, self.params.length_penalty)
        self.hypotheses.append(
            Hypothesis(
                beam.output_token_ids + [token_id], candidate.cumulative_logprob, score, reason, stop_reason
            )
        )
        self.hypotheses.sort(key=lambda h: -h.score)
        del self.hypotheses[self.params.beam_width :]

    def _finished(self, best_running: float, num_generated: int) -> bool:
        """HF's stopping rule, given the best running beam's cumulative logprob."""
        params, width = self.params, self.params.beam_width
        if len(self.hypotheses) < width:
            return False
        if params.early_stopping is True:
            return True
        length = num_generated
        if params.early_stopping == "never" and params.length_penalty > 0:
            length = params.max_tokens
        return bool(
            length_normalized(best_running, length, params.length_penalty) <= self.hypotheses[-1].score
        )

    def _continue(self, running: list[_Candidate], fork: Fork) -> list[Request]:
        """Fork, extend and prune the beams; returns the pruned ones."""
        by_beam: dict[int, list[_Candidate]] = {}
        for candidate in running:
            by_beam.setdefault(candidate.beam, []).append(candidate)
        live, scores = [], {}
        for index, continuations in by_beam.items():
            parent = self.live[index]
            # NOTE: forks copy the parent's tokens before it takes its own continuation.
            for candidate in continuations[1:]:
                child = fork(parent, self._beam_id(self._num_beams))
                self._num_beams += 1
                child.append_token(candidate.token_id)
                live.append(child)
                scores[child.request_id] = candidate.cumulative_logprob
            parent.append_token(continuations[0].token_id)
            live.append(parent)
            scores[parent.request_id] = continuations[0].cumulative_logprob
        pruned = [beam for index, beam in enumerate(self.live) if index not in by_beam]
        self.live, self.scores = live, scores
        return pruned

    def _beam_id(self, index: int) -> str:
        return f"{self.request_id}#beam{index}"


class BeamSearchManager:
    """Every beam search in flight, and which group each live beam belongs to."""

    def __init__(self) -> None:
        self.groups: dict[str, BeamSearchGroup] = {}  # frontend request id -> group
        self._beam_to_group: dict[str, BeamSearchGroup] = {}
        self._ready: list[BeamSearchGroup] = []

    def add(self, request: Request) -> None:
        """Start a search; `request` becomes its first beam (renamed)."""
        group = BeamSearchGroup(request)
        self.groups[group.request_id] = group
        self._beam_to_group[request.request_id] = group

    def report(self, beam: Request, logprobs: PositionLogprobs | None) -> bool:
        """Give a beam's sampled-step logprobs to its search; False if `beam` is no beam."""
        group = self._beam_to_group.get(beam.request_id)
        if group is None:
            return False
        assert logprobs is not None, "a beam always asks for logprobs"
        if group.report(beam, logprobs):
            self._ready.append(group)
        return True

    def output_id_of(self, beam: Request) -> str | None:
        """The first output id of the search `beam` belongs to (what the frontend knows); None if no beam."""
        group = self._beam_to_group.get(beam.request_id)
        return None if group is None else group.output_ids[0]

    def width_of(self, request: Request) -> int:
        """The beam width of the search `request` is a beam of; 0 if it is none."""
        group = self._beam_to_group.get(request.request_id)
        return 0 if group is None else group.params.beam_width

    def forget_report(self, beam: Request) -> None:
        """A beam lost its KV (recompute preemption): it will compute and report again."""
        group = self._beam_to_group.get(beam.request_id)
        if group is not None:
            group.reports.pop(beam.request_id, None)

    def advance(self, fork: Fork) -> tuple[list[Request], list[EngineCoreOutput]]:
        """Advance every search whose beams all reported. Returns the beams to free and the outputs
        of the searches that ended."""
        to_free: list[Request] = []
        outputs: list[EngineCoreOutput] = []
        for group in self._ready:
            freed, done = group.advance(fork)
            to_free += freed
            for beam in freed:
                del self._beam_to_group[beam.request_id]
            if done:
                outputs += group.outputs()
                del self.groups[group.request_id]
            else:
                self._beam_to_group.update((beam.request_id, group) for beam in group.live)
        self._ready = []
        return to_free, outputs

    def take_aborted(self, request_ids: list[str]) -> list[str]:
        """Map ids to abort: a search's request id or output ids end the whole search (returns its
        live beams' ids, the search is forgotten); other ids pass through."""
        result: list[str] = []
        for request_id in request_ids:
            group = next(
                (g for g in self.groups.values() if request_id == g.request_id or request_id in g.output_ids),
                None,
            )
            if group is None:
                result.append(request_id)
                continue
            del self.groups[group.request_id]
            for beam in group.live:
                del self._beam_to_group[beam.request_id]
                result.append(beam.request_id)
        return result


def length_normalized(cumulative_logprob: float, length: int, length_penalty: float) -> float:
    """HF's beam score, cumulative_logprob / length ** length_penalty. NOTE: any finite length_penalty is
    accepted, so the power may overflow (OverflowError) or underflow to 0: the score is then the limit,
    never an exception inside the engine step."""
    try:
        denominator: float = float(length) ** length_penalty
    except OverflowError:
        denominator = math.inf
    if denominator == 0.0:
        return -math.inf if cumulative_logprob < 0 else 0.0
    return cumulative_logprob / denominator
