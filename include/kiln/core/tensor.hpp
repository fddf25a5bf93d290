// Tensor: a typed, strided view of shared storage, with the zero-copy view operations.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/storage.hpp"

namespace kiln {

namespace detail {
/// An error message without its "kiln::<op>: " prefix, to be wrapped in another op's message.
inline std::string strip_kiln_prefix(std::string_view what) {
    if (what.starts_with("kiln::"))
        if (const auto colon = what.find(": "); colon != std::string_view::npos) what.remove_prefix(colon + 2);
    return std::string(what);
}
}  // namespace detail

/// True for expression-template types (specialised in expr/node.hpp).
template <class E> struct IsExprNode : std::false_type {};

class Tensor;
namespace trace {
/// A value of the graph being traced (trace/tracer.hpp): what a tracing tensor stands for.
struct Value;
/// Graph break: the concrete tensor a tracing tensor stands for (defined in trace/tracer.hpp).
Tensor materialize(const Tensor& t, const std::source_location& loc);
/// Records a view of a tracing tensor (defined in trace/tracer.hpp).
Tensor record_view(const Tensor& src, const Tensor& view, unsigned fixed);
/// The device the value of a tracing tensor lives on (defined in trace/tracer.hpp).
Device device_of(const Tensor& t);
/// The dims of a tracing view whose extent a slice fixed (defined in trace/tracer.hpp).
unsigned fixed_dims(const Tensor& t);
}  // namespace trace

/// An n-dimensional array: dtype, shape, strides (in elements) and an offset into shared storage.
/// Copying a Tensor copies the handle, not the data (like torch.Tensor); views share storage.
class Tensor {
public:
    using Loc = std::source_location;

    Tensor() = default;
    /// Uninitialised tensor of the given shape and dtype on device (the factories use this).
    /// CUDA memory comes from kiln's caching device allocator (installed by kiln/kiln.hpp, or by
    /// kiln/backends/cuda/allocator.hpp); DeviceError when there is no driver or no such device,
    /// OutOfMemory when the device is full.
    Tensor(const Shape& shape, DType dtype, Device device = Device::cpu(), Loc loc = Loc::current())
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
    /// A view of existing storage (interop and views use this).
    Tensor(std::shared_ptr<detail::Storage> storage, std::int64_t offset, const Shape& shape, const Strides& strides,
           DType dtype)
        : storage_(std::move(storage)), offset_(offset), shape_(shape), strides_(strides), dtype_(dtype) {}

    /// Evaluates an expression (one fused pass) into a new tensor; defined in expr/.
    template <class E>
        requires IsExprNode<E>::value
    Tensor(const E& expr, Loc loc = Loc::current());  // NOLINT: implicit, `Tensor y = a + b;`
    // `t = a + b;` rebinds t to a new tensor, like Python: it goes through the converting
    // constructor above, whose default argument then records the assignment's line. (A template
    // operator= could not: an operator cannot take a source_location argument.)

    Tensor(const Tensor&) = default;
    Tensor(Tensor&&) noexcept = default;
    Tensor& operator=(const Tensor&) = default;
    Tensor& operator=(Tensor&&) noexcept = default;

    // ---- metadata
    bool defined() const { return storage_ != nullptr || traced_ != nullptr; }
    /// A tracing tensor stands for a value of a graph being traced by kiln::compile: it has a
    /// shape and dtype but no memory; reading its data is a graph break.
    bool is_traced() const { return traced_ != nullptr; }
    const std::shared_ptr<trace::Value>& traced_value() const { return traced_; }
    /// A tracing tensor (contiguous logical layout, no storage) for a traced value.
    /// Its shape, strides and offset describe a view of the traced value's base, as an eager
    /// tensor's describe a view of its storage.
    static Tensor make_traced(std::shared_ptr<trace::Value> v, const Shape& shape, const Strides& strides, std::int64_t offset,
                              DType dtype) {
        Tensor t;
        t.traced_ = std::move(v);
        t.shape_ = shape;
        t.strides_ = strides;
        t.offset_ = offset;
        t.dtype_ = dtype;
        return t;
    }
    const Shape& shape() const { return shape_; }
    const Strides& strides() const { return strides_; }
    std::int64_t offset() const { return offset_; }
    int rank() const { return shape_.rank(); }
    int dim() const { return shape_.rank(); }
    std::int64_t size(std::int64_t axis, Loc loc = Loc::current()) const {
        return shape_[detail::normalize_axis(axis, rank(), "size", loc)];
    }
    std::int64_t stride(std::int64_t axis, Loc loc = Loc::current()) const {
        return strides_[detail::normalize_axis(axis, rank(), "stride", loc)];
    }
    std::int64_t numel() const { return shape_.numel(); }
    DType dtype() const { return dtype_; }
    std::size_t element_size() const { return dtype_size(dtype_); }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
    Device device() const { return storage_ ? storage_->device() : traced_ ? trace::device_of(*this) : Device::cpu(); }
    bool is_contiguous() const { return kiln::is_contiguous(shape_, strides_); }
    const std::shared_ptr<detail::Storage>& storage() const { return storage_; }

    /// Address of the first element (after the offset).
    void* data_ptr() const {
        if (traced_) return trace::materialize(*this, std::source_location::current()).data_ptr();
        if (const auto hook = detail::pending_writes_hook()) [[unlikely]] hook(storage_.get());
        return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(element_size());
    }
    /// Typed address of the first element; T must be the tensor's dtype. For a CUDA tensor this
    /// is a device address: pass it to kernels, never dereference it on the host.
    template <Element T>
    T* data(Loc loc = Loc::current()) const {
        if (traced_) return trace::materialize(*this, loc).template data<T>(loc);
        check_dtype<T>("data", loc);
        return static_cast<T*>(data_ptr());
    }

    // ---- element access
    /// Reference to one element; T must be the dtype. Negative indices count from the end.
    /// Host tensors only: a CUDA tensor throws DeviceError (read it with item(), or copy it with cpu()).
    template <Element T>
    T& at(std::initializer_list<std::int64_t> index, Loc loc = Loc::current()) const {
        if (traced_) return trace::materialize(*this, loc).template at<T>(index, loc);
        if (!device().is_cpu())
            detail::fail<DeviceError>("at", "tensor is on " + device().str() + "; copy it with .cpu()", loc);
        check_dtype<T>("at", loc);
        return *reinterpret_cast<T*>(element_address(index, loc));
    }
    /// The single element, converted to T (numel must be 1).
    template <Element T>
    T item(Loc loc = Loc::current()) const {
        if (numel() != 1)
            detail::fail<ValueError>("item", "a tensor with " + std::to_string(numel()) +
                                                 " elements cannot be converted to a scalar", loc);
        return item<T>(0, loc);
    }
    /// Element `flat` in row-major logical order, converted to T. On a CUDA tensor this copies
    /// the one element to the host (and waits for the device's stream).
    template <Element T>
    T item(std::int64_t flat, Loc loc = Loc::current()) const {
        if (traced_) return trace::materialize(*this, loc).template item<T>(flat, loc);
        if (flat < 0 || flat >= numel())
            detail::fail<ValueError>("item", "index " + std::to_string(flat) + " is out of range for " +
                                                 std::to_string(numel()) + " elements", loc);
        std::int64_t off = 0;
        for (int i = rank() - 1; i >= 0; --i) {
            off += (flat % shape_[i]) * strides_[i];
            flat /= shape_[i];
        }
        if (!device().is_cpu()) return Tensor(storage_, offset_ + off, Shape{}, Strides{}, dtype_).cpu(loc).template item<T>(0, loc);
        const char* p = static_cast<const char*>(data_ptr()) + off * static_cast<std::int64_t>(element_size());
        return visit_dtype(dtype_, [&](auto tag) {
            using S = typename decltype(tag)::type;
            S v;
            std::memcpy(&v, p, sizeof(S));
            return static_cast<T>(static_cast<std::conditional_t<std::is_same_v<S, half> || std::is_same_v<S, bfloat16>,
                                                                 float, S>>(v));
        });
    }

    // ---- views (share storage, never copy)
    /// A view with a new shape; one dim may be -1. Throws ShapeError when strides make it impossible.
    Tensor view(const Shape& shape, Loc loc = Loc::current()) const;
    /// view() when possible, otherwise a contiguous copy reshaped.
    Tensor reshape(const Shape& shape, Loc loc = Loc::current()) const;
    /// Flattens to rank 1.
    Tensor flatten(Loc loc = Loc::current()) const { return reshape({-1}, loc); }
    /// Reorders dims: result dim i is input dim dims[i].
    Tensor permute(const std::vector<std::int64_t>& dims, Loc loc = Loc::current()) const;
    /// Swaps two dims.
    Tensor transpose(std::int64_t a, std::int64_t b, Loc loc = Loc::current()) const;
    /// Transpose of a matrix (rank <= 2).
    Tensor t(Loc loc = Loc::current()) const;
    /// Python-style slice start:stop:step along axis (negative bounds count from the end; step > 0).
    Tensor slice(std::int64_t axis, std::int64_t start, std::int64_t stop, std::int64_t step = 1,
                 Loc loc = Loc::current()) const;
    /// Index `index` of axis, dropping that axis.
    Tensor select(std::int64_t axis, std::int64_t index, Loc loc = Loc::current()) const;
    /// Broadcasts to a larger shape without copying (-1 keeps a dim).
    Tensor expand(const Shape& shape, Loc loc = Loc::current()) const;
    Tensor broadcast_to(const Shape& shape, Loc loc = Loc::current()) const { return expand(shape, loc); }
    /// Removes every dim of size 1.
    Tensor squeeze() const;
    /// Removes axis if it has size 1 (otherwise returns the same view, like torch).
    Tensor squeeze(std::int64_t axis, Loc loc = Loc::current()) const;
    /// Inserts a dim of size 1 at axis (axis may equal rank).
    Tensor unsqueeze(std::int64_t axis, Loc loc = Loc::current()) const;

    // ---- copies (defined in ops/copy.hpp, they run a kernel)
    /// This tensor if contiguous, otherwise a row-major copy.
    Tensor contiguous() const;
    /// A row-major copy that owns its memory.
    Tensor clone() const;
    /// A copy converted to dtype (this tensor when it already has it).
    Tensor to(DType dtype, Loc loc = Loc::current()) const;
    /// A copy on `device` (this tensor when it is already there); contiguous, same dtype.
    /// Between two CUDA devices the data goes through the host.
    Tensor to(Device device, Loc loc = Loc::current()) const;
    /// A copy in host memory (this tensor when it is already there).
    Tensor cpu(Loc loc = Loc::current()) const;
    /// A copy on CUDA device `index` (this tensor when it is already there).
    Tensor cuda(int index = 0, Loc loc = Loc::current()) const;
    /// Writes src (broadcast to this shape, converted to this dtype) into this tensor's elements;
    /// src may be on another device.
    Tensor& copy_(const Tensor& src, Loc loc = Loc::current());
    /// Evaluates expr straight into this tensor's memory (aliasing with its operands is handled).
    template <class E>
    Tensor& assign(const E& expr, Loc loc = Loc::current());
    /// Sets every element to value.
    Tensor& fill_(Scalar value);

    /// Same storage and same view.
    bool is_same(const Tensor& o) const {
        return storage_ == o.storage_ && traced_ == o.traced_ && offset_ == o.offset_ && shape_ == o.shape_ &&
               strides_ == o.strides_ && dtype_ == o.dtype_;
    }

private:
    std::size_t nbytes_dense() const { return static_cast<std::size_t>(numel()) * element_size(); }
    template <class T>
    void check_dtype(const char* op, const Loc& loc) const {
        if (dtype_of<T> != dtype_)
            detail::fail<DTypeError>(op, std::string("requested ") + std::string(dtype_name(dtype_of<T>)) +
                                             " but the tensor is " + std::string(dtype_name(dtype_)), loc);
    }
    char* element_address(std::initializer_list<std::int64_t> index, const Loc& loc) const {
        if (static_cast<int>(index.size()) != rank())
            detail::fail<ValueError>("at", std::to_string(index.size()) + " indices for a tensor of rank " +
                                               std::to_string(rank()), loc);
        std::int64_t off = 0;
        int i = 0;
        for (std::int64_t ix : index) {
            if (ix < -shape_[i] || ix >= shape_[i])
                detail::fail<ValueError>("at", "index " + std::to_string(ix) + " is out of range for dim " +
                                                   std::to_string(i) + " of size " + std::to_string(shape_[i]), loc);
            off += (ix < 0 ? ix + shape_[i] : ix) * strides_[i];
            ++i;
        }
        return static_cast<char*>(data_ptr()) + off * static_cast<std::int64_t>(element_size());
    }
    /// A view of the same memory. `fixed` (tracing tensors only): the view's dims whose extent
    /// came from the caller's bounds (a slice), which a dynamic program must not take to follow
    /// its operand's size: a slice that covers a dim at trace time (0:2 of 2) is not the whole dim.
    Tensor with_view(const Shape& shape, const Strides& strides, std::int64_t offset, unsigned fixed = 0) const {
        if (traced_) return trace::record_view(*this, Tensor(nullptr, offset, shape, strides, dtype_), fixed);
        return Tensor(storage_, offset, shape, strides, dtype_);
    }
    unsigned fixed() const { return traced_ ? trace::fixed_dims(*this) : 0u; }
    /// `m` with bit d removed (a dim dropped) or a clear bit inserted at d (a dim added).
    static unsigned drop_bit(unsigned m, int d) { return (m & ((1u << d) - 1)) | ((m >> (d + 1)) << d); }
    static unsigned insert_bit(unsigned m, int d) { return (m & ((1u << d) - 1)) | ((m >> d) << (d + 1)); }

    std::shared_ptr<detail::Storage> storage_;
    std::int64_t offset_ = 0;
    Shape shape_;
    Strides strides_;
    DType dtype_ = DType::f32;
    std::shared_ptr<trace::Value> traced_;
};

namespace detail {

/// Replaces a single -1 in `shape` so it holds `numel` elements.
inline Shape infer_shape(Shape shape, std::int64_t numel, std::string_view op, const std::source_location& loc) {
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
inline bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape, Strides& out) {
    out = Strides::filled(new_shape.rank(), 1);
    if (old_shape.numel() == 0) {
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

inline Tensor Tensor::view(const Shape& shape, Loc loc) const {
    const Shape s = detail::infer_shape(shape, numel(), "view", loc);
    Strides st;
    if (!detail::view_strides(shape_, strides_, s, st))
        detail::fail<ShapeError>("view", "cannot view a tensor of shape " + shape_.str() + " and strides " +
                                             strides_.str() + " as " + s.str() +
                                             " without copying; use reshape()", loc);
    return with_view(s, st, offset_, fixed() ? (1u << s.rank()) - 1 : 0u);
}

inline Tensor Tensor::reshape(const Shape& shape, Loc loc) const {
    const Shape s = detail::infer_shape(shape, numel(), "reshape", loc);
    Strides st;
    if (detail::view_strides(shape_, strides_, s, st)) return with_view(s, st, offset_, fixed() ? (1u << s.rank()) - 1 : 0u);
    return contiguous().view(s, loc);
}

inline Tensor Tensor::permute(const std::vector<std::int64_t>& dims, Loc loc) const {
    if (static_cast<int>(dims.size()) != rank())
        detail::fail<ShapeError>("permute", "got " + std::to_string(dims.size()) + " dims for a tensor of rank " +
                                                std::to_string(rank()), loc);
    Shape s = shape_;
    Strides st = strides_;
    unsigned seen = 0, fx = 0;
    const unsigned old = fixed();
    for (int i = 0; i < rank(); ++i) {
        const int d = detail::normalize_axis(dims[static_cast<std::size_t>(i)], rank(), "permute", loc);
        if (seen & (1u << d)) detail::fail<ShapeError>("permute", "dim " + std::to_string(d) + " repeats", loc);
        seen |= 1u << d;
        s[i] = shape_[d];
        st[i] = strides_[d];
        fx |= ((old >> d) & 1u) << i;
    }
    return with_view(s, st, offset_, fx);
}

inline Tensor Tensor::transpose(std::int64_t a, std::int64_t b, Loc loc) const {
    const int x = detail::normalize_axis(a, rank(), "transpose", loc);
    const int y = detail::normalize_axis(b, rank(), "transpose", loc);
    Shape s = shape_;
    Strides st = strides_;
    std::swap(s[x], s[y]);
    std::swap(st[x], st[y]);
    const unsigned old = fixed();
    const unsigned fx = (old & ~((1u << x) | (1u << y))) | (((old >> x) & 1u) << y) | (((old >> y) & 1u) << x);
    return with_view(s, st, offset_, fx);
}

inline Tensor Tensor::t(Loc loc) const {
    if (rank() > 2)
        detail::fail<ShapeError>("t", "expects a tensor of rank <= 2, got shape " + shape_.str(), loc);
    return rank() < 2 ? *this : transpose(0, 1, loc);
}

inline Tensor Tensor::slice(std::int64_t axis, std::int64_t start, std::int64_t stop, std::int64_t step,
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
    return with_view(s, st, offset_ + b * strides_[d], fixed() | (1u << d));
}

inline Tensor Tensor::select(std::int64_t axis, std::int64_t index, Loc loc) const {
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
    return with_view(s, st, offset_ + i * strides_[d], drop_bit(fixed(), d));
}

inline Tensor Tensor::expand(const Shape& shape, Loc loc) const {
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
    return with_view(s, detail::broadcast_strides(shape_, strides_, s), offset_, fixed() << off);
}

inline Tensor Tensor::squeeze() const {
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
    return with_view(s, st, offset_, fx);
}

inline Tensor Tensor::squeeze(std::int64_t axis, Loc loc) const {
    if (rank() == 0) return *this;
    const int d = detail::normalize_axis(axis, rank(), "squeeze", loc);
    if (shape_[d] != 1) return *this;
    Shape s = shape_;
    Strides st = strides_;
    s.erase(d);
    st.erase(d);
    return with_view(s, st, offset_, drop_bit(fixed(), d));
}

inline Tensor Tensor::unsqueeze(std::int64_t axis, Loc loc) const {
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
    return with_view(s, st, offset_, insert_bit(fixed(), d));
}

}  // namespace kiln
