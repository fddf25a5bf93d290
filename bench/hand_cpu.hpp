// The hand-written CPU anchors of issue 18: the bench's CPU workloads written by hand as xsimd
// loops (and bias_gelu as an Eigen per-row loop), the way a performance engineer would write them
// for one workload, with none of kiln's code. kiln_bench times them beside kiln's rows, over the
// same pool and with the same inputs, so "at the hand-written limit" is measured in one run.
//
// Each takes row-major contiguous f32 data and a row range [r0, r1) (elementwise workloads: an
// element range); the caller splits it over threads.
#pragma once

#include <xsimd/xsimd.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln_bench_hand {

using B = xsimd::batch<float>;
inline constexpr std::int64_t W = static_cast<std::int64_t>(B::size);

/// relu(x*1.5+0.5)*sigmoid(x) - tanh(x*0.1) + exp(-x*x) for one batch.
inline B chain(B x) {
    const B relu = xsimd::max(x * B(1.5f) + B(0.5f), B(0.0f));
    const B sig = B(1.0f) / (B(1.0f) + xsimd::exp(-x));
    return relu * sig - xsimd::tanh(x * B(0.1f)) + xsimd::exp(-x * x);
}
/// gelu with the tanh approximation, for one batch.
inline B gelu_tanh(B v) {
    const B inner = B(0.7978845608028654f) * (v + B(0.044715f) * v * v * v);
    return B(0.5f) * v * (B(1.0f) + xsimd::tanh(inner));
}

/// The first n (< W) floats at p as a batch, the rest `fill`.
inline B load_tail(const float* p, std::int64_t n, float fill) {
    alignas(64) float t[W];
    for (std::int64_t k = 0; k < W; ++k) t[k] = k < n ? p[k] : fill;
    return B::load_aligned(t);
}
inline void store_tail(float* p, std::int64_t n, B v) {
    alignas(64) float t[W];
    v.store_aligned(t);
    for (std::int64_t k = 0; k < n; ++k) p[k] = t[k];
}

inline float hmax(B v) {
    alignas(64) float t[W];
    v.store_aligned(t);
    float m = t[0];
    for (std::int64_t k = 1; k < W; ++k) m = std::max(m, t[k]);
    return m;
}

/// y[i] = chain(x[i]) for i in [b, e).
inline void chain_range(const float* x, float* y, std::int64_t b, std::int64_t e) {
    std::int64_t i = b;
    for (; i + W <= e; i += W) chain(B::load_unaligned(x + i)).store_unaligned(y + i);
    if (i < e) store_tail(y + i, e - i, chain(load_tail(x + i, e - i, 0.0f)));
}

/// y = gelu_tanh(x + bias) over rows [r0, r1) of n columns.
inline void bias_gelu_rows(const float* x, const float* bias, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        std::int64_t i = 0;
        for (; i + W <= n; i += W) gelu_tanh(B::load_unaligned(xr + i) + B::load_unaligned(bias + i)).store_unaligned(yr + i);
        if (i < n) store_tail(yr + i, n - i, gelu_tanh(load_tail(xr + i, n - i, 0.0f) + load_tail(bias + i, n - i, 0.0f)));
    }
}

/// The same as an Eigen array expression per row (the "Eigen per-row loop").
inline void bias_gelu_rows_eigen(const float* x, const float* bias, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1) {
    const Eigen::Map<const Eigen::ArrayXf> b(bias, n);
    for (std::int64_t r = r0; r < r1; ++r) {
        const Eigen::Map<const Eigen::ArrayXf> xr(x + r * n, n);
        Eigen::Map<Eigen::ArrayXf> yr(y + r * n, n);
        yr = 0.5f * (xr + b) * (1.0f + (0.7978845608028654f * ((xr + b) + 0.044715f * (xr + b).cube())).tanh());
    }
}

/// Column sums of squares: acc[j] += x[r, j]^2 for rows [r0, r1) of n columns (acc: n floats,
/// the caller's per-thread partial; rows read whole, in order).
inline void colsum_sq_rows(const float* x, float* acc, std::int64_t n, std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * n;
        std::int64_t i = 0;
        for (; i + W <= n; i += W) {
            const B v = B::load_unaligned(xr + i);
            xsimd::fma(v, v, B::load_unaligned(acc + i)).store_unaligned(acc + i);
        }
        if (i < n) {
            const B v = load_tail(xr + i, n - i, 0.0f);
            store_tail(acc + i, n - i, xsimd::fma(v, v, load_tail(acc + i, n - i, 0.0f)));
        }
    }
}

/// Softmax of rows [r0, r1) of n columns: the max, then exp(x - max) written to y and summed,
/// then y scaled by 1/sum in place (three passes over a row that stays in L1).
inline void softmax_rows(const float* x, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        B m(ninf);
        std::int64_t i = 0;
        for (; i + W <= n; i += W) m = xsimd::max(m, B::load_unaligned(xr + i));
        if (i < n) m = xsimd::max(m, load_tail(xr + i, n - i, ninf));
        const B mx(hmax(m));
        B s(0.0f);
        for (i = 0; i + W <= n; i += W) {
            const B e = xsimd::exp(B::load_unaligned(xr + i) - mx);
            e.store_unaligned(yr + i);
            s += e;
        }
        if (i < n) {  // padding reads -inf: exp gives 0
            const B e = xsimd::exp(load_tail(xr + i, n - i, ninf) - mx);
            store_tail(yr + i, n - i, e);
            s += e;
        }
        const B inv(1.0f / xsimd::hadd(s));
        for (i = 0; i + W <= n; i += W) (B::load_unaligned(yr + i) * inv).store_unaligned(yr + i);
        if (i < n) store_tail(yr + i, n - i, load_tail(yr + i, n - i, 0.0f) * inv);
    }
}

/// Layer norm of rows [r0, r1) of n columns with weight w and bias b (eps 1e-5): the mean, the
/// variance of x - mean, then the output (three passes over a row in L1).
inline void layernorm_rows(const float* x, const float* w, const float* b, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        B s(0.0f);
        std::int64_t i = 0;
        for (; i + W <= n; i += W) s += B::load_unaligned(xr + i);
        if (i < n) s += load_tail(xr + i, n - i, 0.0f);
        const float mean = xsimd::hadd(s) / static_cast<float>(n);
        const B mu(mean);
        B v(0.0f);
        for (i = 0; i + W <= n; i += W) {
            const B d = B::load_unaligned(xr + i) - mu;
            v = xsimd::fma(d, d, v);
        }
        if (i < n) {  // padding reads the mean: it adds 0
            const B d = load_tail(xr + i, n - i, mean) - mu;
            v = xsimd::fma(d, d, v);
        }
        const B rs(1.0f / std::sqrt(xsimd::hadd(v) / static_cast<float>(n) + 1e-5f));
        for (i = 0; i + W <= n; i += W)
            xsimd::fma((B::load_unaligned(xr + i) - mu) * rs, B::load_unaligned(w + i), B::load_unaligned(b + i)).store_unaligned(yr + i);
        if (i < n)
            store_tail(yr + i, n - i,
                       xsimd::fma((load_tail(xr + i, n - i, 0.0f) - mu) * rs, load_tail(w + i, n - i, 0.0f), load_tail(b + i, n - i, 0.0f)));
    }
}

}  // namespace kiln_bench_hand
