// Tensor methods that copy or convert data: contiguous, clone, to, copy_, fill_, and moves between devices.
#pragma once

#include <cstdlib>

#include "kiln/backends/cuda/copy.hpp"
#include "kiln/core/config.hpp"
#include "kiln/ops/evaluate.hpp"
#include "kiln/ops/elementwise.hpp"

// The definitions (Tensor::copy_, clone, contiguous, to, cpu, cuda, fill_) are in
// ops/copy_impl.hpp, compiled once in separate mode; core/tensor.hpp declares them.

#if KILN_HEADER_ONLY
#include "kiln/ops/copy_impl.hpp"
#endif
