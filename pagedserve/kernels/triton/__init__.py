"""Triton kernels of the triton attention backend and of multi-LoRA serving (GPU). Importing this package
imports triton and defines the kernels: with TRITON_INTERPRET=1 set before that import they run on CPU
tensors through Triton's interpreter (slow, for tests), otherwise they compile for the GPU."""

from triton.runtime.interpreter import InterpretedFunction

from pagedserve.kernels.triton.attention import (
    PagedBatch,
    _paged_attention_kernel,
    choose_num_splits,
    paged_attention,
)
from pagedserve.kernels.triton.cache import reshape_and_cache
from pagedserve.kernels.triton.lora import add_lora
from pagedserve.kernels.triton.quant_matmul import GGML_TRITON_TYPES, ggml_dequantize, ggml_matmul

# Whether the kernels were defined under TRITON_INTERPRET=1, so run on CPU tensors.
INTERPRETED = isinstance(_paged_attention_kernel, InterpretedFunction)

__all__ = [
    "GGML_TRITON_TYPES",
    "INTERPRETED",
    "PagedBatch",
    "add_lora",
    "choose_num_splits",
    "ggml_dequantize",
    "ggml_matmul",
    "paged_attention",
    "reshape_and_cache",
]
