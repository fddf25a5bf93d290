// Autograd's compiled part: recording table ops, reductions, views, matmul and copies; the engine.
#pragma once
// Included at the end of kiln/autograd/autograd.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <unordered_map>

#include "kiln/core/factories.hpp"
#include "kiln/ops/composites.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/reductions.hpp"
#include "kiln/tables/reduce_table.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::autograd::detail {

namespace {
[[noreturn]] void grad_fail(std::string_view op, const std::string& what, const std::source_location& loc) {
    kiln::detail::fail<GradError>(op, what, loc);
}
}  // namespace

KILN_DECL const Tensor& Saved::get(const Node& by) const {
    if (t_.storage() && t_.storage()->version() != version_)
        grad_fail("backward", "a tensor that " + by.name() + " (at " + kiln::detail::format_location(by.loc()) +
                                  ") saved for backward was modified in place since (version " + std::to_string(version_) +
                                  ", now " + std::to_string(t_.storage()->version()) + "); clone it before writing into it",
                  by.loc());
    return t_;
}

KILN_DECL Tensor& Recorder::attach(Tensor& out, std::shared_ptr<Node> node, const std::vector<const Tensor*>& operands) {
    bool any = false;
    node->edges_.clear();
    for (const Tensor* t : operands) {
        node->edges_.push_back(t && t->defined() ? edge_of(*t) : Edge{});
        any = any || node->edges_.back().live();
    }
    if (!any || !grad_mode()) return out;
    node->shape = out.shape();
    node->dtype = out.dtype();
    auto m = std::make_shared<Meta>();  // a fresh handle state: out may share an operand's handle
    m->grad_fn = std::move(node);
    out.set_autograd_meta(std::move(m));
    return out;
}

KILN_DECL Tensor sum_to(const Tensor& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    const int lead = g.rank() - shape.rank();
    std::vector<std::int64_t> axes;
    for (int d = 0; d < g.rank(); ++d)
        if (d < lead || (shape[d - lead] == 1 && g.shape()[d] != 1)) axes.push_back(d);
    const Tensor r = axes.empty() ? g : kiln::sum(g, Axes(axes), true);
    return r.reshape(shape);
}

namespace {

/// A runtime expression: what the tables' rules are instantiated with. One type for every rule
/// (a rule written with kiln's expression templates would instantiate a new C++ type per rule and
/// per operand, which every translation unit compiles in header-only mode); it evaluates as one
/// statement (tile interpreter on the CPU, one generated kernel on CUDA, traced under compile).
class Dyn {
public:
    struct Item {
        enum class Kind : unsigned char { tensor, scalar, op } kind = Kind::op;
        Tensor t;
        Scalar s;
        ops::OpId op{};
        DType attr = DType::f32;
        std::vector<Dyn> in;
        expr::Info info;
    };
    Dyn(const Tensor& t) {  // NOLINT: implicit, a tensor is an expression
        auto it = std::make_shared<Item>();
        it->kind = Item::Kind::tensor;
        it->t = t;
        it->info = expr::TensorLeaf{t}.info();
        n_ = std::move(it);
    }
    template <class A>
        requires std::is_arithmetic_v<A>
    Dyn(A v) {  // NOLINT: implicit, a C++ number operand
        auto it = std::make_shared<Item>();
        it->kind = Item::Kind::scalar;
        it->s = Scalar(v);
        n_ = std::move(it);
    }
    /// Op over operands (tensors, expressions, numbers), its shape and dtype inferred as a node's.
    static Dyn node(ops::OpId op, DType attr, std::vector<Dyn> in) {
        auto it = std::make_shared<Item>();
        it->op = op;
        it->attr = attr;
        it->in = std::move(in);
        std::vector<expr::OperandInfo> oi;
        for (const Dyn& d : it->in)
            oi.push_back(d.n_->kind == Item::Kind::scalar ? expr::OperandInfo{nullptr, &d.n_->s} : expr::OperandInfo{&d.n_->info, nullptr});
        it->info = expr::infer_node(op, oi.data(), static_cast<int>(oi.size()), attr);
        Dyn d;
        d.n_ = std::move(it);
        return d;
    }
    DType dtype() const { return n_->info.dtype; }
    /// The value: the tensor itself for a leaf, else the expression evaluated as one statement.
    Tensor eval(const std::source_location& loc = std::source_location::current()) const {
        if (n_->kind == Item::Kind::tensor) return n_->t;
        expr::Flat f;
        f.items.reserve(16);
        flatten_into(f, DType::f32);
        return expr::eval_statement(f, expr::Fused{}, loc);
    }

private:
    Dyn() = default;
    int flatten_into(expr::Flat& f, DType parent_ct) const {
        expr::Flat::Item it;
        if (n_->kind == Item::Kind::tensor) {
            it.kind = expr::Flat::Kind::tensor;
            it.index = f.leaves++;
            it.tensor = &n_->t;
        } else if (n_->kind == Item::Kind::scalar) {
            it.kind = expr::Flat::Kind::scalar;
            it.index = f.scalars++;
            it.parent_ct = parent_ct;
            it.value = n_->s.value;
        } else {
            it.arity = static_cast<int>(n_->in.size());
            for (std::size_t k = 0; k < n_->in.size(); ++k) it.in[k] = n_->in[k].flatten_into(f, n_->info.ct);
            it.op = ops::op_for_dtype(n_->op, n_->info.dtype);
            it.attr = n_->attr;
            it.info = &n_->info;
        }
        f.items.push_back(it);
        return static_cast<int>(f.items.size() - 1);
    }
    std::shared_ptr<const Item> n_;
};

inline Dyn operator+(const Dyn& a, const Dyn& b) { return Dyn::node(ops::op_id<ops::Add>, DType::f32, {a, b}); }
inline Dyn operator-(const Dyn& a, const Dyn& b) { return Dyn::node(ops::op_id<ops::Sub>, DType::f32, {a, b}); }
inline Dyn operator*(const Dyn& a, const Dyn& b) { return Dyn::node(ops::op_id<ops::Mul>, DType::f32, {a, b}); }
inline Dyn operator/(const Dyn& a, const Dyn& b) { return Dyn::node(ops::op_id<ops::Div>, DType::f32, {a, b}); }
inline Dyn operator-(const Dyn& a) { return Dyn::node(ops::op_id<ops::Neg>, DType::f32, {a}); }
template <class A> requires std::is_arithmetic_v<A> Dyn operator+(const Dyn& a, A b) { return a + Dyn(b); }
template <class A> requires std::is_arithmetic_v<A> Dyn operator+(A a, const Dyn& b) { return Dyn(a) + b; }
template <class A> requires std::is_arithmetic_v<A> Dyn operator-(const Dyn& a, A b) { return a - Dyn(b); }
template <class A> requires std::is_arithmetic_v<A> Dyn operator-(A a, const Dyn& b) { return Dyn(a) - b; }
template <class A> requires std::is_arithmetic_v<A> Dyn operator*(const Dyn& a, A b) { return a * Dyn(b); }
template <class A> requires std::is_arithmetic_v<A> Dyn operator*(A a, const Dyn& b) { return Dyn(a) * b; }
template <class A> requires std::is_arithmetic_v<A> Dyn operator/(const Dyn& a, A b) { return a / Dyn(b); }
template <class A> requires std::is_arithmetic_v<A> Dyn operator/(A a, const Dyn& b) { return Dyn(a) / b; }

/// What the tables' rules build with: table-op nodes, casts, and (reductions) sums and products
/// over the reduced dims, all over runtime expressions.
struct Build {
    Axes axes;
    template <class Op, class... X> Dyn operator()(ops::Tag<Op>, const X&... x) const {
        return Dyn::node(ops::op_id<Op>, DType::f32, {Dyn(x)...});
    }
    Dyn cast(const Dyn& x, DType d) const { return Dyn::node(ops::op_id<ops::Cast>, d, {x}); }
    Tensor sum(const Dyn& x) const { return kiln::sum(x.eval(), axes, true); }
    Tensor prod(const Dyn& x) const { return kiln::prod(x.eval(), axes, true); }
};

/// The gradient of operand k, summed to its shape and converted to its dtype.
Tensor fit(Tensor r, const Shape& shape, DType dtype) {
    r = sum_to(r, shape);
    return r.dtype() == dtype ? r : r.to(dtype);
}

/// Op's rule for operand K, as a tensor.
template <class Op, int K>
Tensor rule(const Build& f, const Dyn& g, const Dyn& y, const std::vector<Dyn>& x, const std::source_location& loc) {
    if constexpr (Op::arity == 1) return Dyn(Op::template vjp<K>(f, g, y, x[0])).eval(loc);
    else if constexpr (Op::arity == 2) return Dyn(Op::template vjp<K>(f, g, y, x[0], x[1])).eval(loc);
    else return Dyn(Op::template vjp<K>(f, g, y, x[0], x[1], x[2])).eval(loc);
}

/// A table op: its rule (the op table's vjp) over the saved operands and result.
class OpNode final : public Node {
public:
    OpNode(ops::OpId op, const std::source_location& loc) : Node(std::string(ops::op_name(op)), loc), op_(op) {}

    std::vector<Saved> in;            ///< tensor operands (undefined for scalars)
    std::vector<double> scalar;       ///< scalar operands' values
    std::vector<Shape> shapes;        ///< operands' shapes
    std::vector<DType> dtypes;        ///< operands' dtypes
    Saved out;

    std::vector<Tensor> apply(const Tensor& g) override {
        const Tensor& y = out.get(*this);
        const int n = static_cast<int>(in.size());
        std::vector<Tensor> x(static_cast<std::size_t>(n)), res(static_cast<std::size_t>(n));
        for (int k = 0; k < n; ++k) {
            const auto K = static_cast<std::size_t>(k);
            x[K] = in[K].defined() ? in[K].get(*this) : full(Shape{}, scalar[K], dtypes[K], y.device(), loc_);
        }
        const Build f;
        const Dyn gd(g), yd(y);
        std::vector<Dyn> xd(x.begin(), x.end());
        ops::visit_op(op_, [&](auto tag) {
            using Op = typename decltype(tag)::type;
            if constexpr (Op::grad == ops::Grad::rule) {
                for (int k = 0; k < n; ++k) {
                    const auto K = static_cast<std::size_t>(k);
                    if (!edges_[K].live() || ((Op::no_grad_operands >> k) & 1u)) continue;
                    [&]<int... I>(std::integer_sequence<int, I...>) {
                        ((k == I ? (res[K] = fit(rule<Op, I>(f, gd, yd, xd, loc_), shapes[K], dtypes[K]), 0) : 0), ...);
                    }(std::make_integer_sequence<int, Op::arity>{});
                }
            }
        });
        return res;
    }

private:
    ops::OpId op_;
};

/// The dims of mask as an axis list (every dim for a rank-0 tensor).
Axes axes_of(unsigned mask, int rank) {
    std::vector<std::int64_t> d;
    for (int i = 0; i < rank; ++i)
        if (mask & (1u << i)) d.push_back(i);
    return Axes(d);
}

class ReduceNode final : public Node {
public:
    ReduceNode(ops::ReduceId r, unsigned mask, const Tensor& x, const Tensor& y, const std::source_location& loc)
        : Node(std::string(ops::reduction_name(r)), loc), r_(r), mask_(mask), x_(x), y_(y) {}
    std::vector<Tensor> apply(const Tensor& g) override {
        const Tensor& x = x_.get(*this);
        const Shape keep = ir::reduced_shape(x.shape(), mask_, true);
        const Tensor gk = g.reshape(keep, loc_), yk = y_.get(*this).reshape(keep, loc_);
        const Build f{axes_of(mask_, x.rank())};
        Tensor r;
        const Dyn gd(gk), yd(yk), xd(x);
        ops::visit_reduction(r_, [&](auto tag) {
            using R = typename decltype(tag)::type;
            if constexpr (requires { R::vjp(f, gd, yd, xd); }) r = Dyn(R::vjp(f, gd, yd, xd)).eval(loc_);
            else throw InternalError("kiln: autograd: reduction " + std::string(R::name) + " has no rule");
        });
        if (!(r.shape() == x.shape())) r = r.expand(x.shape(), loc_);
        return {r.dtype() == x.dtype() ? r : r.to(x.dtype())};
    }

private:
    ops::ReduceId r_;
    unsigned mask_;
    Saved x_, y_;
};

}  // namespace

KILN_DECL Tensor statement(const expr::Flat& f, const std::source_location& loc) {
    const expr::Info& info = f.info();
    if (!info.ok()) info.raise(loc);
    static const Tensor none;
    std::vector<Tensor> value(f.items.size());
    for (std::size_t i = 0; i < f.items.size(); ++i) {
        const expr::Flat::Item& it = f.items[i];
        if (it.kind == expr::Flat::Kind::tensor) value[i] = *it.tensor;
        if (it.kind != expr::Flat::Kind::op) continue;
        // the op alone, over its operands' values
        expr::Flat one;
        expr::Flat::Item op = it;
        std::vector<const Tensor*> operands;
        for (int k = 0; k < it.arity; ++k) {
            const expr::Flat::Item& a = f.items[static_cast<std::size_t>(it.in[k])];
            expr::Flat::Item leaf = a;
            if (a.kind == expr::Flat::Kind::scalar) {
                leaf.index = one.scalars++;
                operands.push_back(&none);
            } else {
                leaf.kind = expr::Flat::Kind::tensor;
                leaf.index = one.leaves++;
                leaf.tensor = &value[static_cast<std::size_t>(it.in[k])];
                operands.push_back(leaf.tensor);
            }
            op.in[k] = k;
            one.items.push_back(leaf);
        }
        one.items.push_back(op);
        Tensor out;
        {
            const no_grad off;
            out = expr::eval_statement(one, expr::Fused{}, loc);
        }
        if (ops::op_grad(it.op) != ops::Grad::none && is_floating(out.dtype())) {
            bool any = false;
            for (const Tensor* t : operands) any = any || (t->defined() && t->requires_grad());
            if (any) {
                auto node = std::make_shared<OpNode>(it.op, loc);
                for (int k = 0; k < it.arity; ++k) {
                    const expr::Flat::Item& a = f.items[static_cast<std::size_t>(it.in[k])];
                    const Tensor* t = operands[static_cast<std::size_t>(k)];
                    node->in.push_back(t->defined() ? Saved(*t) : Saved());
                    node->scalar.push_back(a.kind == expr::Flat::Kind::scalar ? a.value : 0.0);
                    node->shapes.push_back(t->defined() ? t->shape() : Shape{});
                    node->dtypes.push_back(t->defined() ? t->dtype()
                                           : (it.op == ops::op_id<ops::Where> && k == 0) ? DType::boolean : out.dtype());
                }
                node->out = Saved(out);
                Recorder::attach(out, std::move(node), operands);
            }
        }
        value[i] = out;
    }
    return value.back();
}

KILN_DECL Tensor reduce(const expr::Flat& f, std::uint8_t r, unsigned mask, bool keepdim, const std::source_location& loc) {
    // a plain tensor comes as cast(x, x.dtype): reduce x itself
    const bool plain = f.items.size() == 2 && f.items[0].kind == expr::Flat::Kind::tensor &&
                       f.items[1].op == ops::op_id<ops::Cast> && f.items[1].attr == f.items[0].tensor->dtype();
    const Tensor x = plain ? *f.items[0].tensor : statement(f, loc);
    Tensor out;
    {
        const no_grad off;
        ops::visit_reduction(r, [&](auto tag) {
            using R = typename decltype(tag)::type;
            if constexpr (std::is_same_v<R, ops::MeanR>) throw InternalError("kiln: autograd: mean is recorded as a sum");
            else out = kiln::detail::reduce<R>(x, axes_of(mask, x.rank()), keepdim, loc);
        });
    }
    if (!is_floating(out.dtype())) return out;
    return Recorder::attach(out, std::make_shared<ReduceNode>(r, mask, x, out, loc), {&x});
}

KILN_DECL Tensor matmul(const Tensor& a, const Tensor& b, const std::source_location& loc) {
    // vectors as matrices (their views are recorded), then the product of matrices (batched)
    if (a.rank() == 1 && b.rank() == 1) return kiln::matmul(a.unsqueeze(0), b.unsqueeze(1), loc).reshape(Shape{}, loc);
    if (a.rank() == 1) return kiln::matmul(a.unsqueeze(0), b, loc).squeeze(-2, loc);
    if (b.rank() == 1) return kiln::matmul(a, b.unsqueeze(1), loc).squeeze(-1, loc);
    return record_call(
        "matmul", {&a, &b}, [&] { return kiln::matmul(a, b, loc); },
        [sa = Saved(a), sb = Saved(b)](const Tensor& g, const Node& self) {
            const Tensor &A = sa.get(self), &B = sb.get(self);
            std::vector<Tensor> r(2);
            if (self.edges()[0].live()) r[0] = fit(kiln::matmul(g, B.transpose(-2, -1), self.loc()), A.shape(), A.dtype());
            if (self.edges()[1].live()) {
                // B transposed in memory (a weight seen as x @ w.t(), attention's k.transpose(-2, -1)):
                // its gradient made in that layout, (g^T A)^T, so the base's gradient comes out as
                // its own layout, with no transposing copy (read through the transposed layout, the
                // fused kernel summing q, k and v's gradients read k's with a stride of the sequence)
                const int k = B.rank() - 2;
                const bool transposed = B.stride(k) == 1 && B.stride(k + 1) != 1;
                if (B.rank() == 2) {
                    // a matrix (a weight) against a batch: one GEMM over the rows of every batch
                    const Tensor A2 = A.reshape({-1, A.size(-1)}), g2 = g.reshape({-1, g.size(-1)});
                    r[1] = fit(transposed ? kiln::matmul(g2.t(), A2, self.loc()).t() : kiln::matmul(A2.t(), g2, self.loc()),
                               B.shape(), B.dtype());
                } else {
                    r[1] = fit(transposed ? kiln::matmul(g.transpose(-2, -1), A, self.loc()).transpose(-2, -1)
                                          : kiln::matmul(A.transpose(-2, -1), g, self.loc()),
                               B.shape(), B.dtype());
                }
            }
            return r;
        },
        loc);
}

KILN_DECL Tensor copy_of(const Tensor& src, const Device* device, const std::source_location& loc) {
    const Device from = src.device();
    const bool to_device = device != nullptr;
    const Device dst = to_device ? *device : from;
    return record_call(
        to_device ? "to" : "clone", {&src}, [&] { return to_device ? src.to(dst, loc) : src.clone(); },
        [from, to_device](const Tensor& g, const Node&) { return std::vector<Tensor>{to_device ? g.to(from) : g}; }, loc);
}

KILN_DECL Tensor library(std::string_view name, const std::vector<const Tensor*>& operands, FunctionRef<Tensor()> forward,
                         Backward backward, const std::source_location& loc) {
    return record_call(
        std::string(name), operands, [&] { return forward(); },
        [backward = std::move(backward)](const Tensor& g, const Node&) { return backward(g); }, loc);
}

KILN_DECL void before_write(const Tensor& t, std::string_view op, const std::source_location& loc) {
    if (grad_mode() && t.requires_grad() && t.is_leaf())
        grad_fail(op, "a leaf tensor that requires grad cannot be written in place while recording ops for backward "
                      "(wrap the update in kiln::no_grad, as optimizers do)", loc);
}

KILN_DECL void after_write(Tensor& t, const Tensor& value) {
    auto m = t.autograd_meta();
    if (!value.defined() || !value.requires_grad() || !grad_mode()) {
        if (m) m->grad_fn = nullptr;  // overwritten by a value without history
        return;
    }
    auto node = std::make_shared<FnNode>(
        "copy_", std::source_location::current(),
        [shape = value.shape(), dtype = value.dtype(), device = value.device()](const Tensor& g, const Node&) {
            Tensor r = fit(g, shape, dtype);
            return std::vector<Tensor>{r.device() == device ? r : r.to(device)};
        });
    Tensor holder = t;
    Recorder::attach(holder, node, {&value});
    if (!m) {
        t.set_autograd_meta(holder.autograd_meta());
        return;
    }
    m->grad_fn = holder.autograd_meta()->grad_fn;  // every copy of t's handle takes the new history
}

KILN_DECL void record_view(const Tensor& src, Tensor& view, const ViewOp& op) {
    static constexpr const char* names[] = {"reshape", "permute", "slice", "select", "expand"};
    auto node = std::make_shared<FnNode>(
        names[static_cast<int>(op.kind)], std::source_location::current(),
        [shape = src.shape(), op](const Tensor& g, const Node&) -> std::vector<Tensor> {
            switch (op.kind) {
                case ViewOp::Kind::reshape: return {g.reshape(shape)};
                case ViewOp::Kind::permute: {
                    std::vector<std::int64_t> inv(static_cast<std::size_t>(op.dims.rank()));
                    for (int i = 0; i < op.dims.rank(); ++i) inv[static_cast<std::size_t>(op.dims[i])] = i;
                    return {g.permute(inv)};
                }
                case ViewOp::Kind::expand: return {sum_to(g, shape)};
                case ViewOp::Kind::select: {
                    // the gradient broadcast along the axis and kept at the selected index: one
                    // elementwise expression, so that traced, the gradients of several selects of
                    // one tensor (q, k and v of a packed projection) fuse with their sum into one
                    // kernel (zeros with the gradient copied into a view took, per select, a copy
                    // of the whole tensor and a kernel: 3 x ~32 us in the BERT layer's step)
                    std::vector<std::int64_t> at(static_cast<std::size_t>(shape.rank()), 1);
                    at[static_cast<std::size_t>(op.axis)] = shape[op.axis];
                    const Tensor index = arange(shape[op.axis], DType::i64, g.device()).reshape(at);
                    return {Tensor(where(index == op.start, g.unsqueeze(op.axis).expand(shape), 0))};
                }
                default: {  // slice: the gradient in place within zeros
                    Tensor z = zeros(shape, g.dtype(), g.device());
                    if (g.size(op.axis) > 0) {
                        const std::int64_t stop = op.start + (g.size(op.axis) - 1) * op.step + 1;
                        z.slice(op.axis, op.start, stop, op.step).copy_(g);
                    }
                    return {z};
                }
            }
        });
    Recorder::attach(view, std::move(node), {&src});
}

// ------------------------------------------------------------------ the engine
namespace {

/// Adds g into a leaf's gradient. Inside kiln::compile the gradient is a buffer the program
/// writes on every call: a gradient that exists when the step is traced is added to (and a
/// zero_grad in the step is recorded as a fill); one that does not is made then (adopted by the
/// tracer as memory from outside) and set on every call, as that trace's `grad = g` says; one
/// with a grad buffer (set_grad_buffer) is that buffer, written.
void accumulate(Meta& m, Tensor g) {
    if (m.grad.defined()) {
        m.grad.assign(m.grad + g);
    } else if (m.grad_buffer.defined()) {  // set_grad_buffer: the gradient goes into that memory
        m.grad = m.grad_buffer;
        m.grad.assign(g);
    } else if (trace::Tracer* tr = trace::Tracer::active(); tr != nullptr && g.is_traced()) {
        m.grad = empty_in_order(g.shape(), m.grad_order, g.dtype(), g.device());
        tr->adopt(m.grad);
        m.grad.assign(g);
    } else {
        // take g when nothing else holds its memory and it is laid out as the leaf is; otherwise a
        // copy of its own in that layout
        const bool laid_out = m.grad_order.empty() ? g.is_contiguous() : memory_order(g) == m.grad_order;
        if (g.is_traced()) {
            m.grad = g.clone();
        } else if (laid_out && g.storage() && g.storage().use_count() == 1) {
            m.grad = g;
        } else {
            m.grad = empty_in_order(g.shape(), m.grad_order, g.dtype(), g.device());
            m.grad.copy_(g);
        }
    }
}

Tensor add(const Tensor& a, const Tensor& b) { return a.defined() ? Tensor(a + b) : b; }

}  // namespace

/// The callbacks queued (queue_callback) during the backward pass running on this thread, or null
/// (external linkage: one per thread for the whole program, also header-only).
inline std::vector<std::function<void()>>*& queued_callbacks() {
    thread_local std::vector<std::function<void()>>* q = nullptr;
    return q;
}
/// Where the backward pass running on this thread was called (see backward_location()).
inline const std::source_location*& backward_location_slot() {
    thread_local const std::source_location* loc = nullptr;
    return loc;
}
KILN_DECL const std::source_location* backward_location() { return backward_location_slot(); }

namespace {

/// Sets queued_callbacks() and backward_location() for one backward pass and runs what was queued
/// when the pass is done (each callback may queue more).
class CallbackQueue {
public:
    explicit CallbackQueue(const std::source_location& loc) : prev_(queued_callbacks()), prev_loc_(backward_location_slot()) {
        queued_callbacks() = &q_;
        backward_location_slot() = &loc;
    }
    ~CallbackQueue() {
        queued_callbacks() = prev_;
        backward_location_slot() = prev_loc_;
    }
    CallbackQueue(const CallbackQueue&) = delete;
    CallbackQueue& operator=(const CallbackQueue&) = delete;
    void run() {
        for (std::size_t i = 0; i < q_.size(); ++i) {
            const std::function<void()> f = q_[i];
            f();
        }
        q_.clear();
    }

private:
    std::vector<std::function<void()>>* prev_;
    const std::source_location* prev_loc_;
    std::vector<std::function<void()>> q_;
};

/// Calls a leaf's post-accumulate hooks with its gradient.
void run_post_accumulate(const Meta& m) {
    const auto hooks = m.post_accumulate;  // a hook may remove hooks
    for (const auto& [id, h] : hooks) h(m.grad);
}

}  // namespace

KILN_DECL std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                           const std::vector<Tensor>& inputs, const std::source_location& loc) {
    const no_grad off;
    CallbackQueue callbacks(loc);
    const bool capture = !inputs.empty();
    std::map<const void*, std::size_t> target;  // leaf Meta or Node -> index into inputs
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Tensor& t = inputs[i];
        if (!t.requires_grad()) grad_fail("grad", "input " + std::to_string(i) + " does not require grad", loc);
        target[t.grad_fn() ? static_cast<const void*>(t.grad_fn().get()) : static_cast<const void*>(t.autograd_meta().get())] = i;
    }
    std::vector<Tensor> captured(inputs.size());
    // leaf -> edges from reachable nodes still to come, and whether this pass accumulated into it:
    // its post-accumulate hooks run after its last edge
    std::unordered_map<Meta*, int> leaf_deps;
    std::unordered_map<Meta*, bool> accumulated;
    auto to_leaf = [&](const std::shared_ptr<Meta>& m, const Tensor& g) {
        if (!capture) {
            accumulate(*m, g);
            accumulated[m.get()] = true;
            return;
        }
        if (auto it = target.find(m.get()); it != target.end()) captured[it->second] = add(captured[it->second], g);
    };
    auto leaf_edge_done = [&](const std::shared_ptr<Meta>& m) {
        if (capture || --leaf_deps[m.get()] > 0 || !accumulated[m.get()]) return;
        if (!m->post_accumulate.empty()) run_post_accumulate(*m);
    };

    std::unordered_map<Node*, Tensor> buffer;
    std::vector<Node*> starts;
    for (std::size_t i = 0; i < roots.size(); ++i) {
        const Tensor& root = roots[i];
        if (!root.requires_grad())
            grad_fail("backward", "the tensor (shape " + root.shape().str() + ") does not require grad and has no grad_fn", loc);
        Tensor g = i < grads.size() ? grads[i] : Tensor();
        if (!g.defined()) {
            if (root.numel() != 1)
                grad_fail("backward", "a gradient can be implied only for a scalar output; this one has shape " + root.shape().str() +
                                          " (pass a gradient of that shape)", loc);
            g = full(root.shape(), 1.0, root.dtype(), root.device(), loc);
        } else if (!(g.shape() == root.shape())) {
            kiln::detail::fail<ShapeError>("backward", "the gradient has shape " + g.shape().str() + " but the output has shape " +
                                                           root.shape().str(), loc);
        }
        if (root.grad_fn()) {
            Node* n = root.grad_fn().get();
            buffer[n] = add(buffer[n], g);
            starts.push_back(n);
        } else {
            to_leaf(root.autograd_meta(), g);
            ++leaf_deps[root.autograd_meta().get()];
            leaf_edge_done(root.autograd_meta());
        }
    }
    // dependencies: how many edges from reachable nodes point at each node
    std::unordered_map<Node*, int> deps;
    std::vector<Node*> stack = starts, order;
    std::unordered_map<Node*, bool> seen;
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        if (seen[n]) continue;
        seen[n] = true;
        for (const Edge& e : n->edges())
            if (e.fn) {
                ++deps[e.fn.get()];
                stack.push_back(e.fn.get());
            } else if (e.leaf) {
                ++leaf_deps[e.leaf.get()];
            }
    }
    std::vector<Node*> ready;
    for (Node* n : starts)
        if (deps[n] == 0 && std::find(ready.begin(), ready.end(), n) == ready.end()) ready.push_back(n);
    while (!ready.empty()) {
        Node* n = ready.back();
        ready.pop_back();
        Tensor g = std::move(buffer[n]);
        buffer.erase(n);
        std::vector<Tensor> out;
        if (capture)
            if (auto it = target.find(n); it != target.end()) captured[it->second] = add(captured[it->second], g);
        if (g.defined()) {
            if (g.dtype() != n->dtype) g = g.to(n->dtype);
            out = n->apply(g);
        }
        for (std::size_t k = 0; k < n->edges().size(); ++k) {
            const Edge& e = n->edges()[k];
            Tensor gk = k < out.size() ? std::move(out[k]) : Tensor();
            if (e.fn) {
                if (gk.defined()) buffer[e.fn.get()] = add(buffer[e.fn.get()], gk);
                if (--deps[e.fn.get()] == 0) ready.push_back(e.fn.get());
            } else if (e.leaf) {
                if (gk.defined()) to_leaf(e.leaf, gk);
                leaf_edge_done(e.leaf);
            }
        }
    }
    callbacks.run();
    return captured;
}

}  // namespace kiln::autograd::detail

namespace kiln::autograd {

KILN_DECL int register_post_accumulate_grad_hook(Tensor& leaf, std::function<void(const Tensor&)> hook,
                                                 std::source_location loc) {
    if (!leaf.requires_grad() || !leaf.is_leaf())
        detail::grad_fail("register_post_accumulate_grad_hook", "needs a leaf tensor that requires grad (a parameter)", loc);
    static std::atomic<int> next{0};
    const int id = ++next;
    leaf.autograd_meta()->post_accumulate.emplace_back(id, std::move(hook));
    return id;
}

KILN_DECL void set_grad_buffer(Tensor& leaf, const Tensor& buffer, std::source_location loc) {
    if (!leaf.requires_grad() || !leaf.is_leaf()) detail::grad_fail("set_grad_buffer", "needs a leaf tensor that requires grad (a parameter)", loc);
    if (buffer.defined()) {
        const std::string what = "the buffer (" + buffer.shape().str() + ", " + std::string(dtype_name(buffer.dtype())) + ", " +
                                 buffer.device().str() + ") must match the parameter (" + leaf.shape().str() + ", " +
                                 std::string(dtype_name(leaf.dtype())) + ", " + leaf.device().str() + ")";
        if (!(buffer.shape() == leaf.shape())) kiln::detail::fail<ShapeError>("set_grad_buffer", what, loc);
        if (buffer.dtype() != leaf.dtype()) kiln::detail::fail<DTypeError>("set_grad_buffer", what, loc);
        if (buffer.device() != leaf.device()) kiln::detail::fail<DeviceError>("set_grad_buffer", what, loc);
        if (buffer.is_traced()) detail::grad_fail("set_grad_buffer", "needs memory made outside kiln::compile", loc);
    }
    leaf.autograd_meta()->grad_buffer = buffer;
}

KILN_DECL void remove_post_accumulate_grad_hook(const Tensor& leaf, int id) {
    if (!leaf.autograd_meta()) return;
    auto& h = leaf.autograd_meta()->post_accumulate;
    h.erase(std::remove_if(h.begin(), h.end(), [id](const auto& e) { return e.first == id; }), h.end());
}

KILN_DECL void queue_callback(std::function<void()> f, std::source_location loc) {
    auto* q = detail::queued_callbacks();
    if (q == nullptr) detail::grad_fail("queue_callback", "called outside a backward pass", loc);
    q->push_back(std::move(f));
}

}  // namespace kiln::autograd

namespace kiln {

KILN_DECL void Tensor::backward(Loc loc) const { autograd::detail::run_backward({*this}, {}, {}, loc); }
KILN_DECL void Tensor::backward(const Tensor& gradient, Loc loc) const {
    autograd::detail::run_backward({*this}, {gradient}, {}, loc);
}

}  // namespace kiln
