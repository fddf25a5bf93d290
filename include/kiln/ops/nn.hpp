// Row-wise composites: softmax, log_softmax and layer_norm, written with reductions and expressions.
#pragma once

#include <optional>

#include "kiln/ops/composites.hpp"
#include "kiln/ops/reductions.hpp"

namespace kiln {

/// exp(x - max) / sum(exp(x - max)) along axis.
template <class X> Tensor softmax(const X& x, std::int64_t axis = -1, Loc loc = Loc::current()) {
    const Tensor m = max(x, axis, true, loc);
    const Tensor s = sum(exp(x - m), axis, true, loc);
    return Tensor(exp(x - m) / s, loc);
}

/// x - max - log(sum(exp(x - max))) along axis.
template <class X> Tensor log_softmax(const X& x, std::int64_t axis = -1, Loc loc = Loc::current()) {
    const Tensor m = max(x, axis, true, loc);
    const Tensor lse = Tensor(log(sum(exp(x - m), axis, true, loc)) + m, loc);
    return Tensor(x - lse, loc);
}

/// Normalizes over the last `normalized_dims` dims to zero mean and unit variance (biased), then
/// scales by weight and shifts by bias when given (torch.nn.functional.layer_norm).
template <class X>
Tensor layer_norm(const X& x, int normalized_dims = 1, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5, Loc loc = Loc::current()) {
    const Shape& s = detail::operand_shape(x);
    if (normalized_dims < 1 || normalized_dims > s.rank())
        detail::fail<ShapeError>("layer_norm", "cannot normalize the last " + std::to_string(normalized_dims) +
                                                   " dims of a tensor of shape " + s.str(), loc);
    std::vector<std::int64_t> axes;
    for (int d = s.rank() - normalized_dims; d < s.rank(); ++d) axes.push_back(d);
    const Tensor mu = mean(x, axes, true, loc);
    const Tensor rstd = Tensor(rsqrt(mean(square(x - mu), axes, true, loc) + eps), loc);
    for (const Tensor* p : {&weight, &bias}) {
        if (!p->defined()) continue;
        bool ok = p->rank() == normalized_dims;
        for (int d = 0; ok && d < normalized_dims; ++d) ok = p->size(d) == s[s.rank() - normalized_dims + d];
        if (!ok)
            detail::fail<ShapeError>("layer_norm", std::string(p == &weight ? "weight" : "bias") + " of shape " +
                                                       p->shape().str() + " does not match the normalized dims of " + s.str(), loc);
    }
    if (weight.defined() && bias.defined()) return Tensor((x - mu) * rstd * weight + bias, loc);
    if (weight.defined()) return Tensor((x - mu) * rstd * weight, loc);
    if (bias.defined()) return Tensor((x - mu) * rstd + bias, loc);
    return Tensor((x - mu) * rstd, loc);
}

}  // namespace kiln
