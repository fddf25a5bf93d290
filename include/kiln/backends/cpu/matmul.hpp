// The CPU matrix product (kiln's GEMM on AVX-512 targets, Eigen's otherwise and for integers, over
// kiln's threads); its body is compiled once under separate compilation
// (backends/cpu/matmul_impl.hpp), so a translation unit that does not define it never instantiates
// either GEMM.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::detail {

/// a @ b on the CPU with torch.matmul's rules, for operands already validated (kiln::matmul, or a
/// traced graph): kiln's GEMM on AVX-512 (Eigen's otherwise, and for integers) over kiln's threads;
/// f16/bf16 compute in f32.
KILN_DECL Tensor cpu_matmul(const Tensor& a, const Tensor& b);

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cpu/matmul_impl.hpp"
#endif
