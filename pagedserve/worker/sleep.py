"""Sleep (vLLM's POST /sleep) on a worker's side: where the weights go while asleep, and handing the freed
memory back to the OS so that the process's RSS shows it.

Level 1 parks the loaded weights (as loaded: quantized, repacked, sharded) in a temporary file and frees
their storages; waking copies them back, so no checkpoint is read, converted or repacked again. While
asleep the file's pages are the page cache's (shared, written back and reclaimable under pressure), not
the process's private memory: vLLM's level 1 keeps a host copy of the GPU weights, and on CPU the host
copy is what is freed. Level 2 keeps nothing: the runner goes, the checkpoint's cached pages are dropped,
and waking loads the checkpoint again."""

import ctypes
import gc
import os
import tempfile

import torch
from torch import nn

from pagedserve.config import ModelConfig
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def checkpoint_files(config: ModelConfig) -> list[str]:
    """The files the weights load from (none for dummy weights or a hub id resolved elsewhere)."""
    if config.load_format == "dummy":
        return []
    if config.gguf_file is not None:  # with --mmproj's vision tower beside it
        return [config.gguf_file, *([config.mmproj_file] if config.mmproj_file else [])]
    if not os.path.isdir(config.model):
        return []
    return sorted(
        os.path.join(config.model, name)
        for name in os.listdir(config.model)
        if name.endswith(_WEIGHT_SUFFIXES)
    )


class ParkedWeights:
    """Level 1: the storage under every parameter and buffer of `modules` saved to a temporary file and
    resized to nothing, then back: every view of it (tied weights, a quantized layer's packed parts) keeps
    its place and sees the same bytes again."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self._storages = _storages(modules)
        handle, self._path = tempfile.mkstemp(prefix="pagedserve-asleep-", suffix=".pt")
        os.close(handle)
        try:
            torch.save([_bytes_of(storage).cpu() for storage in self._storages], self._path)
        except BaseException:  # e.g. the disk is full: nothing is freed, the worker stays awake
            os.unlink(self._path)
            raise
        for storage in self._storages:
            storage.resize_(0)

    def restore(self) -> None:
        """Copy the weights back into their storages and remove the file."""
        saved = torch.load(self._path, map_location="cpu", mmap=True, weights_only=True)
        for storage, data in zip(self._storages, saved, strict=True):
            storage.resize_(data.numel())
            _bytes_of(storage).copy_(data)
        os.unlink(self._path)


def _storages(modules: list[nn.Module]) -> list[torch.UntypedStorage]:
    """Each distinct, non-empty storage under the modules' parameters and buffers."""
    found: dict[int, torch.UntypedStorage] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            storage = tensor.untyped_storage()
            if storage.nbytes():
                found.setdefault(storage.data_ptr(), storage)
    return list(found.values())


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def drop_cached_pages(files: list[str]) -> None:
    """Level 2: ask the kernel to drop the checkpoint's cached pages (advice: pages in use elsewhere stay)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def release_freed_memory(device: torch.device) -> None:
    """Return what the dropped tensors held: the CUDA caching allocator's blocks, and on CPU the heap's
    free pages (glibc keeps them otherwise, and the RSS would not fall)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        logger.debug("malloc_trim is unavailable; freed heap pages stay with the process.")
