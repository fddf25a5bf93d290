// Tensor factories: empty, zeros, ones, full, arange, linspace, rand, randn, randint, on any device.
#pragma once

#include <cmath>
#include <cstdio>

#include "kiln/core/thread_pool.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

namespace detail {
/// Fills a new contiguous tensor with f(i) for each flat index i, converted to its dtype (the
/// shape checked first, in the name of factory `op`).
template <class F>
Tensor generate(const Shape& shape, DType dtype, std::string_view op, const std::source_location& loc, F&& f) {
    check_shape(shape, dtype_size(dtype), op, loc);
    Tensor t(shape, dtype, Device::cpu(), loc);
    visit_dtype(dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        S* p = static_cast<S*>(t.data_ptr());
        for_each_tile(t.numel(), [&](std::int64_t b, std::int64_t n) {
            for (std::int64_t i = b; i < b + n; ++i) p[i] = store_as<S>(f(i));
        });
    });
    return t;
}

/// A tensor on `device` whose values make_on_host() computes on the host (the CUDA factories
/// fill on the host and transfer, so their values equal the CPU factory's). The device tensor is
/// allocated first, so a missing device fails before any work (and before a generator advances).
template <class F>
Tensor make_on(const Shape& shape, DType dtype, Device device, std::string_view op, const std::source_location& loc,
               F&& make_on_host) {
    check_shape(shape, dtype_size(dtype), op, loc);
    if (device.is_cpu()) return make_on_host();
    Tensor out(shape, dtype, device, loc);
    out.copy_(make_on_host(), loc);
    return out;
}

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
inline Tensor view_in_order(const Tensor& m, const Shape& shape, const std::vector<std::int64_t>& order, Loc loc = Loc::current()) {
    const int r = shape.rank();
    bool identity = static_cast<int>(order.size()) == r;
    for (int k = 0; identity && k < r; ++k) identity = order[static_cast<std::size_t>(k)] == k;
    if (identity || static_cast<int>(order.size()) != r) return m.view(shape, loc);
    std::vector<std::int64_t> back(static_cast<std::size_t>(r));
    for (int k = 0; k < r; ++k) back[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])] = k;
    return m.view(permuted(shape, order), loc).permute(back, loc);
}

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
inline Tensor laid_out_like(const Tensor& v, const Tensor& like, Loc loc = Loc::current()) {
    const std::vector<std::int64_t> want = memory_order(like);
    if (v.is_traced() || want.empty() || v.strides() == like.strides() || memory_order(v) == want) return v;
    Tensor out = empty_in_order(v.shape(), want, v.dtype(), v.device(), loc);
    out.copy_(v, loc);
    return out;
}

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
inline Tensor arange(double start, double end, double step = 1, DType dtype = DType::f32, Loc loc = Loc::current()) {
    if (step == 0 || !std::isfinite(start) || !std::isfinite(end))
        detail::fail<ValueError>("arange", "needs finite bounds and a nonzero step", loc);
    const double count = std::ceil((end - start) / step);
    if (count < 0) detail::fail<ValueError>("arange", "the step's sign does not lead from start to end", loc);
    if (!(count < 0x1p63)) {  // also inf, from end - start overflowing
        char n[32];
        std::snprintf(n, sizeof n, "%.4g", count);
        detail::fail<ShapeError>("arange", std::string("ceil((end - start) / step) = ") + n +
                                               " elements do not fit in int64", loc);
    }
    return detail::generate(Shape{static_cast<std::int64_t>(count)}, dtype, "arange", loc,
                            [&](std::int64_t i) { return start + static_cast<double>(i) * step; });
}
/// start, start+step, ... below end, on device.
inline Tensor arange(double start, double end, double step, DType dtype, Device device, Loc loc = Loc::current()) {
    return arange(start, end, step, dtype, loc).to(device, loc);
}
/// 0, 1, ..., end-1.
inline Tensor arange(std::int64_t end, DType dtype = DType::i64, Loc loc = Loc::current()) {
    return arange(0, static_cast<double>(end), 1, dtype, loc);
}
/// 0, 1, ..., end-1 on device.
inline Tensor arange(std::int64_t end, DType dtype, Device device, Loc loc = Loc::current()) {
    return arange(0, static_cast<double>(end), 1, dtype, device, loc);
}
/// 0, 1, ..., end-1 (int64) on device.
inline Tensor arange(std::int64_t end, Device device, Loc loc = Loc::current()) {
    return arange(0, static_cast<double>(end), 1, DType::i64, device, loc);
}

/// `steps` evenly spaced values from start to end inclusive.
inline Tensor linspace(double start, double end, std::int64_t steps, DType dtype = DType::f32, Loc loc = Loc::current()) {
    if (steps < 0) detail::fail<ValueError>("linspace", "steps must be non-negative, got " + std::to_string(steps), loc);
    const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
    // the second half counts back from end so both ends are exact, as torch does
    return detail::generate(Shape{steps}, dtype, "linspace", loc, [&](std::int64_t i) {
        return (steps == 1 || i < steps / 2) ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
    });
}
/// `steps` evenly spaced values from start to end inclusive, on device.
inline Tensor linspace(double start, double end, std::int64_t steps, DType dtype, Device device, Loc loc = Loc::current()) {
    return linspace(start, end, steps, dtype, loc).to(device, loc);
}

/// Uniform in [0, 1): drawn on the dtype's own grid, so rounding never reaches 1.
inline Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    detail::check_shape(shape, dtype_size(dtype), "rand", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    const int bits = dtype == DType::f64 ? 53 : dtype == DType::f16 ? 11 : dtype == DType::bf16 ? 8 : 24;
    return detail::generate(shape, dtype, "rand", loc, [&](std::int64_t i) {
        return std::ldexp(static_cast<double>(gen.bits(c0 + static_cast<std::uint64_t>(i)) >> (64 - bits)), -bits);
    });
}
/// Uniform in [0, 1) on device: the same numbers as the CPU factory from the same generator state.
inline Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    return detail::make_on(shape, dtype, device, "rand", loc, [&] { return rand(shape, dtype, gen, loc); });
}
/// Float32 uniform in [0, 1) on device.
inline Tensor rand(const Shape& shape, Device device, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    return rand(shape, DType::f32, device, gen, loc);
}
/// Standard normal.
inline Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    detail::check_shape(shape, dtype_size(dtype), "randn", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    return detail::generate(shape, dtype, "randn", loc, [&](std::int64_t i) { return gen.normal(c0 + static_cast<std::uint64_t>(i)); });
}
/// Standard normal on device: the same numbers as the CPU factory from the same generator state.
inline Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    return detail::make_on(shape, dtype, device, "randn", loc, [&] { return randn(shape, dtype, gen, loc); });
}
/// Float32 standard normal on device.
inline Tensor randn(const Shape& shape, Device device, Generator& gen = default_generator(), Loc loc = Loc::current()) {
    return randn(shape, DType::f32, device, gen, loc);
}
/// Integers uniform in [low, high).
inline Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype = DType::i64,
                      Generator& gen = default_generator(), Loc loc = Loc::current()) {
    if (high <= low) detail::fail<ValueError>("randint", "needs low < high, got [" + std::to_string(low) + ", " + std::to_string(high) + ")", loc);
    detail::check_shape(shape, dtype_size(dtype), "randint", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    const std::uint64_t span = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
    return detail::generate(shape, dtype, "randint", loc, [&](std::int64_t i) {
        return static_cast<double>(low + static_cast<std::int64_t>(gen.bits(c0 + static_cast<std::uint64_t>(i)) % span));
    });
}
/// Integers uniform in [low, high) on device: the same numbers as the CPU factory from the same generator state.
inline Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype, Device device,
                      Generator& gen = default_generator(), Loc loc = Loc::current()) {
    if (high <= low) detail::fail<ValueError>("randint", "needs low < high, got [" + std::to_string(low) + ", " + std::to_string(high) + ")", loc);
    return detail::make_on(shape, dtype, device, "randint", loc, [&] { return randint(low, high, shape, dtype, gen, loc); });
}
/// Int64 integers uniform in [low, high) on device.
inline Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Device device,
                      Generator& gen = default_generator(), Loc loc = Loc::current()) {
    return randint(low, high, shape, DType::i64, device, gen, loc);
}

}  // namespace kiln
