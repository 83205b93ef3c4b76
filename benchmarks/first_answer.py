"""Seconds from `pagedserve serve` to its first answer: start the server (default model unless arguments
follow), poll GET /health until 200, then time one completion. Run it with a fresh TORCH_EXTENSIONS_DIR to
see what a first serve on a new machine costs (docs/benchmarks.md, Native kernels built at install).

    TORCH_EXTENSIONS_DIR=$(mktemp -d) python benchmarks/first_answer.py [--port 8123] [-- serve args...]
"""

import argparse
import subprocess
import sys
import time

import httpx


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--limit-s", type=float, default=900.0, help="give up after this many seconds")
    parser.add_argument("serve_args", nargs="*", help="passed to `pagedserve serve` (after --)")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    start = time.monotonic()
    server = subprocess.Popen(["pagedserve", "serve", "--port", str(args.port), *args.serve_args])
    try:
        while not _healthy(base):
            if server.poll() is not None or time.monotonic() - start > args.limit_s:
                print(f"the server exited or did not serve within {args.limit_s:g} s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        healthy_s = time.monotonic() - start
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        reply = httpx.post(f"{base}/v1/completions", json=body, timeout=args.limit_s)
        reply.raise_for_status()
        answered_s = time.monotonic() - start
        print(f"healthy after {healthy_s:.1f} s, first completion answered after {answered_s:.1f} s")
        print(f"completion: {reply.json()['choices'][0]['text']!r}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


def _healthy(base: str) -> bool:
    """GET /health answers 200 (it answers 503 while the engine loads; nothing before the port is bound)."""
    try:
        return httpx.get(f"{base}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
