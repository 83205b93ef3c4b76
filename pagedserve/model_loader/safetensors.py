"""Checkpoint tensors of a HF folder: `*.safetensors`, sharded (with an index) or not.

Each tensor comes as a `CheckpointTensor` that reads only the bytes asked for: a tensor-parallel rank
narrows it to its shard and reads that slice alone (safetensors' layout, header then row-major data, read
with pread: unlike safetensors' own mmap-based `get_slice`, the other ranks' bytes never enter this
process's memory).
"""

import glob
import json
import math
import os
import struct
from collections.abc import Callable, Collection, Iterator

import torch

from pagedserve.errors import ConfigError

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "F8_E4M3": torch.float8_e4m3fn,  # fp8 checkpoints (quantization/fp8.py)
    "F8_E5M2": torch.float8_e5m2,
    "BOOL": torch.bool,
}


class CheckpointTensor:
    """One tensor of an open safetensors file, read on demand. `narrow` reads only its slice; any torch
    function given this object (e.g. `param.data.copy_(tensor)`) reads it whole. Valid while its file
    is open (until the iterator moves to the next file)."""

    def __init__(
        self,
        fd: int,
        offset: int,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        target_dtype: torch.dtype | None = None,
    ) -> None:
        self.fd, self.offset, self.dtype, self.shape = fd, offset, dtype, torch.Size(shape)
        self.target_dtype = target_dtype or dtype

    def to(self, dtype: torch.dtype) -> "CheckpointTensor":
        """The same tensor, converted to `dtype` when read."""
        return CheckpointTensor(self.fd, self.offset, self.dtype, tuple(self.shape), dtype)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Read the slice [start, start + length) of dimension `dim` (and nothing else)."""
        if not 0 <= start <= start + length <= self.shape[dim]:
            raise IndexError(
                f"Slice [{start}, {start + length}) of dimension {dim} out of {tuple(self.shape)}."
            )
        out = torch.empty((*self.shape[:dim], length, *self.shape[dim + 1 :]), dtype=self.dtype)
        item = out.element_size()
        inner = math.prod(self.shape[dim + 1 :]) * item  # bytes of one index of `dim`
        chunk = out.view(torch.uint8).reshape(math.prod(self.shape[:dim]), length * inner)
        for outer, row in enumerate(chunk):  # one contiguous run per index of the outer dimensions
            _pread_into(self.fd, row, self.offset + (outer * self.shape[dim] + start) * inner)
        return out.to(self.target_dtype)

    def read(self) -> torch.Tensor:
        """The whole tensor."""
        if not self.shape:  # a scalar: read as one element
            return (
                CheckpointTensor(self.fd, self.offset, self.dtype, (1,), self.target_dtype).read().reshape(())
            )
        return self.narrow(0, 0, self.shape[0])

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., object],
        types: Collection[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        def read(value: object) -> object:
            return value.read() if isinstance(value, CheckpointTensor) else value

        return func(*map(read, args), **{key: read(value) for key, value in (kwargs or {}).items()})


def iterate_safetensors(folder: str) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield (name, tensor) one at a time; each is read (in part) only when used."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(folder, name) for name in files]
    else:
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ConfigError(f"No *.safetensors files in {folder}: pagedserve loads safetensors or GGUF.")
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            yield from _tensors(path, fd)
        finally:
            os.close(fd)


def _tensors(path: str, fd: int) -> Iterator[tuple[str, CheckpointTensor]]:
    """The file's tensors per its header: 8 bytes of header length, the JSON header, then the data."""
    (header_len,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    header = json.loads(os.pread(fd, header_len, 8))
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _DTYPES:
            raise ConfigError(
                f"{path}: tensor {name} has dtype {entry['dtype']}, which pagedserve cannot "
                f"load (supported: {', '.join(_DTYPES)})."
            )
        yield (
            name,
            CheckpointTensor(
                fd, 8 + header_len + entry["data_offsets"][0], _DTYPES[entry["dtype"]], tuple(entry["shape"])
            ),
        )


def _pread_into(fd: int, buffer: torch.Tensor, offset: int) -> None:
    """Fill the uint8 tensor `buffer` from the file at `offset` (pread may return less than asked)."""
    view = buffer.numpy().data.cast("B")
    done = 0
    while done < len(view):
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            raise ConfigError(f"The checkpoint file ends early (at byte {offset + done}): it is truncated.")
        done += count
