"""Backend registry. Backends are imported lazily: optional libraries (triton) stay unimported on a CPU
install, and the native CPU kernels are built only when the cpu backend is chosen."""

from pagedserve import envs
from pagedserve.attention.backends.base import AnyAttentionBackend
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.platforms import Platform
from pagedserve.utils.registry import Registry

logger = init_logger(__name__)

# --attention-backend -> backend; config.AttentionBackendName lists the same names, plus auto.
ATTENTION_BACKENDS: "Registry[AnyAttentionBackend]" = Registry("Attention backend", "--attention-backend")
ATTENTION_BACKENDS.register("torch", "pagedserve.attention.backends.torch_paged:TorchPagedAttentionBackend")
ATTENTION_BACKENDS.register("cpu", "pagedserve.attention.backends.cpu_native:CpuNativeAttentionBackend")
ATTENTION_BACKENDS.register("triton", "pagedserve.attention.backends.triton:TritonAttentionBackend")


def get_attention_backend(name: str) -> AnyAttentionBackend:
    """`name`: torch (reference; CPU and GPU) | cpu (native CPU decode kernel; CPU tensors only) |
    triton (Triton kernels; CUDA tensors, or CPU ones under TRITON_INTERPRET=1).
    Raises ConfigError for any other name."""
    return ATTENTION_BACKENDS.load(name)()


def select_attention_backend(
    requested: str, platform: Platform, bidirectional_images: bool = False
) -> AnyAttentionBackend:
    """The backend for `requested` (auto or a registered name) on `platform`, with the choice logged.

    `bidirectional_images`: the model's image tokens attend each other both ways (Gemma 3), which the torch
    and cpu backends express and triton does not: auto takes torch instead of triton (logged), triton
    asked for raises ConfigError.

    auto is the platform's default (cpu on a CPU, triton on CUDA). cpu needs the native kernels: when
    they are disabled (PAGEDSERVE_CPU_KERNELS=0) or fail to build, torch is used instead, with the reason
    in the log (a warning unless auto and disabled on purpose). triton needs the triton package (auto
    falls back to torch without it) and, on CPU, kernels defined under TRITON_INTERPRET=1; asked for
    explicitly without them it raises ConfigError.
    """
    if bidirectional_images and requested == "triton":
        raise ConfigError(
            "--attention-backend triton cannot attend an image's tokens both ways, as this model's images "
            "need; use --attention-backend torch or cpu (or auto)."
        )
    name = requested
    if requested == "auto":
        name = platform.default_attention_backend
    if name == "triton" and bidirectional_images:
        logger.info("Attention backend: torch (triton cannot attend an image's tokens both ways).")
        return get_attention_backend("torch")
    if name == "triton":
        error = _triton_unavailable(platform)
        if error is not None and requested == "auto":
            logger.warning("Attention backend: torch (triton is unavailable: %s).", error)
            return get_attention_backend("torch")
        if error is not None:
            raise ConfigError(
                f"--attention-backend triton cannot run here: {error}; use --attention-backend auto or torch."
            )
    if name == "cpu":
        from pagedserve.kernels.cpu import load_cpu_kernels

        error = load_cpu_kernels().error
        if error is not None:
            disabled_on_purpose = requested == "auto" and not envs.cpu_kernels_enabled()
            (logger.info if disabled_on_purpose else logger.warning)(
                "Attention backend: torch (the native CPU kernels are unavailable: %s).", error
            )
            return get_attention_backend("torch")
    logger.info("Attention backend: %s.", name)
    return get_attention_backend(name)


def _triton_unavailable(platform: Platform) -> str | None:
    """Why the Triton kernels cannot run on `platform`, or None when they can."""
    try:
        from pagedserve.kernels import triton as triton_kernels
    except ImportError as exc:
        return f"the triton package does not import ({exc}); pip install triton"
    if platform.device_type == "cpu" and not triton_kernels.INTERPRETED:
        return (
            "its kernels run on CUDA GPUs, and on CPU only in Triton's interpreter (TRITON_INTERPRET=1 "
            "set before pagedserve.kernels.triton is imported: tests only, very slow)"
        )
    return None
