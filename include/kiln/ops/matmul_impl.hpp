// kiln::matmul's compiled part: torch.matmul's shape rules, then the trace, cuBLASLt or the CPU GEMM.
#pragma once
// Included at the end of kiln/ops/matmul.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include "kiln/backends/cpu/matmul.hpp"
#include "kiln/backends/cuda/matmul.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

KILN_DECL Tensor matmul(const Tensor& a_in, const Tensor& b_in, std::source_location loc) {
    if (a_in.rank() == 0 || b_in.rank() == 0)
        detail::fail<ShapeError>("matmul", "both operands need at least 1 dim, got " + a_in.shape().str() + " and " +
                                               b_in.shape().str(), loc);
    const DType dt = promote_types(a_in.dtype(), b_in.dtype());
    if (dt == DType::boolean) detail::fail<DTypeError>("matmul", "not supported for bool operands", loc);
    Tensor a = a_in.rank() == 1 ? a_in.unsqueeze(0) : a_in;
    Tensor b = b_in.rank() == 1 ? b_in.unsqueeze(1) : b_in;
    const std::int64_t m = a.size(-2), k = a.size(-1), k2 = b.size(-2), n = b.size(-1);
    if (k != k2)
        detail::fail<ShapeError>("matmul", "shapes " + a_in.shape().str() + " and " + b_in.shape().str() +
                                               " cannot be multiplied (" + std::to_string(k) + " != " + std::to_string(k2) + ")", loc);
    Shape ba, bb, batch;
    for (int d = 0; d < a.rank() - 2; ++d) ba.push_back(a.size(d));
    for (int d = 0; d < b.rank() - 2; ++d) bb.push_back(b.size(d));
    if (!detail::try_broadcast(ba, bb, batch))
        detail::fail<ShapeError>("matmul", "batch dims " + ba.str() + " and " + bb.str() + " do not broadcast (shapes " +
                                               a_in.shape().str() + " and " + b_in.shape().str() + ")", loc);
    if (a_in.is_traced() || b_in.is_traced()) {
        Shape out = batch;
        if (a_in.rank() > 1) out.push_back(m);
        if (b_in.rank() > 1) out.push_back(n);
        return trace::record_matmul(a_in, b_in, out, dt, loc);
    }
    if (a_in.device().is_cuda() || b_in.device().is_cuda()) return cuda::matmul(a_in, b_in, cuda::Epilogue{}, nullptr, loc);
    return detail::cpu_matmul(a_in, b_in);
}

}  // namespace kiln
