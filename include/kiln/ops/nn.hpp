// Row-wise composites: softmax, log_softmax, layer_norm, rms_norm and one_hot, written with reductions and expressions.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/ops/composites.hpp"
#include "kiln/ops/reductions.hpp"

namespace kiln {
namespace detail {

/// The row composites below, called on concrete tensors, run as one compiled program each (one row
/// kernel, as kiln::compile fuses them) instead of one kernel per statement: eager softmax is one
/// pass over L1-resident rows, as torch's eager softmax is one kernel. Traced calls (inside
/// kiln::compile or export_program), calls autograd records, and programs without kiln::compile's
/// layer (which sets the runner: compile/compiled_core.hpp) take the statements below.
/// KILN_EAGER_COMPOSITES=0 turns it off (to compare).
enum class RowComposite : std::uint8_t { softmax, log_softmax, layer_norm, rms_norm };
struct RowCompositeCall {
    RowComposite op;
    std::int64_t axis = -1;  ///< softmax / log_softmax: the axis; layer_norm / rms_norm: how many trailing dims
    double eps = 0;
    Tensor x, weight, bias;  ///< weight and bias may be undefined
};
using RowCompositeRunner = std::optional<Tensor> (*)(const RowCompositeCall&, const std::source_location&);
inline RowCompositeRunner& row_composite_runner() {
    static RowCompositeRunner run = nullptr;
    return run;
}
/// The composite's result from its compiled program, or nullopt where it takes its statements. The
/// caller has checked the arguments (errors name the user's op, as the statements' would).
KILN_DECL std::optional<Tensor> eager_row_composite(const RowCompositeCall& c, const std::source_location& loc);
/// Whether axis names a dim of a tensor of rank r (a composite with a bad axis takes its
/// statements, whose reduction raises the error).
inline bool axis_ok(std::int64_t axis, int r) { return r >= 1 && axis >= -r && axis < r; }
/// Whether a composite of expression x (softmax(scores * scale), layer_norm(x + residual)) runs
/// as x evaluated once, then the composite's compiled program: a valid expression of a floating
/// dtype over concrete tensors that autograd need not record, with the runner set. Its statements
/// would read x's operands once per pass (3 for softmax) and evaluate x in each; this reads them
/// once and writes x (as torch's eager does), then one row kernel. The value of x is rounded to
/// its dtype first, as in torch's eager (for f32 the same numbers).
template <class X> bool eager_composite_of_expr(const X& x) {
    if constexpr (std::is_same_v<X, Tensor> || !IsExprNode<X>::value) {
        return false;
    } else {
        if (!row_composite_runner() || trace::Tracer::active() != nullptr || !x.info.ok() || !is_floating(x.info.dtype)) return false;
        const expr::Flat f = expr::flatten(x);
        return !expr::any_traced(f) && !autograd::detail::needs_grad(f);
    }
}

}  // namespace detail

/// exp(x - max) / sum(exp(x - max)) along axis.
template <class X> Tensor softmax(const X& x, std::int64_t axis = -1, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("softmax", loc);
    if constexpr (std::is_same_v<X, Tensor>) {
        if (detail::axis_ok(axis, x.rank()))
            if (auto y = detail::eager_row_composite({detail::RowComposite::softmax, axis, 0, x, {}, {}}, loc)) return std::move(*y);
    } else if (detail::eager_composite_of_expr(x) && detail::axis_ok(axis, x.info.shape.rank())) {
        return softmax(Tensor(x, loc), axis, loc);
    }
    const Tensor m = detail::row_max(x, axis, loc);
    const Tensor s = sum(exp(x - m), axis, true, loc);
    return Tensor(exp(x - m) / s, loc);
}

/// x - max - log(sum(exp(x - max))) along axis.
template <class X> Tensor log_softmax(const X& x, std::int64_t axis = -1, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("log_softmax", loc);
    if constexpr (std::is_same_v<X, Tensor>) {
        if (detail::axis_ok(axis, x.rank()))
            if (auto y = detail::eager_row_composite({detail::RowComposite::log_softmax, axis, 0, x, {}, {}}, loc)) return std::move(*y);
    } else if (detail::eager_composite_of_expr(x) && detail::axis_ok(axis, x.info.shape.rank())) {
        return log_softmax(Tensor(x, loc), axis, loc);
    }
    const Tensor m = detail::row_max(x, axis, loc);
    const Tensor lse = Tensor(log(sum(exp(x - m), axis, true, loc)) + m, loc);
    return Tensor(x - lse, loc);
}

/// Normalizes over the last `normalized_dims` dims to zero mean and unit variance (biased), then
/// scales by weight and shifts by bias when given (torch.nn.functional.layer_norm).
template <class X>
Tensor layer_norm(const X& x, int normalized_dims = 1, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5, Loc loc = Loc::current()) {
    const detail::UserOpScope scope("layer_norm", loc);
    const Shape& s = detail::operand_shape(x);
    if (normalized_dims < 1 || normalized_dims > s.rank())
        detail::fail<ShapeError>("layer_norm", "cannot normalize the last " + std::to_string(normalized_dims) +
                                                   " dims of a tensor of shape " + s.str(), loc);
    for (const Tensor* p : {&weight, &bias}) {
        if (!p->defined()) continue;
        bool ok = p->rank() == normalized_dims;
        for (int d = 0; ok && d < normalized_dims; ++d) ok = p->size(d) == s[s.rank() - normalized_dims + d];
        if (!ok)
            detail::fail<ShapeError>("layer_norm", std::string(p == &weight ? "weight" : "bias") + " of shape " +
                                                       p->shape().str() + " does not match the normalized dims of " + s.str(), loc);
    }
    if constexpr (std::is_same_v<X, Tensor>) {
        if (auto y = detail::eager_row_composite({detail::RowComposite::layer_norm, normalized_dims, eps, x, weight, bias}, loc))
            return std::move(*y);
    } else if (detail::eager_composite_of_expr(x) && !autograd::detail::needs_grad({&weight, &bias})) {
        return layer_norm(Tensor(x, loc), normalized_dims, weight, bias, eps, loc);
    }
    std::vector<std::int64_t> axes;
    for (int d = s.rank() - normalized_dims; d < s.rank(); ++d) axes.push_back(d);
    const Tensor mu = mean(x, axes, true, loc);
    const Tensor rstd = Tensor(rsqrt(mean(square(x - mu), axes, true, loc) + eps), loc);
    if (weight.defined() && bias.defined()) return Tensor((x - mu) * rstd * weight + bias, loc);
    if (weight.defined()) return Tensor((x - mu) * rstd * weight, loc);
    if (bias.defined()) return Tensor((x - mu) * rstd + bias, loc);
    return Tensor((x - mu) * rstd, loc);
}


/// x * rsqrt(mean(x^2 over the trailing dims given by normalized_shape) + eps), times weight when
/// given (torch.nn.functional.rms_norm). eps left empty is the machine epsilon of x's dtype, as
/// torch's eps=None (float32: 1.19e-7). f16/bf16 inputs take their statistic in float32; the
/// result has the dtype x and weight promote to.
template <class X>
Tensor rms_norm(const X& x, const Shape& normalized_shape, const Tensor& weight = {}, std::optional<double> eps = {},
                Loc loc = Loc::current()) {
    const detail::UserOpScope scope("rms_norm", loc);
    const Shape& s = detail::operand_shape(x);
    const DType dt = detail::operand_dtype(x);
    if (!is_floating(dt))
        detail::fail<DTypeError>("rms_norm", "needs a floating dtype, got " + std::string(dtype_name(dt)), loc);
    const int nd = normalized_shape.rank();
    bool ok = nd >= 1 && nd <= s.rank();
    for (int d = 0; ok && d < nd; ++d) ok = normalized_shape[d] == s[s.rank() - nd + d];
    if (!ok)
        detail::fail<ShapeError>("rms_norm", "normalized_shape " + normalized_shape.str() +
                                                 " does not match the trailing dims of " + s.str(), loc);
    if (weight.defined() && !(weight.shape() == normalized_shape))
        detail::fail<ShapeError>("rms_norm", "weight of shape " + weight.shape().str() + " does not match normalized_shape " +
                                                 normalized_shape.str(), loc);
    if (weight.defined() && !is_floating(weight.dtype()))
        detail::fail<DTypeError>("rms_norm", "weight must be floating, got " + std::string(dtype_name(weight.dtype())), loc);
    const double e = eps ? *eps : dt == DType::f64 ? 0x1p-52 : dt == DType::f16 ? 0x1p-10 : dt == DType::bf16 ? 0x1p-7 : 0x1p-23;
    if constexpr (std::is_same_v<X, Tensor>) {
        if (auto y = detail::eager_row_composite({detail::RowComposite::rms_norm, nd, e, x, weight, {}}, loc)) return std::move(*y);
    } else if (detail::eager_composite_of_expr(x) && !autograd::detail::needs_grad({&weight})) {
        return rms_norm(Tensor(x, loc), normalized_shape, weight, eps, loc);
    }
    std::vector<std::int64_t> axes;
    for (int d = s.rank() - nd; d < s.rank(); ++d) axes.push_back(d);
    const DType st = dt == DType::f64 ? DType::f64 : DType::f32;  // the statistic's dtype
    const Tensor rstd = Tensor(rsqrt(mean(square(cast(x, st)), axes, true, loc) + e), loc);
    const DType out = weight.defined() ? promote_types(dt, weight.dtype()) : dt;
    if (weight.defined()) return Tensor(cast(x * rstd * weight, out), loc);
    return Tensor(cast(x * rstd, out), loc);
}

/// Class indices as one-hot rows: int64 of shape indices.shape + (num_classes,), 1 at each index
/// (torch.nn.functional.one_hot). num_classes = -1 takes max(indices) + 1. Indices must be integers
/// in [0, num_classes): checked here (ValueError naming the value), except when the indices are
/// traced by kiln::compile with num_classes given, where reading them would break the graph: there
/// an index out of range gives a row of zeros.
KILN_DECL Tensor one_hot(const Tensor& indices, std::int64_t num_classes = -1, Loc loc = Loc::current());

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/ops/nn_impl.hpp"
#endif
