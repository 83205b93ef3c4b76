"""Backend registry. Optional backends (triton) are imported lazily so the CPU install imports cleanly."""
from pagedserve.attention.backends.base import AttentionBackend


def get_attention_backend(name: str) -> AttentionBackend:
    """`name`: torch (reference; CPU and GPU)."""
    if name == "torch":
        from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend

        return TorchPagedAttentionBackend()
    raise ValueError(f"Unknown attention backend {name!r}; supported: torch.")
