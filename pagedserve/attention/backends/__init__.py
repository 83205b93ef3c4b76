"""Backend registry. Backends are imported lazily: optional libraries (triton) stay unimported on a CPU
install, and the native CPU kernels are built only when the cpu backend is chosen."""
from collections.abc import Callable

import torch

from pagedserve import envs
from pagedserve.attention.backends.base import AttentionBackend
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

logger = init_logger(__name__)


def _torch() -> AttentionBackend:
    from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend

    return TorchPagedAttentionBackend()


def _cpu() -> AttentionBackend:
    from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend

    return CpuNativeAttentionBackend()


def _triton() -> AttentionBackend:
    from pagedserve.attention.backends.triton import TritonAttentionBackend

    return TritonAttentionBackend()


# name -> constructor; config.ATTENTION_BACKENDS lists the same names (plus auto) for --attention-backend.
_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {"torch": _torch, "cpu": _cpu, "triton": _triton}


def get_attention_backend(name: str) -> AttentionBackend:
    """`name`: torch (reference; CPU and GPU) | cpu (native CPU decode kernel; CPU tensors only) |
    triton (Triton kernels; CUDA tensors, or CPU ones under TRITON_INTERPRET=1).
    Raises ValueError for any other name."""
    if name not in _BACKENDS:
        raise ValueError(f"Unknown attention backend {name!r}; supported: {', '.join(_BACKENDS)}.")
    return _BACKENDS[name]()


def select_attention_backend(requested: str, device: torch.device) -> AttentionBackend:
    """The backend for `requested` (auto or a registered name) on `device`, with the choice logged.

    auto is cpu on a CPU device and triton on CUDA. cpu needs the native kernels: when they are
    disabled (PAGEDSERVE_CPU_KERNELS=0) or fail to build, torch is used instead, with the reason in
    the log (a warning unless auto and disabled on purpose). triton needs the triton package (auto
    falls back to torch without it) and, on CPU, kernels defined under TRITON_INTERPRET=1; asked for
    explicitly without them it raises ConfigError.
    """
    name = requested
    if requested == "auto":
        name = "cpu" if device.type == "cpu" else "triton"
    if name == "triton":
        error = _triton_unavailable(device)
        if error is not None and requested == "auto":
            logger.warning("Attention backend: torch (triton is unavailable: %s).", error)
            return get_attention_backend("torch")
        if error is not None:
            raise ConfigError(f"--attention-backend triton cannot run here: {error}; use "
                              "--attention-backend auto or torch.")
    if name == "cpu":
        from pagedserve.kernels.cpu import load_cpu_kernels

        error = load_cpu_kernels().error
        if error is not None:
            disabled_on_purpose = requested == "auto" and not envs.cpu_kernels_enabled()
            (logger.info if disabled_on_purpose else logger.warning)(
                "Attention backend: torch (the native CPU kernels are unavailable: %s).", error)
            return get_attention_backend("torch")
    logger.info("Attention backend: %s.", name)
    return get_attention_backend(name)


def _triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device`, or None when they can."""
    try:
        from pagedserve.kernels import triton as triton_kernels
    except ImportError as exc:
        return f"the triton package does not import ({exc}); pip install triton"
    if device.type == "cpu" and not triton_kernels.INTERPRETED:
        return ("its kernels run on CUDA GPUs, and on CPU only in Triton's interpreter (TRITON_INTERPRET=1 "
                "set before pagedserve.kernels.triton is imported: tests only, very slow)")
    return None
