"""Multi-LoRA throughput: the same requests served by the base model alone and spread over N adapters
(round robin, every adapter in one batch), `--concurrency` requests at once; output tok/s of each and their
ratio (docs/benchmarks.md, Multi-LoRA). The adapters are random, rank `--rank` on every projection (q, k, v,
o, gate, up, down), written in PEFT's layout into a temporary folder.

    python benchmarks/lora_throughput.py [--model PATH] [--num-adapters 8] [--concurrency 32]
"""

import argparse
import os
import random
import tempfile
import time

import torch
from safetensors.torch import save_file

from pagedserve import LLM, SamplingParams
from pagedserve.lora.request import LoRARequest
from pagedserve.lora.shapes import MODULE_PARENT, ModelShapes


def write_random_adapter(folder: str, shapes: ModelShapes, rank: int, seed: int) -> str:
    """A PEFT adapter folder: lora_A [rank, in] and lora_B [out, rank] of every projection of every layer."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shapes.num_layers):
        for kind, (n_in, n_out) in shapes.sizes.items():
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_PARENT.get(kind, 'mlp')}.{kind}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, n_in, generator=generator) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(n_out, rank, generator=generator) * 0.02
    os.makedirs(folder)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        f.write(f'{{"peft_type": "LORA", "r": {rank}, "lora_alpha": {2 * rank}, "bias": "none"}}')
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct (GGUF)")
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each, alternating; the best counts")
    args = parser.parse_args()
    llm = LLM(
        args.model,
        enable_lora=True,
        max_loras=args.num_adapters,
        max_lora_rank=args.rank,
        max_num_seqs=args.concurrency,
        max_model_len=args.prompt_tokens + args.output_tokens + 16,
    )
    shapes = ModelShapes.of(llm.llm_engine.config.model.hf_config)
    folder = tempfile.mkdtemp(prefix="lora-bench-")
    adapters = [
        LoRARequest(
            f"adapter-{i}", i + 1, write_random_adapter(os.path.join(folder, str(i)), shapes, args.rank, i)
        )
        for i in range(args.num_adapters)
    ]
    rng = random.Random(0)
    vocab = llm.llm_engine.config.model.vocab_size
    prompts = [
        [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.num_requests)
    ]
    params = SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
    runs = {
        "base model alone": [None] * args.num_requests,
        f"{args.num_adapters} adapters mixed": [
            adapters[i % len(adapters)] for i in range(args.num_requests)
        ],
    }
    best = dict.fromkeys(runs, 0.0)
    for repeat in range(args.repeats + 1):  # the first round warms up (kernels, adapters read)
        for name, requests in runs.items():
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=requests)
            elapsed = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            if repeat:
                best[name] = max(best[name], tokens / elapsed)
    base = best["base model alone"]
    print(
        f"{args.num_requests} requests of {args.prompt_tokens} prompt + {args.output_tokens} output tokens, "
        f"{args.concurrency} at once, rank {args.rank}, best of {args.repeats}"
    )
    print("| run | output tok/s | vs the base model alone |\n|---|---:|---:|")
    for name, rate in best.items():
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
