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
pip download --no-deps --no-binary :all: llama-cpp-python -d "$CACHE/download" >&2
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
# AMX only where this machine runs tile instructions: virtual machines often report AMX without granting its
# tile state, and ggml's AMX kernel then dies of SIGILL (tilezero in tinygemm_kernel_amx). The probe asks the
# kernel for the tile state and runs a tile instruction; without AMX every other ISA of this CPU is used
# (GCC's explicit -mno-* flags win over -march=native whatever their order). pagedserve takes the same
# decision at run time (kernels/cpu/gguf_kquant_amx.cpp), so both use AMX or neither does.
PROBE="$(mktemp -d)"
cat > "$PROBE/amx.c" <<'C'
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 1;
  /* palette 1, tile 0: 16 rows of 64 bytes. NOTE: a static initializer: GCC drops stores to a local array
     that only ldtilecfg reads, and the garbage config then faults. */
  static const unsigned char config[64] = {[0] = 1, [16] = 64, [48] = 16};
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_release();
  return 0;
}
C
AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if cc -mamx-tile -O2 "$PROBE/amx.c" -o "$PROBE/amx" 2>/dev/null && "$PROBE/amx"; then
    AMX_FLAGS=""
    echo "This machine runs AMX: llama.cpp is built with it." >&2
fi
rm -rf "$PROBE"
cmake -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$AMX_FLAGS" -DCMAKE_CXX_FLAGS="$AMX_FLAGS" -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build --target llama-server llama-quantize -j2 >&2
touch "$STAMP"
echo "$BIN"
