// The tracer's out-of-line members (recording, segments, write-backs), compiled once in separate
// compilation. Included at the end of kiln/trace/tracer.hpp (in header-only mode, or by
// kiln/src.hpp), never on its own.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace kiln::trace {

KILN_DECL Tracer::Tracer(SegmentRunner run, bool fullgraph)
    : run_(std::move(run)), fullgraph_(fullgraph), id_(next_id()), first_storage_(kiln::detail::Storage::next_serial()) {}

KILN_DECL Tracer::~Tracer() {
    if (hooked_) kiln::detail::pending_writes_hook() = nullptr;
}

KILN_DECL Tensor Tracer::make(int id) {
    const ir::Node& n = graph_[id];
    auto b = new_base(id, n.shape, n.dtype);
    return view_of(b, b->shape, contiguous_strides(b->shape), 0);
}

KILN_DECL Tensor Tracer::view(const Tensor& t, const Shape& shape, const Strides& strides, std::int64_t offset, unsigned fixed) {
    const Tensor v = view_of(checked(t)->base, shape, strides, offset, fixed);
    (void)node_of(v);
    return v;
}

KILN_DECL int Tracer::scalar(double value, DType dtype) {
    ir::Node n;
    n.kind = ir::Kind::scalar;
    n.value = value;
    n.dtype = dtype;
    return graph_.add(std::move(n));
}

KILN_DECL bool Tracer::records_write_into(const Tensor& dst) const {
    if (dst.is_traced()) return true;
    if (!dst.storage()) return false;
    return dst.storage()->serial() < first_storage_ || storage_bases_.count(dst.storage().get()) != 0 ||
           adopted_.count(dst.storage().get()) != 0;
}

KILN_DECL bool Tracer::live(const Tensor& t) const {
    if (!t.defined() || t.is_traced()) return false;
    if (written_storage(t) != nullptr) return true;
    return t.storage() && (t.requires_grad() || t.storage()->grad_memory()) && t.storage()->serial() < first_storage_;
}

KILN_DECL Tensor Tracer::materialize(const Tensor& t, const std::source_location& loc, const std::string& reason) {
    flush_for_break(loc, reason);
    return concrete_of(t);
}

KILN_DECL void Tracer::set_outputs(const std::vector<Tensor>& outs, std::vector<char>& own, std::vector<const void*>& memory) {
    for (const Tensor& t : outs) {
        graph_.outputs.push_back(node_of(t));
        own.push_back(returns_own_memory(t));
        memory.push_back(memory_of(t));
    }
}

KILN_DECL Tensor Tracer::view_of(const std::shared_ptr<Base>& b, const Shape& shape, const Strides& strides, std::int64_t offset,
                                 unsigned fixed) {
    auto v = std::make_shared<Value>();
    v->tracer = id_;
    v->base = b;
    v->fixed = fixed;
    return Tensor::make_traced(std::move(v), shape, strides, offset, b->dtype);
}

KILN_DECL void Tracer::current(Base& b) {
    if (b.segment == segment_) return;
    if (!b.concrete.defined()) throw InternalError("kiln: tracer: a value from an earlier segment was never computed");
    b.node = b.own_node = input_node(b.concrete);
    b.segment = segment_;
}

KILN_DECL std::shared_ptr<Base> Tracer::written_storage(const Tensor& t) const {
    if (!t.storage()) return nullptr;
    auto it = storage_bases_.find(t.storage().get());
    return it == storage_bases_.end() ? nullptr : it->second;
}

KILN_DECL Tracer& tracer_of(const Tensor& t, const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr || tr->id() != t.traced_value()->tracer)
        kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    return *tr;
}

KILN_DECL Tensor materialize(const Tensor& t, const std::source_location& loc, const char* what) {
    Tracer& tr = tracer_of(t, loc);
    if (Tensor c = tr.concrete_of(t); c.defined()) return c;
    return tr.materialize(t, loc, what);
}

KILN_DECL Tensor record_view(const Tensor& src, const Tensor& view, unsigned fixed) {
    return tracer_of(src, std::source_location::current()).view(src, view.shape(), view.strides(), view.offset(), fixed);
}

KILN_DECL Tensor copy(const Tensor& t, const std::source_location& loc) { return tracer_of(t, loc).copy(t); }

KILN_DECL Tensor record_matmul(const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype,
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

KILN_DECL Tensor call_op(std::shared_ptr<const ir::CallOp> op, const std::vector<Tensor>& operands, DType out_dtype,
                         const std::source_location& loc, bool every_call) {
    Tracer* tr = Tracer::active();
    bool traced = every_call && tr != nullptr;
    for (const Tensor& t : operands) traced = traced || recorded(t);
    if (!traced) return op->run(operands);
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

KILN_DECL Tensor Tracer::input(const Tensor& concrete, int arg) {
    auto b = new_base(input_node(concrete), concrete.shape(), concrete.dtype());
    b->own_node = b->node;
    if (arg >= 0) {
        b->arg = arg;
        b->target = concrete;
        b->outside = true;
        pinned_.push_back(b);
    }
    return view_of(b, b->shape, contiguous_strides(b->shape), 0);
}

KILN_DECL Tensor Tracer::copy(const Tensor& t) {
    ir::Node n;
    n.kind = ir::Kind::elementwise;
    n.op = ops::op_id<ops::Copy>;
    n.dtype = n.attr = t.dtype();
    n.ct = cast_compute_dtype(t.dtype(), t.dtype());
    n.shape = t.shape();
    n.in = {node_of(t)};
    return make(graph_.add(std::move(n)));
}

KILN_DECL int Tracer::node_of(const Tensor& t) {
    if (t.is_traced()) {
        Value& v = *checked(t);
        Base& b = *v.base;
        current(b);
        if (identity(t, b) && v.fixed == 0) return b.node;
        if (v.segment == segment_ && v.version == b.version && v.node >= 0) return v.node;
        v.node = view_node(b.node, t.shape(), t.strides(), t.offset(), b.dtype, v.fixed);
        v.segment = segment_;
        v.version = b.version;
        return v.node;
    }
    // memory the function wrote into earlier in this trace: a view of its current value
    if (auto b = written_storage(t)) {
        if (b->dtype == t.dtype()) {
            current(*b);
            return view_node(b->node, t.shape(), t.strides(), t.offset(), b->dtype);
        }
        flush_for_break(std::source_location::current(), "a read of memory written with another dtype");
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

KILN_DECL void Tracer::write(const Tensor& dst, int value, const std::source_location& loc, std::string_view op) {
    const ir::Node& vn = graph_[value];
    Shape b;
    if (!kiln::detail::try_broadcast(vn.shape, dst.shape(), b) || !(b == dst.shape()))
        kiln::detail::fail<ShapeError>(op, "cannot write a value of shape " + vn.shape.str() + " into a tensor of shape " +
                                               dst.shape().str(), loc);
    std::shared_ptr<Base> base;
    if (dst.is_traced()) {
        base = checked(dst)->base;
    } else {
        base = storage_base(dst);
        if (!base || base->dtype != dst.dtype()) {  // memory viewed with two dtypes: write it now
            const Tensor v = make(value);
            flush_for_break(loc, "a write into memory viewed with another dtype");
            const Tensor c = concrete_of(v);
            const Untraced untraced;
            Tensor(dst).copy_(c, loc);
            return;
        }
    }
    current(*base);
    // the value as dst's dtype and shape
    int v = value;
    if (graph_[v].kind == ir::Kind::scalar || graph_[v].dtype != dst.dtype()) {
        ir::Node c;
        c.kind = ir::Kind::elementwise;
        c.op = ops::op_id<ops::Cast>;
        c.dtype = c.attr = dst.dtype();
        c.ct = cast_compute_dtype(graph_[v].kind == ir::Kind::scalar ? dst.dtype() : graph_[v].dtype, dst.dtype());
        c.shape = graph_[v].shape;
        c.in = {v};
        c.loc = loc;
        if (graph_[v].kind == ir::Kind::scalar) graph_[v].dtype = c.ct;
        v = graph_.add(std::move(c));
    }
    const bool broadcast = !(graph_[v].shape == dst.shape());
    if (broadcast) {
        const Shape& s = graph_[v].shape;
        v = view_node(v, dst.shape(), kiln::detail::broadcast_strides(s, contiguous_strides(s), dst.shape()), 0, dst.dtype());
    }
    // a broadcast value keeps its view_write even over the whole base: the broadcast's shape is
    // dst's at trace time, and the view_write is where a dynamic program sees whether it still fits.
    // So does a write over the whole of captured memory (a parameter, an optimizer's state): the
    // fuser may then have the value's kernel store it there (Plan::store_into) instead of copying
    // it back after the call
    const bool captured = base->outside && base->arg < 0 && base->target.defined();
    if (identity(dst, *base) && !broadcast && !captured && !(dst.is_traced() && checked(dst)->fixed)) {
        base->node = v;
    } else {
        ir::Node w;
        w.kind = ir::Kind::view_write;
        w.dtype = base->dtype;
        w.shape = base->shape;
        w.in = {base->node, v};
        w.args = dst.strides();
        w.value = static_cast<double>(dst.offset());
        w.mask = dst.is_traced() ? checked(dst)->fixed : 0u;
        w.loc = loc;
        base->node = graph_.add(std::move(w));
    }
    ++base->version;
    if (base->target.defined()) base->dirty = true;
    if (!dst.is_traced()) {
        kiln::detail::pending_writes_hook() = &pending_hook;
        hooked_ = true;
    }
}

KILN_DECL Tensor Tracer::concrete_of(const Tensor& t) {
    const Base& b = *checked(t)->base;
    if (b.segment == segment_ || !b.concrete.defined()) return {};
    const Tensor& c = b.concrete;
    if (identity(t, b)) return c;
    if (c.is_contiguous()) return Tensor(c.storage(), c.offset() + t.offset(), t.shape(), t.strides(), t.dtype());
    const Tensor dense = c.contiguous();  // a strided base (an argument): its view reads a copy
    return Tensor(dense.storage(), dense.offset() + t.offset(), t.shape(), t.strides(), t.dtype());
}

KILN_DECL void Tracer::flush() {
    if (hooked_) kiln::detail::pending_writes_hook() = nullptr;
    hooked_ = false;
    std::vector<std::shared_ptr<Base>> live;
    for (auto& w : live_)
        if (auto b = w.lock(); b && b->segment == segment_) live.push_back(b);
    for (auto& b : pinned_)
        if (b->segment == segment_ && std::find(live.begin(), live.end(), b) == live.end()) live.push_back(b);
    graph_.outputs.clear();
    for (auto& b : live) graph_.outputs.push_back(b->node);
    {
        const Untraced untraced;  // the segment's own copies and views, and the write-backs, are not traced
        std::vector<Tensor> out;
        if (!graph_.outputs.empty()) out = run_(graph_, inputs_);
        for (std::size_t i = 0; i < live.size(); ++i) {
            live[i]->concrete = out[i];
            if (live[i]->dirty) {
                live[i]->target.copy_(out[i]);
                live[i]->dirty = false;
            }
        }
    }
    graph_ = {};
    inputs_.clear();
    constants_.clear();
    node_device_.clear();
    ++segment_;
    std::erase_if(live_, [](const std::weak_ptr<Base>& w) { return w.expired(); });
}

KILN_DECL std::vector<WriteBack> Tracer::write_backs() {
    std::vector<WriteBack> out;
    for (auto& b : pinned_) {
        if (!b->dirty || !b->outside) continue;
        current(*b);
        out.push_back({b->node, b->arg, b->arg >= 0 ? Tensor() : b->target});
    }
    return out;
}

KILN_DECL void Tracer::pending_hook(const kiln::detail::Storage* s) {
    Tracer* tr = active();
    if (tr == nullptr) return;
    auto it = tr->storage_bases_.find(s);
    if (it == tr->storage_bases_.end() || !it->second->dirty) return;
    tr->flush_for_break(std::source_location::current(), "a direct access to memory the function wrote into");
}

KILN_DECL Device Tracer::device_of_node(int id) {
    if (node_device_.size() < static_cast<std::size_t>(graph_.size())) node_device_.resize(static_cast<std::size_t>(graph_.size()));
    auto& d = node_device_[static_cast<std::size_t>(id)];
    if (d) return *d;
    const ir::Node& n = graph_[id];
    Device dev = Device::cpu();
    if (n.kind == ir::Kind::input) dev = inputs_[static_cast<std::size_t>(n.index)].device();
    else if (n.kind == ir::Kind::constant) dev = n.tensor.device();
    else
        for (int j : n.in)
            if (const Device o = device_of_node(j); !o.is_cpu()) {
                dev = o;
                break;
            }
    node_device_[static_cast<std::size_t>(id)] = dev;
    return dev;
}

KILN_DECL std::shared_ptr<Base> Tracer::new_base(int node, const Shape& shape, DType dtype) {
    auto b = std::make_shared<Base>();
    b->tracer = id_;
    b->segment = segment_;
    b->node = node;
    b->shape = shape;
    b->dtype = dtype;
    b->device = device_of_node(node);
    live_.push_back(b);
    return b;
}

KILN_DECL int Tracer::input_node(const Tensor& concrete) {
    ir::Node n;
    n.kind = ir::Kind::input;
    n.dtype = concrete.dtype();
    n.shape = concrete.shape();
    n.index = static_cast<int>(inputs_.size());
    const int id = graph_.add(std::move(n));
    graph_.inputs.push_back(id);
    inputs_.push_back(concrete);
    return id;
}

KILN_DECL int Tracer::view_node(int of, const Shape& shape, const Strides& strides, std::int64_t offset, DType dtype, unsigned fixed) {
    ir::Node n;
    n.kind = ir::Kind::view;
    n.mask = fixed;
    n.dtype = dtype;
    n.shape = shape;
    n.in = {of};
    n.vkind = ir::ViewKind::as_strided;
    n.args = strides;
    n.value = static_cast<double>(offset);
    return graph_.add(std::move(n));
}

KILN_DECL std::shared_ptr<Base> Tracer::storage_base(const Tensor& t) {
    const kiln::detail::Storage* s = t.storage().get();
    if (auto it = storage_bases_.find(s); it != storage_bases_.end()) return it->second;
    const std::int64_t n = static_cast<std::int64_t>(s->nbytes() / t.element_size());
    const Tensor whole(t.storage(), 0, Shape{n}, Strides{1}, t.dtype());
    const bool outside = s->serial() < first_storage_ || adopted_.count(s) != 0;
    ir::Node c;
    c.kind = ir::Kind::constant;
    c.dtype = whole.dtype();
    c.shape = whole.shape();
    c.tensor = whole;
    c.fresh = !outside;
    auto b = new_base(graph_.add(std::move(c)), whole.shape(), whole.dtype());
    b->own_node = b->node;
    b->target = whole;
    b->outside = outside;
    storage_bases_[s] = b;
    pinned_.push_back(b);
    return b;
}

KILN_DECL void Tracer::flush_for_break(const std::source_location& loc, const std::string& reason) {
    breaks_.push_back({loc, reason});  // before a fullgraph throw too: kiln::export_program reports it
    if (fullgraph_)
        kiln::detail::fail<GraphBreakError>("compile", "graph break (" + reason + ") with fullgraph = true", loc);
    flush();
}

namespace detail {
KILN_DECL int lower(Tracer& tr, const expr::Flat& f, const LeafNode& leaf) {
    std::vector<int> node(f.items.size());
    for (std::size_t i = 0; i < f.items.size(); ++i) {
        const expr::Flat::Item& it = f.items[i];
        if (it.kind == expr::Flat::Kind::tensor) {
            node[i] = leaf(*it.tensor);
        } else if (it.kind == expr::Flat::Kind::scalar) {
            node[i] = tr.scalar(it.value, it.parent_ct);
        } else {
            ir::Node n;
            n.kind = ir::Kind::elementwise;
            n.op = it.op;
            n.dtype = it.info->dtype;
            n.shape = it.info->shape;
            n.attr = it.attr;
            for (int k = 0; k < it.arity; ++k) n.in.push_back(node[it.in[k]]);
            // agnostic (bool-valued) ops run in the compute type of their first non-scalar operand
            n.ct = it.info->ct;
            if (it.info->agnostic) {
                n.ct = DType::f32;
                for (int k : n.in)
                    if (tr.graph()[k].kind != ir::Kind::scalar && tr.graph()[k].dtype != DType::boolean) {
                        n.ct = compute_dtype(tr.graph()[k].dtype);
                        break;
                    }
            }
            node[i] = tr.graph().add(std::move(n));
        }
    }
    return node.back();
}

KILN_DECL int lower(Tracer& tr, const expr::Flat& f) {
    return lower(tr, f, [&tr](const Tensor& t) { return tr.node_of(t); });
}
}  // namespace detail

KILN_DECL Tensor record_expr(const expr::Flat& f, const std::source_location& loc) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    if (!f.info().ok()) f.info().raise(loc);
    const int id = detail::lower(*tr, f);
    tr->graph()[id].loc = loc;
    return tr->make(id);
}

KILN_DECL Tensor record_reduce(const expr::Flat& f, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                               const Shape& out_shape, DType out_dtype, const std::source_location& loc, double correction) {
    Tracer* tr = Tracer::active();
    if (tr == nullptr) kiln::detail::fail<Error>("compile", "a tracing tensor was used outside its traced call", loc);
    const int in = detail::lower(*tr, f);
    return tr->make(tr->graph().add(detail::reduce_node(kind, rk, arg_max, mask, keepdim, out_shape, out_dtype, loc, in, correction)));
}

}  // namespace kiln::trace
