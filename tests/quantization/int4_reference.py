"""Test-side GPTQ and AWQ checkpoint writers, from the published formats (AutoGPTQ / GPTQModel's
`qweight`/`qzeros`/`scales`/`g_idx`, AutoAWQ's GEMM packing), independent of pagedserve's loader: quantize
a float checkpoint's linear weights to 4-bit groups, write them as those tools publish them, and write the
reference dequantization (scale * (q - zero), float32) as a float checkpoint for HF transformers."""

import json
import os
import shutil
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: bits 4i..4i+3 hold column AWQ_PACK_ORDER[i] of eight
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Scheme:
    method: str  # gptq | awq
    group_size: int
    desc_act: bool = False
    sym: bool = False
    checkpoint_format: str = "gptq"  # gptq (zeros stored minus one) | gptq_v2

    def quantization_config(self) -> dict[str, object]:
        if self.method == "awq":
            return {
                "quant_method": "awq",
                "bits": 4,
                "group_size": self.group_size,
                "zero_point": True,
                "version": "gemm",
            }
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "checkpoint_format": self.checkpoint_format,
            "damp_percent": 0.01,
            "true_sequential": True,
        }


@dataclass
class Quantized:
    q: torch.Tensor  # int64 [N, K] in [0, 15]
    zero: torch.Tensor  # int64 [N, G]
    scale: torch.Tensor  # float16 [N, G]
    g_idx: torch.Tensor  # int64 [K], the group of each input column

    def dequantize(self) -> torch.Tensor:
        """The reference: scale * (q - zero) in float32 (exact: an fp16 scale times a small integer)."""
        return self.scale.float()[:, self.g_idx] * (self.q - self.zero[:, self.g_idx]).float()


def group_index(columns: int, group_size: int, desc_act: bool) -> torch.Tensor:
    """g_idx: column // group_size, or with act-order the groups of a column permutation (GPTQ quantizes
    columns in order of decreasing Hessian diagonal; here a fixed random one per input size, so the
    projections of one input share it, as they do in real checkpoints)."""
    order = torch.randperm(columns, generator=torch.Generator().manual_seed(columns)) if desc_act else None
    rank = torch.arange(columns)
    g_idx = torch.empty(columns, dtype=torch.int64)
    g_idx[order if order is not None else rank] = rank // group_size
    return g_idx


def quantize(weight: torch.Tensor, g_idx: torch.Tensor, sym: bool) -> Quantized:
    """GPTQ's / AWQ's min-max grid per (output row, group): asymmetric with the range widened to include
    0, or symmetric around zero point 8; then round to nearest (the grid, not GPTQ's error feedback)."""
    weight = weight.float()
    groups = int(g_idx.max()) + 1
    q = torch.empty(weight.shape, dtype=torch.int64)
    zero = torch.empty(weight.shape[0], groups, dtype=torch.int64)
    scale = torch.empty(weight.shape[0], groups, dtype=torch.float16)
    for group in range(groups):
        columns = g_idx == group
        w = weight[:, columns]
        low, high = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
        if sym:
            step = torch.maximum(low.abs(), high) * 2 / 15
            z = torch.full_like(step, 8, dtype=torch.int64)
        else:
            step = (high - low) / 15
            z = torch.round(-low / step).to(torch.int64)
        s = step.to(torch.float16)
        q[:, columns] = (torch.round(w / s.float()[:, None]) + z[:, None]).clamp(0, 15).to(torch.int64)
        zero[:, group], scale[:, group] = z, s
    return Quantized(q, zero, scale, g_idx)


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit patterns (int64) as the int32 tensors the checkpoints hold."""
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def pack_rows(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    """int64 [R, C] 4-bit values -> int32 [R, C / 8]: bits 4i..4i+3 of word c hold column 8c + order[i]."""
    words = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for i, column in enumerate(order):
        words |= (values[:, column::8] & 0xF) << (4 * i)
    return _to_int32(words)


def checkpoint_tensors(name: str, quantized: Quantized, scheme: Scheme) -> dict[str, torch.Tensor]:
    """The tensors replacing `<name>.weight`, named and laid out as the scheme's tools publish them."""
    in_order = list(range(8))
    scales = quantized.scale.t().contiguous()  # [G, N]
    if scheme.method == "awq":  # qweight [K, N / 8], qzeros [G, N / 8], both packed along N
        return {
            f"{name}.qweight": pack_rows(quantized.q.t(), AWQ_PACK_ORDER),
            f"{name}.qzeros": pack_rows(quantized.zero.t(), AWQ_PACK_ORDER),
            f"{name}.scales": scales,
        }
    stored_zero = quantized.zero - (1 if scheme.checkpoint_format == "gptq" else 0)
    return {  # qweight [K / 8, N] packed along K; qzeros [G, N / 8] packed along N
        f"{name}.qweight": pack_rows(quantized.q, in_order).t().contiguous(),
        f"{name}.qzeros": pack_rows(stored_zero.t(), in_order),
        f"{name}.scales": scales,
        f"{name}.g_idx": quantized.g_idx.to(torch.int32),
    }


def write_checkpoints(
    float_folder: str, scheme: Scheme, quantized_folder: str, reference_folder: str
) -> None:
    """From a float checkpoint: the quantized one (as published) and the float reference (the quantized
    linear weights dequantized, everything else unchanged)."""
    state = load_file(os.path.join(float_folder, "model.safetensors"))
    config = json.load(open(os.path.join(float_folder, "config.json")))
    quantized_state, reference_state = {}, {}
    for key, tensor in state.items():
        module = key.removesuffix(".weight")
        if key.endswith(".weight") and module.split(".")[-1] in LINEAR_NAMES:
            g_idx = group_index(tensor.shape[1], scheme.group_size, scheme.desc_act)
            quantized = quantize(tensor, g_idx, scheme.sym)
            quantized_state.update(checkpoint_tensors(module, quantized, scheme))
            reference_state[key] = quantized.dequantize()
        else:
            quantized_state[key] = reference_state[key] = tensor
    for folder, tensors in ((quantized_folder, quantized_state), (reference_folder, reference_state)):
        shutil.copytree(float_folder, folder)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    config["quantization_config"] = scheme.quantization_config()
    json.dump(config, open(os.path.join(quantized_folder, "config.json"), "w"), indent=1)
