// The steady decode step's host-array helpers (decode_inputs.cpp), registered on the extension's module.
#pragma once

// NOTE: pybind11 alone, not torch/extension.h: these helpers take no tensors, and torch's header costs
// ~20 s more per compile.
#include <pybind11/pybind11.h>

void register_decode_inputs(pybind11::module_& m);
