#!/usr/bin/env bash
# pagedserve against llama.cpp's llama-server on K-quant (and Q4_0, Q8_0) GGUF files of a random-weight Llama
# of Llama-3.2-1B's shape, made offline by make_kquant_model.py (the first run also builds llama.cpp: see
# build_llama_server.sh). Run it on an otherwise idle machine: llama-server's threads spin-wait.
#
#   benchmarks/kquant_serving.sh [--quant Q4_K_M|Q4_0|Q8_0] [--concurrency "1 8 32"] [--num-prompts N]
#
# Workloads (random token-id prompts, EOS ignored, 32 output tokens): concurrency 1: 4 prompts of 92-223
# tokens; 8: 16 prompts of 35-250; 32 (and any other): 32 prompts of 35-250. --num-prompts N overrides the
# counts (a quick check). For each concurrency each server is started alone, polled on /health, warmed by
# one request (~64 prompt tokens, 4 out), measured by serving.py (its process tree's peak RSS sampled
# meanwhile) and stopped; then one markdown table. Flags as in docs/benchmarks.md's "Serving against llama.cpp", both with 2 threads:
#   pagedserve serve FILE --kv-cache-memory 2GiB --max-model-len 2048 --no-enable-prefix-caching --max-num-seqs 32
#   llama-server -m FILE -np C -c C*1024 -t 2 -cb --no-cache-prompt --cache-ram 0
# Environment: PAGEDSERVE_ARGS (more pagedserve flags, e.g. "--kv-cache-dtype bfloat16"), PAGEDSERVE_PORT
# (8000), LLAMA_PORT (8080), OUT_DIR (the runs' JSON; default a new folder under /tmp).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
QUANT=Q4_K_M
CONCURRENCY="1 8 32"
NUM_PROMPTS=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quant) QUANT="$2"; shift 2 ;;
        --concurrency) CONCURRENCY="$2"; shift 2 ;;
        --num-prompts) NUM_PROMPTS="$2"; shift 2 ;;
        *) sed -n '2,17p' "$0" >&2; exit 2 ;;
    esac
done
export HF_HUB_OFFLINE=1
P_PORT="${PAGEDSERVE_PORT:-8000}"
L_PORT="${LLAMA_PORT:-8080}"
OUT="${OUT_DIR:-$(mktemp -d /tmp/kquant_serving.XXXXXX)}"
mkdir -p "$OUT"

LLAMA_SERVER="$(bash "$HERE/build_llama_server.sh")"
MODEL="$(python "$HERE/make_kquant_model.py" --quant "$QUANT" | tail -n 1)"
echo "model: $MODEL; runs in $OUT" >&2

SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT

# start_server PORT LOG COMMAND...: in its own process group (stopped whole), ready when /health says 200.
start_server() {
    local port="$1" log="$2"
    shift 2
    if curl -s -o /dev/null "http://127.0.0.1:$port/health"; then
        echo "port $port is taken: set PAGEDSERVE_PORT / LLAMA_PORT" >&2
        exit 1
    fi
    setsid "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1200); do
        if [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" == 200 ]]; then
            # warm-up, not measured: a prefill of ~64 tokens and a few decode steps
            curl -sf -o /dev/null "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"prompt\": \"$(printf 'hello %.0s' {1..64})\", \"max_tokens\": 4, \"temperature\": 0}"
            return
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "server died; its log: $log" >&2; tail -n 20 "$log" >&2; exit 1; }
        sleep 0.5
    done
    echo "server not healthy after 600 s; its log: $log" >&2
    exit 1
}

# measure NAME PORT CONCURRENCY SERVING_ARGS...
measure() {
    local name="$1" port="$2" c="$3"
    shift 3
    python "$HERE/kquant_report.py" measure --pid "$SERVER_PID" --out "$OUT/$name-c$c.json" -- \
        --base-url "http://127.0.0.1:$port" --name "$name" --max-concurrency "$c" --ignore-eos --seed 0 "$@" \
        || echo "$name at concurrency $c: serving.py reported failures" >&2
    stop_server
}

for C in $CONCURRENCY; do
    case "$C" in
        1) N=4; LO=92; HI=223 ;;
        8) N=16; LO=35; HI=250 ;;
        *) N=32; LO=35; HI=250 ;;
    esac
    LOAD=(--num-prompts "${NUM_PROMPTS:-$N}" --input-len-min "$LO" --input-len-max "$HI" --output-len-max 32)
    echo "concurrency $C: pagedserve" >&2
    # shellcheck disable=SC2086  # PAGEDSERVE_ARGS is a list of flags
    start_server "$P_PORT" "$OUT/pagedserve-c$C.log" python -m pagedserve serve "$MODEL" --host 127.0.0.1 \
        --port "$P_PORT" --kv-cache-memory 2GiB --max-model-len 2048 --no-enable-prefix-caching \
        --max-num-seqs 32 ${PAGEDSERVE_ARGS:-}
    measure pagedserve "$P_PORT" "$C" "${LOAD[@]}"
    echo "concurrency $C: llama.cpp" >&2
    start_server "$L_PORT" "$OUT/llama.cpp-c$C.log" "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 \
        --port "$L_PORT" -np "$C" -c "$((C * 1024))" -t 2 -cb --no-cache-prompt --cache-ram 0
    measure llama.cpp "$L_PORT" "$C" "${LOAD[@]}"
done

echo
echo "$QUANT, $(basename "$MODEL"), $(date -u +%Y-%m-%d):"
python "$HERE/kquant_report.py" table "$OUT"/*-c*.json
