// The LM head of a greedy step: the packed GGUF matmul (gguf_packed_matmul.cpp) with each activation row's
// argmax folded in. Reading a batch-64 step's 12.6 MB of logits again after the matmul took about 1 ms beside
// a CPU forward, as much as the rest of the step's host work (docs/benchmarks.md); folded in, it is read from
// L1 a group of 16 rows at a time.
#include "argmax_lanes.h"
#include "gguf_blocks.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

using namespace gguf;  // NOLINT(build/namespaces): the shared declarations of gguf_blocks.h

namespace {

// The LM head's argmax folded into its matmul: once a thread has written a group of 16 rows for every
// activation row, it adds them to its own lanes (argmax_lanes.h) while they are in L1; the threads' lanes are
// merged at the end. NOTE: reading a batch-64 step's 12.6 MB of logits again after the matmul took about
// 1 ms beside a CPU forward, as much as the rest of the step's host work (docs/benchmarks.md).
class FusedArgmax {
 public:
  FusedArgmax(const float* y, int64_t batch, int64_t rows)
      : y_(y), batch_(batch), rows_(rows),
        lanes_(at::get_num_threads(), std::vector<argmax::Lanes>(batch * kTileRegisters)) {
    for (int lane = 0; lane < vec::kLanes; ++lane) lane_offsets_[lane] = lane;
  }

  void operator()(int64_t g) {
    std::vector<argmax::Lanes>& lanes = lanes_[at::get_thread_num()];
    const int64_t row = g * kTileRows, valid = std::min(kTileRows, rows_ - row);
    alignas(64) float padded[kTileRows];
    for (int64_t b = 0; b < batch_; ++b) {
      const float* values = y_ + b * rows_ + row;
      if (valid < kTileRows) {  // the last group's missing rows never win: -inf, and only greater replaces
        std::fill(padded, padded + kTileRows, -INFINITY);
        std::copy(values, values + valid, padded);
        values = padded;
      }
      for (int j = 0; j < kTileRegisters; ++j) {
        const auto first = static_cast<int32_t>(row + j * vec::kLanes);
        lanes[b * kTileRegisters + j].add(vec::load(values + j * vec::kLanes), lane_offsets_ + first);
      }
    }
  }

  at::Tensor tokens() const {
    at::Tensor out = at::empty({batch_}, at::kLong);
    int64_t* ids = out.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch_; ++b) {
      argmax::Best best;
      for (const auto& lanes : lanes_)
        for (int j = 0; j < kTileRegisters; ++j) best.merge(lanes[b * kTileRegisters + j]);
      ids[b] = best.nan ? argmax::first_nan(y_ + b * rows_, rows_) : best.index;
    }
    return out;
  }

 private:
  const float* y_;
  int64_t batch_, rows_;
  std::vector<std::vector<argmax::Lanes>> lanes_;  // [thread][activation row * kTileRegisters + register]
  argmax::Ints lane_offsets_;
};

}  // namespace

// gguf_packed_matmul's y, and each row's argmax (int64 [B]: the first of equal values, the first NaN if any,
// as torch.argmax): the LM head of a greedy step. Folded into the matmul a group at a time where the path
// takes it (FusedArgmax), else read from y after it.
std::tuple<at::Tensor, at::Tensor> gguf_packed_matmul_greedy(const at::Tensor& x, const at::Tensor& packed, int64_t type,
                                                             int64_t rows, int64_t activation_bits) {
  const at::Tensor xc = checked_packed_input(x, packed, type, rows, activation_bits);
  TORCH_CHECK(rows > 0 && rows <= INT32_MAX, "gguf_packed_matmul_greedy takes 1 to 2^31 - 1 rows, got ", rows);
  at::Tensor y = at::empty({xc.size(0), rows}, xc.options());
  if (xc.size(0) == 0) return {y, at::empty({0}, xc.options().dtype(at::kLong))};
  FusedArgmax fused(y.data_ptr<float>(), xc.size(0), rows);
  const bool folded = packed_matmul_into(xc, packed.data_ptr<uint8_t>(), type, rows, activation_bits, y,
                                         [&fused](int64_t g) { fused(g); });
  return {y, folded ? fused.tokens() : argmax::greedy_argmax(y)};
}

TORCH_LIBRARY_FRAGMENT(pagedserve, m) {
  m.def("gguf_packed_matmul_greedy(Tensor x, Tensor packed, int type, int rows, int activation_bits) -> (Tensor, Tensor)",
        gguf_packed_matmul_greedy);
}
