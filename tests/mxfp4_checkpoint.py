"""MXFP4 test checkpoints: a float gpt-oss folder's experts quantized to OCP MXFP4 (E2M1 values times
power-of-two scales, quantization/mxfp4.py's `quantize_mxfp4`), written as HF's `mxfp4` checkpoint layout."""

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from pagedserve.quantization.mxfp4 import dequantize_mxfp4, quantize_mxfp4


def write_mxfp4_checkpoint(source: str, packed: str, dequantized: str | None = None) -> str:
    """Writes `source`'s model with its experts in MXFP4 to the folder `packed` (returned) and, given
    `dequantized`, the same model in float32 with the experts dequantized (the reference)."""
    folders = [packed] if dequantized is None else [packed, dequantized]
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(source):
            if os.path.isfile(os.path.join(source, name)) and name != "model.safetensors":
                shutil.copy(os.path.join(source, name), folder)
    tensors = load_file(os.path.join(source, "model.safetensors"))
    floats, quantized = dict(tensors), dict(tensors)
    for name, tensor in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # HF's in-memory [E, in, out] is the checkpoint's [E, out, in] transposed
            blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))
            floats[name] = dequantize_mxfp4(blocks, scales, torch.float32).transpose(1, 2).contiguous()
            del quantized[name]
            quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
    if dequantized is not None:
        save_file(floats, os.path.join(dequantized, "model.safetensors"))
    save_file(quantized, os.path.join(packed, "model.safetensors"))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"],
    }
    with open(os.path.join(packed, "config.json"), "w") as f:
        json.dump(config, f)
    return packed
