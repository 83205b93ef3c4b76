"""Factories shared by the core tests (no torch): requests and schedulers built directly."""

import time
from typing import Any

from pagedserve.config import PreemptionMode, SchedulerConfig, SpeculativeConfig
from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.config.scheduler import SchedulingPolicy
from pagedserve.core.kv_admission import KVAdmissionPolicy
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.scheduler import Scheduler
from pagedserve.lora.request import LoRARequest
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams


def make_request(
    request_id: str,
    prompt: int | list[int],
    max_tokens: int = 4,
    *,
    first_token: int = 3,
    eos_token_id: int | None = 2,
    group_id: str | None = None,
    cache_salt: str | None = None,
    priority: int = 0,
    lora_request: LoRARequest | None = None,
    **params: Any,
) -> Request:
    """A request whose prompt is `prompt` tokens counting up from `first_token` (or the given token ids);
    `params` go to SamplingParams."""
    tokens = list(range(first_token, first_token + prompt)) if isinstance(prompt, int) else prompt
    sampling = SamplingParams(max_tokens=max_tokens, **params)
    return Request(
        EngineCoreRequest(
            request_id,
            tokens,
            sampling,
            eos_token_id,
            time.time(),
            group_id=group_id,
            cache_salt=cache_salt,
            priority=priority,
            lora_request=lora_request,
        )
    )


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    *,
    preemption_mode: PreemptionMode | None = None,
    num_host_blocks: int = 0,
    admission: KVAdmissionPolicy | None = None,
    enable_caching: bool = True,
    speculative: SpeculativeConfig | None = None,
    policy: SchedulingPolicy = "fcfs",
    max_loras: int | None = None,
    max_batches_in_flight: int = 1,
) -> Scheduler:
    """A scheduler over a fresh KV-cache manager (and a swap space of `num_host_blocks`, if any)."""
    config = SchedulerConfig(
        max_num_seqs, max_num_batched_tokens, max_model_len, preemption_mode, policy, max_loras=max_loras
    )
    return Scheduler(
        config,
        KVCacheManager(num_blocks, KVCacheGroups.uniform(block_size), enable_caching, num_host_blocks),
        admission=admission,
        speculative=speculative,
        max_batches_in_flight=max_batches_in_flight,
    )
