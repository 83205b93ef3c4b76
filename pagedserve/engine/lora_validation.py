"""A request's LoRA adapter, checked before it reaches the engine: LoRA enabled, and the adapter's files
readable and fitting the base model and --max-lora-rank (each adapter id read once, then remembered)."""

from collections import OrderedDict
from typing import TYPE_CHECKING

from pagedserve.config.lora import LoRAConfig
from pagedserve.errors import InvalidRequestError
from pagedserve.lora.peft import LoRAAdapter, load_adapter
from pagedserve.lora.shapes import ModelShapes
from pagedserve.protocol import LoRARequest

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_REMEMBERED = 4096  # adapter (id, path) pairs known good; older ones are read again when used


class LoRAValidator:
    def __init__(self, config: LoRAConfig | None, hf_config: "PretrainedConfig") -> None:
        self.config = config
        self.shapes = ModelShapes.of(hf_config) if config is not None else None
        self._checked: OrderedDict[tuple[int, str], None] = OrderedDict()

    def check(self, request: object) -> None:
        """Raises InvalidRequestError (param lora_request) naming what is wrong."""
        if request is None:
            return
        if not isinstance(request, LoRARequest):
            raise InvalidRequestError(
                f"lora_request must be a LoRARequest, got {type(request).__name__}.", param="lora_request"
            )
        if self.config is None:
            raise InvalidRequestError(
                f"LoRA adapter {request.lora_name!r} was asked for, but LoRA is off: start the engine with "
                "--enable-lora (enable_lora=True offline).",
                param="lora_request",
            )
        key = (request.lora_int_id, request.lora_path)
        if key in self._checked:
            self._checked.move_to_end(key)
            return
        self.load(request.lora_path)
        self._checked[key] = None
        if len(self._checked) > _REMEMBERED:
            self._checked.popitem(last=False)

    def load(self, path: str) -> LoRAAdapter:
        """Read and check the adapter at `path` (for a server registering it). Raises InvalidRequestError."""
        assert self.config is not None and self.shapes is not None, "LoRA is enabled"
        return load_adapter(path, self.shapes, self.config.max_lora_rank)
