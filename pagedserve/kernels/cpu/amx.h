// What the AMX kernels share (gguf_kquant_amx.cpp: INT8 tiles for the K-quants; gguf_block_amx.cpp: BF16
// tiles for Q4_0/Q4_1/Q8_0 on integer or float activations): the tile state, one tile shape, the tile
// instructions, the L2-sized passes, and the switch (PAGEDSERVE_CPU_AMX).
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec_int.h"

#if defined(__AMX_TILE__) && defined(PAGEDSERVE_VEC_AVX512)
#define PAGEDSERVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace amx {

// Whether AMX kernels may run: switched on (gguf_set_amx, default on), built with AMX, and the process got
// the tile state. Defined in gguf_kquant_amx.cpp.
bool usable();

#if defined(PAGEDSERVE_AMX)
constexpr int64_t kRows = 16, kRowBytes = 64, kTileBytes = kRows * kRowBytes;

// Linux hands a process AMX's 8 KiB tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for the
// XTILEDATA feature, Linux 5.16+); a tile instruction without it dies of SIGILL. Asked once, for every thread.
inline bool tile_state_granted() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // asm/prctl.h; the kernel's xfeature number
  static const bool granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// One thread's tiles, all 8 of 16 rows x 64 bytes, configured for the scope (tile state is per thread: each
// at::parallel_for chunk holds its own). NOTE: the configuration static, so every byte is in place when
// ldtilecfg reads it: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes, and it could leave a
// local's other stores for later.
class Tiles {
 public:
  Tiles() {
    static constexpr TileConfig kConfig = [] {
      TileConfig c;
      for (int tile = 0; tile < 8; ++tile) c.bytes_per_row[tile] = kRowBytes, c.rows[tile] = kRows;
      return c;
    }();
    _tile_loadconfig(&kConfig);
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// The tile instructions, the tile a template argument. NOTE: not GCC 12's intrinsics, which take it as a literal
// only, and whose tile store clobbers all memory: that keeps the float accumulators on the stack (a load and a
// store around every multiply-add); store names what it writes. `load` tells the compiler it reads no
// memory: a caller that just wrote what it loads puts a compiler barrier between.
template <int kTile>
inline void load(const void* at, int64_t stride) {
  asm volatile("tileloadd (%[at],%[stride],1), %%tmm%c[tile]" ::[tile] "i"(kTile), [at] "r"(at), [stride] "r"(stride));
}

template <int kTile>
inline void zero() {
  asm volatile("tilezero %%tmm%c[tile]" ::[tile] "i"(kTile));
}

// 16-row chunks of activation rows per pass over a thread's weight groups, each row `row_bytes` of tiles:
// the pass's tiles (`budget` bytes) stay in L2 while every group takes them. NOTE: all rows at once (each
// group reading the whole activations from L3) ran the K-quant kernel at 60% of the speed at batch 1024.
inline int64_t chunks_per_pass(int64_t row_bytes, int64_t budget) {
  return std::max<int64_t>(1, budget / (row_bytes * kRows));
}

// A tile's 16 rows of 16 int32 or float32 lanes.
template <typename Lanes>
using Rows = Lanes[kRows];

template <int kTile, typename Lanes>
inline void store(Rows<Lanes>& rows) {
  static_assert(sizeof(Lanes) == kRowBytes, "a tile row is 64 bytes");
  asm volatile("tilestored %%tmm%c[tile], (%[at],%[stride],1)"
               : "=m"(rows)
               : [tile] "i"(kTile), [at] "r"(rows), [stride] "r"(kRowBytes));
}
#endif

}  // namespace amx
