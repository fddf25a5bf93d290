// Evaluating expressions: one fused SIMD loop per statement, the tile interpreter for mixed dtypes, and eager.
#pragma once

#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "kiln/backends/cpu/program.hpp"
#include "kiln/backends/cuda/frontend.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/function_ref.hpp"
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

/// Whether every op of E may write large outputs with streaming stores (ops::streams_ok).
template <class E> struct Streams : std::true_type {};
template <class Op, class... A>
struct Streams<Node<Op, A...>> : std::bool_constant<ops::streams_ok(Op::rule) && (Streams<A>::value && ...)> {};

/// The tensors (in leaf order, repeats kept) and scalars of an expression.
inline void collect(const Flat& f, std::vector<const Tensor*>& leaves, std::vector<double>& scalars) {
    for (const Flat::Item& it : f.items) {
        if (it.kind == Flat::Kind::tensor) leaves.push_back(it.tensor);
        else if (it.kind == Flat::Kind::scalar) scalars.push_back(it.value);
    }
}

// ------------------------------------------------------------------ the fused loop
template <class T, std::size_t L, std::size_t S, class E>
[[gnu::always_inline]] inline simd::Batch<T> eval_at(const E& e, const T* const* lp, const simd::Batch<T>* sv,
                                                     std::int64_t i);

template <class T, std::size_t L, std::size_t S, class Op, class... A, std::size_t... K>
[[gnu::always_inline]] inline simd::Batch<T> eval_node(const Node<Op, A...>& n, const T* const* lp,
                                                       const simd::Batch<T>* sv, std::int64_t i,
                                                       std::index_sequence<K...>) {
    // An add of bool result is a logical or (ops::op_for_dtype). Where the type shows it
    // (StaticBool: compares and logical ops) the loop computes one; where only the dtypes do, the
    // tree goes to the tile interpreter (Flat::bool_add). A test per node in the loop would be a
    // branch or a blend per element, and compiling both arms doubles every subtree under an add.
    using Runs = std::conditional_t<std::is_same_v<Op, ops::Add> && StaticBool<Node<Op, A...>>::value, ops::LogicalOr, Op>;
    return kiln::detail::apply_op<Runs>(
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
/// loop body: every intermediate lives in registers. `stream`: write with streaming stores from
/// the first aligned element, where e is bound by memory (Streams).
template <class T, class E>
void fused_tile(const E& e, const T* const* lp, const T* scalars, T* out, std::int64_t n, [[maybe_unused]] bool stream = false) {
    constexpr std::size_t nl = Count<E>::leaves, ns = Count<E>::scalars;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    simd::Batch<T> sv[ns ? ns : 1];
    for (std::size_t s = 0; s < ns; ++s) sv[s] = simd::splat(scalars[s]);
    auto part = [&](std::int64_t b, std::int64_t e1) {  // fewer than w elements through the same code, on padded copies
        alignas(64) T pad[nl ? nl : 1][w] = {};
        const T* pp[nl ? nl : 1];
        for (std::size_t k = 0; k < nl; ++k) {
            std::copy(lp[k] + b, lp[k] + e1, pad[k]);
            pp[k] = pad[k];
        }
        alignas(64) T res[w];
        simd::store_aligned(res, eval_at<T, 0, 0>(e, pp, sv, 0));
        std::copy(res, res + (e1 - b), out + b);
    };
    std::int64_t i = 0;
    if constexpr (Streams<E>::value) {
        if (stream && n >= 2 * w) {
            const std::int64_t h = simd::stream_head(out);
            if (h > 0) {
                part(0, h);
                i = h;
            }
            if (simd::stream_aligned(out + i))
                for (; i + w <= n; i += w) simd::store_stream(out + i, eval_at<T, 0, 0>(e, lp, sv, i));
        }
    }
    for (; i + w <= n; i += w) simd::store(out + i, eval_at<T, 0, 0>(e, lp, sv, i));
    if (i < n) part(i, n);
    if constexpr (Streams<E>::value) {
        if (stream) simd::stream_fence();
    }
}

// ------------------------------------------------------------------ evaluation
class EvalState;

/// An expression type's fused loop: writes elements [start, start + len) of st's iteration
/// order, in st.ct(), into dst. Instantiated per expression type (KILN_FUSED_LOOPS).
using FusedTile = void (*)(const void* e, const EvalState& st, std::int64_t start, std::int64_t len, void* dst);
/// An expression's fused loop, if it has one (else the tile interpreter runs it).
struct Fused {
    const void* expr = nullptr;
    FusedTile tile = nullptr;
};

/// An expression prepared for evaluation over its shape (optionally with dims permuted, as
/// reductions do): tile(start, len, dst) writes elements [start, start + len) of the row-major
/// iteration order, in compute type ct(), either from the expression type's fused loop (one
/// floating compute type across the tree, when the loop was instantiated) or from the tile
/// interpreter (integer or mixed compute types; or no fused loop). Compiled once.
class EvalState {
public:
    /// shape: the iteration shape (the expression broadcasts to it). perm: iteration dim i is
    /// dim perm[i] (empty: identity). extra: accesses over the same unpermuted shape that take
    /// part in collapsing, e.g. a statement's output.
    KILN_DECL EvalState(const Flat& f, Fused fused, const Shape& shape, const std::vector<int>& perm = {},
                        std::vector<kiln::detail::Access*> extra = {});
    EvalState(const EvalState&) = delete;
    EvalState& operator=(const EvalState&) = delete;

    DType ct() const { return ct_; }
    const kiln::detail::IterSpace& space() const { return space_; }
    bool fused() const { return fused_.tile != nullptr; }
    const std::vector<kiln::detail::Access>& leaves() const { return leaves_; }
    bool direct(std::size_t k) const { return direct_[k] != 0; }
    const std::vector<double>& scalars() const { return scalars_; }

    /// Whether fused loops write with streaming stores (dst is the output's memory, and it is large).
    bool stream() const { return stream_; }
    void set_stream(bool s) { stream_ = s; }

    void tile(std::int64_t start, std::int64_t len, void* dst) const {
        if (fused_.tile) fused_.tile(fused_.expr, *this, start, len, dst);
        else runner_->tile(start, len, dst);
    }

private:
    kiln::detail::IterSpace space_;
    std::vector<kiln::detail::Access> leaves_;
    std::vector<char> direct_;
    std::vector<double> scalars_;
    Fused fused_;
    DType ct_ = DType::f32;
    bool stream_ = false;
    std::unique_ptr<kiln::detail::TileProgram> prog_;
    std::unique_ptr<kiln::detail::ProgramRunner> runner_;
};

template <class T, class E>
void fused_tile_at(const E& e, const EvalState& st, std::int64_t start, std::int64_t len, T* dst) {
    constexpr std::size_t nl = Count<E>::leaves, ns = Count<E>::scalars;
    struct Tag {};
    T* buf = kiln::detail::scratch<T, Tag>(nl ? nl : 1);
    const T* lp[nl ? nl : 1];
    for (std::size_t k = 0; k < nl; ++k) {
        const auto& a = st.leaves()[k];
        if (st.direct(k) && a.dtype == dtype_of<T>) {
            lp[k] = reinterpret_cast<const T*>(a.base) + start;
        } else {
            T* b = buf + k * kiln::detail::tile_elems;
            kiln::detail::gather(st.space(), a, start, len, b);
            lp[k] = b;
        }
    }
    T sc[ns ? ns : 1] = {};
    for (std::size_t s = 0; s < ns; ++s) sc[s] = static_cast<T>(st.scalars()[s]);
    fused_tile<T>(e, lp, sc, dst, len, st.stream());
}

template <class E>
void fused_entry(const void* p, const EvalState& st, std::int64_t start, std::int64_t len, void* dst) {
    const E& e = *static_cast<const E*>(p);
    if (st.ct() == DType::f64) {
        if constexpr (RunsIn<E, double>::value) return fused_tile_at<double>(e, st, start, len, static_cast<double*>(dst));
    } else {
        if constexpr (RunsIn<E, float>::value) return fused_tile_at<float>(e, st, start, len, static_cast<float*>(dst));
    }
    throw InternalError("kiln: fused expression has no loop for " + std::string(dtype_name(st.ct())));
}

/// e's fused loop (KILN_FUSED_LOOPS=1), or none: the tile interpreter then runs e.
template <class E>
Fused fused_of([[maybe_unused]] const E& e) {
#if KILN_FUSED_LOOPS
    return {&e, &fused_entry<E>};
#else
    return {};
#endif
}

/// Whether writing `out` while reading `in` could clobber values still to be read: same memory,
/// different element mapping.
inline bool may_alias(const Tensor& out, const Tensor& in) {
    if (out.storage() != in.storage()) return false;
    const Strides bs = kiln::detail::broadcast_strides(in.shape(), in.strides(), out.shape());
    return !(in.offset() == out.offset() && bs == out.strides() && in.dtype() == out.dtype());
}

/// Whether any tensor of f is a tracing tensor, or live for the active trace (memory it wrote into,
/// whose value is then the trace's, or a parameter it may write later: Tracer::live).
inline bool any_traced(const Flat& f) {
    for (const Flat::Item& it : f.items)
        if (it.kind == Flat::Kind::tensor && trace::recorded(*it.tensor)) return true;
    return false;
}
inline bool on_cuda(const Flat& f) {
    for (const Flat::Item& it : f.items)
        if (it.kind == Flat::Kind::tensor && it.tensor->defined() && !it.tensor->is_traced() && it.tensor->device().is_cuda())
            return true;
    return false;
}

/// Evaluates f (broadcast to out's shape) into out's memory, converting to out's dtype.
KILN_DECL void evaluate_into(const Flat& f, Fused fused, const Tensor& out);

/// Runs one table op as its own kernel over materialized operands (tensors and scalars, in
/// operand order) into a new tensor of the node's shape and dtype.
KILN_DECL Tensor run_single_op(ops::OpId op, const Info& info, DType attr, const std::vector<Tensor>& tensors,
                               const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars);

/// Evaluates f one op at a time, each op its own kernel that materializes its result.
KILN_DECL Tensor eager_eval(const Flat& f);

/// A new tensor holding f's value: recorded when traced, a CUDA statement, or evaluated here.
KILN_DECL Tensor eval_statement(const Flat& f, Fused fused, const std::source_location& loc);

/// Writes f into t (broadcast to t's shape; recorded when traced).
KILN_DECL void assign_into(Tensor& t, const Flat& f, Fused fused, const std::source_location& loc);

}  // namespace kiln::expr

// Autograd's entry points from the ops (defined in autograd/autograd_impl.hpp): when recording is
// on and an operand requires grad, an op runs through these, which record it for backward.
namespace kiln::autograd::detail {
/// Whether statement f must be recorded: recording is on and one of its tensors requires grad.
inline bool needs_grad(const expr::Flat& f) {
    if (!grad_mode()) return false;
    for (const expr::Flat::Item& it : f.items)
        if (it.kind == expr::Flat::Kind::tensor && it.tensor->requires_grad()) return true;
    return false;
}
/// f evaluated one table op at a time, each op a node of the backward graph.
KILN_DECL Tensor statement(const expr::Flat& f, const std::source_location& loc);
/// A reduction (ops::ReduceId r over the dims in mask) of f, recorded.
KILN_DECL Tensor reduce(const expr::Flat& f, std::uint8_t r, unsigned mask, bool keepdim, const std::source_location& loc);
/// a @ b, recorded.
KILN_DECL Tensor matmul(const Tensor& a, const Tensor& b, const std::source_location& loc);
/// A copy of src (clone, or a transfer to `device`), recorded.
KILN_DECL Tensor copy_of(const Tensor& src, const Device* device, const std::source_location& loc);
/// Before an in-place write into t (assign, copy_, fill_): a leaf that requires grad cannot be
/// written while recording (GradError). (The write itself bumps the storage's version.)
KILN_DECL void before_write(const Tensor& t, std::string_view op, const std::source_location& loc);
/// After t's elements were overwritten by `value` (broadcast into t): t's handle now stands for
/// value's history (or none when value needs no grad).
KILN_DECL void after_write(Tensor& t, const Tensor& value);
/// The gradients of a library op's operands from its result's gradient (run with recording off).
using Backward = std::function<std::vector<Tensor>(const Tensor& grad)>;
/// A library op of the ops layer (cat, pad, roll, gather, scatter): `forward` run with recording
/// off; when recording is on and an operand requires grad, its result gets `backward`.
KILN_DECL Tensor library(std::string_view name, const std::vector<const Tensor*>& operands, FunctionRef<Tensor()> forward,
                         Backward backward, const std::source_location& loc);
/// Whether recording is on and one of ts requires grad.
inline bool needs_grad(std::initializer_list<const Tensor*> ts) {
    if (!grad_mode()) return false;
    for (const Tensor* t : ts)
        if (t->defined() && t->requires_grad()) return true;
    return false;
}
}  // namespace kiln::autograd::detail

namespace kiln {

template <class E>
    requires IsExprNode<E>::value
Tensor::Tensor(const E& e, Loc loc) {
    *this = expr::eval_statement(expr::flatten(e), expr::fused_of(e), loc);
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
    const expr::Flat f = expr::flatten(e);
    if (autograd::detail::needs_grad(f)) return autograd::detail::statement(f, loc);
    if (expr::any_traced(f)) return trace::record_expr(f, loc);
    if (!e.info.ok()) e.info.raise(loc);
    return expr::eager_eval(f);
}
inline Tensor eager(const Tensor& t) { return t; }

template <class E>
Tensor& Tensor::assign(const E& e, Loc loc) {
    if constexpr (std::is_same_v<std::remove_cvref_t<E>, Tensor>) {
        return copy_(e, loc);
    } else {
        static_assert(TensorExpr<E>, "kiln::Tensor::assign takes a Tensor or a tensor expression");
        expr::assign_into(*this, expr::flatten(e), expr::fused_of(e), loc);
        return *this;
    }
}

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/ops/evaluate_impl.hpp"
#endif
