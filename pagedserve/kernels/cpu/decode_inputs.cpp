// A steady decode step's host arrays, one native call each (worker/input_batch.py): the same work as the
// input batch's numpy path, which every other step takes and which these calls must equal. Beside a CPU
// forward each numpy call of a step costs several microseconds (its code and data come back from memory);
// a decode step made a dozen of them to write one token per row and gather that row's inputs.
//
// Python ints and numpy int64 arrays in; the inputs are written into a buffer the caller keeps, whose
// tensors it made once (pybind11: no torch tensors to wrap per call).
// Every index is checked against the arrays it reads or writes: a bad row or position raises IndexError.
#include "decode_inputs.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// int64, C order, as input_batch.py keeps its arrays. NOTE: the arguments are registered noconvert: numpy
// would otherwise cast another integer dtype into a copy, and the writes would land in that copy.
using Int64Array = py::array_t<int64_t, py::array::c_style>;

void check_index(int64_t index, int64_t size, const char* what) {
  if (index < 0 || index >= size) {
    throw py::index_error(std::string(what) + " " + std::to_string(index) + " is outside [0, " +
                          std::to_string(size) + ")");
  }
}

void check_lengths(size_t n, size_t m, const char* what) {
  if (n != m) {
    throw py::value_error(std::string(what) + ": " + std::to_string(m) + " values for " + std::to_string(n) +
                          " rows");
  }
}

// Row rows[i] knows one more token, tokens[i], at position starts[i], and has computed[i] tokens computed:
// token_ids[row, start] = token, num_tokens[row] = start + 1, num_computed[row] = computed.
void write_next_tokens(Int64Array token_ids, Int64Array num_tokens, Int64Array num_computed,
                       const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& tokens, const std::vector<int64_t>& computed) {
  check_lengths(rows.size(), starts.size(), "starts");
  check_lengths(rows.size(), tokens.size(), "tokens");
  check_lengths(rows.size(), computed.size(), "computed");
  auto ids = token_ids.mutable_unchecked<2>();
  auto known = num_tokens.mutable_unchecked<1>();
  auto done = num_computed.mutable_unchecked<1>();
  for (size_t i = 0; i < rows.size(); ++i) {  // NOTE: every index checked before anything is written
    check_index(rows[i], std::min({ids.shape(0), known.shape(0), done.shape(0)}), "row");
    check_index(starts[i], ids.shape(1), "position");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    ids(rows[i], starts[i]) = tokens[i];
    known(rows[i]) = starts[i] + 1;
    done(rows[i]) = computed[i];
  }
}

// One token per row of `rows`: its id tokens[i] at position starts[i]. Writes, in `out` (int64, 1-D):
// input_ids [n], positions [n], seq_lens [n], slot_mapping [groups, n], then block_tables [groups, n, width],
// width being the longest table of the rows (table [groups, rows, max width], num_blocks [rows]); returns
// width. `out` must hold (3 + groups) * n + groups * n * (table's max width) values.
int64_t decode_inputs(Int64Array table, Int64Array num_blocks, Int64Array rows, const std::vector<int64_t>& starts,
                      const std::vector<int64_t>& tokens, int64_t block_size, Int64Array out) {
  const auto t = table.unchecked<3>();
  const auto blocks = num_blocks.unchecked<1>();
  const auto r = rows.unchecked<1>();
  const int64_t n = r.shape(0), groups = t.shape(0);
  check_lengths(n, starts.size(), "starts");
  check_lengths(n, tokens.size(), "tokens");
  if (block_size <= 0) throw py::value_error("block_size must be positive");
  const int64_t capacity = (3 + groups) * n + groups * n * t.shape(2);
  if (out.ndim() != 1 || out.shape(0) < capacity) {
    throw py::value_error("out holds " + std::to_string(out.size()) + " values; the inputs of " +
                          std::to_string(n) + " rows need " + std::to_string(capacity));
  }
  int64_t width = 0;
  for (int64_t i = 0; i < n; ++i) {
    check_index(r(i), std::min(t.shape(1), blocks.shape(0)), "row");
    width = std::max(width, blocks(r(i)));
  }
  if (width > t.shape(2)) {
    throw py::index_error("table width " + std::to_string(width) + " exceeds the table's " +
                          std::to_string(t.shape(2)));
  }
  int64_t* ids = out.mutable_data();
  int64_t* pos = ids + n;
  int64_t* lens = pos + n;
  int64_t* slot = lens + n;            // [groups, n]
  int64_t* tab = slot + groups * n;    // [groups, n, width]
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = starts[i], block = start / block_size;
    check_index(block, width, "block index");
    ids[i] = tokens[i];
    pos[i] = start;
    lens[i] = start + 1;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t j = 0; j < width; ++j) tab[(g * n + i) * width + j] = t(g, r(i), j);
      slot[g * n + i] = t(g, r(i), block) * block_size + start % block_size;
    }
  }
  return width;
}

}  // namespace

void register_decode_inputs(py::module_& m) {
  m.def("write_next_tokens", &write_next_tokens,
        "Each row's one new token at its position: token_ids[row, start] = token, num_tokens[row] = start + 1, "
        "num_computed[row] = computed.",
        py::arg("token_ids").noconvert(), py::arg("num_tokens").noconvert(), py::arg("num_computed").noconvert(),
        py::arg("rows"),
        py::arg("starts"), py::arg("tokens"), py::arg("computed"));
  m.def("decode_inputs", &decode_inputs,
        "A decode step's input_ids, positions, seq_lens, slot_mapping and block_tables for one token per row, "
        "written one after the other into out; returns the tables' width.",
        py::arg("table").noconvert(), py::arg("num_blocks").noconvert(), py::arg("rows").noconvert(),
        py::arg("starts"), py::arg("tokens"), py::arg("block_size"), py::arg("out").noconvert());
}
