"""What the API server costs beside the model (docs/benchmarks.md, Frontend footprint): start
`python -m pagedserve.entrypoints.openai.api_server` (the default model unless arguments follow) and report
the seconds to GET /health 200 and to the first completion; then each process's RSS and peak RSS (VmHWM),
whether it holds torch (libtorch mapped), and the CPU it burns idle (user + system time over --idle-s
seconds, a few seconds after the last answer, as % of one core).

    python benchmarks/frontend_footprint.py [--port 8125] [--idle-s 20] [-- server args...]

With `-- --model NAME=PATH` it measures the pool's frontend before any model is loaded, then after one.
"""

import argparse
import subprocess
import sys
import time

import httpx
import psutil
from first_answer import _healthy  # NOTE: benchmarks/ is on the path of a script run from it
from sleep_memory import _complete

_SETTLE_S = 5.0  # after the last answer: the engine's last statistics, the OpenMP threads' spin


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8125)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("server_args", nargs="*", help="passed to the server (after --)")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "pagedserve.entrypoints.openai.api_server", "--port", str(args.port)]
    start = time.monotonic()
    server = subprocess.Popen(
        [*command, *args.server_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while not _healthy(base):
            if server.poll() is not None or time.monotonic() - start > 600:
                print("the server exited or did not serve within 600 s", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"healthy after {time.monotonic() - start:.1f} s")
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        frontend = psutil.Process(server.pid)
        if not _engines(frontend):  # a pool: nothing loaded yet
            _report("pool, no model loaded", frontend, args.idle_s)
        _complete(base, model)
        print(f"first completion answered after {time.monotonic() - start:.1f} s")
        _report("serving", frontend, args.idle_s)
    finally:
        server.terminate()
        server.wait(60)
    return 0


def _engines(frontend: psutil.Process) -> list[psutil.Process]:
    return [c for c in frontend.children() if c.cmdline()[-1:] == ["EngineCore"]]


def _report(state: str, frontend: psutil.Process, idle_s: float) -> None:
    time.sleep(_SETTLE_S)
    processes = {"frontend": frontend, **{f"engine {p.pid}": p for p in _engines(frontend)}}
    before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
    time.sleep(idle_s)
    for name, process in processes.items():
        busy = (sum(process.cpu_times()[:2]) - before[name]) / idle_s
        print(
            f"{state}: {name}: RSS {process.memory_info().rss / 2**20:.0f} MiB, peak {_peak_rss(process) / 2**20:.0f}"
            f" MiB, torch {'loaded' if _holds_torch(process) else 'not loaded'}, idle CPU {100 * busy:.2f}% of a core"
        )


def _peak_rss(process: psutil.Process) -> int:
    with open(f"/proc/{process.pid}/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    return int(kib) * 1024


def _holds_torch(process: psutil.Process) -> bool:
    return any("libtorch" in mapped.path for mapped in process.memory_maps())


if __name__ == "__main__":
    sys.exit(main())
