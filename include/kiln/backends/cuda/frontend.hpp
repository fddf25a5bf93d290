// The CUDA front doors for statements: an expression assigned to a tensor, an eager op, or a
// reduction of an expression lowers to a small graph, fused and run by the CUDA graph program,
// and cached per statement type and guards (dtypes, device, shapes, scalar values).
#pragma once

#include <cstring>
#include <memory>
#include <shared_mutex>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/passes/pipeline.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::cuda::detail {

/// Distinct tensor leaves of an expression (by view identity), in the order lowering meets them,
/// and its scalars.
template <class E>
void statement_leaves(const E& e, std::vector<Tensor>& ts, std::vector<double>& scalars) {
    if constexpr (std::is_same_v<E, expr::TensorLeaf>) {
        for (const Tensor& t : ts)
            if (t.is_same(e.t)) return;
        ts.push_back(e.t);
    } else if constexpr (std::is_same_v<E, expr::ScalarLeaf>) {
        scalars.push_back(e.s.value);
    } else {
        std::apply([&](const auto&... a) { (statement_leaves(a, ts, scalars), ...); }, e.args);
    }
}

/// The run-time parts of an expression's nodes that its type does not fix (cast targets, compute
/// and result dtypes), as key text.
template <class E>
void statement_attrs(const E& e, std::string& key) {
    if constexpr (!std::is_same_v<E, expr::TensorLeaf> && !std::is_same_v<E, expr::ScalarLeaf>) {
        key += std::to_string(static_cast<int>(e.attr)) + std::to_string(static_cast<int>(e.info.ct)) +
               std::to_string(static_cast<int>(e.info.dtype)) + ".";
        std::apply([&](const auto&... a) { (statement_attrs(a, key), ...); }, e.args);
    }
}

/// Whether any leaf of e lives on a CUDA device.
template <class E>
bool on_cuda(const E& e) {
    if constexpr (std::is_same_v<E, expr::TensorLeaf>) return e.t.defined() && !e.t.is_traced() && e.t.device().is_cuda();
    else if constexpr (std::is_same_v<E, expr::ScalarLeaf>) return false;
    else return std::apply([](const auto&... a) { return (false || ... || on_cuda(a)); }, e.args);
}

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

/// Compiled statements of one kind (Tag: the expression type), by guard text.
template <class Tag>
struct StatementCache {
    std::shared_mutex mu;
    std::unordered_map<std::string, std::shared_ptr<CudaGraphProgram>> programs;
    static StatementCache& get() {
        static StatementCache c;
        return c;
    }
};

/// Runs a statement: `build(tracer, leaf)` records its nodes (leaf(t) gives an input's node) and
/// returns the result node. Compiled once per Tag and key.
template <class Tag, class Build>
Tensor run_statement(const std::vector<Tensor>& inputs, const std::string& key, std::string_view op,
                     const std::source_location& loc, Build&& build, const Tensor* into = nullptr) {
    const int device = common_device(inputs, op, loc);
    auto& cache = StatementCache<Tag>::get();
    const std::string full = key + "|" + guard_text(inputs);
    std::shared_ptr<CudaGraphProgram> prog;
    {
        std::shared_lock lock(cache.mu);
        if (auto it = cache.programs.find(full); it != cache.programs.end()) prog = it->second;
    }
    if (!prog) {
        trace::Tracer tr(nullptr, true);
        std::vector<int> nodes;
        for (const Tensor& t : inputs) nodes.push_back(tr.node_of(tr.input(t)));
        auto leaf = [&](const Tensor& t) {
            for (std::size_t k = 0; k < inputs.size(); ++k)
                if (inputs[k].is_same(t)) return nodes[k];
            throw InternalError("kiln: CUDA statement leaf not among its inputs");
        };
        const int out = build(tr, leaf);
        ir::Graph g = tr.graph();
        g.outputs = {out};
        ir::Graph opt = passes::run_pipeline(g, {});
        const int res = opt.outputs[0];
        if (opt[res].kind != ir::Kind::elementwise && opt[res].kind != ir::Kind::reduce && opt[res].kind != ir::Kind::arg_reduce &&
            opt[res].kind != ir::Kind::matmul) {
            // the statement simplified to one of its inputs (or a view): a statement always
            // makes a new contiguous tensor, so copy it (an identity cast the passes never see)
            ir::Node copy;
            copy.kind = ir::Kind::elementwise;
            copy.op = ops::op_id<ops::Cast>;
            copy.dtype = copy.attr = opt[res].dtype;
            copy.ct = compute_dtype(opt[res].dtype);
            copy.shape = opt[res].shape;
            copy.in = {res};
            opt.outputs[0] = opt.add(std::move(copy));
        }
        fuse::Plan plan = fuse::plan(opt);
        auto made = std::make_shared<CudaGraphProgram>(std::move(opt), std::move(plan), device);
        std::unique_lock lock(cache.mu);
        prog = cache.programs.emplace(full, std::move(made)).first->second;
    }
    return prog->run(inputs, into)[0];
}

/// An expression statement on CUDA: one fused kernel (per group of its graph).
/// `into` (optional): a contiguous CUDA tensor of e's shape and dtype that receives the result.
template <class E>
Tensor eval_expr(const E& e, const std::source_location& loc, const Tensor* into = nullptr) {
    std::vector<Tensor> ts;
    std::vector<double> scalars;
    statement_leaves(e, ts, scalars);
    std::string key;
    statement_attrs(e, key);
    for (double s : scalars) key += number_text(s) + ",";
    return run_statement<E>(
        ts, key, "eval", loc, [&](trace::Tracer& tr, auto& leaf) { return trace::detail::lower(tr, e, e.info.ct, leaf); },
        into);
}

/// A reduction (or arg-reduction) of an expression on CUDA, fused with its prologue.
template <class Tag, class E>
Tensor eval_reduce(const E& e, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                   const Shape& out_shape, DType out_dtype, std::string_view op, const std::source_location& loc) {
    std::vector<Tensor> ts;
    std::vector<double> scalars;
    statement_leaves(e, ts, scalars);
    std::string key = std::to_string(static_cast<int>(kind)) + "/" + std::to_string(static_cast<int>(rk)) + "/" +
                      std::to_string(arg_max) + "/" + std::to_string(mask) + "/" + std::to_string(keepdim) + ":";
    statement_attrs(e, key);
    for (double s : scalars) key += number_text(s) + ",";
    key += "/" + std::to_string(static_cast<int>(out_dtype));
    return run_statement<std::pair<Tag, E>>(ts, key, op, loc, [&](trace::Tracer& tr, auto& leaf) {
        const int in = trace::detail::lower(tr, e, e.info.ct, leaf);
        return tr.graph().add(trace::detail::reduce_node(kind, rk, arg_max, mask, keepdim, out_shape, out_dtype, loc, in));
    });
}

/// One table op as its own kernel (eager CUDA): operands in order, tensors or scalars.
inline Tensor run_op(ops::OpId op, DType dtype, DType ct, DType attr, const Shape& shape, const std::vector<Tensor>& tensors,
                     const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars) {
    std::string key = std::to_string(op) + "/" + std::to_string(static_cast<int>(dtype)) + "/" + std::to_string(static_cast<int>(ct)) +
                      "/" + std::to_string(static_cast<int>(attr)) + ":";
    for (int t : operand_is_tensor) key += t ? "t" : "s";
    for (double s : scalars) key += number_text(s) + ",";
    struct EagerOp {};
    return run_statement<EagerOp>(tensors, key, ops::op_name(op), std::source_location::current(), [&](trace::Tracer& tr, auto&) {
        ir::Node n;
        n.kind = ir::Kind::elementwise;
        n.op = op;
        n.dtype = dtype;
        n.ct = ct;
        n.attr = attr;
        n.shape = shape;
        std::size_t nt = 0, ns = 0;
        for (int is_t : operand_is_tensor) {
            if (is_t) n.in.push_back(tr.graph().inputs[nt++]);
            else n.in.push_back(tr.scalar(scalars[ns++], ct));
        }
        return tr.graph().add(std::move(n));
    });
}

/// Writes `value` (already out's shape and dtype, contiguous) into out's memory.
inline void copy_contiguous_into(const Tensor& out, const Tensor& value) {
    if (out.numel() == 0) return;
    const int dev = out.device().index;
    use_device(dev);
    check(driver().memcpy_dtod_async(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(out.data_ptr())),
                                     static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(value.data_ptr())), out.nbytes(),
                                     current_stream(dev)),
          "cuMemcpyDtoDAsync");
}

}  // namespace kiln::cuda::detail
