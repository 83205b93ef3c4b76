"""The device kinds the engine runs on (CPU, CUDA): see interface.Platform for what they decide."""

from pagedserve.platforms.interface import Platform


def get_platform(device: str) -> Platform:
    """The Platform of a resolved --device (cpu | cuda)."""
    if device == "cuda":
        from pagedserve.platforms.cuda import CudaPlatform

        return CudaPlatform()
    from pagedserve.platforms.cpu import CpuPlatform

    return CpuPlatform()


__all__ = ["Platform", "get_platform"]
