"""A request's LoRA adapter, checked before it reaches the engine: LoRA enabled, and the adapter's files
readable and fitting the base model and --max-lora-rank (each adapter id read once, then remembered with
its files' digest, which every request of it carries to the workers)."""

from collections import OrderedDict
from typing import TYPE_CHECKING

import msgspec

from pagedserve.config.lora import LoRAConfig
from pagedserve.errors import InvalidRequestError
from pagedserve.lora.shapes import ModelShapes
from pagedserve.protocol import LoRARequest

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from pagedserve.lora.peft import LoRAAdapter

_REMEMBERED = 4096  # adapter (id, path) pairs known good, with their digest; older ones are read again


class LoRAValidator:
    def __init__(self, config: LoRAConfig | None, hf_config: "PretrainedConfig") -> None:
        self.config = config
        self.shapes = ModelShapes.of(hf_config) if config is not None else None
        self._digests: OrderedDict[tuple[int, str], str] = OrderedDict()

    def check(self, request: object) -> LoRARequest | None:
        """The request's adapter with its files' digest set (`files_digest`: of the files read at this
        (id, path)'s first use). Raises InvalidRequestError (param lora_request or lora_path) naming what is
        wrong: a request that carries a digest (the server's adapters: read when loaded) whose files no
        longer match it is refused."""
        if request is None:
            return None
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
        digest = self._digests.get(key)
        if digest is None:
            digest = self._digests[key] = self.load(request.lora_path).digest
            if len(self._digests) > _REMEMBERED:
                self._digests.popitem(last=False)
        self._digests.move_to_end(key)
        if request.files_digest and request.files_digest != digest:
            from pagedserve.lora.peft import changed_files_error  # NOTE: lazy, as in load()

            raise changed_files_error(request.lora_path, request.files_digest, digest)
        return msgspec.structs.replace(request, files_digest=digest)

    def load(self, path: str) -> "LoRAAdapter":
        """Read and check the adapter at `path` (for a server registering it). Raises InvalidRequestError."""
        from pagedserve.lora.peft import load_adapter  # NOTE: lazy: it reads tensors with torch

        assert self.config is not None and self.shapes is not None, "LoRA is enabled"
        return load_adapter(path, self.shapes, self.config.max_lora_rank)
