"""The scheduler's limits: requests and tokens per step, and what preemption does."""

from dataclasses import dataclass
from typing import Literal, get_args

from pagedserve.errors import ConfigError

PreemptionMode = Literal["recompute", "swap"]
PREEMPTION_MODES: tuple[str, ...] = get_args(PreemptionMode)
SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[str, ...] = get_args(SchedulingPolicy)


def default_max_num_batched_tokens(max_num_seqs: int, max_model_len: int = 0, pooling: bool = False) -> int:
    """The step's token budget when --max-num-batched-tokens is not given (a pooling runner's step holds
    a whole prompt: it keeps no KV cache to chunk it over)."""
    return max(2048, max_num_seqs, max_model_len if pooling else 0)


@dataclass(frozen=True)
class SchedulerConfig:
    """Validated scheduler settings. Raises ConfigError naming the flag to change."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    preemption_mode: PreemptionMode | None = None  # None: swap groups that share blocks, recompute others
    policy: SchedulingPolicy = "fcfs"
    pooling: bool = False  # --runner pooling: every prompt is computed in one step
    max_loras: int | None = None  # --enable-lora: the most adapters running at once (--max-loras)
    # An image model whose image tokens attend each other both ways (Gemma 3): one image's tokens, which a
    # step schedules whole (a chunk never ends inside an image); None: chunks may cut through images.
    whole_image_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs={self.max_num_seqs} must be at least 1 (--max-num-seqs).")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be at least 1 "
                "(--max-num-batched-tokens)."
            )
        if self.max_model_len < 1:
            raise ConfigError(f"max_model_len={self.max_model_len} must be at least 1 (--max-model-len).")
        if self.pooling and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"--runner pooling computes each prompt in one step: --max-num-batched-tokens "
                f"({self.max_num_batched_tokens}) must be at least --max-model-len ({self.max_model_len})."
            )
        if self.whole_image_tokens is not None and self.max_num_batched_tokens < self.whole_image_tokens:
            raise ConfigError(
                f"this model's images attend within themselves and are computed in one step: "
                f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be at least one image's "
                f"{self.whole_image_tokens} tokens."
            )
        if self.preemption_mode not in (None, *PREEMPTION_MODES):
            raise ConfigError(
                f"preemption_mode={self.preemption_mode!r} is not supported; "
                f"--preemption-mode must be one of {', '.join(PREEMPTION_MODES)}."
            )
        if self.policy not in SCHEDULING_POLICIES:
            raise ConfigError(
                f"policy={self.policy!r} is not supported; --scheduling-policy must be one of "
                f"{', '.join(SCHEDULING_POLICIES)}."
            )
