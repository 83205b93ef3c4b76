"""Make GGUF files of a random-weight Llama of Llama-3.2-1B's shape, offline, for kquant_serving.sh.

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
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "llama-1b-shape"
CACHE = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
DEFAULT_OUT = os.path.join(CACHE, "pagedserve", "models", NAME)
HERE = os.path.dirname(os.path.abspath(__file__))


def llama_cpp_tree() -> str:
    """The llama.cpp source tree, built by build_llama_server.sh if it is not yet (it prints the server)."""
    build = os.path.join(HERE, "build_llama_server.sh")
    server = subprocess.run(["bash", build], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return os.path.dirname(os.path.dirname(os.path.dirname(server)))  # .../llama.cpp/build/bin/llama-server


def make_checkpoint(folder: str, seed: int) -> None:
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


def run(command: list[str]) -> None:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)  # stdout: only the paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=DEFAULT_OUT)
    parser.add_argument(
        "--quant", nargs="+", default=["Q4_K_M", "Q4_0", "Q8_0"], help="llama-quantize types."
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    hf = os.path.join(args.out_dir, "hf")
    bf16 = os.path.join(args.out_dir, f"{NAME}-BF16.gguf")
    wanted = {q: os.path.join(args.out_dir, f"{NAME}-{q}.gguf") for q in args.quant}
    missing = [q for q, path in wanted.items() if not os.path.exists(path)]
    if missing and not os.path.exists(bf16) and not os.path.exists(hf):
        start = time.time()
        make_checkpoint(hf, args.seed)
        print(f"checkpoint made in {time.time() - start:.0f} s", file=sys.stderr)
    tree = llama_cpp_tree() if missing else ""
    if missing and not os.path.exists(bf16):
        if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it for any Llama
            run([sys.executable, "-m", "pip", "install", "sentencepiece>=0.1.98,<0.3.0"])
        # NOTE: the converter puts its tree's gguf-py first on sys.path (the installed gguf may be older).
        start = time.time()
        convert = os.path.join(tree, "convert_hf_to_gguf.py")
        run([sys.executable, convert, hf, "--outtype", "bf16", "--outfile", bf16 + ".tmp"])
        os.replace(bf16 + ".tmp", bf16)
        print(f"BF16 GGUF made in {time.time() - start:.0f} s", file=sys.stderr)
    for quant in missing:
        start = time.time()
        quantize = os.path.join(tree, "build", "bin", "llama-quantize")
        run([quantize, bf16, wanted[quant] + ".tmp", quant, str(os.cpu_count() or 2)])
        os.replace(wanted[quant] + ".tmp", wanted[quant])
        print(f"{quant} made in {time.time() - start:.0f} s", file=sys.stderr)
    for path in wanted.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
