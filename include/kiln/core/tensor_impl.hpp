// Tensor's out-of-line members (construction, views, element access), compiled once in separate mode.
#pragma once
// Included at the end of kiln/core/tensor.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cstring>
#include <string>
#include <vector>

namespace kiln {

KILN_DECL Tensor::Tensor(const Tensor&) noexcept = default;
KILN_DECL Tensor& Tensor::operator=(const Tensor&) noexcept = default;
KILN_DECL Tensor::~Tensor() = default;

KILN_DECL Tensor::Tensor(const Shape& shape, DType dtype, Device device, Loc loc)
        : shape_(detail::check_shape(shape, dtype_size(dtype), "empty", loc)), strides_(contiguous_strides(shape)),
          dtype_(dtype) {
    const std::size_t nbytes = std::max<std::size_t>(nbytes_dense(), 1);
    if (device.is_cpu()) {
        storage_ = std::make_shared<detail::Storage>(nbytes, host_allocator(), device);
        return;
    }
    const std::string where = "cannot create a tensor on " + device.str() + ": ";
    const DeviceAllocatorHook hook = cuda_allocator_hook();
    if (!hook)
        detail::fail<DeviceError>("empty", where + "kiln's CUDA allocator is not compiled in (include "
                                                   "kiln/kiln.hpp or kiln/backends/cuda/allocator.hpp)", loc);
    try {
        storage_ = std::make_shared<detail::Storage>(nbytes, *hook(device.index), device);
    } catch (const OutOfMemory& e) {
        detail::fail<OutOfMemory>("empty", where + detail::strip_kiln_prefix(e.what()), loc);
    } catch (const DeviceError& e) {
        detail::fail<DeviceError>("empty", where + detail::strip_kiln_prefix(e.what()), loc);
    }
}

KILN_DECL void* Tensor::data_ptr() const {
    if (traced_) return trace::materialize(*this, std::source_location::current(), "data_ptr()").data_ptr();
    if (const auto hook = detail::pending_writes_hook()) [[unlikely]] hook(storage_.get());
    return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(element_size());
}
KILN_DECL void Tensor::element_bytes(std::int64_t flat, void* out, Loc loc) const {
    if (flat < 0 || flat >= numel())
        detail::fail<ValueError>("item", "index " + std::to_string(flat) + " is out of range for " +
                                             std::to_string(numel()) + " elements", loc);
    std::int64_t off = 0;
    for (int i = rank() - 1; i >= 0; --i) {
        off += (flat % shape_[i]) * strides_[i];
        flat /= shape_[i];
    }
    if (!device().is_cpu()) {
        const Tensor host = Tensor(storage_, offset_ + off, Shape{}, Strides{}, dtype_).cpu(loc);
        std::memcpy(out, host.data_ptr(), element_size());
        return;
    }
    std::memcpy(out, static_cast<const char*>(data_ptr()) + off * static_cast<std::int64_t>(element_size()), element_size());
}

namespace detail {

/// Replaces a single -1 in `shape` so it holds `numel` elements.
KILN_DECL Shape infer_shape(Shape shape, std::int64_t numel, std::string_view op, const std::source_location& loc) {
    int infer = -1;
    std::int64_t known = 1;
    for (int i = 0; i < shape.rank(); ++i) {
        if (shape[i] == -1) {
            if (infer >= 0) fail<ShapeError>(op, "only one dimension can be -1 in " + shape.str(), loc);
            infer = i;
        } else if (shape[i] < 0) {
            fail<ShapeError>(op, "invalid dimension " + std::to_string(shape[i]) + " in " + shape.str(), loc);
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            fail<ShapeError>(op, "shape " + shape.str() + " is too large: the product of its dims overflows int64", loc);
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            fail<ShapeError>(op, "shape " + shape.str() + " is invalid for " + std::to_string(numel) + " elements", loc);
        shape[infer] = numel / known;
    } else if (known != numel) {
        fail<ShapeError>(op, "shape " + shape.str() + " is invalid for " + std::to_string(numel) + " elements", loc);
    }
    return check_shape(shape, 1, op, loc);  // (0, 2^40, 2^40) holds 0 elements but has no int64 strides
}

/// Strides for viewing (old_shape, old_strides) as new_shape without copying, if possible
/// (the algorithm of torch's computeStride: each group of merged dims must be contiguous).
KILN_DECL bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape, Strides& out) {
    out = Strides::filled(new_shape.rank(), 1);
    if (old_shape.numel() == 0 || old_shape.rank() == 0) {  // no elements, or one
        out = contiguous_strides(new_shape);
        return true;
    }
    int view_d = new_shape.rank() - 1;
    std::int64_t chunk_base_stride = old_strides.rank() ? old_strides.back() : 1;
    std::int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = old_shape.rank() - 1; tensor_d >= 0; --tensor_d) {
        tensor_numel *= old_shape[tensor_d];
        if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                              old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base_stride;
                view_numel *= new_shape[view_d];
                --view_d;
            }
            if (view_numel != tensor_numel) return false;
            if (tensor_d > 0) {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

}  // namespace detail

KILN_DECL Tensor Tensor::view(const Shape& shape, Loc loc) const {
    const Shape s = detail::infer_shape(shape, numel(), "view", loc);
    Strides st;
    if (!detail::view_strides(shape_, strides_, s, st))
        detail::fail<ShapeError>("view", "cannot view a tensor of shape " + shape_.str() + " and strides " +
                                             strides_.str() + " as " + s.str() +
                                             " without copying; use reshape()", loc);
    return with_view(s, st, offset_, fixed() ? (1u << s.rank()) - 1 : 0u, {});
}

KILN_DECL Tensor Tensor::reshape(const Shape& shape, Loc loc) const {
    const Shape s = detail::infer_shape(shape, numel(), "reshape", loc);
    Strides st;
    if (detail::view_strides(shape_, strides_, s, st)) return with_view(s, st, offset_, fixed() ? (1u << s.rank()) - 1 : 0u, {});
    return contiguous().view(s, loc);
}

KILN_DECL Tensor Tensor::permute(const std::vector<std::int64_t>& dims, Loc loc) const {
    if (static_cast<int>(dims.size()) != rank())
        detail::fail<ShapeError>("permute", "got " + std::to_string(dims.size()) + " dims for a tensor of rank " +
                                                std::to_string(rank()), loc);
    Shape s = shape_;
    Strides st = strides_;
    unsigned seen = 0, fx = 0;
    const unsigned old = fixed();
    autograd::detail::ViewOp pv{autograd::detail::ViewOp::Kind::permute};
    for (int i = 0; i < rank(); ++i) {
        const int d = detail::normalize_axis(dims[static_cast<std::size_t>(i)], rank(), "permute", loc);
        if (seen & (1u << d)) detail::fail<ShapeError>("permute", "dim " + std::to_string(d) + " repeats", loc);
        seen |= 1u << d;
        s[i] = shape_[d];
        st[i] = strides_[d];
        fx |= ((old >> d) & 1u) << i;
        pv.dims.push_back(d);
    }
    return with_view(s, st, offset_, fx, pv);
}

KILN_DECL Tensor Tensor::transpose(std::int64_t a, std::int64_t b, Loc loc) const {
    const int x = detail::normalize_axis(a, rank(), "transpose", loc);
    const int y = detail::normalize_axis(b, rank(), "transpose", loc);
    Shape s = shape_;
    Strides st = strides_;
    std::swap(s[x], s[y]);
    std::swap(st[x], st[y]);
    const unsigned old = fixed();
    const unsigned fx = (old & ~((1u << x) | (1u << y))) | (((old >> x) & 1u) << y) | (((old >> y) & 1u) << x);
    autograd::detail::ViewOp pv{autograd::detail::ViewOp::Kind::permute};
    for (int i = 0; i < rank(); ++i) pv.dims.push_back(i == x ? y : i == y ? x : i);
    return with_view(s, st, offset_, fx, pv);
}

KILN_DECL Tensor Tensor::t(Loc loc) const {
    if (rank() > 2)
        detail::fail<ShapeError>("t", "expects a tensor of rank <= 2, got shape " + shape_.str(), loc);
    return rank() < 2 ? *this : transpose(0, 1, loc);
}

KILN_DECL Tensor Tensor::slice(std::int64_t axis, std::int64_t start, std::int64_t stop, std::int64_t step,
                            Loc loc) const {
    const int d = detail::normalize_axis(axis, rank(), "slice", loc);
    if (rank() == 0) detail::fail<ShapeError>("slice", "cannot slice a 0-dim tensor", loc);
    if (step <= 0) detail::fail<ValueError>("slice", "step must be positive, got " + std::to_string(step), loc);
    const std::int64_t n = shape_[d];
    auto clamp = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
    const std::int64_t b = clamp(start), e = clamp(stop);
    Shape s = shape_;
    Strides st = strides_;
    s[d] = e > b ? (e - b + step - 1) / step : 0;
    st[d] = strides_[d] * step;
    return with_view(s, st, offset_ + b * strides_[d], fixed() | (1u << d), {autograd::detail::ViewOp::Kind::slice, d, b, step});
}

KILN_DECL Tensor Tensor::select(std::int64_t axis, std::int64_t index, Loc loc) const {
    if (rank() == 0) detail::fail<ShapeError>("select", "cannot index a 0-dim tensor", loc);
    const int d = detail::normalize_axis(axis, rank(), "select", loc);
    if (index < -shape_[d] || index >= shape_[d])
        detail::fail<ValueError>("select", "index " + std::to_string(index) + " is out of range for dim " +
                                               std::to_string(d) + " of size " + std::to_string(shape_[d]), loc);
    const std::int64_t i = index < 0 ? index + shape_[d] : index;
    Shape s = shape_;
    Strides st = strides_;
    s.erase(d);
    st.erase(d);
    return with_view(s, st, offset_ + i * strides_[d], drop_bit(fixed(), d), {autograd::detail::ViewOp::Kind::select, d, i, 1});
}

KILN_DECL Tensor Tensor::expand(const Shape& shape, Loc loc) const {
    if (shape.rank() < rank())
        detail::fail<ShapeError>("expand", "cannot expand shape " + shape_.str() + " to fewer dims " + shape.str(), loc);
    Shape s = shape;
    const int off = shape.rank() - rank();
    for (int i = 0; i < shape.rank(); ++i) {
        const std::int64_t have = i < off ? 1 : shape_[i - off];
        if (s[i] == -1) {
            if (i < off) detail::fail<ShapeError>("expand", "-1 is not allowed for a new leading dim in " + shape.str(), loc);
            s[i] = have;
        }
        if (have != s[i] && have != 1)
            detail::fail<ShapeError>("expand", "cannot expand shape " + shape_.str() + " to " + shape.str(), loc);
    }
    detail::check_shape(s, element_size(), "expand", loc);
    return with_view(s, detail::broadcast_strides(shape_, strides_, s), offset_, fixed() << off, {autograd::detail::ViewOp::Kind::expand});
}

KILN_DECL Tensor Tensor::squeeze() const {
    Shape s;
    Strides st;
    unsigned fx = 0;
    const unsigned old = fixed();
    for (int i = 0; i < rank(); ++i)
        if (shape_[i] != 1) {
            fx |= ((old >> i) & 1u) << s.rank();
            s.push_back(shape_[i]);
            st.push_back(strides_[i]);
        }
    return with_view(s, st, offset_, fx, {});
}

KILN_DECL Tensor Tensor::squeeze(std::int64_t axis, Loc loc) const {
    if (rank() == 0) return *this;
    const int d = detail::normalize_axis(axis, rank(), "squeeze", loc);
    if (shape_[d] != 1) return *this;
    Shape s = shape_;
    Strides st = strides_;
    s.erase(d);
    st.erase(d);
    return with_view(s, st, offset_, drop_bit(fixed(), d), {});
}

KILN_DECL Tensor Tensor::unsqueeze(std::int64_t axis, Loc loc) const {
    const int d = detail::normalize_axis(axis, rank() + 1, "unsqueeze", loc);
    if (rank() + 1 > max_rank)
        detail::fail<ShapeError>("unsqueeze", "rank " + std::to_string(rank() + 1) + " of the result of unsqueeze of " +
                                                  shape_.str() + " exceeds the maximum rank " + std::to_string(max_rank),
                                 loc);
    Shape s = shape_;
    Strides st = strides_;
    const std::int64_t stride = d < rank() ? strides_[d] * shape_[d] : 1;
    s.insert(d, 1, loc);
    st.insert(d, stride, loc);
    return with_view(s, st, offset_, insert_bit(fixed(), d), {});
}

}  // namespace kiln
