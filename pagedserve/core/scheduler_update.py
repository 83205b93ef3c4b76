"""The scheduler's update from each step's model output (`update_from_output`): sampled tokens appended
and stop conditions applied, a failed request ended, prompt logprobs reported once across recompute
preemptions, drafts settled and proposed, beam searches advanced (their beams forked), finished requests
freed. The scheduling decisions are scheduler.py's."""

from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.core.scheduler_diffs import SchedulerDiffs
from pagedserve.protocol import EngineCoreOutput, FinishReason, PositionLogprobs


def report(
    request: Request,
    new_logprobs: list[PositionLogprobs] | None = None,
    prompt_logprobs: list[PositionLogprobs | None] | None = None,
) -> EngineCoreOutput:
    """The request's output to the frontend: its tokens not reported yet, and its finish if it ended; with
    its first generated tokens, its prefix-cache hit."""
    first = request.num_reported == request.num_prompt_tokens and request.num_cached_tokens >= 0
    output = EngineCoreOutput(
        request.request_id,
        request.all_token_ids[request.num_reported :],
        new_logprobs,
        prompt_logprobs,
        request.finish_reason,
        request.stop_reason,
        num_cached_tokens=request.num_cached_tokens if first else None,
    )
    request.num_reported = request.num_tokens
    return output


class SchedulerUpdate(SchedulerDiffs):
    """A SchedulerDiffs that takes in what each step computed (`update_from_output`); on SchedulerDiffs
    because settled drafts trim blocks off a table, which the request's next diff reports."""

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply token-level stop conditions, free finished requests, advance
        beam searches."""
        outputs, self._cut_outputs = self._cut_outputs, []
        for ended in self.in_flight.returned(scheduler_output.num_scheduled_tokens):
            self.kv_cache_manager.free(ended)  # aborted while its step ran: the step wrote its last now
        finished: list[Request] = []
        # NOTE: a decode step's loop runs once per request: what most steps lack (failures, prompt logprobs,
        # logprobs, drafts) is looked up only when the step has any.
        requests, running, sampled = self.requests, RequestStatus.RUNNING, runner_output.sampled_token_ids
        failed, all_logprobs = runner_output.failed, runner_output.logprobs
        prompt_logprobs_of, extra_tokens = runner_output.prompt_logprobs, runner_output.extra_token_ids
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        for request_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(request_id)
            if request is None or request.status is not running:
                continue  # aborted or preempted meanwhile
            error = failed.get(request_id) if failed else None
            if error is not None:
                outputs.append(self._fail(request, error))
                finished.append(request)
                continue
            prompt_logprobs = (
                self._unreported_prompt_logprobs(
                    request, prompt_logprobs_of.get(request_id), scheduler_output
                )
                if prompt_logprobs_of
                else None
            )
            token_id = sampled.get(request_id)
            if token_id is None:
                if prompt_logprobs is not None:
                    outputs.append(EngineCoreOutput(request_id, [], prompt_logprobs=prompt_logprobs))
                continue
            logprobs = all_logprobs.get(request_id) if all_logprobs else None
            if request.beam_search is not None and self.beam_search.report(request, logprobs):
                continue  # a beam: its search picks the continuations
            num_tokens = request.num_tokens
            extra = extra_tokens.get(request_id) if extra_tokens else None
            stopped = self._append_tokens(request, (token_id, *extra) if extra else (token_id,))
            if stopped:
                finished.append(request)
            drafts = spec_tokens.get(request_id) if spec_tokens else None
            if drafts:
                assert self.drafts is not None, "drafts come with a speculative config"
                num_accepted = request.num_tokens - num_tokens - 1
                self._note_dropped(request_id, self.drafts.settle(request, drafts, num_accepted))
            # NOTE: a final-only request reports its first token (its time) and then only its end.
            if stopped or not request.final_only or request.num_reported == request.num_prompt_tokens:
                outputs.append(report(request, [logprobs] if logprobs else None, prompt_logprobs))
        pruned, beam_outputs = self.beam_search.advance(self._fork_beam)
        if finished or pruned:
            self._finish(finished + pruned)
        if self.drafts is not None:
            drafting = self.in_flight.drafting(self.running, scheduler_output.num_scheduled_tokens)
            self.drafts.propose(drafting, runner_output.draft_token_ids)
        return outputs + beam_outputs

    def _append_tokens(self, request: Request, tokens: tuple[int, ...]) -> bool:
        """Append the step's tokens (the sampled one, then accepted drafts) to the request up to the first
        that ends it (a stop token, the length, a completed grammar); True if one did."""
        for token in tokens:
            request.append_token(token)
            grammar_complete = self.structured.accept(request, token)
            if request.check_stop(self.config.max_model_len, grammar_complete):
                return True
        return False

    def _fail(self, request: Request, error: str) -> EngineCoreOutput:
        """The worker could not run the request (its adapter's files): it ends with `error`, and the blocks
        its step filled (the base model's K/V under its adapter's key) leave the prefix cache."""
        request.finish_reason = FinishReason.ERROR
        self.kv_cache_manager.uncache(request)
        return EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ERROR, error=error)

    @staticmethod
    def _unreported_prompt_logprobs(
        request: Request,
        entries: list[PositionLogprobs | None] | None,
        scheduler_output: SchedulerOutput,
    ) -> list[PositionLogprobs | None] | None:
        """The step's prompt logprobs less those of prompt tokens already reported before a recompute
        preemption; None when nothing is new. A step whose tokens start at position s > 0 reports prompt
        tokens s + 1, ... (position p predicts token p + 1); the first step reports token 0 (None) too."""
        if entries is None:
            return None
        start = request.num_computed_tokens - scheduler_output.num_scheduled_tokens[request.request_id]
        first_token = start + 1 if start else 0
        reported = request.num_prompt_logprobs_reported
        request.num_prompt_logprobs_reported = max(reported, first_token + len(entries))
        return entries[max(0, reported - first_token) :] or None

    def _fork_beam(self, parent: Request, request_id: str) -> Request:
        assert parent.status is RequestStatus.RUNNING, "a beam forks right after it reported"
        child = parent.fork(request_id)
        self.kv_cache_manager.fork(parent, child, parent.num_computed_tokens)
        self._keep(child)
        self.running.append(child)
        return child
