// The steady decode step's host-array helpers (decode_inputs.cpp), registered on the extension's module.
#pragma once

#include <torch/extension.h>

void register_decode_inputs(pybind11::module_& m);
