"""Make GGUF files of a random-weight Llama of Llama-3.2-1B's shape, offline, for kquant_serving.sh (or,
with --model smollm2, K-quant files of the embedded SmolLM2's weights, for accuracy.py --gguf).

The model: hidden 2048, 16 layers, 32 heads / 8 KV heads, intermediate 8192, rope_theta 500000, tied
embeddings, seeded random weights (std 0.02), with the embedded SmolLM2's tokenizer (vocab 49152). It is
saved as bfloat16 safetensors, converted by llama.cpp's convert_hf_to_gguf.py to a BF16 GGUF, and quantized
by llama-quantize (both from benchmarks/build_llama_server.sh's build; the converter needs sentencepiece,
pip-installed here if missing). Files that exist are kept; the
paths of the quantized files are printed, one a line. Random weights make degenerate text: serve with
ignore_eos. 2.1 GB for the checkpoint and for the BF16 GGUF, 0.6-1.1 GB per quantized file; about 2.5
minutes on 2 cores (Q4_K_M's quantization is most of it).

    python benchmarks/make_kquant_model.py                       # Q4_K_M, Q4_0 and Q8_0
    python benchmarks/make_kquant_model.py --quant Q4_0 --out-dir /somewhere

--model smollm2: the embedded Q4_1 GGUF dequantized to a float32 folder (accuracy.py's float_folder), an F32
GGUF (bfloat16 would round the Q4_1 values), Q4_K_M by default. SmolLM2's hidden size 576 is not a multiple
of 256, where llama-quantize would fall back to Q5_0 (which the engine does not read): K-quant files take
Q8_0 for every tensor whose rows are not a multiple of 256 (there, every tensor but ffn_down); 15 s in all.

    python benchmarks/make_kquant_model.py --model smollm2   # .../smollm2-kquant/SmolLM2-135M-Instruct.Q4_K_M.gguf
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CACHE = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
# --model -> (default folder under CACHE/pagedserve/models, file name prefix, converter outtype, default types)
MODELS = {
    "llama-1b-shape": ("llama-1b-shape", "llama-1b-shape-", "bf16", ["Q4_K_M", "Q4_0", "Q8_0"]),
    "smollm2": ("smollm2-kquant", "SmolLM2-135M-Instruct.", "f32", ["Q4_K_M"]),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def llama_cpp_tree() -> str:
    """The llama.cpp source tree, built by build_llama_server.sh if it is not yet (it prints the server)."""
    build = os.path.join(HERE, "build_llama_server.sh")
    server = subprocess.run(["bash", build], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return os.path.dirname(os.path.dirname(os.path.dirname(server)))  # .../llama.cpp/build/bin/llama-server


def make_checkpoint(folder: str, seed: int) -> None:
    """The random-weight Llama of Llama-3.2-1B's shape, bfloat16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from pagedserve.utils.default_model import default_model_path
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    tokenizer_folder = gguf_hf_folder(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, folder)


def smollm2_checkpoint(folder: str) -> None:
    """The embedded SmolLM2 GGUF's weights as a float32 HF folder, config.json naming its architecture (the
    converter detects the model by it)."""
    import json

    from accuracy import float_folder

    from pagedserve.utils.default_model import default_model_path

    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    float_folder(default_model_path(), tmp)
    config_path = os.path.join(tmp, "config.json")
    config = json.load(open(config_path))
    config["architectures"] = ["LlamaForCausalLM"]
    json.dump(config, open(config_path, "w"), indent=2)
    os.replace(tmp, folder)


def q8_0_overrides(gguf_file: str, path: str) -> list[str]:
    """llama-quantize's arguments giving Q8_0 to each tensor of gguf_file whose rows are not a multiple of
    K-quants' 256-value super-blocks (llama-quantize's own fallback, Q5_0 for Q4_K, the engine does not read);
    none if there is none. The list is written to path."""
    from gguf import GGUFReader

    names = [t.name for t in GGUFReader(gguf_file).tensors if len(t.shape) == 2 and int(t.shape[0]) % 256]
    if not names:
        return []
    with open(path, "w") as file:
        file.write("\n".join(f"^{re.escape(name)}$=q8_0" for name in names) + "\n")
    return ["--tensor-type-file", path]


def run(command: list[str]) -> None:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)  # stdout: only the paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="llama-1b-shape")
    parser.add_argument("--out-dir", default=None, help="default: ~/.cache/pagedserve/models/<folder>")
    parser.add_argument("--quant", nargs="+", default=None, help="llama-quantize types (default: per model).")
    parser.add_argument("--seed", type=int, default=0, help="llama-1b-shape's weights")
    args = parser.parse_args()
    folder, prefix, outtype, quants = MODELS[args.model]
    out_dir = args.out_dir or os.path.join(CACHE, "pagedserve", "models", folder)
    os.makedirs(out_dir, exist_ok=True)
    hf = os.path.join(out_dir, "hf")
    source = os.path.join(out_dir, f"{prefix}{outtype.upper()}.gguf")
    wanted = {q: os.path.join(out_dir, f"{prefix}{q}.gguf") for q in args.quant or quants}
    missing = [q for q, path in wanted.items() if not os.path.exists(path)]
    if missing and not os.path.exists(source) and not os.path.exists(hf):
        start = time.time()
        if args.model == "smollm2":
            smollm2_checkpoint(hf)
        else:
            make_checkpoint(hf, args.seed)
        print(f"checkpoint made in {time.time() - start:.0f} s", file=sys.stderr)
    tree = llama_cpp_tree() if missing else ""
    if missing and not os.path.exists(source):
        if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it for any Llama
            run([sys.executable, "-m", "pip", "install", "sentencepiece>=0.1.98,<0.3.0"])
        # NOTE: the converter puts its tree's gguf-py first on sys.path (the installed gguf may be older).
        start = time.time()
        convert = os.path.join(tree, "convert_hf_to_gguf.py")
        run([sys.executable, convert, hf, "--outtype", outtype, "--outfile", source + ".tmp"])
        os.replace(source + ".tmp", source)
        print(f"{outtype.upper()} GGUF made in {time.time() - start:.0f} s", file=sys.stderr)
    for quant in missing:
        start = time.time()
        quantize = os.path.join(tree, "build", "bin", "llama-quantize")
        overrides = q8_0_overrides(source, wanted[quant] + ".types") if "_K" in quant else []
        run([quantize, *overrides, source, wanted[quant] + ".tmp", quant, str(os.cpu_count() or 2)])
        os.replace(wanted[quant] + ".tmp", wanted[quant])
        print(f"{quant} made in {time.time() - start:.0f} s", file=sys.stderr)
    for path in wanted.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
