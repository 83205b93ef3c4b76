"""EngineArgs' flags that vLLM has and that change nothing here: accepted, so that vLLM command lines run
as written, with a warning where a value asks for what pagedserve does not do."""

from dataclasses import dataclass

from pagedserve.config.cli import config_field
from pagedserve.logger import init_logger

logger = init_logger(__name__)


# NOTE: keyword-only, so that in EngineArgs' __init__ they come after its own fields: EngineArgs("model")
# still names the model.
@dataclass(kw_only=True)
class VllmCompatArgs:
    """The vLLM-only part of EngineArgs (one of its base classes: the flags are one flat set)."""

    enable_chunked_prefill: bool | None = config_field(
        None,
        "Accepted for vLLM: chunked prefill is always on here (a prompt longer than "
        "--max-num-batched-tokens is split across steps); --no-enable-chunked-prefill only warns.",
    )
    trust_remote_code: bool = config_field(
        False, "Accepted for vLLM: pagedserve never runs a model's own Python code (a warning says so)."
    )

    def warn_vllm_only_settings(self) -> None:
        """Warn about vLLM's settings that change nothing here."""
        if self.trust_remote_code:
            logger.warning(
                "trust_remote_code (--trust-remote-code) is accepted but has no effect: pagedserve never "
                "runs a model's own Python code; its architecture must be one pagedserve implements."
            )
        if self.enable_chunked_prefill is False:
            logger.warning(
                "--no-enable-chunked-prefill has no effect: chunked prefill is always on here (prompts "
                "longer than --max-num-batched-tokens are split across steps)."
            )
