"""Sleep (vLLM's POST /sleep) on a worker's side: what stays of the checkpoint while the weights and the KV
cache are freed, and handing the freed memory back to the OS so that the process's RSS shows it.

Level 1 keeps the checkpoint files mapped and asks the kernel to keep their pages cached, so waking reads
the weights from memory rather than disk; those pages are the page cache's (shared and reclaimable under
pressure), not this process's private memory. Level 2 drops them too: waking reads from disk."""

import ctypes
import gc
import mmap
import os

import torch

from pagedserve.config import ModelConfig
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def checkpoint_files(config: ModelConfig) -> list[str]:
    """The files the weights load from (none for dummy weights or a hub id resolved elsewhere)."""
    if config.load_format == "dummy":
        return []
    if config.gguf_file is not None:
        return [config.gguf_file]
    if not os.path.isdir(config.model):
        return []
    return sorted(
        os.path.join(config.model, name)
        for name in os.listdir(config.model)
        if name.endswith(_WEIGHT_SUFFIXES)
    )


class MappedCheckpoint:
    """Level 1: the checkpoint's files mapped read-only, their pages asked to stay cached."""

    def __init__(self, files: list[str]) -> None:
        self._maps: list[mmap.mmap] = []
        for path in files:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_size == 0:
                    continue
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            mapping.madvise(mmap.MADV_WILLNEED)
            self._maps.append(mapping)

    def close(self) -> None:
        for mapping in self._maps:
            mapping.close()
        self._maps = []


def drop_cached_pages(files: list[str]) -> None:
    """Level 2: ask the kernel to drop the files' cached pages (advice: pages other processes use stay)."""
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
