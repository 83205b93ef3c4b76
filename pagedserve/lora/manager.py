"""A worker's adapters: up to --max-loras in the slots beside every linear layer (those of the step's
requests), up to --max-cpu-loras read into host memory (least recently used evicted), the rest on disk."""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from pagedserve.config.lora import LoRAConfig
from pagedserve.errors import ConfigError
from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedserve.logger import init_logger
from pagedserve.lora.linear import LinearLoRA, LoRABatch
from pagedserve.lora.peft import LoRAAdapter, load_adapter
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
        self.slot_adapter: list[int | None] = [None] * config.max_loras  # adapter id in each slot
        self.slot_last_used = [0] * config.max_loras
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()
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

    def set_batch(self, adapters: Sequence[LoRARequest | None], num_tokens: Sequence[int]) -> None:
        """The step's rows (their adapter, their token count, in batch order): load each adapter into a
        slot and map every token to it. The scheduler never runs more than --max-loras adapters at once."""
        self.step += 1
        if all(adapter is None for adapter in adapters):
            self.batch.token_slots = None
            return
        needed = {a.lora_int_id for a in adapters if a is not None}
        slot_of = {a.lora_int_id: self._slot(a, needed) for a in adapters if a is not None}
        row_slots = np.array([-1 if a is None else slot_of[a.lora_int_id] for a in adapters], dtype=np.int64)
        token_slots = np.repeat(row_slots, np.asarray(num_tokens, dtype=np.int64))
        self.batch.token_slots = torch.from_numpy(token_slots).to(self.device)

    def _slot(self, request: LoRARequest, needed: set[int]) -> int:
        if request.lora_int_id in self.slot_adapter:
            slot = self.slot_adapter.index(request.lora_int_id)
        else:
            # NOTE: an empty slot, else the least recently used one no row of this step needs.
            free = [s for s, held in enumerate(self.slot_adapter) if held is None or held not in needed]
            assert free, f"a step with more than --max-loras {self.config.max_loras} adapters"
            slot = min(free, key=lambda s: (self.slot_adapter[s] is not None, self.slot_last_used[s]))
            self._write_slot(slot, self._adapter(request))
            self.slot_adapter[slot] = request.lora_int_id
        self.slot_last_used[slot] = self.step
        return slot

    def _adapter(self, request: LoRARequest) -> LoRAAdapter:
        """From host memory, else read from disk (and kept, evicting the least recently used)."""
        adapter = self.host.pop(request.lora_int_id, None)
        if adapter is None:
            adapter = load_adapter(request.lora_path, self.shapes, self.config.max_lora_rank)
            # NOTE: checked whole (every rank refuses the same files), kept for this stage's layers only.
            ours = {module: w for module, w in adapter.modules.items() if module in self.targets}
            adapter = replace(adapter, modules=ours)
            logger.info(
                "LoRA adapter %s (id %d) read from %s.",
                request.lora_name,
                request.lora_int_id,
                request.lora_path,
            )
        self.host[request.lora_int_id] = adapter
        while len(self.host) > self.config.num_cpu_loras:
            self.host.popitem(last=False)
        return adapter

    def _write_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for layer in self.layers.values():
            layer.clear(slot)
        for module, weights in adapter.modules.items():
            layer, shard_id = self.targets[module]
            layer.write(slot, shard_id, weights)
