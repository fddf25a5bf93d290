// Tensor factories: empty, zeros, ones, full, arange, linspace, rand, randn, randint, on any device.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

namespace detail {
/// A new tensor with every element `value`, for factory `op` (full, zeros, ones).
inline Tensor filled(std::string_view op, const Shape& shape, Scalar value, DType dtype, Device device,
                     const std::source_location& loc) {
    Tensor t(check_shape(shape, dtype_size(dtype), op, loc), dtype, device, loc);
    t.fill_(value);
    return t;
}
}  // namespace detail

using Loc = std::source_location;

/// Uninitialised memory (reading it before writing is the caller's bug).
inline Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(), Loc loc = Loc::current()) {
    return Tensor(shape, dtype, device, loc);
}
/// Uninitialised float32 memory on device.
inline Tensor empty(const Shape& shape, Device device, Loc loc = Loc::current()) {
    return Tensor(shape, DType::f32, device, loc);
}

/// Contiguous memory m (numel of `shape` elements) seen as `shape` laid out in `order` (its dims
/// from the outermost to the innermost of memory, as dense_order gives them; empty: row-major).
KILN_DECL Tensor view_in_order(const Tensor& m, const Shape& shape, const std::vector<std::int64_t>& order, Loc loc = Loc::current());

/// Uninitialised memory of `shape` laid out in `order` (view_in_order).
inline Tensor empty_in_order(const Shape& shape, const std::vector<std::int64_t>& order, DType dtype, Device device,
                             Loc loc = Loc::current()) {
    const Tensor m(shape, dtype, device, loc);
    return order.empty() ? m : view_in_order(m, shape, order, loc);
}

/// t's memory order (dense_order) where t is dense and not row-major; empty otherwise.
inline std::vector<std::int64_t> memory_order(const Tensor& t) {
    std::vector<std::int64_t> order;
    if (t.is_contiguous() || !dense_order(t.shape(), t.strides(), order)) order.clear();
    return order;
}

/// Uninitialised memory of t's shape, in t's memory order where t is dense (channels-last stays
/// channels-last), row-major otherwise: torch.empty_like's preserve_format.
inline Tensor empty_like(const Tensor& t, DType dtype, Device device, Loc loc = Loc::current()) {
    return empty_in_order(t.shape(), memory_order(t), dtype, device, loc);
}

/// v's values in the memory order of `like` (same shape): v itself where like is row-major or not
/// dense, or v is already laid out so, or v is a tracing tensor (whose layout the program chooses);
/// a copy otherwise. A module's parameter replaced by a loaded, moved or converted tensor keeps its
/// layout this way.
KILN_DECL Tensor laid_out_like(const Tensor& v, const Tensor& like, Loc loc = Loc::current());

/// Every element `value`, on device (CUDA: the driver's memset where the value's bytes repeat).
inline Tensor full(const Shape& shape, Scalar value, DType dtype, Device device, Loc loc = Loc::current()) {
    return detail::filled("full", shape, value, dtype, device, loc);
}
/// Every element `value`.
inline Tensor full(const Shape& shape, Scalar value, DType dtype = DType::f32, Loc loc = Loc::current()) {
    return full(shape, value, dtype, Device::cpu(), loc);
}
/// Every element `value` (float32), on device.
inline Tensor full(const Shape& shape, Scalar value, Device device, Loc loc = Loc::current()) {
    return full(shape, value, DType::f32, device, loc);
}
/// Zeros.
inline Tensor zeros(const Shape& shape, DType dtype = DType::f32, Loc loc = Loc::current()) {
    return detail::filled("zeros", shape, 0, dtype, Device::cpu(), loc);
}
/// Zeros on device.
inline Tensor zeros(const Shape& shape, DType dtype, Device device, Loc loc = Loc::current()) {
    return detail::filled("zeros", shape, 0, dtype, device, loc);
}
/// Float32 zeros on device.
inline Tensor zeros(const Shape& shape, Device device, Loc loc = Loc::current()) {
    return detail::filled("zeros", shape, 0, DType::f32, device, loc);
}
/// Ones.
inline Tensor ones(const Shape& shape, DType dtype = DType::f32, Loc loc = Loc::current()) {
    return detail::filled("ones", shape, 1, dtype, Device::cpu(), loc);
}
/// Ones on device.
inline Tensor ones(const Shape& shape, DType dtype, Device device, Loc loc = Loc::current()) {
    return detail::filled("ones", shape, 1, dtype, device, loc);
}
/// Float32 ones on device.
inline Tensor ones(const Shape& shape, Device device, Loc loc = Loc::current()) {
    return detail::filled("ones", shape, 1, DType::f32, device, loc);
}

/// start, start+step, ... below end (above, for a negative step).
KILN_DECL Tensor arange(double start, double end, double step = 1, DType dtype = DType::f32, Loc loc = Loc::current());
/// start, start+step, ... below end, on device.
KILN_DECL Tensor arange(double start, double end, double step, DType dtype, Device device, Loc loc = Loc::current());
/// 0, 1, ..., end-1.
KILN_DECL Tensor arange(std::int64_t end, DType dtype = DType::i64, Loc loc = Loc::current());
/// 0, 1, ..., end-1 on device.
KILN_DECL Tensor arange(std::int64_t end, DType dtype, Device device, Loc loc = Loc::current());
/// 0, 1, ..., end-1 (int64) on device.
KILN_DECL Tensor arange(std::int64_t end, Device device, Loc loc = Loc::current());

/// `steps` evenly spaced values from start to end inclusive.
KILN_DECL Tensor linspace(double start, double end, std::int64_t steps, DType dtype = DType::f32, Loc loc = Loc::current());
/// `steps` evenly spaced values from start to end inclusive, on device.
KILN_DECL Tensor linspace(double start, double end, std::int64_t steps, DType dtype, Device device, Loc loc = Loc::current());

/// Uniform in [0, 1): drawn on the dtype's own grid, so rounding never reaches 1.
KILN_DECL Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Uniform in [0, 1) on device: the same numbers as the CPU factory from the same generator state.
KILN_DECL Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Float32 uniform in [0, 1) on device.
KILN_DECL Tensor rand(const Shape& shape, Device device, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Standard normal.
KILN_DECL Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Standard normal on device: the same numbers as the CPU factory from the same generator state.
KILN_DECL Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Float32 standard normal on device.
KILN_DECL Tensor randn(const Shape& shape, Device device, Generator& gen = default_generator(), Loc loc = Loc::current());
/// Integers uniform in [low, high).
KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype = DType::i64,
                      Generator& gen = default_generator(), Loc loc = Loc::current());
/// Integers uniform in [low, high) on device: the same numbers as the CPU factory from the same generator state.
KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype, Device device,
                      Generator& gen = default_generator(), Loc loc = Loc::current());
/// Int64 integers uniform in [low, high) on device.
KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Device device,
                      Generator& gen = default_generator(), Loc loc = Loc::current());

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/core/factories_impl.hpp"
#endif
