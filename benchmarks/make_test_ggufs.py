"""Write the GGUF test files of tests/data/llama_cpp with llama.cpp's own converter and quantizer.

llama.cpp commit 0c1e57098 (the source of llama-cpp-python 0.3.36, which benchmarks/build_llama_server.sh
builds). Tiny random-weight models, two layers each:
- a Llama and a Mixtral (hidden 256: every matrix a whole number of K-quants' 256-value super-blocks) with a
  256-piece SentencePiece vocabulary trained on docs/ (llama.cpp's converter reads a SentencePiece model
  without its BPE pre-tokenizer check), converted to F32 and quantized by llama-quantize into the type mixes
  users download: Q4_0, Q4_K_M, Q5_K_M, Q6_K and Q8_0 for the Llama, Q4_K_M for the Mixtral;
- a gpt-oss (hidden 64; its experts in MXFP4, as OpenAI ships them, which the converter keeps as ggml's
  MXFP4; the rest F32) and a DeepSeek V2 and V3 (MLA, F32), with a 300-token byte-level BPE vocabulary
  trained on docs/.
  NOTE: the converter recognizes a BPE vocabulary by hashing how it splits a test text, which no tiny
  vocabulary matches: it is told the vocabulary is GPT-2's (`tokenizer.ggml.pre`, read by llama.cpp's own
  tokenizer only).
- a Gemma 3 and a Qwen2.5-VL with images (tests/conftest.py's tiny builders on the same BPE vocabulary):
  each a text GGUF and an mmproj GGUF (`--mmproj`: the vision tower and projector, F32 but the
  Gemma 3 projection matrix, which the converter always writes as F16).
Each file is 0.1 to 1.3 MB; the HF folders of the last five are kept beside their files (safetensors,
config, tokenizer, image processor) as the references the tests compare the GGUFs' greedy tokens with.

Needs benchmarks/build_llama_server.sh's build (run it first: 5-10 minutes; its llama-quantize suffices)
and sentencepiece, which the converter imports (pip-installed into the peer cache here, never into the environment):

    python benchmarks/make_test_ggufs.py            # rewrites tests/data/llama_cpp/
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)  # run as a script: pagedserve from this checkout
sys.path.insert(0, os.path.join(REPO, "tests"))
from conftest import TINY_MODELS, build_tiny_gemma3v, build_tiny_qwen2_5_vl  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "llama_cpp")
PEERS = os.environ.get(
    "PAGEDSERVE_PEER_CACHE",
    os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedserve", "peers"),
)
LLAMA_TYPES = ["Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
MIXTRAL_TYPES = ["Q4_K_M"]
COMMON = dict(
    num_hidden_layers=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.02,  # a trained model's scale: greedy ties stay rare
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA_SIZES = dict(
    COMMON,
    vocab_size=256,
    hidden_size=256,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rope_theta=10000.0,
)
BPE_VOCAB = 300
# The families' tiny test configs (tests/conftest.py's TINY_MODELS) at hidden 64.
# tests/conftest.py's tiny gpt-oss (YaRN, a 24-token window, 4 experts) at hidden 64.
GPT_OSS_SIZES = dict(
    COMMON,
    **TINY_MODELS["gpt_oss"],
    initializer_range=0.1,  # at hidden 64, 0.02 makes every step's top token the same
    max_position_embeddings=512,  # YaRN's factor times its original length
    vocab_size=BPE_VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
)
# tests/conftest.py's tiny DeepSeek V2 and V3 (MLA; layer 0 dense, layer 1 experts in groups) at hidden 64;
# the scoring function is written out, as DeepSeek's own configs do, for the converter to record it.
DEEPSEEK_V2_SIZES = dict(
    COMMON, **TINY_MODELS["deepseek_v2"], initializer_range=0.1, vocab_size=BPE_VOCAB, hidden_size=64
)
DEEPSEEK_V2_SIZES.update(scoring_func="softmax", intermediate_size=96, num_attention_heads=4)
DEEPSEEK_V3_SIZES = dict(
    COMMON, **TINY_MODELS["deepseek_v3"], initializer_range=0.1, vocab_size=BPE_VOCAB, hidden_size=64
)
DEEPSEEK_V3_SIZES.update(scoring_func="sigmoid", intermediate_size=96, num_attention_heads=4)
DEEPSEEK_V3_SIZES["max_position_embeddings"] = 512  # YaRN's factor times its original length


def docs_lines() -> Iterator[str]:
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            yield from (line.strip() for line in f if line.strip())


def train_sentencepiece(folder: str) -> None:
    """tokenizer.model: a 256-piece unigram SentencePiece model of the repository's docs."""
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=docs_lines(),
        model_prefix=os.path.join(folder, "tokenizer"),
        vocab_size=LLAMA_SIZES["vocab_size"],
        model_type="unigram",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    os.remove(os.path.join(folder, "tokenizer.vocab"))


def train_byte_bpe(folder: str) -> None:
    """tokenizer.json: a byte-level BPE of BPE_VOCAB tokens (ids 1 and 2 <s> and </s>) of the docs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs_lines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def mxfp4_checkpoint(folder: str) -> None:
    """Rewrite a float gpt-oss folder as OpenAI ships gpt-oss: experts in MXFP4 blocks and scales."""
    import torch
    from safetensors.torch import load_file, save_file

    from pagedserve.quantization.mxfp4 import quantize_mxfp4

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        # HF's in-memory [E, in, out] is the checkpoint's [E, out, in] transposed
        blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2).to(torch.float32))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    save_file(tensors, path, metadata={"format": "pt"})
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"],
    }
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def save_model(folder: str, family: str) -> None:
    import torch
    from transformers import (
        AutoModelForCausalLM,
        DeepseekV2Config,
        DeepseekV3Config,
        GptOssConfig,
        LlamaConfig,
        MixtralConfig,
    )

    configs = {
        "llama": lambda: LlamaConfig(**LLAMA_SIZES),
        "mixtral": lambda: MixtralConfig(**LLAMA_SIZES, num_local_experts=4, num_experts_per_tok=2),
        "gpt-oss": lambda: GptOssConfig(**GPT_OSS_SIZES),
        "deepseek-v2": lambda: DeepseekV2Config(**DEEPSEEK_V2_SIZES),
        "deepseek-v3": lambda: DeepseekV3Config(**DEEPSEEK_V3_SIZES),
    }
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(configs[family](), dtype=torch.float32)
    with torch.no_grad():  # HF initializes biases (and V3's router bias) to zero: make them count
        for name, param in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    if family in ("llama", "mixtral"):
        train_sentencepiece(folder)
    else:
        train_byte_bpe(folder)
    if family == "gpt-oss":
        mxfp4_checkpoint(folder)


# The image families: their builders in tests/conftest.py.
VISION_BUILDERS = {"gemma3-vision": build_tiny_gemma3v, "qwen2.5-vl": build_tiny_qwen2_5_vl}


def save_vision_model(folder: str, family: str) -> None:
    """A tiny image model on the docs' byte-level BPE (its embedding table a few hundred rows). Gemma 3's
    tower is saved under `vision_tower.vision_model.`, as Google's checkpoints have it: the converter
    maps only that name (transformers 5 saves `vision_tower.` and reads both). Its language model takes
    what a Gemma 3 GGUF implies, which the tiny test config does not: scores scaled by the head size and
    five window layers in six (at two layers, both)."""
    from safetensors.torch import load_file, save_file

    with tempfile.TemporaryDirectory() as vocabulary:
        train_byte_bpe(vocabulary)
        VISION_BUILDERS[family](folder, vocabulary)
    if family == "gemma3-vision":
        path = os.path.join(folder, "model.safetensors")
        tensors = {
            name.replace("vision_tower.", "vision_tower.vision_model.", 1): tensor
            for name, tensor in load_file(path).items()
        }
        save_file(tensors, path, metadata={"format": "pt"})
        config_path = os.path.join(folder, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        text = config["text_config"]
        text.update(query_pre_attn_scalar=text["head_dim"], layer_types=["sliding_attention"] * 2)
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)


def llama_cpp_tree() -> str:
    """The llama.cpp source tree of benchmarks/build_llama_server.sh, with its llama-quantize built."""
    tree = os.path.join(PEERS, "llama.cpp")
    if not os.access(os.path.join(tree, "build", "bin", "llama-quantize"), os.X_OK):
        raise SystemExit(f"no llama-quantize in {tree}/build/bin: run benchmarks/build_llama_server.sh first")
    return tree


def peer_deps() -> str:
    """The folder sentencepiece is installed in (both this script and the converter import it)."""
    deps = os.path.join(PEERS, "pydeps")
    if not os.path.isdir(os.path.join(deps, "sentencepiece")):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", deps, "sentencepiece"], check=True
        )
    return deps


def converter_env(tree: str) -> dict[str, str]:
    path = os.pathsep.join([tree, os.path.join(tree, "gguf-py"), peer_deps()])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


# The converter's main, with a BPE vocabulary taken as GPT-2's (see the module's docstring).
_CONVERT_AS_GPT2 = (
    "import sys, runpy, conversion.base as base\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def convert(tree: str, folder: str, out: str, mmproj: bool = False) -> None:
    """`folder` -> `out` in F32 (with `mmproj`: its vision tower and projector alone)."""
    converter = os.path.join(tree, "convert_hf_to_gguf.py")
    command = [
        sys.executable,
        "-c",
        _CONVERT_AS_GPT2,
        converter,
        folder,
        "--outtype",
        "f32",
        "--outfile",
        out,
        *(["--mmproj"] if mmproj else []),
    ]
    subprocess.run(command, check=True, env=converter_env(tree), stdout=subprocess.DEVNULL)


def main() -> int:
    tree = llama_cpp_tree()
    sys.path.append(peer_deps())
    os.makedirs(OUT, exist_ok=True)
    for family, types in (("llama", LLAMA_TYPES), ("mixtral", MIXTRAL_TYPES)):
        with tempfile.TemporaryDirectory() as tmp:
            folder, f32 = os.path.join(tmp, "hf"), os.path.join(tmp, f"tiny-{family}.F32.gguf")
            save_model(folder, family)
            convert(tree, folder, f32)
            for qtype in types:
                out = os.path.join(OUT, f"tiny-{family}.{qtype}.gguf")
                quantize = [os.path.join(tree, "build", "bin", "llama-quantize"), f32, out, qtype]
                subprocess.run(quantize, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(out)
    for family in ("gpt-oss", "deepseek-v2", "deepseek-v3"):
        folder = os.path.join(OUT, f"tiny-{family}")
        shutil.rmtree(folder, ignore_errors=True)
        save_model(folder, family)
        convert(tree, folder, os.path.join(OUT, f"tiny-{family}.gguf"))
    for family in VISION_BUILDERS:
        folder = os.path.join(OUT, f"tiny-{family}")
        shutil.rmtree(folder, ignore_errors=True)
        save_vision_model(folder, family)
        convert(tree, folder, os.path.join(OUT, f"tiny-{family}.gguf"))
        convert(tree, folder, os.path.join(OUT, f"tiny-{family}.mmproj.gguf"), mmproj=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
