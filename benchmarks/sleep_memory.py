"""What sleep frees and what waking costs: start `python -m pagedserve.entrypoints.openai.api_server` (the
default model unless arguments follow), then for each level: the engine process's RSS awake (after one
completion), after POST /sleep, the seconds POST /wake_up takes, and that the same greedy completion
follows (docs/benchmarks.md, Sleep).

    python benchmarks/sleep_memory.py [--port 8124] [-- server args...]
"""

import argparse
import subprocess
import sys
import time

import httpx
import psutil
from first_answer import _healthy  # NOTE: benchmarks/ is on the path of a script run from it


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("server_args", nargs="*", help="passed to the server (after --)")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "pagedserve.entrypoints.openai.api_server", "--port", str(args.port)]
    server = subprocess.Popen(
        [*command, *args.server_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        while not _healthy(base):
            if server.poll() is not None or time.monotonic() > deadline:
                print("the server exited or did not serve within 600 s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        (engine,) = [c for c in psutil.Process(server.pid).children() if c.cmdline()[-1:] == ["EngineCore"]]
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        first = _complete(base, model)
        for level in (1, 2):
            awake = engine.memory_info().rss
            httpx.post(f"{base}/sleep", params={"level": level}, timeout=600).raise_for_status()
            asleep = engine.memory_info().rss
            start = time.monotonic()
            httpx.post(f"{base}/wake_up", timeout=600).raise_for_status()
            woke_s = time.monotonic() - start
            same = _complete(base, model) == first
            print(
                f"level {level}: engine RSS {awake / 2**20:.0f} MiB awake, {asleep / 2**20:.0f} MiB asleep "
                f"(-{(awake - asleep) / 2**20:.0f} MiB); woke in {woke_s:.2f} s; same completion after: {same}"
            )
    finally:
        server.terminate()
        server.wait(60)
    return 0


def _complete(base: str, model: str) -> str:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"{base}/v1/completions", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()["choices"][0]["text"]


if __name__ == "__main__":
    sys.exit(main())
