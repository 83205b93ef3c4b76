"""How many NVIDIA GPUs this process may use, found without torch: importing torch costs the API server
~0.3 GB and seconds, and configuration resolution only needs the count (the engine process, which
imports torch anyway, then opens the devices). The NVIDIA driver lists each GPU under
/proc/driver/nvidia/gpus (containers get it from the NVIDIA runtime with the /dev/nvidiaN nodes, the
fallback); CUDA_VISIBLE_DEVICES then narrows them as the CUDA runtime does."""

import os
import re

_DRIVER_GPUS = "/proc/driver/nvidia/gpus"
_DEVICE_NODE = re.compile(r"nvidia\d+")


def visible_gpu_count() -> int:
    """The GPUs CUDA would show this process (torch.cuda.device_count()'s answer on a working driver)."""
    installed = _installed_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if installed == 0 or visible is None:
        return installed
    return _count_visible(visible, installed)


def _installed_gpus() -> int:
    try:
        return len(os.listdir(_DRIVER_GPUS))
    except OSError:
        pass
    try:
        return sum(1 for name in os.listdir("/dev") if _DEVICE_NODE.fullmatch(name))
    except OSError:
        return 0


def _count_visible(visible: str, installed: int) -> int:
    """CUDA's reading of CUDA_VISIBLE_DEVICES: comma-separated indices or GPU-/MIG- UUIDs, read up to the
    first invalid entry ("" and "-1" hide every GPU); an index names one GPU once."""
    seen: set[str] = set()
    for entry in (part.strip() for part in visible.split(",")):
        if entry.startswith(("GPU-", "MIG-")):
            key = entry
        elif entry.isdigit() and int(entry) < installed:
            key = str(int(entry))
        else:
            break
        if key in seen:
            break
        seen.add(key)
    return len(seen)
