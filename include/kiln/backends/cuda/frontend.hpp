// The CUDA front doors for statements: an expression assigned to a tensor, an eager op, or a
// reduction of an expression lowers to a small graph, fused and run by the CUDA graph program,
// and cached per statement type and guards (dtypes, device, shapes, scalar values).
#pragma once

#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/function_ref.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::cuda::detail {

class CudaGraphProgram;

/// The one CUDA device every tensor is on; DeviceError naming the op and devices otherwise.
KILN_DECL int common_device(const std::vector<Tensor>& ts, std::string_view op, const std::source_location& loc);
/// Guard text of a statement's inputs: dtype, device and shape each (layouts are handled per launch).
KILN_DECL std::string guard_text(const std::vector<Tensor>& ts);
/// The exact bits of a number, as text (for cache keys).
KILN_DECL std::string number_text(double v);

/// Compiled statements of one kind (one expression type, or one eager op), by guard text.
struct StatementCache;

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
