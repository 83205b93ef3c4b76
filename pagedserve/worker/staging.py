"""One host-to-device copy per step: every host array a step's batch needs (token ids, positions, slot
mappings, block tables, sampling settings) is packed into one staging buffer, copied once, and handed out
as typed views of the device copy. On CUDA the buffer is pinned (the copy runs asynchronously). On CPU
the arrays are wrapped as they are (no copy at all); tests pack on CPU too, through the same code."""

import numpy as np
import torch

# NOTE: every array starts at a multiple of 8 bytes, so any dtype's view of the device buffer is aligned.
_ALIGN = 8


class StepStaging:
    """Packs named numpy arrays into one buffer and copies it to `device` in one transfer."""

    def __init__(self, device: torch.device, pack: bool | None = None) -> None:
        """`pack`: pack and copy (default: unless the device is the CPU, where the arrays are already
        where the model reads them and wrapping each costs less than viewing a packed buffer)."""
        self.device = device
        self.pack = device.type != "cpu" if pack is None else pack
        self.pinned = device.type == "cuda"
        self._host = torch.empty(0, dtype=torch.uint8, pin_memory=self.pinned)
        # The previous step's transfer: its pinned buffer is reused only after the copy finished.
        self._copied: torch.cuda.Event | None = None

    def to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The arrays on the device, same names, shapes and dtypes (after one copy)."""
        if not self.pack:
            return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in arrays.items()}
        offsets, end = {}, 0
        for name, array in arrays.items():
            offsets[name] = end
            end += -(-array.nbytes // _ALIGN) * _ALIGN
        host = self._buffer(end)
        view = host.numpy()
        for name, array in arrays.items():
            start = offsets[name]
            view[start : start + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        device_buffer = host.to(self.device, non_blocking=self.pinned)
        if self.pinned:
            self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._copied.record()
        return {
            name: device_buffer[offsets[name] : offsets[name] + array.nbytes]
            .view(_TORCH_DTYPE[array.dtype.str])
            .view(array.shape)
            for name, array in arrays.items()
        }

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """A host buffer of at least `nbytes`. On CPU a fresh one each step: the device views alias it, and
        a step's tensors must not change under whoever still holds them."""
        if not self.pinned:
            return torch.empty(nbytes, dtype=torch.uint8)
        if self._copied is not None:
            self._copied.synchronize()
        if self._host.numel() < nbytes:
            self._host = torch.empty(max(nbytes, 2 * self._host.numel()), dtype=torch.uint8, pin_memory=True)
        return self._host[:nbytes]


_TORCH_DTYPE = {
    np.dtype(np.int64).str: torch.int64,
    np.dtype(np.int32).str: torch.int32,
    np.dtype(np.float32).str: torch.float32,
    np.dtype(np.bool_).str: torch.bool,
}
