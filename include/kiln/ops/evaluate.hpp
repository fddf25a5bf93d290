// Evaluating expressions: one fused SIMD loop per statement, the tile interpreter for mixed dtypes, and eager.
#pragma once

#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "kiln/backends/cpu/program.hpp"
#include "kiln/backends/cuda/frontend.hpp"
#include "kiln/core/config.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::expr {

namespace simd = kiln::detail::simd;

// ------------------------------------------------------------------ compile-time structure
template <class E> struct Count {
    static constexpr std::size_t leaves = 0, scalars = 0;
};
template <> struct Count<TensorLeaf> {
    static constexpr std::size_t leaves = 1, scalars = 0;
};
template <> struct Count<ScalarLeaf> {
    static constexpr std::size_t leaves = 0, scalars = 1;
};
template <class Op, class... A> struct Count<Node<Op, A...>> {
    static constexpr std::size_t leaves = (std::size_t{0} + ... + Count<A>::leaves);
    static constexpr std::size_t scalars = (std::size_t{0} + ... + Count<A>::scalars);
};

/// Leaves (or scalars) in the operands before operand K.
template <std::size_t K, class... A>
constexpr std::size_t leaves_before() {
    std::size_t n = 0, i = 0;
    ((n += (i++ < K ? Count<A>::leaves : 0)), ...);
    return n;
}
template <std::size_t K, class... A>
constexpr std::size_t scalars_before() {
    std::size_t n = 0, i = 0;
    ((n += (i++ < K ? Count<A>::scalars : 0)), ...);
    return n;
}

/// Whether every op of E has a kernel in compute type T (so the fused loop can be instantiated).
template <class E, class T> struct RunsIn : std::true_type {};
template <class T, class Op, class... A>
struct RunsIn<Node<Op, A...>, T> : std::bool_constant<kiln::detail::op_runs_in<Op, T> && (RunsIn<A, T>::value && ...)> {};

template <class E>
void collect(const E& e, std::vector<const Tensor*>& leaves, std::vector<double>& scalars) {
    if constexpr (std::is_same_v<E, TensorLeaf>) leaves.push_back(&e.t);
    else if constexpr (std::is_same_v<E, ScalarLeaf>) scalars.push_back(e.s.value);
    else std::apply([&](const auto&... a) { (collect(a, leaves, scalars), ...); }, e.args);
}

// ------------------------------------------------------------------ the fused loop
template <class T, std::size_t L, std::size_t S, class E>
[[gnu::always_inline]] inline simd::Batch<T> eval_at(const E& e, const T* const* lp, const simd::Batch<T>* sv,
                                                     std::int64_t i);

template <class T, std::size_t L, std::size_t S, class Op, class... A, std::size_t... K>
[[gnu::always_inline]] inline simd::Batch<T> eval_node(const Node<Op, A...>& n, const T* const* lp,
                                                       const simd::Batch<T>* sv, std::int64_t i,
                                                       std::index_sequence<K...>) {
    if constexpr (std::is_same_v<Op, ops::Add>)
        if (n.info.dtype == DType::boolean)  // bool + bool: logical or (ops::op_for_dtype)
            return kiln::detail::apply_op<ops::LogicalOr>(
                n.attr, eval_at<T, L + leaves_before<K, A...>(), S + scalars_before<K, A...>()>(std::get<K>(n.args), lp, sv, i)...);
    return kiln::detail::apply_op<Op>(
        n.attr, eval_at<T, L + leaves_before<K, A...>(), S + scalars_before<K, A...>()>(std::get<K>(n.args), lp, sv, i)...);
}

template <class T, std::size_t L, std::size_t S, class E>
[[gnu::always_inline]] inline simd::Batch<T> eval_at(const E& e, const T* const* lp, const simd::Batch<T>* sv,
                                                     std::int64_t i) {
    if constexpr (std::is_same_v<E, TensorLeaf>) return simd::load(lp[L] + i);
    else if constexpr (std::is_same_v<E, ScalarLeaf>) return sv[S];
    else return eval_node<T, L, S>(e, lp, sv, i, std::make_index_sequence<std::tuple_size_v<decltype(e.args)>>{});
}

/// out[i] = e at element i, for i < n; leaf k's values start at lp[k]. The whole tree is one
/// loop body: every intermediate lives in registers.
template <class T, class E>
void fused_tile(const E& e, const T* const* lp, const T* scalars, T* out, std::int64_t n) {
    constexpr std::size_t nl = Count<E>::leaves, ns = Count<E>::scalars;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    simd::Batch<T> sv[ns ? ns : 1];
    for (std::size_t s = 0; s < ns; ++s) sv[s] = simd::splat(scalars[s]);
    std::int64_t i = 0;
    for (; i + w <= n; i += w) simd::store(out + i, eval_at<T, 0, 0>(e, lp, sv, i));
    if (i < n) {  // the tail through the same code, on padded copies
        alignas(64) T pad[nl ? nl : 1][w] = {};
        const T* pp[nl ? nl : 1];
        for (std::size_t k = 0; k < nl; ++k) {
            std::copy(lp[k] + i, lp[k] + n, pad[k]);
            pp[k] = pad[k];
        }
        alignas(64) T res[w];
        simd::store_aligned(res, eval_at<T, 0, 0>(e, pp, sv, 0));
        std::copy(res, res + (n - i), out + i);
    }
}

// ------------------------------------------------------------------ lowering to the tile interpreter
struct Lowered {
    int value;
    int ct;  ///< compute type of a node value, -1 for leaves
};

template <std::size_t L, std::size_t S>
Lowered lower(const TensorLeaf&, kiln::detail::TileProgram& p) { return {p.leaf_value(static_cast<int>(L)), -1}; }
template <std::size_t L, std::size_t S>
Lowered lower(const ScalarLeaf&, kiln::detail::TileProgram& p) { return {p.scalar_value(static_cast<int>(S)), -1}; }

/// The compute type an op runs in; agnostic ops follow their first node operand (else f32).
inline DType resolve_ct(const Info& info, std::initializer_list<int> child_cts) {
    if (!info.agnostic) return info.ct;
    for (int c : child_cts)
        if (c >= 0) return static_cast<DType>(c);
    return DType::f32;
}

template <std::size_t L, std::size_t S, class Op, class... A>
Lowered lower(const Node<Op, A...>& n, kiln::detail::TileProgram& p) {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
        const Lowered kids[] = {lower<L + leaves_before<K, A...>(), S + scalars_before<K, A...>()>(std::get<K>(n.args), p)...};
        kiln::detail::TileProgram::Instr ins{ops::op_for_dtype(ops::op_id<Op>, n.info.dtype), resolve_ct(n.info, {kids[K].ct...}), n.attr,
                                             {-1, -1, -1}};
        for (std::size_t k = 0; k < sizeof...(K); ++k) ins.in[k] = kids[k].value;
        p.instrs.push_back(ins);
        return Lowered{p.instr_value(static_cast<int>(p.instrs.size() - 1)), static_cast<int>(ins.ct)};
    }(std::index_sequence_for<A...>{});
}

// ------------------------------------------------------------------ evaluation
/// The part of an Evaluator that does not depend on the expression's type (compiled once in
/// separate mode, not once per expression type): the iteration space, the leaves' accesses and
/// whether each is read in place, the scalars, and the interpreter program and runner when the
/// tree does not run as one fused loop.
class EvalState {
public:
    EvalState() = default;
    EvalState(const EvalState&) = delete;
    EvalState& operator=(const EvalState&) = delete;

    DType ct() const { return ct_; }
    const kiln::detail::IterSpace& space() const { return space_; }
    bool fused() const { return fused_; }

protected:
    /// leaves: the expression's tensors in leaf order (scalars_ already collected); shape, perm
    /// and extra as Evaluator's; tree_ct: the expression's Info::tree_ct. Sets fused_; when not
    /// fused, prog_ is ready for the tree's instructions.
    KILN_DECL void prepare(const std::vector<const Tensor*>& leaves, const Shape& shape, const std::vector<int>& perm,
                           std::vector<kiln::detail::Access*> extra, int tree_ct);
    /// Starts the interpreter on prog_ (after the tree was lowered into it).
    KILN_DECL void start_interpreter();

    kiln::detail::IterSpace space_;
    std::vector<kiln::detail::Access> leaves_;
    std::vector<char> direct_;
    std::vector<double> scalars_;
    bool fused_ = true;
    DType ct_ = DType::f32;
    std::unique_ptr<kiln::detail::TileProgram> prog_;
    std::unique_ptr<kiln::detail::ProgramRunner> runner_;
};

/// An expression prepared for evaluation over its shape (optionally with dims permuted, as
/// reductions do): tile(start, len, dst) writes elements [start, start + len) of the row-major
/// iteration order, in compute type ct(), either from the fused loop (one floating compute type
/// across the tree) or from the tile interpreter (integer or mixed compute types).
template <class E>
class Evaluator : public EvalState {
public:
    /// shape: the iteration shape (the expression broadcasts to it). perm: iteration dim i is
    /// dim perm[i] (empty: identity). extra: accesses over the same unpermuted shape that take
    /// part in collapsing, e.g. a statement's output.
    Evaluator(const E& e, const Shape& shape, const std::vector<int>& perm = {},
              std::vector<kiln::detail::Access*> extra = {})
        : e_(e) {
        std::vector<const Tensor*> leaves;
        collect(e, leaves, scalars_);
        prepare(leaves, shape, perm, std::move(extra), e.info.tree_ct);
        if (!fused_) {
            lower<0, 0>(e, *prog_);
            start_interpreter();
        }
    }

    void tile(std::int64_t start, std::int64_t len, void* dst) const {
        if (!fused_) {
            runner_->tile(start, len, dst);
            return;
        }
        if (ct_ == DType::f64) fused_tile_in<double>(start, len, dst);
        else fused_tile_in<float>(start, len, dst);
    }

private:
    template <class T>
    void fused_tile_in(std::int64_t start, std::int64_t len, void* dst) const {
        if constexpr (RunsIn<E, T>::value) fused_tile_at<T>(start, len, static_cast<T*>(dst));
        else throw InternalError("kiln: fused expression has no loop for " + std::string(dtype_name(ct_)));
    }
    template <class T>
    void fused_tile_at(std::int64_t start, std::int64_t len, T* dst) const {
        constexpr std::size_t nl = Count<E>::leaves, ns = Count<E>::scalars;
        struct Tag {};
        T* buf = kiln::detail::scratch<T, Tag>(nl ? nl : 1);
        const T* lp[nl ? nl : 1];
        for (std::size_t k = 0; k < nl; ++k) {
            const auto& a = leaves_[k];
            if (direct_[k] && a.dtype == dtype_of<T>) {
                lp[k] = reinterpret_cast<const T*>(a.base) + start;
            } else {
                T* b = buf + k * kiln::detail::tile_elems;
                kiln::detail::gather(space_, a, start, len, b);
                lp[k] = b;
            }
        }
        T sc[ns ? ns : 1];
        for (std::size_t s = 0; s < ns; ++s) sc[s] = static_cast<T>(scalars_[s]);
        fused_tile<T>(e_, lp, sc, dst, len);
    }

    const E& e_;
};

/// Whether writing `out` while reading `in` could clobber values still to be read: same memory,
/// different element mapping.
inline bool may_alias(const Tensor& out, const Tensor& in) {
    if (out.storage() != in.storage()) return false;
    const Strides bs = kiln::detail::broadcast_strides(in.shape(), in.strides(), out.shape());
    return !(in.offset() == out.offset() && bs == out.strides() && in.dtype() == out.dtype());
}

/// Evaluates e (broadcast to out's shape) into out's memory, converting to out's dtype.
template <class E>
void evaluate_into(const E& e, const Tensor& out) {
    if (out.numel() == 0) return;
    if (out.device().is_cuda() || cuda::detail::on_cuda(e)) {
        // the statement's kernel writes straight into out when it can (contiguous, same shape and
        // dtype); otherwise into a new tensor that is then converted, broadcast and copied
        if (out.device().is_cuda() && e.info.shape == out.shape() && e.info.dtype == out.dtype()) {  // contiguous or a strided view
            (void)cuda::detail::eval_expr(e, std::source_location::current(), &out);
            return;
        }
        const Tensor v = cuda::detail::eval_expr(e, std::source_location::current());
        const Tensor w = v.shape() == out.shape() && v.dtype() == out.dtype()
                             ? v
                             : cuda::detail::eval_expr(make<ops::Cast>(out.dtype(), v.expand(out.shape())),
                                                       std::source_location::current());
        if (out.is_contiguous()) cuda::detail::copy_contiguous_into(out, w);
        else (void)cuda::detail::eval_expr(make<ops::Cast>(out.dtype(), w), std::source_location::current(), &out);
        return;
    }
    kiln::detail::Access oa = kiln::detail::access_of(out, out.shape());
    const Evaluator<E> ev(e, out.shape(), {}, {&oa});
    kiln::detail::store_tiles(ev.space(), oa, ev.ct(),
                              [&](std::int64_t start, std::int64_t len, void* dst) { ev.tile(start, len, dst); });
}

/// Runs one table op as its own kernel over materialized operands (tensors and scalars, in
/// operand order) into a new tensor of the node's shape and dtype.
inline Tensor run_single_op(ops::OpId op, const Info& info, DType attr, const std::vector<Tensor>& tensors,
                            const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars) {
    DType ct = info.ct;
    if (info.agnostic) {  // bool-valued logic: run in the operands' compute type, f32 for bools
        ct = DType::f32;
        for (const Tensor& t : tensors)
            if (t.dtype() != DType::boolean) { ct = compute_dtype(t.dtype()); break; }
    }
    for (const Tensor& t : tensors)
        if (t.device().is_cuda()) return cuda::detail::run_op(op, info.dtype, ct, attr, info.shape, tensors, operand_is_tensor, scalars);
    kiln::detail::TileProgram p;
    Tensor out(info.shape, info.dtype);
    p.scalars = scalars;
    for (const Tensor& t : tensors) p.leaves.push_back(kiln::detail::access_of(t, out.shape()));
    p.out = kiln::detail::access_of(out, out.shape());
    p.space.shape = out.shape();
    std::vector<kiln::detail::Access*> all{&p.out};
    for (auto& a : p.leaves) all.push_back(&a);
    kiln::detail::collapse(p.space, all);
    kiln::detail::TileProgram::Instr ins{op, ct, attr, {-1, -1, -1}};
    int nt = 0, ns = 0;
    for (std::size_t k = 0; k < operand_is_tensor.size(); ++k)
        ins.in[k] = operand_is_tensor[k] ? p.leaf_value(nt++) : p.scalar_value(ns++);
    p.instrs.push_back(ins);
    if (out.numel() > 0) kiln::detail::run_program(p);
    return out;
}

/// Evaluates e one op at a time, each op its own kernel that materializes its result.
template <class E>
Tensor eager_eval(const E& e) {
    if constexpr (std::is_same_v<E, TensorLeaf>) {
        return e.t;
    } else {
        std::vector<Tensor> tensors;
        std::vector<int> is_tensor;
        std::vector<double> scalars;
        std::apply([&](const auto&... a) {
            ([&] {
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(a)>, ScalarLeaf>) {
                    scalars.push_back(a.s.value);
                    is_tensor.push_back(0);
                } else {
                    tensors.push_back(eager_eval(a));
                    is_tensor.push_back(1);
                }
            }(), ...);
        }, e.args);
        return run_single_op(ops::op_for_dtype(ops::op_id<typename E::op>, e.info.dtype), e.info, e.attr, tensors, is_tensor, scalars);
    }
}

}  // namespace kiln::expr

namespace kiln {

template <class E>
    requires IsExprNode<E>::value
Tensor::Tensor(const E& e, Loc loc) {
    if (trace::any_traced(e)) {
        *this = trace::record_expr(e, loc);
        return;
    }
    if (!e.info.ok()) e.info.raise(loc);
    if (cuda::detail::on_cuda(e)) {
        *this = cuda::detail::eval_expr(e, loc);
        return;
    }
    *this = Tensor(e.info.shape, e.info.dtype);
    expr::evaluate_into(e, *this);
}


/// Evaluates an expression: one fused pass, a new tensor.
template <TensorExpr E>
Tensor eval(const E& e, std::source_location loc = std::source_location::current()) {
    return Tensor(e, loc);
}
inline Tensor eval(const Tensor& t, std::source_location = std::source_location::current()) { return t; }

/// Evaluates an expression the way PyTorch eager does: each op its own kernel, every
/// intermediate materialized. The baseline that fused results are tested and timed against.
template <TensorExpr E>
Tensor eager(const E& e, std::source_location loc = std::source_location::current()) {
    if (trace::any_traced(e)) return trace::record_expr(e, loc);
    if (!e.info.ok()) e.info.raise(loc);
    return expr::eager_eval(e);
}
inline Tensor eager(const Tensor& t) { return t; }

template <class E>
Tensor& Tensor::assign(const E& e, Loc loc) {
    if constexpr (std::is_same_v<std::remove_cvref_t<E>, Tensor>) {
        return copy_(e, loc);
    } else {
        static_assert(TensorExpr<E>, "kiln::Tensor::assign takes a Tensor or a tensor expression");
        if (trace::Tracer* tr = trace::Tracer::active(); is_traced() || trace::any_traced(e) || (tr && tr->records_write_into(*this))) {
            // inside a traced function a write is recorded (functionalized): the tensor's base
            // gets a new value, which every view of it sees and the program writes back
            if (tr == nullptr) detail::fail<Error>("assign", "a tracing tensor was used outside its traced call", loc);
            if (!e.info.ok()) e.info.raise(loc);
            tr->write(*this, trace::detail::lower(*tr, e, e.info.ct), loc);
            return *this;
        }
        if (!e.info.ok()) e.info.raise(loc);
        Shape b;
        if (!detail::try_broadcast(e.info.shape, shape_, b) || !(b == shape_))
            detail::fail<ShapeError>("assign", "cannot write a value of shape " + e.info.shape.str() +
                                                   " into a tensor of shape " + shape_.str(), loc);
        std::vector<const Tensor*> leaves;
        std::vector<double> scalars;
        expr::collect(e, leaves, scalars);
        bool alias = false;
        for (const Tensor* t : leaves) alias = alias || expr::may_alias(*this, *t);
        if (alias) return copy_(Tensor(e, loc), loc);  // evaluate first, then write
        expr::evaluate_into(e, *this);
        return *this;
    }
}

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/ops/evaluate_impl.hpp"
#endif
