// Tensor factories' definitions (declared in core/factories.hpp), compiled once in separate mode.
#pragma once
// Included at the end of kiln/core/factories.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cmath>
#include <cstdio>

#include "kiln/core/thread_pool.hpp"

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

}  // namespace detail

KILN_DECL Tensor view_in_order(const Tensor& m, const Shape& shape, const std::vector<std::int64_t>& order, Loc loc) {
    const int r = shape.rank();
    bool identity = static_cast<int>(order.size()) == r;
    for (int k = 0; identity && k < r; ++k) identity = order[static_cast<std::size_t>(k)] == k;
    if (identity || static_cast<int>(order.size()) != r) return m.view(shape, loc);
    std::vector<std::int64_t> back(static_cast<std::size_t>(r));
    for (int k = 0; k < r; ++k) back[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])] = k;
    return m.view(permuted(shape, order), loc).permute(back, loc);
}

KILN_DECL Tensor laid_out_like(const Tensor& v, const Tensor& like, Loc loc) {
    const std::vector<std::int64_t> want = memory_order(like);
    if (v.is_traced() || want.empty() || v.strides() == like.strides() || memory_order(v) == want) return v;
    Tensor out = empty_in_order(v.shape(), want, v.dtype(), v.device(), loc);
    out.copy_(v, loc);
    return out;
}

KILN_DECL Tensor arange(double start, double end, double step, DType dtype, Loc loc) {
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

KILN_DECL Tensor arange(double start, double end, double step, DType dtype, Device device, Loc loc) {
    return arange(start, end, step, dtype, loc).to(device, loc);
}

KILN_DECL Tensor arange(std::int64_t end, DType dtype, Loc loc) {
    return arange(0, static_cast<double>(end), 1, dtype, loc);
}

KILN_DECL Tensor arange(std::int64_t end, DType dtype, Device device, Loc loc) {
    return arange(0, static_cast<double>(end), 1, dtype, device, loc);
}

KILN_DECL Tensor arange(std::int64_t end, Device device, Loc loc) {
    return arange(0, static_cast<double>(end), 1, DType::i64, device, loc);
}

KILN_DECL Tensor linspace(double start, double end, std::int64_t steps, DType dtype, Loc loc) {
    if (steps < 0) detail::fail<ValueError>("linspace", "steps must be non-negative, got " + std::to_string(steps), loc);
    const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
    // the second half counts back from end so both ends are exact, as torch does
    return detail::generate(Shape{steps}, dtype, "linspace", loc, [&](std::int64_t i) {
        return (steps == 1 || i < steps / 2) ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
    });
}

KILN_DECL Tensor linspace(double start, double end, std::int64_t steps, DType dtype, Device device, Loc loc) {
    return linspace(start, end, steps, dtype, loc).to(device, loc);
}

KILN_DECL Tensor rand(const Shape& shape, DType dtype, Generator& gen, Loc loc) {
    detail::check_shape(shape, dtype_size(dtype), "rand", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    const int bits = dtype == DType::f64 ? 53 : dtype == DType::f16 ? 11 : dtype == DType::bf16 ? 8 : 24;
    return detail::generate(shape, dtype, "rand", loc, [&](std::int64_t i) {
        return std::ldexp(static_cast<double>(gen.bits(c0 + static_cast<std::uint64_t>(i)) >> (64 - bits)), -bits);
    });
}

KILN_DECL Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen, Loc loc) {
    return detail::make_on(shape, dtype, device, "rand", loc, [&] { return rand(shape, dtype, gen, loc); });
}

KILN_DECL Tensor rand(const Shape& shape, Device device, Generator& gen, Loc loc) {
    return rand(shape, DType::f32, device, gen, loc);
}

KILN_DECL Tensor randn(const Shape& shape, DType dtype, Generator& gen, Loc loc) {
    detail::check_shape(shape, dtype_size(dtype), "randn", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    return detail::generate(shape, dtype, "randn", loc, [&](std::int64_t i) { return gen.normal(c0 + static_cast<std::uint64_t>(i)); });
}

KILN_DECL Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen, Loc loc) {
    return detail::make_on(shape, dtype, device, "randn", loc, [&] { return randn(shape, dtype, gen, loc); });
}

KILN_DECL Tensor randn(const Shape& shape, Device device, Generator& gen, Loc loc) {
    return randn(shape, DType::f32, device, gen, loc);
}

KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype, Generator& gen, Loc loc) {
    if (high <= low) detail::fail<ValueError>("randint", "needs low < high, got [" + std::to_string(low) + ", " + std::to_string(high) + ")", loc);
    detail::check_shape(shape, dtype_size(dtype), "randint", loc);  // before the generator advances
    const std::uint64_t c0 = gen.advance(static_cast<std::uint64_t>(shape.numel()));
    const std::uint64_t span = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
    return detail::generate(shape, dtype, "randint", loc, [&](std::int64_t i) {
        return static_cast<double>(low + static_cast<std::int64_t>(gen.bits(c0 + static_cast<std::uint64_t>(i)) % span));
    });
}

KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype, Device device, Generator& gen, Loc loc) {
    if (high <= low) detail::fail<ValueError>("randint", "needs low < high, got [" + std::to_string(low) + ", " + std::to_string(high) + ")", loc);
    return detail::make_on(shape, dtype, device, "randint", loc, [&] { return randint(low, high, shape, dtype, gen, loc); });
}

KILN_DECL Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Device device, Generator& gen, Loc loc) {
    return randint(low, high, shape, DType::i64, device, gen, loc);
}

}  // namespace kiln
