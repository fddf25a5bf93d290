// Public reductions over any axes (sum, mean, prod, max, min, argmax, argmin, var, std, logsumexp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backends/cpu/reduce.hpp"
#include "kiln/core/config.hpp"
#include "kiln/ir/shapes.hpp"
#include "kiln/ops/copy.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

/// Which axes to reduce: all of them (the default), one, or a list. Negative axes count from the end.
struct Axes {
    std::vector<std::int64_t> dims;
    Axes() = default;
    Axes(std::int64_t a) : dims{a} {}  // NOLINT: implicit, `sum(x, 1)`
    Axes(int a) : dims{a} {}           // NOLINT
    Axes(std::initializer_list<std::int64_t> l) : dims(l) {}
    Axes(std::vector<std::int64_t> v) : dims(std::move(v)) {}  // NOLINT
    bool all() const { return dims.empty(); }
};

namespace detail {

/// The reduced-axis mask for a rank, validated.
inline unsigned reduce_mask(const Axes& axes, int rank, std::string_view op, const std::source_location& loc) {
    if (axes.all()) return rank == 0 ? 0u : (1u << rank) - 1u;
    unsigned m = 0;
    for (std::int64_t a : axes.dims) {
        const int d = normalize_axis(a, rank, op, loc);
        if (rank == 0) continue;
        if (m & (1u << d)) fail<ShapeError>(op, "axis " + std::to_string(a) + " appears twice", loc);
        m |= 1u << d;
    }
    return m;
}


/// An operand as an expression node (a Tensor becomes an identity cast).
template <class X>
auto as_expr(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return cast(x, x.dtype());
    else return x;
}

template <class R> ir::ReduceKind reduce_kind() { return static_cast<ir::ReduceKind>(ops::reduce_id<R>); }

/// A reduction of the expression f (shape s) over the dims in mask.
template <class R>
Tensor reduce_flat(const expr::Flat& f, expr::Fused fused, const Axes& axes, bool keepdim, const std::source_location& loc) {
    const Shape& s = f.info().shape;
    const unsigned mask = reduce_mask(axes, s.rank(), R::name, loc);
    const DType out_dtype = ops::reduce_dtype<R>(f.info().dtype);
    const ReduceLayout lay = reduce_layout(s, mask, true);
    const std::int64_t outer = lay.outer * lay.kept_run, inner = lay.inner;
    if (autograd::detail::needs_grad(f)) return autograd::detail::reduce(f, ops::reduce_id<R>, mask, keepdim, loc);
    if (expr::any_traced(f))
        return trace::record_reduce(f, ir::Kind::reduce, reduce_kind<R>(), true, mask, keepdim, ir::reduced_shape(s, mask, keepdim),
                                    out_dtype, loc);
    if (expr::on_cuda(f))
        return cuda::detail::eval_reduce(f, ir::Kind::reduce, reduce_kind<R>(), true, mask, keepdim, ir::reduced_shape(s, mask, keepdim),
                                         out_dtype, R::name, loc);
    Tensor out(ir::reduced_shape(s, mask, keepdim), out_dtype);
    if (inner == 0 && R::needs_elements && outer > 0)
        fail<ValueError>(R::name, "cannot reduce over an empty dimension of shape " + s.str() + " (no identity)", loc);
    if (outer == 0) return out;
    if (inner == 0) {
        out.fill_(Scalar(static_cast<double>(R::template identity<double>())));
        return out;
    }
    const expr::EvalState ev(f, fused, s, lay.perm);
    auto source = [&](std::int64_t b, std::int64_t n, void* dst) { ev.tile(b, n, dst); };
    if (lay.columns) reduce_cols<R>(lay.outer, inner, lay.kept_run, ev.ct(), source, out);
    else reduce_rows<R>(outer, inner, ev.ct(), source, out);
    return out;
}

template <class R, class X>
Tensor reduce(const X& x, const Axes& axes, bool keepdim, const std::source_location& loc) {
    static_assert(Operand<X> && !std::is_arithmetic_v<X>, "kiln: reductions take a Tensor or a tensor expression");
    const auto e = as_expr(x);
    if (!e.info.ok()) e.info.raise(loc);
    return reduce_flat<R>(expr::flatten(e), expr::fused_of(e), axes, keepdim, loc);
}

template <bool Max>
Tensor arg_reduce_flat(const expr::Flat& f, expr::Fused fused, std::optional<std::int64_t> axis, bool keepdim,
                       const std::source_location& loc) {
    const char* op = Max ? "argmax" : "argmin";
    const Shape& s = f.info().shape;
    const unsigned mask = axis ? reduce_mask(Axes{*axis}, s.rank(), op, loc) : reduce_mask(Axes{}, s.rank(), op, loc);
    const ReduceLayout lay = reduce_layout(s, mask, false);
    const std::int64_t outer = lay.outer, inner = lay.inner;
    const Shape out_shape = axis ? ir::reduced_shape(s, mask, keepdim) : (keepdim ? Shape::filled(s.rank(), 1) : Shape{});
    if (expr::any_traced(f))
        return trace::record_reduce(f, ir::Kind::arg_reduce, ir::ReduceKind::max, Max, mask, keepdim, out_shape, DType::i64, loc);
    if (expr::on_cuda(f))
        return cuda::detail::eval_reduce(f, ir::Kind::arg_reduce, ir::ReduceKind::max, Max, mask, keepdim, out_shape, DType::i64, op, loc);
    Tensor out(out_shape, DType::i64);
    if (inner == 0 && outer > 0) fail<ValueError>(op, "cannot reduce over an empty dimension of shape " + s.str(), loc);
    if (outer == 0) return out;
    const expr::EvalState ev(f, fused, s, lay.perm);
    arg_reduce_rows<Max>(outer, inner, ev.ct(), [&](std::int64_t b, std::int64_t n, void* dst) { ev.tile(b, n, dst); },
                         out.data<std::int64_t>());
    return out;
}

template <bool Max, class X>
Tensor arg_reduce(const X& x, std::optional<std::int64_t> axis, bool keepdim, const std::source_location& loc) {
    static_assert(Operand<X> && !std::is_arithmetic_v<X>, "kiln: reductions take a Tensor or a tensor expression");
    const auto e = as_expr(x);
    if (!e.info.ok()) e.info.raise(loc);
    return arg_reduce_flat<Max>(expr::flatten(e), expr::fused_of(e), axis, keepdim, loc);
}

/// sum(x, axes) / max(0, n - correction), n the number of elements reduced. Traced, it is one
/// mean node, so a dim that becomes dynamic divides by its size at run time, not the traced one.
template <class X>
Tensor mean_reduce(const X& x, const Axes& axes, bool keepdim, double correction, std::string_view op, const std::source_location& loc) {
    const auto e = as_expr(x);
    if (!e.info.ok()) e.info.raise(loc);
    const Shape& s = e.info.shape;
    const unsigned mask = reduce_mask(axes, s.rank(), op, loc);
    const expr::Flat f = expr::flatten(e);
    if (expr::any_traced(f) && !autograd::detail::needs_grad(f))  // recorded: a sum and a division
        return trace::record_reduce(f, ir::Kind::reduce, ir::ReduceKind::mean, true, mask, keepdim,
                                    ir::reduced_shape(s, mask, keepdim), e.info.dtype, loc, correction);
    std::int64_t n = 1;
    for (int d = 0; d < s.rank(); ++d)
        if (mask & (1u << d)) n *= s[d];
    return Tensor(reduce_flat<ops::SumR>(f, expr::fused_of(e), axes, keepdim, loc) / std::max(0.0, static_cast<double>(n) - correction), loc);
}

template <class X> DType operand_dtype(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return x.dtype();
    else return x.info.dtype;
}
template <class X> const Shape& operand_shape(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return x.shape();
    else return x.info.shape;
}


// A reduction of a plain tensor is one instantiation per reduction (mean has its own path), whatever the program, and
// so is the reduction of any expression once flattened (reduce_flat, arg_reduce_flat: the expression's own code is
// its fused loop, passed in): in separate compilation the runtime compiles them once and user code only calls them.
#if !KILN_HEADER_ONLY
#define KILN_INSTANTIATE extern template
#elif defined(KILN_SEPARATE_COMPILATION)
#define KILN_INSTANTIATE template
#endif
#ifdef KILN_INSTANTIATE
#define KILN_REDUCTION(R)                                                                                    \
    KILN_INSTANTIATE Tensor reduce<ops::R, Tensor>(const Tensor&, const Axes&, bool, const std::source_location&); \
    KILN_INSTANTIATE Tensor reduce_flat<ops::R>(const expr::Flat&, expr::Fused, const Axes&, bool, const std::source_location&);
#define KILN_ARG_REDUCTION(Max) \
    KILN_INSTANTIATE Tensor arg_reduce_flat<Max>(const expr::Flat&, expr::Fused, std::optional<std::int64_t>, bool, const std::source_location&);
KILN_REDUCTION(SumR)
KILN_REDUCTION(ProdR)
KILN_REDUCTION(MaxR)
KILN_REDUCTION(MinR)
KILN_ARG_REDUCTION(true)
KILN_ARG_REDUCTION(false)
#undef KILN_REDUCTION
#undef KILN_ARG_REDUCTION
#undef KILN_INSTANTIATE
#endif

}  // namespace detail

using Loc = std::source_location;

/// Sum over axes (all by default); integers and bool sum to int64.
template <class X> Tensor sum(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::reduce<ops::SumR>(x, axes, keepdim, loc);
}
/// Product over axes; integers and bool multiply in int64.
template <class X> Tensor prod(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::reduce<ops::ProdR>(x, axes, keepdim, loc);
}
/// Maximum over axes; NaN propagates.
template <class X> Tensor max(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::reduce<ops::MaxR>(x, axes, keepdim, loc);
}
/// Minimum over axes; NaN propagates.
template <class X> Tensor min(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::reduce<ops::MinR>(x, axes, keepdim, loc);
}
/// Index of the first maximum along axis (over the flattened tensor when axis is absent).
template <class X> Tensor argmax(const X& x, std::optional<std::int64_t> axis = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::arg_reduce<true>(x, axis, keepdim, loc);
}
/// Index of the first minimum along axis (over the flattened tensor when axis is absent).
template <class X> Tensor argmin(const X& x, std::optional<std::int64_t> axis = {}, bool keepdim = false, Loc loc = Loc::current()) {
    return detail::arg_reduce<false>(x, axis, keepdim, loc);
}
/// Mean over axes; floating dtypes only, like torch.
template <class X> Tensor mean(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("mean", loc);
    const DType d = detail::operand_dtype(x);
    if (!is_floating(d))
        detail::fail<DTypeError>("mean", "needs a floating dtype, got " + std::string(dtype_name(d)) +
                                             " (cast first, e.g. kiln::cast(x, kiln::DType::f32))", loc);
    return detail::mean_reduce(x, axes, keepdim, 0.0, "mean", loc);
}
/// Variance over axes with Bessel's correction by default (torch.var(correction=1)).
template <class X> Tensor var(const X& x, const Axes& axes = {}, bool keepdim = false, double correction = 1, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("var", loc);
    const Tensor m = mean(x, axes, true, loc);
    return detail::mean_reduce(square(x - m), axes, keepdim, correction, "var", loc);
}
/// Standard deviation over axes: sqrt(var).
template <class X> Tensor std(const X& x, const Axes& axes = {}, bool keepdim = false, double correction = 1, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("std", loc);
    return Tensor(sqrt(var(x, axes, keepdim, correction, loc)), loc);
}
namespace detail {
/// max over axes (keepdim) as a constant shift: not recorded for backward, since the results it
/// stabilizes (softmax, logsumexp) do not depend on it.
template <class X> Tensor row_max(const X& x, const Axes& axes, const std::source_location& loc) {
    const no_grad off;
    return max(x, axes, true, loc);
}
}  // namespace detail

/// log(sum(exp(x))) over axes, computed stably around the maximum.
template <class X> Tensor logsumexp(const X& x, const Axes& axes = {}, bool keepdim = false, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("logsumexp", loc);
    const Tensor m = detail::row_max(x, axes, loc);
    const Tensor shift = Tensor(where(abs(m) == std::numeric_limits<double>::infinity(), 0.0, m), loc);
    Tensor r = Tensor(log(sum(exp(x - shift), axes, true, loc)) + shift, loc);
    if (keepdim) return r;
    return r.reshape(ir::reduced_shape(detail::operand_shape(x), detail::reduce_mask(axes, detail::operand_shape(x).rank(), "logsumexp", loc), false), loc);
}

}  // namespace kiln
