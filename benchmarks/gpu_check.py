"""The benchmark half of benchmarks/gpu_check.sh: pagedserve against HF transformers `generate` on
Llama-architecture configs with random weights (1B and 8B, `--load-format dummy`), the decode step at
batch 1 against the weights-bytes / HBM-bandwidth bound, and one table with the test results.

    python benchmarks/gpu_check.py --out DIR [--tests-xml DIR/gpu_tests.xml] [--tokenizer FOLDER]
    python benchmarks/gpu_check.py --out DIR --dry-run   # CPU: the same steps on a tiny config, tiny loads

Targets (issue 13, on the 1B config): output tokens/s >= 15x HF one request at a time and >= 3x HF
static batches; decode step at batch 1 <= 1.5x weights bytes / HBM bandwidth.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # pagedserve from this checkout
TARGETS = {"vs HF single": 15.0, "vs HF batch": 3.0, "decode step / bound": 1.5}


@dataclass(frozen=True)
class Workload:
    name: str  # config folder under benchmarks/configs
    num_prompts: int
    output_len: int
    input_len_max: int
    hf_single_prompts: int
    hf_batch_prompts: int
    hf_batch_size: int
    max_num_seqs: int


GPU_WORKLOADS = [
    Workload("llama-1b", 256, 128, 512, 4, 64, 32, 256),
    Workload("llama-8b", 128, 128, 512, 2, 32, 32, 128),
]
DRY_WORKLOADS = [Workload("llama-tiny", 6, 4, 24, 1, 2, 2, 4)]


def run_throughput(
    workload: Workload,
    out: str,
    tokenizer: str | None,
    dry: bool,
    batch1: bool,
    model: str | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """benchmarks/throughput.py in a fresh process (each engine gets the whole GPU); its --json figures.
    Its output is appended to OUT/gpu_check.log (few files: the device tool brings back at most 8).
    `model`: a GGUF file to read, or a config folder to give random weights (default: the workload's); `extra`: more
    throughput.py flags (they come last, so they override)."""
    tag = f"{workload.name}-{'batch1' if batch1 else 'throughput'}"
    result = os.path.join(tempfile.mkdtemp(prefix="gpu_check_"), f"{tag}.json")
    model = model or os.path.join(HERE, "configs", workload.name)
    source = ["--model", model, *(["--load-format", "dummy"] if os.path.isdir(model) else [])]
    args = [
        sys.executable,
        os.path.join(HERE, "throughput.py"),
        *source,
        "--input-len-min",
        "16",
        "--input-len-max",
        str(workload.input_len_max),
        "--json",
        result,
        "--max-model-len",
        "2048",
        "--dtype",
        "float32" if dry else "bfloat16",
    ]
    if not dry:  # HF's copy of the model and its generate run in the same process, after pagedserve
        args += ["--gpu-memory-utilization", "0.5"]
    if batch1:  # one request alone: every step after its prefill is a batch-1 decode step
        args += [
            "--num-prompts",
            "1",
            "--output-len",
            str(8 if dry else 256),
            "--max-num-seqs",
            "1",
            "--skip-hf",
        ]
    else:
        args += [
            "--num-prompts",
            str(workload.num_prompts),
            "--output-len",
            str(workload.output_len),
            "--max-num-seqs",
            str(workload.max_num_seqs),
            "--hf-single-prompts",
            str(workload.hf_single_prompts),
            "--hf-batch-prompts",
            str(workload.hf_batch_prompts),
            "--hf-batch-size",
            str(workload.hf_batch_size),
        ]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if dry:
        args += ["--kv-cache-memory", "16MiB"]
    args += list(extra)
    with open(os.path.join(out, "gpu_check.log"), "a") as log:
        command = f"[gpu_check] {tag}: {' '.join(args[1:])}"
        print(command, flush=True)
        log.write(command + "\n")
        log.flush()
        start = time.perf_counter()
        try:
            completed = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, timeout=600)
            code = str(completed.returncode)
        except subprocess.TimeoutExpired:
            code = "timeout after 600 s"
        log.write(f"[gpu_check] {tag}: exit {code} after {time.perf_counter() - start:.0f} s\n")
    if code != "0" or not os.path.exists(result):
        return {"error": f"{tag} failed ({code}), see gpu_check.log"}
    with open(result) as f:
        return json.load(f)


# Issue 43's steps: an 8B-shaped Q4_K_M file of random blocks against the 8B in bf16 (its resident bytes,
# output tok/s at 1 and 32 concurrent, the decode step against the packed bytes over the bandwidth), a GPTQ
# 8B config with random weights, and the 8B in bf16 with 8 GiB of its layers in host memory on a capped
# share of the GPU. The dry run does each on the tiny shapes on CPU.
CONCURRENT = 32
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def quantized_and_offload_rows(
    out: str, tokenizer: str | None, dry: bool, bandwidth: float, bf16_batch1: dict[str, Any]
) -> tuple[list[tuple[str, str, str, str]], dict[str, Any]]:
    """The rows and details of issue 43's steps (`bf16_batch1`: the main loop's batch-1 run of the 8B)."""
    from benchmarks.random_gguf import SHAPES, default_tokenizer, write_random_gguf
    from pagedserve.config.parallel import pipeline_stages
    from pagedserve.entrypoints.plan_weights import gguf_weights_bytes

    workload = DRY_WORKLOADS[0] if dry else GPU_WORKLOADS[1]
    shape = SHAPES["tiny" if dry else "llama-8b"]
    folder = tempfile.mkdtemp(prefix="gpu_check_q4km_")
    start = time.perf_counter()
    path = write_random_gguf(
        os.path.join(folder, f"{workload.name}-Q4_K_M.gguf"), shape, tokenizer or default_tokenizer()
    )
    written_s = time.perf_counter() - start
    device, float_bytes = ("cpu", 4) if dry else ("cuda", 2)
    resident = gguf_weights_bytes(path, 1, pipeline_stages(shape.layers, 1)[0], device, float_bytes).total
    concurrent = ("--skip-hf", "--max-num-seqs", str(CONCURRENT), "--num-prompts", str(2 * CONCURRENT))
    runs = {
        "q4km_batch1": run_throughput(workload, out, tokenizer, dry, batch1=True, model=path),
        "q4km_concurrent": run_throughput(
            workload, out, tokenizer, dry, batch1=False, model=path, extra=concurrent
        ),
        "bf16_batch1": bf16_batch1,
        "bf16_concurrent": run_throughput(workload, out, tokenizer, dry, batch1=False, extra=concurrent),
        "gptq_batch1": run_throughput(
            workload, out, tokenizer, dry, batch1=True, model=_gptq_config(workload)
        ),
        "offload_batch1": run_throughput(
            workload,
            out,
            tokenizer,
            dry,
            batch1=True,
            # NOTE: on the GPU a 0.15 share (12 GiB of an H100) cannot hold the 15 GiB of bf16 weights.
            extra=("--cpu-offload-gb", "0.0001")
            if dry
            else ("--cpu-offload-gb", "8", "--gpu-memory-utilization", "0.15"),
        ),
    }
    tok_s = {name: _tok_s(run) for name, run in runs.items()}
    name = workload.name
    rows = [
        (
            f"{name} Q4_K_M (random blocks, written in {written_s:.0f} s): resident weights",
            f"{resident / 2**30:.2f} GiB",
            "",
            "",
        ),
        (
            f"{name} Q4_K_M / bf16 output tok/s at 1",
            f"{tok_s['q4km_batch1']} / {tok_s['bf16_batch1']}",
            "",
            "",
        ),
        (
            f"{name} Q4_K_M / bf16 output tok/s at {CONCURRENT}",
            f"{tok_s['q4km_concurrent']} / {tok_s['bf16_concurrent']}",
            "",
            "",
        ),
    ]
    step_ms = runs["q4km_batch1"].get("pagedserve", {}).get("decode_step_ms_p50")
    bound_ms = resident / bandwidth * 1e3
    rows.append(
        (
            f"{name} Q4_K_M decode step at batch 1, p50 / (packed bytes / bandwidth = {bound_ms:.3f} ms)",
            f"{fmt(step_ms, ' ms')} = {fmt(step_ms / bound_ms if step_ms else None)}",
            "",
            "",
        )
    )
    rows.append(
        (f"{name} GPTQ 4-bit config, random weights: output tok/s at 1", tok_s["gptq_batch1"], "", "")
    )
    offload = "--cpu-offload-gb 0.0001" if dry else "--cpu-offload-gb 8 --gpu-memory-utilization 0.15"
    rows.append((f"{name} bf16 {offload}: output tok/s at 1", tok_s["offload_batch1"], "", ""))
    return rows, {"q4km_resident_bytes": resident, **runs}


def _tok_s(run: dict[str, Any]) -> str:
    if "error" in run:
        return str(run["error"])
    results = {r["name"]: r for r in run.get("results", [])}
    return fmt(results.get("pagedserve", {}).get("output_tokens_per_s"), "")


def _gptq_config(workload: Workload) -> str:
    """The workload's config.json with a GPTQ 4-bit quantization_config, in a fresh folder."""
    with open(os.path.join(HERE, "configs", workload.name, "config.json")) as f:
        config = json.load(f)
    folder = tempfile.mkdtemp(prefix="gpu_check_gptq_")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "quantization_config": GPTQ_CONFIG}, f)
    return folder


def hbm_bandwidth(dry: bool) -> tuple[float, str]:
    """Bytes/s of a large device-to-device copy (read + written), or the H200 datasheet's on CPU."""
    import torch

    if dry or not torch.cuda.is_available():
        return 4.8e12, "H200 datasheet (dry run)"
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    bandwidth = 2 * src.numel() * 10 / (time.perf_counter() - start)
    del src, dst
    torch.cuda.empty_cache()  # the engines run in child processes: leave them the memory
    return bandwidth, "measured copy"


def weights_bytes(workload: Workload, dtype_bytes: int) -> int:
    from transformers import AutoConfig

    from pagedserve.model_shape import ModelShape

    config = AutoConfig.from_pretrained(os.path.join(HERE, "configs", workload.name))
    return ModelShape.from_hf_config(config, "LlamaForCausalLM").num_parameters() * dtype_bytes


def test_summary(xml_path: str | None) -> tuple[str, str]:
    """(counts, verdict) of the pytest run: PASS only when some passed and none failed."""
    if not xml_path or not os.path.exists(xml_path):
        return "not run", "MISS"
    suite = ET.parse(xml_path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, failures, errors, skipped = (
        int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
    )
    passed, failed = total - failures - errors - skipped, failures + errors
    verdict = "MISS" if failed else "PASS" if passed else "n/a"
    return f"{passed} passed, {failed} failed, {skipped} skipped", verdict


def ratio(summary: dict[str, Any], peer_prefix: str) -> float | None:
    for name, values in summary.get("ratios", {}).items():
        if name.startswith(f"pagedserve / {peer_prefix}"):
            return values[1]  # output tokens/s
    return None


def verdict(value: float | None, target: float | None, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    if target is None:
        return ""
    return "PASS" if (value >= target if higher_is_better else value <= target) else "MISS"


def build_table(tests: tuple[str, str], rows: list[tuple[str, str, str, str]]) -> str:
    lines = [
        "| check | result | target | verdict |",
        "|---|---|---|---|",
        f"| gpu-marked tests + Triton kernel/graph tests | {tests[0]} | all pass | {tests[1]} |",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def fmt(value: float | None, unit: str = "x") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--tests-xml", default=None, help="pytest --junitxml of the GPU tests")
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer folder (default: the embedded SmolLM2's)"
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny config, tiny loads (checks the script)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bandwidth, source = hbm_bandwidth(args.dry_run)
    rows = [("HBM bandwidth", f"{bandwidth / 1e12:.2f} TB/s ({source})", "", "")]
    details: dict[str, Any] = {"bandwidth_bytes_per_s": bandwidth}
    for workload in DRY_WORKLOADS if args.dry_run else GPU_WORKLOADS:
        main_run = run_throughput(workload, args.out, args.tokenizer, args.dry_run, batch1=False)
        batch1 = run_throughput(workload, args.out, args.tokenizer, args.dry_run, batch1=True)
        details[workload.name] = {"throughput": main_run, "batch1": batch1}
        is_target = workload.name == "llama-1b" or args.dry_run
        results = {r["name"]: r for r in main_run.get("results", [])}
        ours = results.get("pagedserve", {}).get("output_tokens_per_s")
        rows.append(
            (
                f"{workload.name}: pagedserve output tok/s",
                fmt(ours, "") if "error" not in main_run else main_run["error"],
                "",
                "",
            )
        )
        for label, prefix, peer in (
            ("vs HF single", "HF single", "HF generate one at a time"),
            ("vs HF batch", "HF batch", "HF generate in static batches"),
        ):
            value = ratio(main_run, prefix)
            target = TARGETS[label] if is_target else None
            rows.append(
                (
                    f"{workload.name}: output tok/s, pagedserve / {peer}",
                    fmt(value),
                    f">= {target}x" if target else "",
                    verdict(value, target),
                )
            )
        step_ms = batch1.get("pagedserve", {}).get("decode_step_ms_p50")
        bound_ms = weights_bytes(workload, 4 if args.dry_run else 2) / bandwidth * 1e3
        step_ratio = step_ms / bound_ms if step_ms else None
        target = TARGETS["decode step / bound"] if is_target else None
        rows.append(
            (
                f"{workload.name}: decode step at batch 1, p50 / (weights / bandwidth = {bound_ms:.3f} ms)",
                f"{fmt(step_ms, ' ms')} = {fmt(step_ratio)}",
                f"<= {target}x" if target else "",
                verdict(step_ratio, target, higher_is_better=False),
            )
        )
    extra_rows, details["issue43"] = quantized_and_offload_rows(
        args.out,
        args.tokenizer,
        args.dry_run,
        bandwidth,
        details[(DRY_WORKLOADS[0] if args.dry_run else GPU_WORKLOADS[1]).name]["batch1"],
    )
    rows += extra_rows
    table = build_table(test_summary(args.tests_xml), rows)
    if args.dry_run:
        table = (
            "DRY RUN (CPU, tiny config): checks the script only; the figures and verdicts mean nothing\n"
            + table
        )
    print(table)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(details, f, indent=2)


if __name__ == "__main__":
    main()
