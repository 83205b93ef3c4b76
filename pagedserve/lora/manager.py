"""A worker's adapters: up to --max-loras in the slots beside every linear layer (those of the step's
requests), up to --max-cpu-loras read into host memory (least recently used evicted), the rest on disk.
Each is keyed by its identity (id and files' digest). The files are input like any other: an adapter that
cannot be read again, or whose files changed since the frontend read them, fails its own requests (the
step runs their tokens on the base model and reports them failed); nothing else notices."""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from pagedserve.config.lora import LoRAConfig
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedserve.logger import init_logger
from pagedserve.lora.linear import LinearLoRA, LoRABatch
from pagedserve.lora.peft import LoRAAdapter, changed_files_error, load_adapter
from pagedserve.lora.shapes import MODULE_PARENT, TARGET_MODULES, ModelShapes
from pagedserve.protocol import LoRARequest

logger = init_logger(__name__)


class LoRAManager:
    """Attaches a LinearLoRA to every linear layer of `model` and, each step, puts the step's adapters in
    slots and tells the layers which slot each token uses. `layers`: the decoder layers `model` holds (a
    pipeline stage's): their modules alone are targets, and an adapter keeps only theirs in host memory."""

    def __init__(
        self,
        model: nn.Module,
        config: LoRAConfig,
        device: torch.device,
        dtype: torch.dtype,
        layers: range,
    ) -> None:
        self.config = config
        self.device = device
        self.shapes = ModelShapes.of(model.config)  # type: ignore[arg-type]
        self.batch = LoRABatch()
        self.layers: dict[str, LinearLoRA] = {}
        for name, module in model.named_modules():
            if isinstance(module, ColumnParallelLinear | RowParallelLinear):
                module.lora = self.layers[name] = LinearLoRA(
                    module, config.max_loras, config.max_lora_rank, self.batch, device, dtype
                )
        # HF module name -> (our layer, its shard id), for every module an adapter may target.
        self.targets: dict[str, tuple[LinearLoRA, object]] = {}
        for index in layers:
            for kind in TARGET_MODULES:
                module = f"model.layers.{index}.{MODULE_PARENT.get(kind, 'mlp')}.{kind}"
                self.targets[module] = self._target(model, module)
        self.slot_adapter: list[bytes | None] = [None] * config.max_loras  # adapter identity in each slot
        self.slot_last_used = [0] * config.max_loras
        self.host: OrderedDict[bytes, LoRAAdapter] = OrderedDict()
        self.step = 0

    def _target(self, model: nn.Module, module: str) -> tuple[LinearLoRA, object]:
        """The layer (and shard) holding HF `module`'s weight, as the model's checkpoint loader says."""
        mapped = next(model.checkpoint_tensors(f"{module}.weight", torch.empty(0)), None)  # type: ignore[operator]
        name, _, shard_id = mapped or ("", None, None)
        layer = self.layers.get(name.removesuffix(".weight"))
        if layer is None or shard_id not in layer.layer.shard_ids:
            raise ConfigError(
                f"--enable-lora: {type(model).__name__} has no linear layer for {module}; LoRA serves "
                "Llama-style models (q/k/v/o and gate/up/down projections) only."
            )
        return layer, shard_id

    @property
    def num_bytes(self) -> int:
        """Device memory of the slots."""
        return sum(layer.num_bytes for layer in self.layers.values())

    def set_batch(
        self, request_ids: Sequence[str], adapters: Sequence[LoRARequest | None], num_tokens: Sequence[int]
    ) -> dict[str, str]:
        """The step's rows (their request, adapter and token count, in batch order): load each adapter into
        a slot and map every token to it. The scheduler never runs more than --max-loras adapters at once.
        Returns the requests whose adapter could not be loaded, with why (their tokens take the base
        model: the caller fails them)."""
        self.step += 1
        if all(adapter is None for adapter in adapters):
            self.batch.token_slots = None
            return {}
        needed = {a.identity for a in adapters if a is not None}
        slot_of: dict[bytes, int] = {}
        errors: dict[bytes, str] = {}
        for adapter in adapters:
            if adapter is not None and adapter.identity not in slot_of and adapter.identity not in errors:
                try:
                    slot_of[adapter.identity] = self._slot(adapter, needed)
                except InvalidRequestError as exc:
                    errors[adapter.identity] = str(exc)
                    logger.error("LoRA adapter %s (id %d): %s", adapter.lora_name, adapter.lora_int_id, exc)
        row_slots = np.array(
            [-1 if a is None else slot_of.get(a.identity, -1) for a in adapters], dtype=np.int64
        )
        token_slots = np.repeat(row_slots, np.asarray(num_tokens, dtype=np.int64))
        self.batch.token_slots = torch.from_numpy(token_slots).to(self.device)
        return {
            request_id: errors[adapter.identity]
            for request_id, adapter in zip(request_ids, adapters)
            if adapter is not None and adapter.identity in errors
        }

    def _slot(self, request: LoRARequest, needed: set[bytes]) -> int:
        if request.identity in self.slot_adapter:
            slot = self.slot_adapter.index(request.identity)
        else:
            # NOTE: an empty slot, else the least recently used one no row of this step needs.
            free = [s for s, held in enumerate(self.slot_adapter) if held is None or held not in needed]
            assert free, f"a step with more than --max-loras {self.config.max_loras} adapters"
            slot = min(free, key=lambda s: (self.slot_adapter[s] is not None, self.slot_last_used[s]))
            self._write_slot(slot, self._adapter(request))
            self.slot_adapter[slot] = request.identity
        self.slot_last_used[slot] = self.step
        return slot

    def _adapter(self, request: LoRARequest) -> LoRAAdapter:
        """From host memory, else read from disk (and kept, evicting the least recently used). Raises
        InvalidRequestError when the files cannot be read or are not those the frontend read."""
        adapter = self.host.pop(request.identity, None)
        if adapter is None:
            adapter = load_adapter(request.lora_path, self.shapes, self.config.max_lora_rank)
            if request.files_digest and adapter.digest != request.files_digest:
                raise changed_files_error(request.lora_path, request.files_digest, adapter.digest)
            # NOTE: checked whole (every rank refuses the same files), kept for this stage's layers only.
            ours = {module: w for module, w in adapter.modules.items() if module in self.targets}
            adapter = replace(adapter, modules=ours)
            logger.info(
                "LoRA adapter %s (id %d) read from %s.",
                request.lora_name,
                request.lora_int_id,
                request.lora_path,
            )
        self.host[request.identity] = adapter
        while len(self.host) > self.config.num_cpu_loras:
            self.host.popitem(last=False)
        return adapter

    def _write_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for layer in self.layers.values():
            layer.clear(slot)
        for module, weights in adapter.modules.items():
            layer, shard_id = self.targets[module]
            layer.write(slot, shard_id, weights)
