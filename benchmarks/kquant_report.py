"""kquant_serving.sh's helper: measure one server under serving.py's load, then one table of all runs.

python benchmarks/kquant_report.py measure --pid PID --out RUN.json -- SERVING_PY_ARGS...
    runs benchmarks/serving.py against one server, sampling the resident memory of the process tree
    rooted at PID meanwhile (psutil, every 0.2 s); writes serving.py's result with peak_rss_mib added
python benchmarks/kquant_report.py table RUN.json...
    prints one markdown table: per concurrency, each metric for pagedserve, llama.cpp and their ratio
"""

import argparse
import json
import os
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = [  # (row title, key, format)
    ("output tok/s", "output_throughput", "{:.2f}"),
    ("median TPOT (ms)", "median_tpot_ms", "{:.2f}"),
    ("median TTFT (ms)", "median_ttft_ms", "{:.1f}"),
    ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}"),
]


def tree_rss(root: psutil.Process) -> int:
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:  # exited between the listing and the read
            pass
    return total


def measure(args: argparse.Namespace) -> int:
    root = psutil.Process(args.pid)
    command = [
        sys.executable,
        os.path.join(HERE, "serving.py"),
        *args.serving_args,
        "--result-json",
        args.out,
    ]
    load = subprocess.Popen(command)
    peak = 0
    while load.poll() is None:
        peak = max(peak, tree_rss(root))
        time.sleep(0.2)
    if not os.path.exists(args.out):
        return load.returncode or 1
    with open(args.out, encoding="utf-8") as file:
        result = json.load(file)
    for summary in result["results"].values():
        summary["peak_rss_mib"] = peak / 2**20
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=2)
    return load.returncode


def table(args: argparse.Namespace) -> int:
    runs: dict[int, dict[str, dict]] = {}  # concurrency -> server name -> (args, summary)
    for path in args.runs:
        with open(path, encoding="utf-8") as file:
            result = json.load(file)
        ((name, summary),) = result["results"].items()
        runs.setdefault(result["args"]["max_concurrency"], {})[name] = (result["args"], summary)
    print("| concurrency | workload | metric | pagedserve | llama.cpp | pagedserve / llama.cpp |")
    print("|---:|---|---|---:|---:|---:|")
    for concurrency, servers in sorted(runs.items()):
        run_args = next(iter(servers.values()))[0]
        workload = (
            f"{run_args['num_prompts']} prompts of {run_args['input_len_min']}-{run_args['input_len_max']} "
            f"tokens, {run_args['output_len_max']} out"
        )
        for title, key, fmt in METRICS:
            cells = [
                fmt.format(servers[n][1][key]) if n in servers else "-" for n in ("pagedserve", "llama.cpp")
            ]
            ratio = "-"
            if len(servers) == 2 and servers["llama.cpp"][1][key]:
                ratio = f"{servers['pagedserve'][1][key] / servers['llama.cpp'][1][key]:.2f}x"
            print(f"| {concurrency} | {workload} | {title} | {cells[0]} | {cells[1]} | {ratio} |")
    for concurrency, servers in sorted(runs.items()):
        for name, (_, summary) in servers.items():
            if summary["failed_requests"]:
                print(
                    f"\n{name} at concurrency {concurrency}: {summary['failed_requests']:.0f} failed requests"
                )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("measure")
    one.add_argument("--pid", type=int, required=True, help="The server's process (its children count too).")
    one.add_argument("--out", required=True)
    one.add_argument("serving_args", nargs=argparse.REMAINDER, help="After --: serving.py's flags.")
    both = commands.add_parser("table")
    both.add_argument("runs", nargs="+")
    args = parser.parse_args()
    if args.command == "measure":
        args.serving_args = args.serving_args[1:] if args.serving_args[:1] == ["--"] else args.serving_args
        return measure(args)
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
