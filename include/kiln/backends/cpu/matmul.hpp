// The CPU matrix product (kiln's GEMM on AVX-512 targets, Eigen's otherwise and for integers, over
// kiln's threads); its body is compiled once under separate compilation
// (backends/cpu/matmul_impl.hpp), so a translation unit that does not define it never instantiates
// either GEMM.
#pragma once

#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::detail {

/// A matmul epilogue's hooks (compiled programs: backends/cpu/graph_exec.hpp). When kiln's GEMM
/// computes the product in its result dtype (f32, f64 on AVX-512 CPUs), cpu_matmul calls
/// `prepare(ctx, c, n)` with the result before any of it is computed (contiguous, its elements in
/// the result's order, though perhaps with its batch dims merged; n: its columns), then
/// `rows(ctx, row0, row1, col0, col1)` for each part that is final, on the thread that computed it,
/// while it is in cache (row r of the product flattened over its batch dims: elements
/// [r * n + col0, r * n + col1) of the result). Otherwise it calls neither: a caller whose
/// `prepare` ran knows every part went through `rows`.
struct MatmulEpilogue {
    void (*prepare)(void* ctx, const Tensor& c, std::int64_t n) = nullptr;
    void (*rows)(void* ctx, std::int64_t row0, std::int64_t row1, std::int64_t col0, std::int64_t col1) = nullptr;
    void* ctx = nullptr;
};

/// a @ b on the CPU with torch.matmul's rules, for operands already validated (kiln::matmul, or a
/// traced graph): kiln's GEMM on AVX-512 (Eigen's otherwise, and for integers) over kiln's threads;
/// f16/bf16 compute in f32. `epilogue`: see MatmulEpilogue.
KILN_DECL Tensor cpu_matmul(const Tensor& a, const Tensor& b, MatmulEpilogue* epilogue = nullptr);

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cpu/matmul_impl.hpp"
#endif
