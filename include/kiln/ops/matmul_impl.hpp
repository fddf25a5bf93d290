// kiln::matmul's compiled part: torch.matmul's shape rules, then the trace, cuBLASLt or the CPU GEMM.
#pragma once
// Included at the end of kiln/ops/matmul.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include "kiln/backends/cpu/matmul.hpp"
#include "kiln/backends/cuda/matmul.hpp"
#include "kiln/ir/shapes.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

KILN_DECL Tensor matmul(const Tensor& a_in, const Tensor& b_in, std::source_location loc) {
    if (autograd::detail::grad_mode() && (a_in.requires_grad() || b_in.requires_grad()))
        return autograd::detail::matmul(a_in, b_in, loc);
    const ir::MatmulShapes sh = ir::matmul_shapes(a_in.shape(), b_in.shape());
    if (!sh.ok()) detail::fail<ShapeError>("matmul", sh.error, loc);
    const DType dt = promote_types(a_in.dtype(), b_in.dtype());
    if (dt == DType::boolean) detail::fail<DTypeError>("matmul", "not supported for bool operands", loc);
    if (trace::recorded(a_in) || trace::recorded(b_in)) return trace::record_matmul(a_in, b_in, sh.result, dt, loc);
    if (a_in.device().is_cuda() || b_in.device().is_cuda()) return cuda::matmul(a_in, b_in, cuda::Epilogue{}, nullptr, loc);
    return detail::cpu_matmul(a_in, b_in);
}

}  // namespace kiln
