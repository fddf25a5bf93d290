// The CUDA front doors for statements: an expression assigned to a tensor, an eager op, or a
// reduction of an expression lowers to a small graph, fused and run by the CUDA graph program,
// and cached per statement type and guards (dtypes, device, shapes, scalar values).
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/function_ref.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::cuda::detail {

class CudaGraphProgram;

/// The one CUDA device every tensor is on; DeviceError naming the op and devices otherwise.
inline int common_device(const std::vector<Tensor>& ts, std::string_view op, const std::source_location& loc) {
    int dev = -1;
    for (const Tensor& t : ts) {
        if (!t.device().is_cuda() || (dev >= 0 && t.device().index != dev)) {
            std::string devs;
            for (const Tensor& u : ts) devs += (devs.empty() ? "" : ", ") + u.device().str();
            kiln::detail::fail<DeviceError>(op, "expected all tensors on one CUDA device, got " + devs, loc);
        }
        dev = t.device().index;
    }
    if (dev < 0) kiln::detail::fail<DeviceError>(op, "no CUDA tensor among the operands", loc);
    return dev;
}

/// Guard text of a statement's inputs: dtype, device and shape each (layouts are handled per launch).
inline std::string guard_text(const std::vector<Tensor>& ts) {
    std::string k;
    for (const Tensor& t : ts) {
        k += std::to_string(static_cast<int>(t.dtype())) + "@" + std::to_string(t.device().index) + "[";
        for (auto d : t.shape()) k += std::to_string(d) + ",";
        k += "]";
    }
    return k;
}
inline std::string number_text(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return std::to_string(bits);
}

/// Compiled statements of one kind (one expression type, or one eager op), by guard text.
struct StatementCache {
    std::shared_mutex mu;
    std::unordered_map<std::string, std::shared_ptr<CudaGraphProgram>> programs;
};
template <class Tag>
StatementCache& statement_cache() {
    static StatementCache c;
    return c;
}

/// A statement's node for an input tensor (one of the statement's inputs).
using StatementLeaf = trace::detail::LeafNode;
/// Records a statement's nodes into the tracer (leaf(t) gives an input's node); returns the result
/// node. Called only during run_statement.
using StatementBuild = FunctionRef<int(trace::Tracer&, const StatementLeaf&)>;

/// Runs a statement: `build` records its nodes; compiled once per cache and key, and run with
/// `inputs` (into `into` when given: a CUDA tensor of the result's shape and dtype).
KILN_DECL Tensor run_statement(StatementCache& cache, const std::vector<Tensor>& inputs, const std::string& key, std::string_view op,
                               const std::source_location& loc, const StatementBuild& build, const Tensor* into = nullptr);

/// An expression statement on CUDA: one fused kernel (per group of its graph).
/// `into` (optional): a contiguous CUDA tensor of f's shape and dtype that receives the result.
KILN_DECL Tensor eval_expr(const expr::Flat& f, const std::source_location& loc, const Tensor* into = nullptr);

/// A reduction (or arg-reduction) of an expression on CUDA, fused with its prologue.
KILN_DECL Tensor eval_reduce(const expr::Flat& f, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                             const Shape& out_shape, DType out_dtype, std::string_view op, const std::source_location& loc);

/// One table op as its own kernel (eager CUDA): operands in order, tensors or scalars.
KILN_DECL Tensor run_op(ops::OpId op, DType dtype, DType ct, DType attr, const Shape& shape, const std::vector<Tensor>& tensors,
                        const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars);

/// Writes `value` (already out's shape and dtype, contiguous) into out's memory.
KILN_DECL void copy_contiguous_into(const Tensor& out, const Tensor& value);

}  // namespace kiln::cuda::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cuda/frontend_impl.hpp"
#endif
