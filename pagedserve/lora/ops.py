"""The batched multi-LoRA op (punica's "bgmv"): each token of a batch adds its own adapter's low-rank
update to a layer's output, one call for the whole mixed batch.

`add_lora` runs the Triton kernels on CUDA tensors (kernels/triton/lora.py), the native CPU kernel on CPU
tensors when the native kernels are built (kernels/cpu/lora_bgmv.cpp), else `add_lora_reference`.
"""

import torch

from pagedserve.kernels.cpu import load_cpu_kernels


def add_lora(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slots: torch.Tensor
) -> None:
    """In place, for every token t with slots[t] >= 0:  y[t] += (x[t] @ lora_a[s].T) @ lora_b[s],  s = slots[t].
    Tokens with slot -1 (base-model requests) are left unchanged.
    y: [T, out] (the base layer's output; float32, bfloat16 or float16), x: [T, in] (same dtype as y),
    lora_a: [S, R, in], lora_b: [S, R, out] (B transposed; float32, or y's dtype), slots: int32 or int64 [T]
    on y's device. The adapter scaling is already folded into lora_b. R is the max rank (adapters of lower
    rank are zero-padded).

    Every path sums in float32 (bfloat16/float16 values widened exactly, no conversion copies: the CPU and
    Triton kernels read each dtype as it is) and rounds y[t] + update once to y's dtype. The CPU and Triton
    kernels are batch invariant: a token's row is the same bits whatever the other tokens of the call and
    their slots (each token's sums in one fixed order). y's and x's rows must be contiguous (stride 1 along
    the last dimension), lora_a and lora_b contiguous. Raises RuntimeError (native) or IndexError
    (reference) for a slot outside [-1, S)."""
    if y.device.type == "cuda":
        from pagedserve.kernels.triton.lora import add_lora as add_lora_triton

        add_lora_triton(y, x, lora_a, lora_b, slots)
    elif y.device.type == "cpu" and load_cpu_kernels().module is not None:
        torch.ops.pagedserve.add_lora(y, x, lora_a, lora_b, slots)
    else:
        add_lora_reference(y, x, lora_a, lora_b, slots)


def add_lora_reference(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slots: torch.Tensor
) -> None:
    """`add_lora` in plain PyTorch (the tests' reference, and the fallback): one pair of float32 matmuls per
    adapter in the batch, over the rows of its tokens (not batch invariant: the matmuls' order may follow
    the number of rows)."""
    for slot in torch.unique(slots).tolist():
        if slot < 0:
            continue
        rows = (slots == slot).nonzero().squeeze(1)
        update = (x[rows].float() @ lora_a[slot].float().T) @ lora_b[slot].float()
        y[rows] = (y[rows].float() + update).to(y.dtype)
