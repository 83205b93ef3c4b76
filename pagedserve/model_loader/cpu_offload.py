"""--cpu-offload-gb: whole decoder layers, from the last, keep their weights in (pinned) host memory; before
each of them runs, its bytes are copied into one of two device buffers on a side stream, one layer ahead,
so the copy of layer i + 1 overlaps the compute of layer i.

Each offloaded layer's parameters are fixed views into its buffer (layers alternate between the two), so
their device addresses never change: a CUDA graph captured over the forward records the copies (issued
by the layers' pre-hooks, fork/join on events) and replays them, so CUDA graphs stay on. A layer's bytes are
one flat host tensor, one copy per layer. Quantized layers move their packed bytes (their quantization
method's views of `qweight` are rebased onto the buffer).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.sizing import CPUOffload, choose_offloaded_layers
from pagedserve.utils import format_bytes

logger = init_logger(__name__)

_ALIGNMENT = 256  # bytes: every parameter starts aligned in the flat buffers (any dtype's view is valid)


class LayerCopier:
    """The copy engine: host bytes into a device buffer on a side stream, waited for on the compute stream
    (on CPU, as in the tests, a plain copy). `log` records ("copy" | "run", layer) in issue order."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]
        self.log: list[tuple[str, int]] = []

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> torch.cuda.Event | None:
        if self.stream is None:
            destination.copy_(source)
            return None
        # NOTE: the buffer's previous layer (two back) must have finished reading it.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            destination.copy_(source, non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        return done

    def wait(self, done: torch.cuda.Event | None) -> None:
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)


@dataclass
class _OffloadedLayer:
    host: torch.Tensor  # uint8, the layer's parameters back to back (pinned on CUDA)
    buffer: torch.Tensor  # uint8 view of the device buffer it runs from
    pending: torch.cuda.Event | None = None
    issued: bool = False


@dataclass
class CPUOffloader:
    """The offloaded layers of one model and their prefetch hooks (kept as `model.cpu_offloader`)."""

    plan: CPUOffload
    copier: LayerCopier
    layers: dict[int, _OffloadedLayer] = field(default_factory=dict)  # by position among the decoder layers
    parameter_bytes: int = 0  # the offloaded parameters' own bytes (the plan's are aligned)

    def prefetch(self, position: int) -> None:
        layer = self.layers.get(position)
        if layer is not None and not layer.issued:
            self.copier.log.append(("copy", position))
            layer.pending, layer.issued = self.copier.copy(layer.buffer, layer.host), True

    def before_layer(self, position: int) -> None:
        """Layer `position` is about to run: its weights in place (copied now if not yet), and the next
        offloaded layer's copy started."""
        self.prefetch(position)
        self.prefetch(position + 1)
        layer = self.layers.get(position)
        if layer is not None:
            self.copier.wait(layer.pending)
            layer.pending, layer.issued = None, False
        self.copier.log.append(("run", position))


def offload_layers(model: nn.Module, offload_gb: float, device: torch.device) -> CPUOffloader | None:
    """Move the last decoder layers' weights (at least `offload_gb` GiB) to host memory and install the
    prefetch hooks. Raises ConfigError (naming --cpu-offload-gb) when the layers hold less than that."""
    if offload_gb <= 0:
        return None
    decoder_layers = _decoder_layers(model)
    sizes = [_layer_bytes(layer) for layer in decoder_layers]
    plan = choose_offloaded_layers(sizes, offload_gb)
    buffer_size = max(sizes[position] for position in plan.layers)
    buffers = [
        torch.empty(buffer_size, dtype=torch.uint8, device=device) for _ in range(min(2, len(plan.layers)))
    ]
    offloader = CPUOffloader(plan, LayerCopier(device))
    for slot, position in enumerate(plan.layers):
        buffer = buffers[slot % len(buffers)][: sizes[position]]
        offloader.layers[position] = _move_to_host(decoder_layers[position], buffer, device)
        offloader.parameter_bytes += sum(
            p.numel() * p.element_size() for p, _ in _offsets(decoder_layers[position])
        )
    for position, layer in enumerate(decoder_layers):
        layer.register_forward_pre_hook(
            lambda module, args, position=position: offloader.before_layer(position)
        )
    logger.info(
        "CPU offload (--cpu-offload-gb %s): decoder layers %s in %s memory, %s; the device holds %s of buffers "
        "for them (two layers, filled one layer ahead); CUDA graphs stay on (they replay the copies).",
        offload_gb,
        _ranges(plan.layers),
        "pinned host" if device.type == "cuda" else "host",
        format_bytes(plan.host_bytes),
        format_bytes(plan.buffer_bytes),
    )
    return offloader


def host_resident_bytes(model: nn.Module) -> int:
    """What --cpu-offload-gb moved off the device, less the device buffers it runs from: to subtract from
    the parameters' bytes (the offloaded parameters are views into those buffers)."""
    offloader = getattr(model, "cpu_offloader", None)
    return 0 if offloader is None else offloader.parameter_bytes - offloader.plan.buffer_bytes


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers this rank computes (every family's trunk is `model.layers`)."""
    trunk = getattr(model, "model", None)
    layers = getattr(trunk, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"--cpu-offload-gb moves decoder layers, which {type(model).__name__} does not have; drop --cpu-offload-gb."
        )
    return [layer for layer in layers if any(True for _ in layer.parameters())]


def _offsets(layer: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """Each parameter of `layer` (once, even if shared) and its aligned byte offset in the flat layout."""
    placed, offset, seen = [], 0, set()
    for param in layer.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        placed.append((param, offset))
        offset += -(-param.numel() * param.element_size() // _ALIGNMENT) * _ALIGNMENT
    return placed


def _layer_bytes(layer: nn.Module) -> int:
    placed = _offsets(layer)
    if not placed:
        return 0
    param, offset = placed[-1]
    return offset + param.numel() * param.element_size()


def _move_to_host(layer: nn.Module, buffer: torch.Tensor, device: torch.device) -> _OffloadedLayer:
    """The layer's bytes into one host tensor; its parameters become views of `buffer` (same layout)."""
    host = torch.empty(buffer.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
    for param, offset in _offsets(layer):
        nbytes = param.numel() * param.element_size()
        old = param.data
        host[offset : offset + nbytes].copy_(old.contiguous().view(-1).view(torch.uint8))
        param.data = _view(buffer, offset, old)
        _rebase_quantized_views(layer, old, param.data)
    return _OffloadedLayer(host, buffer)


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    nbytes = like.numel() * like.element_size()
    return buffer[offset : offset + nbytes].view(like.dtype).view(like.shape)


def _rebase_quantized_views(layer: nn.Module, old: torch.Tensor, new: torch.Tensor) -> None:
    """Quantization methods keep `parts` whose rows are views of their layer's `qweight` (GGUF, online
    int8/int4): point them at the same bytes of the new storage."""
    for module in layer.modules():
        method = getattr(module, "quant_method", None)
        qweight = getattr(module, "qweight", None)
        if not getattr(method, "parts", None) or qweight is None or qweight.data_ptr() != new.data_ptr():
            continue
        shift = new.storage_offset() - old.storage_offset()
        method.parts = [  # type: ignore[union-attr]
            replace(
                part,
                rows=new.as_strided(part.rows.shape, part.rows.stride(), part.rows.storage_offset() + shift),
            )
            for part in method.parts  # type: ignore[union-attr]
        ]


def _ranges(positions: Sequence[int]) -> str:
    return f"{positions[0]}-{positions[-1]}" if len(positions) > 1 else str(positions[0])
