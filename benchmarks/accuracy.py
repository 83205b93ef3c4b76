"""Perplexity of SmolLM2-135M on a fixed public-domain text (benchmarks/data/opticks.txt, ~22k tokens) for
each weight / KV-cache quantization, against the float32 reference (the GGUF's weights dequantized). The
GGUF is the embedded Q4_1 file, or --gguf's (e.g. a K-quant file of the same weights from
`make_kquant_model.py --model smollm2`).

The text is split into windows of --window tokens; every token but a window's first is scored with the
engine's prompt_logprobs. int8 and int4 quantize a float32 HF folder written from the same GGUF (there is
no other local copy of the model), so every row starts from the same weights; the fp8 weights row reads an
fp8 checkpoint written here from that folder (per-channel scales, as llm-compressor's FP8_DYNAMIC).

    python benchmarks/accuracy.py --window 1024
    python benchmarks/accuracy.py --gguf FILE.gguf --only "float32 (reference)" "GGUF native, 8-bit activations"
"""

import argparse
import gc
import math
import os
import shutil
import tempfile
import time

from pagedserve import LLM, SamplingParams
from pagedserve.utils.default_model import default_model_path

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "opticks.txt")
# row name -> (model: "gguf" file or "hf" folder, engine arguments)
SETTINGS = {
    "float32 (reference)": ("gguf", dict(quantization="none")),
    "GGUF native": ("gguf", dict()),
    "GGUF native, float activations": ("gguf", dict(activation_bits=32)),
    "GGUF native, 16-bit activations": ("gguf", dict(activation_bits=16)),
    "GGUF native, 8-bit activations": ("gguf", dict(activation_bits=8)),
    "int8 (online, g32)": ("hf", dict(quantization="int8")),
    "int4 (online, g32)": ("hf", dict(quantization="int4")),
    "fp8 weights (per channel)": ("fp8", dict()),
    # NOTE: prompts chunked by 128 tokens, so later chunks attend their prefix through the fp8 cache (a
    # window prefilled in one chunk attends its fresh K/V and would never read the cache back).
    "bfloat16 KV": ("gguf", dict(quantization="none", kv_cache_dtype="bfloat16", max_num_batched_tokens=128)),
    "fp8 KV (e4m3, scale 1)": (
        "gguf",
        dict(quantization="none", kv_cache_dtype="fp8", max_num_batched_tokens=128),
    ),
    "fp8 KV (e4m3, calculated)": (
        "gguf",
        dict(quantization="none", kv_cache_dtype="fp8", calculate_kv_scales=True, max_num_batched_tokens=128),
    ),
}


def float_folder(gguf_file: str, folder: str) -> str:
    """The GGUF's weights dequantized to a float32 HF folder: the engine's own GGUF reader's tensors as
    model.safetensors, beside the config and tokenizer converted from the file."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from pagedserve.model_loader.gguf import iterate_gguf
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    converted = gguf_hf_folder(gguf_file)
    for name in os.listdir(converted):
        shutil.copy(os.path.join(converted, name), folder)
    config = AutoConfig.from_pretrained(converted)
    tensors = dict(iterate_gguf(gguf_file, config))
    save_file(
        {name: tensor.contiguous() for name, tensor in tensors.items()},
        os.path.join(folder, "model.safetensors"),
    )
    return folder


def fp8_folder(float_folder: str, folder: str) -> str:
    """An fp8 checkpoint of the float folder: each linear weight as float8_e4m3fn with a per-output-channel
    scale (max |w| / 448), config.json's quantization_config saying so."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(float_folder, folder)
    tensors = load_file(os.path.join(float_folder, "model.safetensors"))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        scale = tensors[name].abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
        tensors[name] = (tensors[name] / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        tensors[name.removesuffix("weight") + "weight_scale"] = scale
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    config_path = os.path.join(folder, "config.json")
    config = json.load(open(config_path))
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    json.dump(config, open(config_path, "w"))
    return folder


def perplexity(model: str, windows: list[list[int]], engine_args: dict, window: int) -> tuple[float, float]:
    """(perplexity, seconds) over the windows. `activation_bits` in engine_args: the GGUF kernels' activation
    width (PAGEDSERVE_GGUF_ACTIVATION_BITS) for this engine."""
    engine_args = dict(engine_args)
    bits = engine_args.pop("activation_bits", None)
    if bits is not None:
        os.environ["PAGEDSERVE_GGUF_ACTIVATION_BITS"] = str(bits)
    try:
        llm = LLM(model, kv_cache_memory="512MiB", max_model_len=window + 8, **engine_args)
    finally:
        os.environ.pop("PAGEDSERVE_GGUF_ACTIVATION_BITS", None)
    start = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    total, count = 0.0, 0
    for output, tokens in zip(outputs, windows):
        for entry, token in zip(output.prompt_logprobs[1:], tokens[1:]):
            value = entry[token]
            total += getattr(value, "logprob", value)
            count += 1
    del llm
    gc.collect()
    return math.exp(-total / count), seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--window", type=int, default=1024, help="tokens per scored window")
    parser.add_argument("--max-tokens", type=int, default=None, help="score only the text's first N tokens")
    parser.add_argument("--only", nargs="*", default=None, help="row names to run (default: all)")
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the embedded Q4_1 SmolLM2)")
    args = parser.parse_args()
    if unknown := set(args.only or ()) - set(SETTINGS):
        parser.error(f"unknown rows {sorted(unknown)}; the rows: {list(SETTINGS)}")
    gguf_file = args.gguf or default_model_path()
    with tempfile.TemporaryDirectory() as folder:
        models = {"gguf": gguf_file, "hf": float_folder(gguf_file, folder)}
        models["fp8"] = fp8_folder(models["hf"], os.path.join(folder, "fp8"))
        from transformers import AutoTokenizer

        tokens = AutoTokenizer.from_pretrained(folder)(open(TEXT, encoding="utf-8").read()).input_ids
        tokens = tokens[: args.max_tokens]
        windows = [tokens[i : i + args.window] for i in range(0, len(tokens) - 1, args.window)]
        print(f"{len(tokens)} tokens of {os.path.basename(TEXT)} in {len(windows)} windows of {args.window}")
        print(f"GGUF: {os.path.basename(gguf_file)}")
        print(f"{'setting':32s} {'perplexity':>10s} {'vs float32':>10s} {'seconds':>8s}")
        reference = None
        for name, (kind, engine_args) in SETTINGS.items():
            if args.only and name not in args.only and reference is not None:
                continue
            value, seconds = perplexity(models[kind], windows, engine_args, args.window)
            reference = reference or value
            print(
                f"{name:32s} {value:10.4f} {100 * (value / reference - 1):+9.2f}% {seconds:8.1f}", flush=True
            )


if __name__ == "__main__":
    main()
