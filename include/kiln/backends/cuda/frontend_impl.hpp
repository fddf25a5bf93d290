// The CUDA statement front door's compiled part: a statement's graph is optimized, fused and
// compiled once per statement cache and key (backends/cuda/frontend.hpp has the templates).
#pragma once
// Included at the end of kiln/backends/cuda/frontend.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/passes/pipeline.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::cuda::detail {

struct StatementCache {
    std::shared_mutex mu;
    std::unordered_map<std::string, std::shared_ptr<CudaGraphProgram>> programs;
};
template <class Tag>
StatementCache& statement_cache() {
    static StatementCache c;
    return c;
}

KILN_DECL int common_device(const std::vector<Tensor>& ts, std::string_view op, const std::source_location& loc) {
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

KILN_DECL std::string guard_text(const std::vector<Tensor>& ts) {
    std::string k;
    for (const Tensor& t : ts) {
        k += std::to_string(static_cast<int>(t.dtype())) + "@" + std::to_string(t.device().index) + "[";
        for (auto d : t.shape()) k += std::to_string(d) + ",";
        k += "]";
    }
    return k;
}
KILN_DECL std::string number_text(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return std::to_string(bits);
}


/// Runs a statement: `build(tracer, leaf)` records its nodes (leaf(t) gives an input's node) and
/// returns the result node. Compiled once per Tag and key.
KILN_DECL Tensor run_statement(StatementCache& cache, const std::vector<Tensor>& inputs, const std::string& key, std::string_view op,
                               const std::source_location& loc, const StatementBuild& build, const Tensor* into) {
    const int device = common_device(inputs, op, loc);
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
        auto leaf_of = [&](const Tensor& t) {
            for (std::size_t k = 0; k < inputs.size(); ++k)
                if (inputs[k].is_same(t)) return nodes[k];
            throw InternalError("kiln: CUDA statement leaf not among its inputs");
        };
        const int out = build(tr, StatementLeaf(leaf_of));
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
        fuse::Limits lim;
        lim.column_rows = false;  // as CudaBackend::adjust_limits
        fuse::Plan plan = fuse::plan(opt, lim);
        auto made = std::make_shared<CudaGraphProgram>(std::move(opt), std::move(plan), device);
        std::unique_lock lock(cache.mu);
        prog = cache.programs.emplace(full, std::move(made)).first->second;
    }
    return prog->run(inputs, into)[0];
}

/// One table op as its own kernel (eager CUDA): operands in order, tensors or scalars.
KILN_DECL Tensor run_op(ops::OpId op, DType dtype, DType ct, DType attr, const Shape& shape, const std::vector<Tensor>& tensors,
                     const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars) {
    std::string key = std::to_string(op) + "/" + std::to_string(static_cast<int>(dtype)) + "/" + std::to_string(static_cast<int>(ct)) +
                      "/" + std::to_string(static_cast<int>(attr)) + ":";
    for (int t : operand_is_tensor) key += t ? "t" : "s";
    for (double s : scalars) key += number_text(s) + ",";
    struct EagerOp {};
    return run_statement(statement_cache<EagerOp>(), tensors, key, ops::op_name(op), std::source_location::current(),
                         [&](trace::Tracer& tr, const StatementLeaf&) {
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
KILN_DECL void copy_contiguous_into(const Tensor& out, const Tensor& value) {
    if (out.numel() == 0) return;
    const int dev = out.device().index;
    use_device(dev);
    check(driver().memcpy_dtod_async(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(out.data_ptr())),
                                     static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(value.data_ptr())), out.nbytes(),
                                     current_stream(dev)),
          "cuMemcpyDtoDAsync");
}

/// The distinct tensors of f (by view identity) in walk order, its scalars, and key text for
/// what the guards do not cover: the tree's structure, which distinct tensor each leaf is, and
/// each op's cast target, compute and result dtypes.
inline void statement_of(const expr::Flat& f, std::vector<Tensor>& ts, std::vector<double>& scalars, std::string& key) {
    using K = expr::Flat::Kind;
    key.reserve(key.size() + 6 * f.items.size() + 8 * static_cast<std::size_t>(f.scalars) + 2);
    auto byte = [&](int v) { key.push_back(static_cast<char>(v)); };
    auto number = [&](std::size_t v) {  // 7 bits a byte, the last byte below 128
        for (; v >= 128; v >>= 7) byte(static_cast<int>(128 | (v & 127)));
        byte(static_cast<int>(v));
    };
    for (const expr::Flat::Item& it : f.items) {  // a few bytes per item: kind, then what it names
        byte(static_cast<int>(it.kind));
        if (it.kind == K::tensor) {
            std::size_t k = 0;
            while (k < ts.size() && !ts[k].is_same(*it.tensor)) ++k;
            if (k == ts.size()) ts.push_back(*it.tensor);
            number(k);
        } else if (it.kind == K::scalar) {
            scalars.push_back(it.value);
            byte(static_cast<int>(it.parent_ct));
        } else {
            number(static_cast<std::size_t>(it.op));
            byte(static_cast<int>(it.attr));
            byte(static_cast<int>(it.info->ct));
            byte(static_cast<int>(it.info->dtype));
        }
    }
    byte('|');
    for (double s : scalars) key.append(reinterpret_cast<const char*>(&s), sizeof s);  // exact bits
}

struct ExprStatements {};
struct ReduceStatements {};

KILN_DECL Tensor eval_expr(const expr::Flat& f, const std::source_location& loc, const Tensor* into) {
    std::vector<Tensor> ts;
    std::vector<double> scalars;
    std::string key;
    statement_of(f, ts, scalars, key);
    return run_statement(
        statement_cache<ExprStatements>(), ts, key, "eval", loc,
        [&](trace::Tracer& tr, const StatementLeaf& leaf) { return trace::detail::lower(tr, f, leaf); }, into);
}

KILN_DECL Tensor eval_reduce(const expr::Flat& f, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                             const Shape& out_shape, DType out_dtype, std::string_view op, const std::source_location& loc) {
    std::vector<Tensor> ts;
    std::vector<double> scalars;
    std::string key = std::string(op) + "/" + std::to_string(static_cast<int>(kind)) + "/" + std::to_string(static_cast<int>(rk)) + "/" +
                      std::to_string(arg_max) + "/" + std::to_string(mask) + "/" + std::to_string(keepdim) + ":";
    statement_of(f, ts, scalars, key);
    key += "/" + std::to_string(static_cast<int>(out_dtype));
    return run_statement(statement_cache<ReduceStatements>(), ts, key, op, loc, [&](trace::Tracer& tr, const StatementLeaf& leaf) {
        const int in = trace::detail::lower(tr, f, leaf);
        return tr.graph().add(trace::detail::reduce_node(kind, rk, arg_max, mask, keepdim, out_shape, out_dtype, loc, in));
    });
}

}  // namespace kiln::cuda::detail
