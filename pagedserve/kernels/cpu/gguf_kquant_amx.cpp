// AMX-INT8 for the K-quant matmul's whole 16-row chunks of activation rows (gguf_kquant_matmul.cpp has the
// packed layout and takes the other rows, and every row where the build or the process has no AMX).
//
// One `tdpbsud` multiplies a tile of signed activation bytes (16 activation rows x K columns) by a tile of
// unsigned weight bytes (K/4 column quads x 16 weight rows x 4) into 16 x 16 int32 dots. The packed values
// already are that B layout (quad c is B's row c, lane r weight row r's 4 bytes), except Q4_K's nibble pairs,
// unpacked to a byte each once per group. K is one sub-block (32 columns, Q6_K 16): the weight scales change
// there, so each sub-block's dots are stored and scaled by the VNNI path's own float epilogue (gguf_kquant.h,
// add_sub_block): the same exact integers through the same float operations, so both paths give the same bits.
// A sub-block of 16 activation rows is one tile op (15-bit activations: two) where AVX-512 VNNI takes 16 x 8
// `vpdpbusd` (16 x 16); what is left is the epilogue's 4 vector operations per activation row (15 bits: 6),
// and on the Xeon this was measured on the tile ops hardly overlap with them: 1.2-2x the VNNI path's speed
// (benchmarks/kquant_kernels.py), not the tile op's 10x.
#include <torch/library.h>

#include <atomic>

#include "gguf_kquant.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(PAGEDSERVE_VEC_AVX512)
#define PAGEDSERVE_KQUANT_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace gguf::kquant {
namespace {

// Batches below this stay on the VNNI path. NOTE: 16, a whole chunk: at batch 16 AMX was already 1.0-1.7x as
// fast (by type and activation bits; benchmarks/kquant_kernels.py).
constexpr int64_t kMinAmxBatch = 16;

std::atomic<bool> amx_switched_on{true};  // gguf_set_amx: PAGEDSERVE_CPU_AMX, read in gguf_ops.py

#if defined(PAGEDSERVE_KQUANT_AMX)
static_assert(kTileRegisters == 1, "AMX builds have AVX-512: a tile row of 16 int32 dots is one Quads");

// Linux hands a process AMX's 8 KiB tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for the
// XTILEDATA feature, Linux 5.16+); a tile instruction without it dies of SIGILL. Asked once, for every thread.
bool tile_state_granted() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // asm/prctl.h; the kernel's xfeature number
  static const bool granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// Tiles, two sets (k = 0, 1) so a sub-block's dots are started before the previous sub-block's are stored
// and scaled (15-25% faster than one set, which waited on every tile op's result): k and 2 + k the high and
// low bytes' dots (16 x 16 int32), 4 + k the activation bytes (16 rows x K; the high bytes, then the low),
// 6 + k the weights (K/4 quads x 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig tile_config(uint16_t k) {
  TileConfig c;
  for (int dots = 0; dots < 4; ++dots) c.bytes_per_row[dots] = 64, c.rows[dots] = kTileRows;
  for (int bytes : {4, 5}) c.bytes_per_row[bytes] = k, c.rows[bytes] = kTileRows;
  for (int weights : {6, 7}) c.bytes_per_row[weights] = kQuadBytes, c.rows[weights] = k / 4;
  return c;
}

// NOTE: static, so every byte is in place when ldtilecfg reads it: GCC 12's _tile_loadconfig tells the
// compiler it reads 8 bytes, and it could leave a local's other stores for later.
const TileConfig& config_for(int64_t type) {
  static constexpr TileConfig kSubBlocksOf32 = tile_config(32), kSubBlocksOf16 = tile_config(16);
  return tile_format(type).columns_per_scale() == 32 ? kSubBlocksOf32 : kSubBlocksOf16;
}

// A Q4_K group's values, a byte each (AMX has no nibble operands): quad c of super-block s at 4096 s + 64 c.
void unpack_nibbles(const uint8_t* t, int64_t supers, uint8_t* out) {
  constexpr int64_t kTileBytes = tile_format(Q4_K).bytes(), kPairs = 32;
  for (int64_t s = 0; s < supers; ++s, t += kTileBytes, out += 4096)
    for (int64_t p = 0; p < kPairs; ++p)
      for (int64_t lane = 0; lane < kQuadBytes; ++lane) {
        const uint8_t both = t[kQuadBytes * p + lane];
        out[2 * kQuadBytes * p + lane] = both & 0xF;
        out[2 * kQuadBytes * p + kQuadBytes + lane] = both >> 4;
      }
  // NOTE: load_tile tells the compiler it reads no memory: these stores must not wait past it.
  asm volatile("" ::: "memory");
}

// The tile instructions, the tile a template argument. NOTE: not GCC 12's intrinsics, which take it as a literal
// only, and whose tile store clobbers all memory: that keeps the float accumulators on the stack (a load and a
// store around every multiply-add); store_dots names what it writes.
template <int kTile>
inline void load_tile(const void* at, int64_t stride) {
  asm volatile("tileloadd (%[at],%[stride],1), %%tmm%c[tile]" ::[tile] "i"(kTile), [at] "r"(at), [stride] "r"(stride));
}

template <int kTile>
inline void zero_tile() {
  asm volatile("tilezero %%tmm%c[tile]" ::[tile] "i"(kTile));
}

// c += a b: signed activation bytes a, unsigned weight bytes b.
template <int kC, int kA, int kB>
inline void dot_tiles() {
  asm volatile("tdpbsud %%tmm%c[b], %%tmm%c[a], %%tmm%c[c]" ::[c] "i"(kC), [a] "i"(kA), [b] "i"(kB));
}

using Dots = Quads[kTileRows][1];  // a dots tile: 16 activation rows of 16 weight rows' int32

template <int kTile>
inline void store_dots(Dots& dots) {
  asm volatile("tilestored %%tmm%c[tile], (%[at],%[stride],1)"
               : "=m"(dots)
               : [tile] "i"(kTile), [at] "r"(dots), [stride] "r"(int64_t{sizeof dots[0]}));
}

// What a chunk of 16 activation rows multiplies: the group's tiles and their values (a byte each: super-block
// s's at values + s * values_stride), the chunk's first activation row.
struct Operands {
  const uint8_t *t, *values;
  int64_t values_stride;
  const int8_t *high, *low;
  int64_t cols;
};

// Starts the dots of sub-block i (of the row's sub-blocks, in order) in tile set kSet.
template <int64_t kType, bool kSplit, int kSet>
__attribute__((always_inline)) inline void start_dots(const Operands& o, int64_t i) {
  constexpr TileFormat f = tile_format(kType);
  constexpr int64_t kK = f.columns_per_scale();
  const int64_t s = i / f.sub_blocks, first_quad = i % f.sub_blocks * kK / 4;
  load_tile<6 + kSet>(o.values + s * o.values_stride + kQuadBytes * first_quad, kQuadBytes);
  load_tile<4 + kSet>(o.high + i * kK, o.cols);
  zero_tile<kSet>();
  dot_tiles<kSet, 4 + kSet, 6 + kSet>();
  if constexpr (kSplit) {
    load_tile<4 + kSet>(o.low + i * kK, o.cols);
    zero_tile<2 + kSet>();
    dot_tiles<2 + kSet, 4 + kSet, 6 + kSet>();
  }
}

// The dots tile set kSet computed: 8 bits the high bytes', 15 bits 128 high + low.
template <bool kSplit, int kSet>
__attribute__((always_inline)) inline void finish_dots(Dots& dots) {
  if constexpr (kSplit) {
    alignas(64) Dots high, low;
    store_dots<kSet>(high);
    store_dots<2 + kSet>(low);
#pragma GCC unroll 16
    for (int64_t b = 0; b < kTileRows; ++b) dots[b][0] = (high[b][0] << 7) + low[b][0];
  } else {
    store_dots<kSet>(dots);
  }
}

// Group g's rows of y for activation rows [first, first + 16): each sub-block's dots start before the
// previous one's are scaled, in the other tile set.
template <int64_t kType, bool kSplit>
void amx_chunk(const ByteActivations& a, int64_t first, const Operands& o, int64_t rows, int64_t g, float* y) {
  constexpr TileFormat f = tile_format(kType);
  Vec acc[kTileRows][1];
#pragma GCC unroll 16  // NOTE: as add_sub_block's loops (gguf_kquant.h); a loop left whole also became memset
  for (auto& row : acc) row[0] = Vec{};
  SuperScales scales{};  // set at each super-block's first sub-block
  const auto add = [&](int64_t i, const Dots& dots) __attribute__((always_inline)) {
    const int64_t sub = i % f.sub_blocks;
    const uint8_t* t = o.t + i / f.sub_blocks * f.bytes();
    if (sub == 0 && first == 0) prefetch_tile(t, f.bytes());
    if (sub == 0) scales = super_scales<kType>(t);
    add_sub_block<kType, kTileRows>(t, scales, sub, i * f.columns_per_scale(), a, first, dots, acc);
  };
  alignas(64) Dots dots;
  const int64_t sub_blocks = o.cols / kSuper * f.sub_blocks;  // even: 8 or 16 a super-block
  start_dots<kType, kSplit, 0>(o, 0);
  for (int64_t i = 0; i < sub_blocks; i += 2) {
    start_dots<kType, kSplit, 1>(o, i + 1);
    finish_dots<kSplit, 0>(dots);
    add(i, dots);
    if (i + 2 < sub_blocks) start_dots<kType, kSplit, 0>(o, i + 2);
    finish_dots<kSplit, 1>(dots);
    add(i + 1, dots);
  }
  store_group<kTileRows>(acc, first, rows, g, y);
}

template <int64_t kType, bool kSplit>
void amx_group(const ByteActivations& a, int64_t amx_rows, const uint8_t* packed, int64_t rows, int64_t cols,
               int64_t g, uint8_t* unpacked, float* y) {
  constexpr TileFormat f = tile_format(kType);
  const int64_t supers = cols / kSuper;
  const uint8_t* t = packed + g * supers * f.bytes();
  if constexpr (f.nibbles) unpack_nibbles(t, supers, unpacked);
  for (int64_t first = 0; first < amx_rows; first += kTileRows) {
    const Operands o{t, f.nibbles ? unpacked : t, f.nibbles ? 4096 : f.bytes(), a.high.data() + first * cols,
                     kSplit ? a.low.data() + first * cols : nullptr, cols};
    amx_chunk<kType, kSplit>(a, first, o, rows, g, y);
  }
}

template <int64_t kType>
void amx_group(const ByteActivations& a, int64_t amx_rows, const uint8_t* packed, int64_t rows, int64_t cols,
               int64_t g, uint8_t* unpacked, float* y) {
  if (a.low.empty()) return amx_group<kType, false>(a, amx_rows, packed, rows, cols, g, unpacked, y);
  amx_group<kType, true>(a, amx_rows, packed, rows, cols, g, unpacked, y);
}
#else
bool tile_state_granted() { return false; }  // no AMX-INT8 in this build
#endif

bool gguf_set_amx(bool enabled) {
  amx_switched_on = enabled;
  return enabled && tile_state_granted();
}

}  // namespace

int64_t amx_rows(int64_t batch) {
  const bool usable = batch >= kMinAmxBatch && amx_switched_on && tile_state_granted();
  return usable ? batch / kTileRows * kTileRows : 0;
}

#if defined(PAGEDSERVE_KQUANT_AMX)
AmxTiles::AmxTiles(int64_t type, int64_t cols, int64_t amx_rows) : type_(type), cols_(cols), amx_rows_(amx_rows) {
  if (amx_rows_ == 0) return;
  _tile_loadconfig(&config_for(type));
  if (tile_format(type).nibbles) unpacked_.resize(cols / kSuper * 4096);
}

AmxTiles::~AmxTiles() {
  if (amx_rows_ > 0) _tile_release();
}

void AmxTiles::multiply(const ByteActivations& a, const uint8_t* packed, int64_t rows, int64_t g, float* y) {
  if (amx_rows_ == 0) return;
  switch (type_) {
    case Q4_K: return amx_group<Q4_K>(a, amx_rows_, packed, rows, cols_, g, unpacked_.data(), y);
    case Q5_K: return amx_group<Q5_K>(a, amx_rows_, packed, rows, cols_, g, unpacked_.data(), y);
    default: return amx_group<Q6_K>(a, amx_rows_, packed, rows, cols_, g, unpacked_.data(), y);
  }
}
#else
// amx_rows is 0 in this build: no tiles to configure, no rows to multiply.
AmxTiles::AmxTiles(int64_t type, int64_t cols, int64_t amx_rows) : type_(type), cols_(cols), amx_rows_(amx_rows) {}
AmxTiles::~AmxTiles() = default;
void AmxTiles::multiply(const ByteActivations&, const uint8_t*, int64_t, int64_t, float*) {}
#endif

}  // namespace gguf::kquant

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  // Whether the K-quant matmul takes whole 16-row chunks of activation rows on AMX (default on); returns
  // whether it now does: false when switched off, or the build or the process has no AMX.
  m.def("gguf_set_amx(bool enabled) -> bool", gguf::kquant::gguf_set_amx);
}
