"""The GGUF kernels' integer activations, in plain PyTorch: the reference their tests compare against."""

import torch


def rounded_activations(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x with each 32-value block rounded as the kernel does: q = round(x * (L / max|x|)), x ~ q max|x| / L,
    L = 2^(bits-1) - 1 (float32 arithmetic, ties to even), as float64."""
    largest = 2 ** (bits - 1) - 1
    blocks = x.reshape(-1, 32)
    block_max = blocks.abs().amax(dim=1, keepdim=True)
    # NOTE: the float32 inverse comes from a float64 division: torch's float32 `scalar / tensor` is not
    # correctly rounded (off by an ulp), which moved a product across a rounding tie at batch 64.
    inverse = torch.where(block_max > 0, (largest / block_max.double()).float(), torch.zeros_like(block_max))
    q = torch.round(blocks * inverse)
    return (q.double() * (block_max / largest).double()).reshape(x.shape)
