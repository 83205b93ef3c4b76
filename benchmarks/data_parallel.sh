#!/usr/bin/env bash
# Data parallelism on CPU: `pagedserve serve --data-parallel-size 2 --cpu-threads 1` (two replicas, one
# thread each) against the same server at --data-parallel-size 1 (one replica, one thread), the same
# workload at 32 requests in flight (benchmarks/serving.py, its peer column), on the embedded default
# model unless MODEL is set. The point is that the replicas overlap: with one core each, dp=2 should serve
# close to twice the tokens. Run it on an otherwise idle machine with at least 2 cores.
#
#   benchmarks/data_parallel.sh [serving.py flags, e.g. --num-prompts 64]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HF_HUB_OFFLINE=1
MODEL_ARGS=(${MODEL:+"$MODEL"})
COMMON=(--kv-cache-memory 1GiB --max-model-len 1024 --cpu-threads 1 --no-enable-prefix-caching --disable-log-stats)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start() {  # start PORT FLAGS...: its own process group, ready when /health answers 200
    local port="$1"
    shift
    setsid pagedserve serve "${MODEL_ARGS[@]}" --port "$port" "${COMMON[@]}" "$@" >"/tmp/dp_bench_$port.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 600); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/health" && return 0
        sleep 1
    done
    echo "the server on port $port did not start: /tmp/dp_bench_$port.log" >&2
    exit 1
}

start 8101 --data-parallel-size 2
start 8102 --data-parallel-size 1
python "$HERE/serving.py" --base-url http://127.0.0.1:8101 --name "dp=2" \
    --peer-base-url http://127.0.0.1:8102 --peer-name "dp=1" \
    --num-prompts 64 --max-concurrency 32 --input-len-min 32 --input-len-max 256 --output-len-max 64 \
    --ignore-eos "$@"
