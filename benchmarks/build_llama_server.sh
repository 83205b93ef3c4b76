#!/usr/bin/env bash
# Build llama.cpp's native llama-server once, the peer of benchmarks/serving.py, with its llama-quantize
# (benchmarks/kquant_serving.sh makes K-quant files with it).
#
# The sources come from the llama-cpp-python source distribution on PyPI (vendor/llama.cpp inside it);
# everything lives in a cache folder outside the repository, and none of it is ever committed. The build
# takes 5-10 minutes of both cores; later runs only print the binary's path.
#
#   benchmarks/build_llama_server.sh          # prints .../llama.cpp/build/bin/llama-server
#   PAGEDSERVE_PEER_CACHE=/somewhere benchmarks/build_llama_server.sh
#
# Then, on an otherwise idle machine (its threads spin-wait: any other load slows it by orders of magnitude):
#   "$BIN" -m MODEL.gguf --host 127.0.0.1 --port 8080 -np 32 -c 32768 -t 2 -cb --no-cache-prompt --cache-ram 0
set -euo pipefail

CACHE="${PAGEDSERVE_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagedserve/peers}"
SRC="$CACHE/llama.cpp"
BIN="$SRC/build/bin/llama-server"
STAMP="$SRC/build/.pagedserve-built"

if [[ -f "$STAMP" && -x "$BIN" && -x "$SRC/build/bin/llama-quantize" ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE/download"
echo "Downloading the llama-cpp-python source distribution into $CACHE/download ..." >&2
pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d "$CACHE/download" >&2
SDIST="$(ls -t "$CACHE"/download/llama_cpp_python-*.tar.gz | head -n 1)"

# NOTE: unpack, then build in the final folder: build/bin's binaries find their shared libraries there.
UNPACK="$(mktemp -d "$CACHE/unpack.XXXXXX")"
trap 'rm -rf "$UNPACK"' EXIT
tar -xzf "$SDIST" -C "$UNPACK"
rm -rf "$SRC"
mv "$UNPACK"/llama_cpp_python-*/vendor/llama.cpp "$SRC"

echo "Building llama-server in $SRC (5-10 minutes) ..." >&2
cd "$SRC"
# Without LLAMA_USE_PREBUILT_UI=OFF the build tries to download its web UI, and fails offline.
# NOTE: every ISA of this CPU but AMX. Virtual machines often report AMX without granting its tile state, and
# ggml's AMX kernel then dies of SIGILL (tilezero in tinygemm_kernel_amx); on a Xeon that does grant it
# (2026-12-05, llama.cpp of llama-cpp-python 0.3.36) its AMX weight repacking crashed loading a Q4_K_M file
# (SIGSEGV; fine with --no-repack, which also turns off its other repacked kernels). GCC's explicit -mno-*
# flags win over -march=native whatever their order.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build --target llama-server llama-quantize -j2 >&2
touch "$STAMP"
echo "$BIN"
