// Matrix products with torch.matmul's rules (1-D operands, batch broadcasting, transposes as layout):
// on the CPU through kiln's GEMM on AVX-512 (backends/cpu/gemm.hpp) or Eigen's, on CUDA through cuBLASLt (ops/matmul_impl.hpp).
#pragma once

#include <source_location>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/evaluate.hpp"

namespace kiln {

/// Matrix product with torch.matmul's rules: 1-D operands are vectors, leading dims broadcast.
/// Floating and integer dtypes; f16/bf16 compute in f32. On the CPU it runs kiln's GEMM (AVX-512) or Eigen's across kiln's threads.
KILN_DECL Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc = std::source_location::current());

/// matmul of expressions: operands are evaluated first (the product is a library call).
template <class A, class B>
    requires((TensorExpr<A> || TensorExpr<B>) && Operand<A> && Operand<B>)
Tensor matmul(const A& a, const B& b, std::source_location loc = std::source_location::current()) {
    return matmul(Tensor(eval(a, loc)), Tensor(eval(b, loc)), loc);
}

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/ops/matmul_impl.hpp"
#endif
