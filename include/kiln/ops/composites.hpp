// Composite elementwise ops, written as decompositions into table ops (no backend code of their own).
#pragma once

#include <numbers>

#include "kiln/ops/elementwise.hpp"

namespace kiln {

/// x * x.
template <Operand X> auto square(const X& x) { return x * x; }

/// GELU, exact form: x/2 * (1 + erf(x / sqrt 2)).
template <Operand X> auto gelu(const X& x) {
    return x * 0.5 * (1.0 + erf(x * (1.0 / std::numbers::sqrt2)));
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

}  // namespace kiln
