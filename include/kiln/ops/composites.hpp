// Composite elementwise ops, written as decompositions into table ops (no backend code of their own).
#pragma once

#include <numbers>
#include <string>

#include "kiln/core/factories.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/tables/activations.hpp"

namespace kiln {

/// x * x.
template <Operand X> auto square(const X& x) { return x * x; }

/// GELU, exact form: x/2 * (1 + erf(x / sqrt 2)).
template <Operand X> auto gelu(const X& x) {
    return x * 0.5 * (1.0 + erf(x * (1.0 / std::numbers::sqrt2)));
}

/// act(x) as one expression statement: each row of the activation table bound to its formula.
template <Operand X> Tensor apply_act(Act act, const X& x, std::source_location loc = std::source_location::current()) {
    switch (act) {
        case Act::none: break;
        case Act::relu: return Tensor(relu(x), loc);
        case Act::gelu_tanh: return Tensor(gelu_tanh(x), loc);
        case Act::gelu: return Tensor(gelu(x), loc);
    }
    if constexpr (std::is_same_v<X, Tensor>) return x;
    else return Tensor(x, loc);
}

/// x * sigmoid(x).
template <Operand X> auto silu(const X& x) { return x * sigmoid(x); }

/// log(1 + exp(x)), linear above the threshold (torch's beta=1, threshold=20).
template <Operand X> auto softplus(const X& x) { return where(x > 20.0, x, log1p(exp(x))); }

/// min(max(x, lo), hi); NaN stays NaN.
template <Operand X, Operand L, Operand H> auto clamp(const X& x, const L& lo, const H& hi) {
    return minimum(maximum(x, lo), hi);
}

/// a + w * (b - a), computed from the nearer end for |w| >= 0.5 like torch.lerp.
template <Operand A, Operand B, Operand W> auto lerp(const A& a, const B& b, const W& w) {
    if constexpr (std::is_arithmetic_v<W>) {
        // both torch formulas as `end - (b - a) * c`: a + (b-a)w == a - (b-a)(-w) exactly
        const double wd = static_cast<double>(w);
        if constexpr (std::is_same_v<A, B>) {
            const bool near_a = wd < 0.5 && wd > -0.5;
            return (near_a ? a : b) - (b - a) * (near_a ? -wd : 1.0 - wd);
        } else {
            return a - (b - a) * (-wd);
        }
    } else {
        return where(abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1.0 - w));
    }
}


namespace detail {

/// The device of an operand's first concrete tensor leaf (CPU for numbers; a tracing tensor reports the device its program runs on).
template <class X> Device leaf_device(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return x.defined() ? x.device() : Device::cpu();
    else if constexpr (std::is_same_v<X, expr::TensorLeaf>) return leaf_device(x.t);
    else if constexpr (std::is_same_v<X, expr::ScalarLeaf> || std::is_arithmetic_v<X>) return Device::cpu();
    else {
        Device d = Device::cpu();
        std::apply([&](const auto&... a) { ((d.is_cpu() ? void(d = leaf_device(a)) : void()), ...); }, x.args);
        return d;
    }
}
template <class X> const Shape& expr_shape(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return x.shape();
    else return x.info.shape;
}
template <class X> DType expr_dtype(const X& x) {
    if constexpr (std::is_same_v<X, Tensor>) return x.dtype();
    else return x.info.dtype;
}

/// Keeps the elements of x whose column minus row (on the last two dims) passes `keep`, zeroes the
/// rest, in x's dtype: the mask compares a column ramp with a row ramp, so it fuses.
template <bool Upper, class X> auto triangle(const X& x, std::int64_t diagonal, std::string_view op, const std::source_location& loc) {
    const Shape& s = expr_shape(x);
    if (s.rank() < 2) fail<ShapeError>(op, "needs a tensor of at least 2 dims, got shape " + s.str(), loc);
    const Device dev = leaf_device(x);
    const Tensor rows = arange(0, static_cast<double>(s[s.rank() - 2]), 1, DType::i64, dev, loc).unsqueeze(1, loc);
    const Tensor cols = arange(0, static_cast<double>(s[s.rank() - 1]), 1, DType::i64, dev, loc);
    const auto offset = cols - rows;  // j - i, (rows, cols)
    auto keep = [&] {
        if constexpr (Upper) return offset >= diagonal;
        else return offset <= diagonal;
    }();
    const DType dt = expr_dtype(x);
    // a bool zero keeps bool tensors bool; any other dtype keeps its own under an integer zero
    return cast(dt == DType::boolean ? where(keep, x, false) : where(keep, x, 0), dt);
}

}  // namespace detail

/// The upper triangle of the last two dims: elements with column - row >= diagonal, others 0
/// (torch.triu). Same dtype as x.
template <Operand X> requires(!std::is_arithmetic_v<X>)
auto triu(const X& x, std::int64_t diagonal = 0, std::source_location loc = std::source_location::current()) {
    return detail::triangle<true>(x, diagonal, "triu", loc);
}

/// The lower triangle of the last two dims: elements with column - row <= diagonal, others 0
/// (torch.tril). Same dtype as x.
template <Operand X> requires(!std::is_arithmetic_v<X>)
auto tril(const X& x, std::int64_t diagonal = 0, std::source_location loc = std::source_location::current()) {
    return detail::triangle<false>(x, diagonal, "tril", loc);
}

/// value where mask is true, x elsewhere (torch.masked_fill, out of place). The mask must be bool
/// and broadcast with x; the result has x's dtype (value converted to it) and the broadcast shape.
template <Operand X> requires(!std::is_arithmetic_v<X>)
auto masked_fill(const X& x, const Tensor& mask, Scalar value, std::source_location loc = std::source_location::current()) {
    if (mask.dtype() != DType::boolean)
        detail::fail<DTypeError>("masked_fill", "the mask must be bool, got " + std::string(dtype_name(mask.dtype())), loc);
    Shape b;
    if (!detail::try_broadcast(mask.shape(), detail::expr_shape(x), b))
        detail::fail<ShapeError>("masked_fill", "mask of shape " + mask.shape().str() + " does not broadcast with " +
                                                    detail::expr_shape(x).str(), loc);
    const DType dt = detail::expr_dtype(x);
    // one node type for every kind of value (a number operand of any kind is a ScalarLeaf)
    const auto filled = value.kind == DType::boolean ? where(mask, value.value != 0, x)
                        : value.kind == DType::i64   ? where(mask, static_cast<std::int64_t>(value.value), x)
                                                     : where(mask, value.value, x);
    return cast(filled, dt);
}

}  // namespace kiln
