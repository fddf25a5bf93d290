// Tensor methods that copy or convert data (declared in core/tensor.hpp), compiled once in separate mode.
#pragma once
// Included at the end of kiln/ops/copy.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cstdlib>

namespace kiln {


// Across devices copy_ converts and broadcasts on the host and moves only the result, so a
// transfer never needs a device kernel unless a CUDA side is strided. Between two CUDA devices
// the data goes through the host (no peer-to-peer copies yet).
KILN_DECL Tensor& Tensor::copy_(const Tensor& src, Loc loc) {
    if (autograd::detail::grad_mode() && (requires_grad() || src.requires_grad())) {
        autograd::detail::before_write(*this, "copy_", loc);
        {
            const no_grad off;
            copy_(src, loc);
        }
        autograd::detail::after_write(*this, src);
        return *this;
    }
    if (storage_) storage_->bump_version();
    if (trace::Tracer* tr = trace::Tracer::active();
        is_traced() || src.is_traced() ||
        (tr && (tr->records_write_into(*this) || tr->live(src)) && src.device() == device())) {
        if (tr == nullptr) detail::fail<Error>("copy_", "a tracing tensor was used outside its traced call", loc);
        tr->write(*this, tr->node_of(src), loc, "copy_");  // recorded, like assign
        return *this;
    }
    Shape b;
    if (!detail::try_broadcast(src.shape(), shape_, b) || !(b == shape_))
        detail::fail<ShapeError>("copy_", "cannot copy a tensor of shape " + src.shape().str() +
                                              " into a tensor of shape " + shape_.str(), loc);
    if (numel() == 0) return *this;
    const Device dst_dev = device(), src_dev = src.device();
    const bool straight = src.dtype() == dtype_ && src.shape() == shape_;  // bytes move unchanged
    if (dst_dev != src_dev) {
        if (src_dev.is_cuda() && dst_dev.is_cuda()) return copy_(src.cpu(loc), loc);
        if (dst_dev.is_cpu()) {  // device -> host
            if (straight && is_contiguous() && !is_traced()) {
                cuda::detail::download(*this, src);
                return *this;
            }
            return copy_(src.cpu(loc), loc);  // convert and broadcast on the host
        }
        // host -> device
        if (!straight) {
            Tensor h(shape_, dtype_, Device::cpu(), loc);
            h.copy_(src, loc);
            return copy_(h, loc);
        }
        if (is_contiguous()) {
            cuda::detail::upload(*this, src);
            return *this;
        }
        return copy_(src.to(dst_dev, loc), loc);  // then a device kernel writes the strided view
    }
    if (dst_dev.is_cuda() && straight && is_contiguous() && src.is_contiguous()) {
        if (data_ptr() == src.data_ptr()) return *this;
        const std::int64_t gap = std::abs(offset() - src.offset());
        if (storage() == src.storage() && gap < numel()) return copy_(src.clone(), loc);  // overlapping ranges
        cuda::detail::device_to_device(data_ptr(), src.data_ptr(), nbytes(), dst_dev.index);
        return *this;
    }
    // one device: the expression evaluator (a generated kernel on CUDA devices)
    const auto node = cast(expr::may_alias(*this, src) ? src.clone() : src, dtype_);
    expr::evaluate_into(expr::flatten(node), expr::fused_of(node), *this);
    return *this;
}

KILN_DECL Tensor Tensor::clone() const {
    if (autograd::detail::grad_mode() && requires_grad()) return autograd::detail::copy_of(*this, nullptr, std::source_location::current());
    if (traced_) return trace::copy(*this, std::source_location::current());
    Tensor out(shape_, dtype_, device());
    out.copy_(*this);
    return out;
}

KILN_DECL Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

KILN_DECL Tensor Tensor::to(DType dtype, Loc loc) const {
    if (dtype == dtype_) return *this;
    return Tensor(cast(*this, dtype), loc);
}

KILN_DECL Tensor Tensor::to(Device device, Loc loc) const {
    if (autograd::detail::grad_mode() && requires_grad() && device != this->device())
        return autograd::detail::copy_of(*this, &device, loc);
    if (traced_) return device == this->device() ? *this : trace::materialize(*this, loc, "to(device)").to(device, loc);
    const Device from = this->device();
    if (device == from) return *this;
    if (from.is_cuda() && device.is_cuda()) return cpu(loc).to(device, loc);
    Tensor out(shape_, dtype_, device, loc);
    if (numel() == 0) return out;
    if (device.is_cuda()) cuda::detail::upload(out, *this);
    else cuda::detail::download(out, *this);
    return out;
}

KILN_DECL Tensor Tensor::cpu(Loc loc) const { return to(Device::cpu(), loc); }

KILN_DECL Tensor Tensor::cuda(int index, Loc loc) const { return to(Device::cuda(index), loc); }

KILN_DECL Tensor& Tensor::fill_(Scalar value) {
    if (autograd::detail::grad_mode() && requires_grad()) {
        autograd::detail::before_write(*this, "fill_", std::source_location::current());
        autograd::detail::after_write(*this, Tensor());
    }
    if (storage_) storage_->bump_version();
    if (trace::Tracer* tr = trace::Tracer::active(); is_traced() || (tr && tr->records_write_into(*this))) {
        const std::source_location loc = std::source_location::current();
        if (tr == nullptr) detail::fail<Error>("fill_", "a tracing tensor was used outside its traced call", loc);
        tr->write(*this, tr->scalar(value.value, compute_dtype(dtype_)), loc, "fill_");
        return *this;
    }
    if (numel() == 0) return *this;
    if (device().is_cuda()) {
        if (cuda::detail::is_dense(*this)) {
            cuda::detail::fill_dense(*this, value.value);
        } else {  // broadcast one filled element into the strided view (a device kernel)
            Tensor one(Shape{}, dtype_, device());
            cuda::detail::fill_dense(one, value.value);
            copy_(one);
        }
        return *this;
    }
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
