// Tensor methods that copy or convert data: contiguous, clone, to, copy_, fill_.
#pragma once

#include "kiln/expr/evaluate.hpp"
#include "kiln/ops/elementwise.hpp"

namespace kiln {

inline Tensor& Tensor::copy_(const Tensor& src, Loc loc) {
    Shape b;
    if (!detail::try_broadcast(src.shape(), shape_, b) || !(b == shape_))
        detail::fail<ShapeError>("copy_", "cannot copy a tensor of shape " + src.shape().str() +
                                              " into a tensor of shape " + shape_.str(), loc);
    if (numel() == 0) return *this;
    const auto node = cast(expr::may_alias(*this, src) ? src.clone() : src, dtype_);
    expr::evaluate_into(node, *this);
    return *this;
}

inline Tensor Tensor::clone() const {
    Tensor out(shape_, dtype_);
    out.copy_(*this);
    return out;
}

inline Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

inline Tensor Tensor::to(DType dtype, Loc loc) const {
    if (dtype == dtype_) return *this;
    return Tensor(cast(*this, dtype), loc);
}

inline Tensor& Tensor::fill_(Scalar value) {
    if (numel() == 0) return *this;
    detail::IterSpace space{shape_};
    detail::Access a = detail::access_of(*this, shape_);
    detail::collapse(space, {&a});
    visit_dtype(dtype_, [&](auto tag) {
        using S = typename decltype(tag)::type;
        const S v = detail::store_as<S>(value.value);
        detail::for_each_tile(space.numel(), [&](std::int64_t start, std::int64_t len) {
            detail::for_each_segment(space, a.strides, start, len,
                                     [&](std::int64_t off, std::int64_t n, std::int64_t s, std::int64_t) {
                                         S* p = reinterpret_cast<S*>(a.base) + off;
                                         for (std::int64_t k = 0; k < n; ++k) p[k * s] = v;
                                     });
        });
    });
    return *this;
}

}  // namespace kiln
