// Tracing: tracing tensors, the active tracer that records every op as an IR node, and graph breaks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln {

/// Thrown by a traced function compiled with fullgraph = true when it would break the graph.
class GraphBreakError : public Error { using Error::Error; };

namespace trace {

class Tracer;

/// A value of the graph being traced: the node that computes it in the current segment, or,
/// after a graph break ran that segment, the concrete tensor it turned out to be.
struct Value {
    std::uint64_t tracer = 0;  ///< id of the tracer that made it (ids are never reused, addresses are)
    int segment = 0;  ///< segment the node id belongs to
    int node = -1;
    Tensor concrete;  ///< set when a graph break materialized the value
};

/// One graph break: where it happened and why.
struct Break {
    std::source_location loc;
    std::string reason;
};

/// Records ops into a graph. A graph break runs the graph recorded so far (through `run_segment`,
/// supplied by kiln::compile), binds every live traced value to its concrete tensor and starts a
/// new segment whose inputs are those tensors.
class Tracer {
public:
    /// Runs a segment: the graph and the concrete tensors of its inputs; returns its outputs.
    using SegmentRunner = std::function<std::vector<Tensor>(const ir::Graph&, const std::vector<Tensor>&)>;

    Tracer(SegmentRunner run, bool fullgraph) : run_(std::move(run)), fullgraph_(fullgraph), id_(next_id()) {}
    Tracer(const Tracer&) = delete;
    Tracer& operator=(const Tracer&) = delete;

    /// The tracer of this thread's traced call, or nullptr.
    static Tracer*& active() {
        thread_local Tracer* t = nullptr;
        return t;
    }

    std::uint64_t id() const { return id_; }
    ir::Graph& graph() { return graph_; }
    const std::vector<Tensor>& segment_inputs() const { return inputs_; }
    const std::vector<Break>& breaks() const { return breaks_; }
    int segment() const { return segment_; }

    /// A new graph input bound to `concrete` (a call argument or a value from an earlier segment).
    Tensor input(const Tensor& concrete) {
        ir::Node n;
        n.kind = ir::Kind::input;
        n.dtype = concrete.dtype();
        n.shape = concrete.shape();
        n.index = static_cast<int>(inputs_.size());
        const int id = graph_.add(std::move(n));
        graph_.inputs.push_back(id);
        inputs_.push_back(concrete);
        return make(id);
    }

    /// A tracing tensor for node `id` of the current segment.
    Tensor make(int id) {
        auto v = std::make_shared<Value>();
        v->tracer = id_;
        v->segment = segment_;
        v->node = id;
        live_.push_back(v);
        const ir::Node& n = graph_[id];
        return Tensor::make_traced(std::move(v), n.shape, n.dtype);
    }

    /// The node that stands for t in the current segment (adding an input or constant if needed).
    int node_of(const Tensor& t) {
        if (const auto& v = t.traced_value()) {
            if (v->tracer != id_)
                throw Error("kiln::compile: a tracing tensor escaped its traced call (stored outside the function?)");
            if (v->segment == segment_) return v->node;
            // materialized by a graph break: an input of this segment, once
            auto it = carried_.find(v.get());
            if (it != carried_.end()) return it->second;
            const Tensor in = input(v->concrete);
            const int id = in.traced_value()->node;
            carried_[v.get()] = id;
            return id;
        }
        // a tensor captured by the function (weights): bound by handle, read at run time
        for (int id : constants_)
            if (graph_[id].tensor.is_same(t)) return id;
        ir::Node n;
        n.kind = ir::Kind::constant;
        n.dtype = t.dtype();
        n.shape = t.shape();
        n.tensor = t;
        const int id = graph_.add(std::move(n));
        constants_.push_back(id);
        return id;
    }

    int scalar(double value, DType dtype) {
        ir::Node n;
        n.kind = ir::Kind::scalar;
        n.value = value;
        n.dtype = dtype;
        return graph_.add(std::move(n));
    }

    /// Graph break: runs the current segment and returns the concrete tensor t stands for.
    Tensor materialize(const Tensor& t, const std::source_location& loc, const std::string& reason) {
        if (fullgraph_)
            kiln::detail::fail<GraphBreakError>("compile", "graph break (" + reason + ") with fullgraph = true", loc);
        breaks_.push_back({loc, reason});
        flush();
        return t.traced_value()->concrete;
    }

    /// Runs the current segment with every live value as an output; binds the values.
    void flush() {
        std::vector<std::shared_ptr<Value>> live;
        for (auto& w : live_)
            if (auto v = w.lock(); v && v->segment == segment_ && v->concrete.storage() == nullptr) live.push_back(v);
        graph_.outputs.clear();
        for (auto& v : live) graph_.outputs.push_back(v->node);
        const std::vector<Tensor> out = graph_.outputs.empty() ? std::vector<Tensor>{} : run_(graph_, inputs_);
        for (std::size_t i = 0; i < live.size(); ++i) live[i]->concrete = out[i];
        graph_ = {};
        inputs_.clear();
        constants_.clear();
        carried_.clear();
        live_.clear();
        ++segment_;
    }

private:
    static std::uint64_t next_id() {
        static std::atomic<std::uint64_t> n{0};
        return ++n;
    }
    SegmentRunner run_;
    bool fullgraph_;
    std::uint64_t id_;
    ir::Graph graph_;
    std::vector<Tensor> inputs_;
    std::vector<int> constants_;
    std::map<const Value*, int> carried_;
    std::vector<std::weak_ptr<Value>> live_;
    std::vector<Break> breaks_;
    int segment_ = 0;
};

/// Makes `t` the active tracer of this thread for a scope.
class ActiveScope {
public:
    explicit ActiveScope(Tracer* t) : prev_(Tracer::active()) { Tracer::active() = t; }
    ~ActiveScope() { Tracer::active() = prev_; }
    ActiveScope(const ActiveScope&) = delete;
    ActiveScope& operator=(const ActiveScope&) = delete;

private:
    Tracer* prev_;
};

inline Tracer& tracer_of(const Tensor& t, const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr || tr->id() != t.traced_value()->tracer)
        kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    return *tr;
}

inline Tensor materialize(const Tensor& t, const std::source_location& loc) {
    const auto& v = t.traced_value();
    if (v->concrete.storage() != nullptr) return v->concrete;
    return tracer_of(t, loc).materialize(t, loc, "data access");
}

inline Tensor record_view(const Tensor& src, const Tensor& view) {
    Tracer& tr = tracer_of(src, std::source_location::current());
    ir::Node n;
    n.kind = ir::Kind::view;
    n.dtype = src.dtype();
    n.shape = view.shape();
    n.in = {tr.node_of(src)};
    n.vkind = ir::ViewKind::as_strided;
    n.args = view.strides();
    n.value = static_cast<double>(view.offset());
    return tr.make(tr.graph().add(std::move(n)));
}

// ---------------------------------------------------------------- expressions
template <class E> bool any_traced(const E& e) {
    if constexpr (std::is_same_v<E, expr::TensorLeaf>) return e.t.is_traced();
    else if constexpr (std::is_same_v<E, expr::ScalarLeaf>) return false;
    else return std::apply([](const auto&... a) { return (false || ... || any_traced(a)); }, e.args);
}

namespace detail {
/// Records expression e as nodes of tr's graph; each tensor leaf becomes leaf(tensor)'s node.
template <class E, class Leaf> int lower(Tracer& tr, const E& e, DType parent_ct, Leaf&& leaf) {
    if constexpr (std::is_same_v<E, expr::TensorLeaf>) {
        return leaf(e.t);
    } else if constexpr (std::is_same_v<E, expr::ScalarLeaf>) {
        return tr.scalar(e.s.value, parent_ct);
    } else {
        ir::Node n;
        n.kind = ir::Kind::elementwise;
        n.op = ops::op_id<typename E::op>;
        n.dtype = e.info.dtype;
        n.shape = e.info.shape;
        n.attr = e.attr;
        std::vector<int> kids;
        std::apply([&](const auto&... a) { (kids.push_back(lower(tr, a, e.info.ct, leaf)), ...); }, e.args);
        // agnostic (bool-valued) ops run in the compute type of their first non-scalar operand
        n.ct = e.info.ct;
        if (e.info.agnostic) {
            n.ct = DType::f32;
            for (int k : kids)
                if (tr.graph()[k].kind != ir::Kind::scalar && tr.graph()[k].dtype != DType::boolean) {
                    n.ct = compute_dtype(tr.graph()[k].dtype);
                    break;
                }
        }
        n.in = std::move(kids);
        return tr.graph().add(std::move(n));
    }
}
/// Records e; tensor leaves become graph inputs (traced values) or constants (captured tensors).
template <class E> int lower(Tracer& tr, const E& e, DType parent_ct) {
    return lower(tr, e, parent_ct, [&tr](const Tensor& t) { return tr.node_of(t); });
}
}  // namespace detail

/// Records an expression whose leaves include tracing tensors; returns the tracing result.
template <class E> Tensor record_expr(const E& e, const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    if (!e.info.ok()) e.info.raise(loc);
    const int id = detail::lower(*tr, e, e.info.ct);
    (*tr).graph()[id].loc = loc;
    return tr->make(id);
}

}  // namespace trace
}  // namespace kiln

namespace kiln::trace {

namespace detail {
/// A reduce or arg_reduce node over operand `in`.
inline ir::Node reduce_node(ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim, const Shape& out_shape,
                            DType out_dtype, const std::source_location& loc, int in) {
    ir::Node n;
    n.kind = kind;
    n.rkind = rk;
    n.arg_max = arg_max;
    n.mask = mask;
    n.keepdim = keepdim;
    n.shape = out_shape;
    n.dtype = out_dtype;
    n.loc = loc;
    n.in = {in};
    return n;
}
}  // namespace detail

/// Records a reduction of an expression (or tensor) with tracing leaves.
template <class E>
Tensor record_reduce(const E& e, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                     const Shape& out_shape, DType out_dtype, const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    const int in = detail::lower(*tr, e, e.info.ct);
    return tr->make(tr->graph().add(detail::reduce_node(kind, rk, arg_max, mask, keepdim, out_shape, out_dtype, loc, in)));
}

/// Records a matrix product with a tracing operand.
inline Tensor record_matmul(const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype,
                            const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    ir::Node n;
    n.kind = ir::Kind::matmul;
    n.shape = out_shape;
    n.dtype = out_dtype;
    n.loc = loc;
    n.in = {tr->node_of(a), tr->node_of(b)};
    return tr->make(tr->graph().add(std::move(n)));
}

/// Runs a library op (ir::CallOp) on its operands: as one Kind::call node when an operand is a
/// tracing tensor (the op then runs inside the compiled program, with the operands it has there),
/// otherwise at once.
inline Tensor call_op(std::shared_ptr<const ir::CallOp> op, const std::vector<Tensor>& operands, DType out_dtype,
                      const std::source_location& loc) {
    bool traced = false;
    for (const Tensor& t : operands) traced = traced || t.is_traced();
    if (!traced) return op->run(operands);
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    ir::Node n;
    n.kind = ir::Kind::call;
    std::vector<Shape> shapes;
    for (const Tensor& t : operands) {
        n.in.push_back(tr->node_of(t));
        shapes.push_back(t.shape());
    }
    n.shape = op->shape(shapes);
    n.dtype = out_dtype;
    n.loc = loc;
    n.call = std::move(op);
    return tr->make(tr->graph().add(std::move(n)));
}

}  // namespace kiln::trace
