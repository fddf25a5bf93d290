// Tensor: a typed, strided view of shared storage, with the zero-copy view operations.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <type_traits>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/config.hpp"
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
namespace autograd {
/// A step of the backward graph (autograd/autograd.hpp): what made a tensor that requires grad.
class Node;
namespace detail {
/// A tensor's autograd state (shared by the copies of one handle, as a torch.Tensor's).
struct Meta;
/// How a view was made from its source: what its backward undoes (reshape also stands for view,
/// squeeze and unsqueeze; select drops `axis` at `start`).
struct ViewOp {
    enum class Kind : std::uint8_t { reshape, permute, slice, select, expand };
    ViewOp(Kind k = Kind::reshape, int a = 0, std::int64_t s = 0, std::int64_t st = 1) : kind(k), axis(a), start(s), step(st) {}
    Kind kind;
    int axis;
    std::int64_t start, step;
    Dims dims;  ///< permute: view dim i is source dim dims[i]
};
/// Whether this thread records ops for backward (kiln::no_grad turns it off for a scope).
inline bool& grad_mode() {
    thread_local bool on = true;
    return on;
}
/// Gives `view` (of src, which requires grad) its backward node (defined in autograd/).
KILN_DECL void record_view(const Tensor& src, Tensor& view, const ViewOp& op);
}  // namespace detail
}  // namespace autograd
namespace trace {
/// A value of the graph being traced (trace/tracer.hpp): what a tracing tensor stands for.
struct Value;
/// Graph break: the concrete tensor a tracing tensor stands for (defined in trace/tracer.hpp);
/// `what` names the construct that needs it ("item()"), for graph-break reports and export errors.
Tensor materialize(const Tensor& t, const std::source_location& loc, const char* what = "data access");
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
    KILN_DECL Tensor(const Shape& shape, DType dtype, Device device = Device::cpu(), Loc loc = Loc::current());
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

    /// Copies and the destructor are out of line (compiled once in separate mode): the storage,
    /// trace and autograd handles' reference counts inline made every expression node's
    /// construction and destructor large.
    KILN_DECL Tensor(const Tensor&) noexcept;
    Tensor(Tensor&&) noexcept = default;
    KILN_DECL Tensor& operator=(const Tensor&) noexcept;
    Tensor& operator=(Tensor&&) noexcept = default;
    KILN_DECL ~Tensor();

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
    KILN_DECL void* data_ptr() const;

    /// Typed address of the first element; T must be the tensor's dtype. For a CUDA tensor this
    /// is a device address: pass it to kernels, never dereference it on the host.
    template <Element T>
    T* data(Loc loc = Loc::current()) const {
        if (traced_) return trace::materialize(*this, loc, "data()").template data<T>(loc);
        check_dtype<T>("data", loc);
        return static_cast<T*>(data_ptr());
    }

    // ---- element access
    /// Reference to one element; T must be the dtype. Negative indices count from the end.
    /// Host tensors only: a CUDA tensor throws DeviceError (read it with item(), or copy it with cpu()).
    template <Element T>
    T& at(std::initializer_list<std::int64_t> index, Loc loc = Loc::current()) const {
        if (traced_) return trace::materialize(*this, loc, "at()").template at<T>(index, loc);
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
        if (traced_) return trace::materialize(*this, loc, "item()").template item<T>(flat, loc);
        alignas(8) unsigned char b[8];
        element_bytes(flat, b, loc);
        const void* p = b;
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

    // ---- autograd (autograd/autograd.hpp: backward, the rules, kiln::grad)
    /// Whether ops on this tensor are recorded for backward: a leaf marked by requires_grad_(), or
    /// the result of a recorded op.
    bool requires_grad() const;
    /// Marks a leaf (a tensor no recorded op made) as needing its gradient, like torch's
    /// requires_grad_(); floating dtypes only (DTypeError otherwise).
    Tensor& requires_grad_(bool on = true, Loc loc = Loc::current());
    /// The gradient accumulated by backward() (undefined before the first, like torch's None).
    Tensor grad() const;
    /// Replaces the accumulated gradient (an undefined tensor clears it, like `p.grad = None`).
    void set_grad(const Tensor& g);
    /// True unless a recorded op made this tensor.
    bool is_leaf() const;
    /// The op that made this tensor (null for leaves).
    const std::shared_ptr<autograd::Node>& grad_fn() const;
    /// The same data, cut from the backward graph (never requires grad).
    Tensor detach() const { return Tensor(storage_, offset_, shape_, strides_, dtype_, traced_); }
    /// Gradients of this scalar with respect to every leaf that requires grad, accumulated into
    /// their grad(). A tensor of more than one element needs `gradient` (its shape): ValueError.
    KILN_DECL void backward(Loc loc = Loc::current()) const;
    KILN_DECL void backward(const Tensor& gradient, Loc loc = Loc::current()) const;
    /// The autograd state (internal: the rules set it; users call the methods above).
    const std::shared_ptr<autograd::detail::Meta>& autograd_meta() const { return ag_; }
    void set_autograd_meta(std::shared_ptr<autograd::detail::Meta> m) { ag_ = std::move(m); }

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
    /// The raw storage bytes (dtype_size bytes) of element `flat` in row-major logical order,
    /// copied into out (8 bytes); a CUDA tensor's element is copied to the host.
    KILN_DECL void element_bytes(std::int64_t flat, void* out, Loc loc) const;
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
    /// `op` says how the view was made, for backward.
    Tensor with_view(const Shape& shape, const Strides& strides, std::int64_t offset, unsigned fixed,
                     const autograd::detail::ViewOp& op) const {
        Tensor v = traced_ ? trace::record_view(*this, Tensor(nullptr, offset, shape, strides, dtype_), fixed)
                           : Tensor(storage_, offset, shape, strides, dtype_);
        if (ag_ && autograd::detail::grad_mode() && requires_grad()) autograd::detail::record_view(*this, v, op);
        return v;
    }
    Tensor(std::shared_ptr<detail::Storage> storage, std::int64_t offset, const Shape& shape, const Strides& strides,
           DType dtype, std::shared_ptr<trace::Value> traced)
        : storage_(std::move(storage)), offset_(offset), shape_(shape), strides_(strides), dtype_(dtype),
          traced_(std::move(traced)) {}
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
    std::shared_ptr<autograd::detail::Meta> ag_;
};

namespace autograd::detail {
struct Meta {
    bool requires_grad = false;       ///< a leaf whose gradient is wanted
    Tensor grad;                      ///< accumulated by backward
    std::shared_ptr<Node> grad_fn;    ///< the recorded op that made the tensor (non-leaves)
    /// A leaf's hooks (autograd::register_post_accumulate_grad_hook), by id: each called with
    /// `grad` once a backward pass has accumulated into it for the last time.
    std::vector<std::pair<int, std::function<void(const Tensor&)>>> post_accumulate;
    /// Where a new gradient goes (autograd::set_grad_buffer): when backward finds `grad` undefined
    /// it writes into this memory and makes it `grad`, instead of taking memory of its own.
    Tensor grad_buffer;
    /// The leaf's memory order when it was marked (dense_order; empty: row-major): a gradient made
    /// for it is laid out so (torch's gradient layout contract), which an optimizer's update,
    /// reading both, then walks in one order.
    std::vector<std::int64_t> grad_order;
};
}  // namespace autograd::detail

inline bool Tensor::requires_grad() const { return ag_ && (ag_->requires_grad || ag_->grad_fn); }
inline Tensor Tensor::grad() const { return ag_ ? ag_->grad : Tensor(); }
inline bool Tensor::is_leaf() const { return !ag_ || !ag_->grad_fn; }
inline const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
    static const std::shared_ptr<autograd::Node> none;
    return ag_ ? ag_->grad_fn : none;
}
inline void Tensor::set_grad(const Tensor& g) {
    if (!ag_) ag_ = std::make_shared<autograd::detail::Meta>();
    ag_->grad = g;
}
inline Tensor& Tensor::requires_grad_(bool on, Loc loc) {
    if (on && !is_floating(dtype_))
        detail::fail<DTypeError>("requires_grad_", "only floating tensors can require gradients, got " +
                                                       std::string(dtype_name(dtype_)), loc);
    if (!on && ag_ && ag_->grad_fn)
        detail::fail<ValueError>("requires_grad_", "cannot turn off requires_grad of a tensor a recorded op made; use detach()", loc);
    if (!ag_) ag_ = std::make_shared<autograd::detail::Meta>();
    ag_->requires_grad = on;
    if (on && storage_) storage_->mark_grad_memory();
    if (on && !ag_->grad_fn && (is_contiguous() || !dense_order(shape_, strides_, ag_->grad_order))) ag_->grad_order.clear();
    return *this;
}

namespace autograd::detail {
/// Sets this thread's recording to On for a scope, then restores it.
template <bool On>
class GradModeScope {
public:
    GradModeScope() : prev_(grad_mode()) { grad_mode() = On; }
    ~GradModeScope() { grad_mode() = prev_; }
    GradModeScope(const GradModeScope&) = delete;
    GradModeScope& operator=(const GradModeScope&) = delete;

private:
    bool prev_;
};
}  // namespace autograd::detail
/// Turns off the recording of ops for backward in a scope (torch.no_grad): `kiln::no_grad off;`.
using no_grad = autograd::detail::GradModeScope<false>;
/// Turns recording back on in a scope (torch.enable_grad).
using enable_grad = autograd::detail::GradModeScope<true>;
inline bool is_grad_enabled() { return autograd::detail::grad_mode(); }

namespace detail {
/// Replaces a single -1 in `shape` so it holds `numel` elements.
KILN_DECL Shape infer_shape(Shape shape, std::int64_t numel, std::string_view op, const std::source_location& loc);
KILN_DECL bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape, Strides& out);
}  // namespace detail

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/core/tensor_impl.hpp"
#endif
