"""Communication cost of one tensor-parallel decode step on CPU (gloo over 127.0.0.1).

Two measurements in one run, so each figure has its own reference:
1. Raw collectives between two processes: the all-reduce of a [batch, hidden] activation (2 per layer,
   plus 1 for the vocab-parallel embedding) and the all-gather of the [batch, vocab / 2] logits; their
   sum is the pure communication of one decode step.
2. A decode step end to end (the executor's execute_model, as the engine sees it) on a random-weight
   Llama of the same shape at tp=1 in process (uni), tp=1 in a worker process (mp: the executor's pipe
   and pickle cost alone), and tp=2 (mp).

    python benchmarks/tp_comm.py --batch-sizes 1 8 --num-layers 12 --hidden-size 768
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402


def collective_times(rank: int, args: argparse.Namespace, store: str, queue: Any) -> None:
    """One of two ranks: time all-reduce and all-gather per batch size; rank 0 puts (batch, µs, µs)."""
    import torch.distributed as dist

    from pagedserve.distributed import DistributedInit, init_distributed_environment

    torch.set_num_threads(1)
    init_distributed_environment(DistributedInit(f"file://{store}", 2, "gloo", 60.0, True), rank)
    for batch in args.batch_sizes:
        hidden = torch.randn(batch, args.hidden_size)
        logits = torch.randn(batch, args.vocab_size // 2)
        parts = [torch.empty_like(logits) for _ in range(2)]
        reduce_us = 1e6 * median_seconds(lambda h=hidden: dist.all_reduce(h), args.iterations, warmup=10)
        gather_us = 1e6 * median_seconds(
            lambda p=parts, x=logits: dist.all_gather(p, x), args.iterations, warmup=10
        )  # gloo connects lazily
        if rank == 0:
            queue.put((batch, reduce_us, gather_us))
    dist.destroy_process_group()


def measure_collectives(args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="tp-comm-"), "store")
    ranks = [context.Process(target=collective_times, args=(rank, args, store, queue)) for rank in range(2)]
    for process in ranks:
        process.start()
    results = {}
    for _ in args.batch_sizes:
        batch, reduce_us, gather_us = queue.get(timeout=300)
        results[batch] = (reduce_us, gather_us)
    for process in ranks:
        process.join()
    return results


def make_model(args: argparse.Namespace) -> str:
    """A config-only Llama folder (weights are random: load_format=dummy)."""
    from transformers import LlamaConfig

    folder = tempfile.mkdtemp(prefix="tp-comm-model-")
    LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    return folder


def decode_step_ms(model: str, batch: int, args: argparse.Namespace, **engine_args: Any) -> float:
    """Median wall time of execute_model over the decode steps of `batch` requests."""
    from pagedserve import LLM, SamplingParams
    from pagedserve.utils.default_model import default_model_path
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    llm = LLM(
        model,
        load_format="dummy",
        tokenizer=gguf_hf_folder(default_model_path()),
        kv_cache_memory="256MiB",
        max_model_len=256,
        **engine_args,
    )
    executor = llm.llm_engine.engine_core.executor
    execute, times = executor.execute_model, []

    def timed(scheduler_output: Any) -> Any:
        start = time.perf_counter()
        output = execute(scheduler_output)
        if not scheduler_output.scheduled_new_reqs and scheduler_output.total_num_scheduled_tokens == batch:
            times.append(time.perf_counter() - start)
        return output

    executor.execute_model = timed
    prompts = [{"prompt_token_ids": [100 + i] * 16} for i in range(batch)]
    llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True), use_tqdm=False
    )
    llm.llm_engine.engine_core.shutdown()
    return statistics.median(times) * 1e3


def main() -> None:
    args = parse_args()
    collectives = measure_collectives(args)
    model = make_model(args)
    print(
        f"Llama shape: {args.num_layers} layers, hidden {args.hidden_size}, vocab {args.vocab_size}; "
        f"gloo on 127.0.0.1, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    )
    per_step = 2 * args.num_layers + 1
    print(
        f"\n| batch | all-reduce [batch, {args.hidden_size}] µs | all-gather logits µs | comm per step "
        f"({per_step} all-reduces + 1 all-gather) ms | step tp=1 uni ms | step tp=1 mp ms | "
        "step tp=2 mp ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        reduce_us, gather_us = collectives[batch]
        comm_ms = (per_step * reduce_us + gather_us) / 1e3
        uni = decode_step_ms(model, batch, args)
        mp1 = decode_step_ms(model, batch, args, distributed_executor_backend="mp")
        mp2 = decode_step_ms(model, batch, args, tensor_parallel_size=2)
        print(
            f"| {batch} | {reduce_us:.0f} | {gather_us:.0f} | {comm_ms:.2f} | {uni:.2f} | {mp1:.2f} | "
            f"{mp2:.2f} |",
            flush=True,
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--num-layers", type=int, default=12)
    p.add_argument("--hidden-size", type=int, default=768)
    p.add_argument("--intermediate-size", type=int, default=2048)
    p.add_argument("--num-heads", type=int, default=12)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per configuration")
    p.add_argument("--iterations", type=int, default=200, help="timed calls per collective")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main())
