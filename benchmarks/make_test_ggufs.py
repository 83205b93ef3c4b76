"""Write the GGUF test files of tests/data/llama_cpp with llama.cpp's own converter and quantizer.

Two tiny random-weight models (a Llama and a Mixtral: hidden 256, two layers, every matrix a whole number
of K-quants' 256-value super-blocks) with a 256-piece SentencePiece vocabulary trained on docs/ (llama.cpp's
converter reads a SentencePiece model without its BPE pre-tokenizer check), converted by
convert_hf_to_gguf.py to F32 and quantized by llama-quantize into the type mixes users download: Q4_0,
Q4_K_M, Q5_K_M, Q6_K and Q8_0 for the Llama, Q4_K_M for the Mixtral. About 1 MB each; the tests compare
what the engine's kernels compute on them with the same blocks dequantized.

Needs benchmarks/build_llama_server.sh's build (run it first: 5-10 minutes) and sentencepiece, which the
converter imports (pip-installed into the peer cache here, never into the environment):

    python benchmarks/make_test_ggufs.py            # rewrites tests/data/llama_cpp/*.gguf
"""

import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(REPO, "tests", "data", "llama_cpp")
PEERS = os.environ.get(
    "PAGEDSERVE_PEER_CACHE",
    os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedserve", "peers"),
)
LLAMA_TYPES = ["Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
MIXTRAL_TYPES = ["Q4_K_M"]
SIZES = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    initializer_range=0.02,  # a trained model's scale: greedy ties stay rare
    bos_token_id=1,
    eos_token_id=2,
)


def train_vocabulary(folder: str) -> None:
    """tokenizer.model: a 256-piece unigram SentencePiece model of the repository's docs."""
    import sentencepiece

    lines = [
        line.strip()
        for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
        for line in open(path, encoding="utf-8")
        if line.strip()
    ]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=os.path.join(folder, "tokenizer"),
        vocab_size=SIZES["vocab_size"],
        model_type="unigram",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    os.remove(os.path.join(folder, "tokenizer.vocab"))


def save_model(folder: str, mixtral: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig

    config = (
        MixtralConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2)
        if mixtral
        else LlamaConfig(**SIZES)
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    train_vocabulary(folder)


def llama_cpp_tree() -> str:
    server = subprocess.run(
        ["bash", os.path.join(HERE, "build_llama_server.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    return os.path.dirname(os.path.dirname(os.path.dirname(server)))  # .../llama.cpp/build/bin/llama-server


def converter_env(tree: str) -> dict[str, str]:
    deps = os.path.join(PEERS, "pydeps")
    if not os.path.isdir(os.path.join(deps, "sentencepiece")):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", deps, "sentencepiece"], check=True
        )
    path = os.pathsep.join([os.path.join(tree, "gguf-py"), deps])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def main() -> int:
    tree = llama_cpp_tree()
    env = converter_env(tree)
    os.makedirs(OUT, exist_ok=True)
    for name, mixtral, types in (("tiny-llama", False, LLAMA_TYPES), ("tiny-mixtral", True, MIXTRAL_TYPES)):
        with tempfile.TemporaryDirectory() as tmp:
            folder, f32 = os.path.join(tmp, "hf"), os.path.join(tmp, f"{name}.F32.gguf")
            save_model(folder, mixtral)
            converter = os.path.join(tree, "convert_hf_to_gguf.py")
            command = [sys.executable, converter, folder, "--outtype", "f32", "--outfile", f32]
            subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
            for qtype in types:
                out = os.path.join(OUT, f"{name}.{qtype}.gguf")
                quantize = [os.path.join(tree, "build", "bin", "llama-quantize"), f32, out, qtype]
                subprocess.run(quantize, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
