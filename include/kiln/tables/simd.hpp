// The SIMD layer: kiln's only xsimd user, with every kernel math function for scalars and batches alike.
#pragma once

// GCC 12's AVX-512 intrinsics seed results with a self-initialised _mm512_undefined_*(), which
// -Wuninitialized reports at every inlined use (GCC PR 105593, fixed in 12.3). The warning is
// located inside the intrinsic headers, so it is silenced for them alone: they must be first
// included here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <xsimd/xsimd.hpp>
#if XSIMD_WITH_AVX512F
#include <immintrin.h>
#endif
#pragma GCC diagnostic pop

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln::detail::simd {

// ------------------------------------------------------------------ types

template <class T> using Batch = xsimd::batch<T>;
template <class T> inline constexpr std::size_t width = Batch<T>::size;

template <class V> struct ScalarOf { using type = V; };
template <class T, class A> struct ScalarOf<xsimd::batch<T, A>> { using type = T; };
/// Element type of a scalar or a batch.
template <class V> using scalar_of = typename ScalarOf<V>::type;
template <class V> inline constexpr bool is_batch_v = !std::is_same_v<scalar_of<V>, V>;

/// float or double, alone or in a batch.
template <class V>
concept real_value = std::is_same_v<scalar_of<V>, float> || std::is_same_v<scalar_of<V>, double>;
/// Any compute type of kiln (f32, f64, i32, i64), alone or in a batch.
template <class V>
concept kernel_value =
    real_value<V> || std::is_same_v<scalar_of<V>, std::int32_t> || std::is_same_v<scalar_of<V>, std::int64_t>;

// ------------------------------------------------------------------ memory

template <class T> Batch<T> load(const T* p) { return Batch<T>::load_unaligned(p); }
template <class T> Batch<T> load_aligned(const T* p) { return Batch<T>::load_aligned(p); }
template <class T> void store(T* p, const Batch<T>& v) { v.store_unaligned(p); }
template <class T> void store_aligned(T* p, const Batch<T>& v) { v.store_aligned(p); }
template <class T> Batch<T> splat(T v) { return Batch<T>(v); }
/// Outputs of at least this many bytes are written with store_stream by loops bound by memory
/// (ops::streams_ok), in fused expressions and in generated CPU kernels: a third less traffic for
/// a write-only stream. Smaller outputs are stored normally, in cache for their next reader.
inline constexpr std::int64_t stream_min_bytes = std::int64_t{16} << 20;
/// Stores v at p, aligned to sizeof(Batch<T>), with a non-temporal store where the ISA has one:
/// the line goes to memory without first being read (no read for ownership) and without evicting
/// cached data. Call stream_fence() before another thread reads what was stored this way.
template <class T> void store_stream(T* p, const Batch<T>& v) {
#if XSIMD_WITH_AVX512F
    if constexpr (sizeof(Batch<T>) == 64) {
        __m512i r;
        std::memcpy(&r, &v, 64);
        _mm512_stream_si512(reinterpret_cast<__m512i*>(p), r);
        return;
    }
#endif
#if XSIMD_WITH_AVX
    if constexpr (sizeof(Batch<T>) == 32) {
        __m256i r;
        std::memcpy(&r, &v, 32);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(p), r);
        return;
    }
#endif
#if XSIMD_WITH_SSE2
    if constexpr (sizeof(Batch<T>) == 16) {
        __m128i r;
        std::memcpy(&r, &v, 16);
        _mm_stream_si128(reinterpret_cast<__m128i*>(p), r);
        return;
    }
#endif
    v.store_aligned(p);
}
/// Whether p is aligned for store_stream.
template <class T> bool stream_aligned(const T* p) { return reinterpret_cast<std::uintptr_t>(p) % sizeof(Batch<T>) == 0; }
/// Elements of T from p up to the next address aligned for store_stream.
template <class T> int stream_head(const T* p) {
    const std::uintptr_t a = sizeof(Batch<T>), m = reinterpret_cast<std::uintptr_t>(p) % a;
    return static_cast<int>((a - m) % a / sizeof(T));
}
/// Orders the non-temporal stores before it ahead of every later store (x86's sfence).
inline void stream_fence() {
#if XSIMD_WITH_SSE2
    _mm_sfence();
#endif
}
/// Writes the transpose of the 16 x 16 floats at src (row stride ls) to dst (row stride ld): with
/// AVX-512, 16 loads, 64 in-register shuffles and 16 stores; one element at a time otherwise.
inline void transpose16(const float* src, std::ptrdiff_t ls, float* dst, std::ptrdiff_t ld) {
#if XSIMD_WITH_AVX512F
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ls);
    for (int i = 0; i < 16; i += 2) {  // interleave pairs of rows
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // then pairs of pairs, within each 128-bit lane
        r[g] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8)  // then 128-bit lanes across rows 4 apart
        for (int i = 0; i < 4; ++i) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; ++i) {  // and across rows 8 apart
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld, r[i]);
#else
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) dst[j * ld + i] = src[i * ls + j];
#endif
}

/// Writes 8 floats from each of 8 rows (rows[i], i < 8) transposed: dst[j * 8 + i] = rows[i][j]
/// (a GEMM's 8-row strip of packed A). With AVX, 8 loads, 24 shuffles and 8 stores.
inline void transpose8_rows(const float* const* rows, float* dst) {
#if XSIMD_WITH_AVX
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i]);
    for (int i = 0; i < 8; i += 2) {  // interleave pairs of rows
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {  // then pairs of pairs, within each 128-bit lane
        r[g] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {  // and 128-bit lanes across rows 4 apart
        _mm256_storeu_ps(dst + 8 * i, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + 8 * (i + 4), _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
#else
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) dst[j * 8 + i] = rows[i][j];
#endif
}

// ------------------------------------------------------------------ building blocks
namespace impl {

// xsimd 8.1 has no fma kernel for AVX-512 (it falls back to x*y+z, fused or not at the compiler's whim),
// and on targets without FMA std::fma is a slow exact software routine while the batch is x*y+z. Scalar
// and batch must round identically, so both take the same path here.
inline constexpr bool has_fma =
    XSIMD_WITH_FMA3_SSE || XSIMD_WITH_FMA3_AVX || XSIMD_WITH_FMA3_AVX2 || XSIMD_WITH_AVX512F;

template <class V> inline constexpr bool is_zmm_v = is_batch_v<V> && sizeof(V) == 64;

template <class V>
[[gnu::always_inline]] inline V fmadd(const V& a, const V& b, const V& c) {
    if constexpr (!has_fma) {
        return a * b + c;
    } else if constexpr (!is_batch_v<V>) {
        return std::fma(a, b, c);
    } else {
#if XSIMD_WITH_AVX512F
        if constexpr (is_zmm_v<V> && std::is_same_v<scalar_of<V>, float>) return V(_mm512_fmadd_ps(a, b, c));
        else if constexpr (is_zmm_v<V>) return V(_mm512_fmadd_pd(a, b, c));
        else return xsimd::fma(a, b, c);
#else
        return xsimd::fma(a, b, c);
#endif
    }
}

template <class V, class M>
[[gnu::always_inline]] inline V sel(const M& m, const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return xsimd::select(m, a, b);
    else return m ? a : b;
}

/// Lanes that are not zero. Spelled !(v == 0) because xsimd 8.1's != on AVX/AVX-512 is an ordered
/// compare, which calls NaN equal to zero.
template <class V> [[gnu::always_inline]] inline auto nonzero(const V& v) { return !(v == V(scalar_of<V>(0))); }

/// The comparison mask as T-valued 1 / 0.
template <class V, class M> [[gnu::always_inline]] inline V as_value(const M& m) {
    using T = scalar_of<V>;
    return sel(m, V(T(1)), V(T(0)));
}

// max(lo, x) and min(hi, x) in the order that returns x when it is NaN: MAXPS/MINPS return their
// second operand on NaN, and xsimd 8.1 passes (self, other) through on SSE2, AVX and AVX-512.
template <class V> [[gnu::always_inline]] inline V max_keep_nan(const V& lo, const V& x) {
    if constexpr (is_batch_v<V>) return xsimd::max(lo, x);
    else return lo > x ? lo : x;
}
template <class V> [[gnu::always_inline]] inline V min_keep_nan(const V& hi, const V& x) {
    if constexpr (is_batch_v<V>) return xsimd::min(hi, x);
    else return hi < x ? hi : x;
}
template <class V> [[gnu::always_inline]] inline V clamp_keep_nan(const V& x, const V& lo, const V& hi) {
    return min_keep_nan(hi, max_keep_nan(lo, x));
}

template <class V>
using bits_of = std::conditional_t<is_batch_v<V>, xsimd::batch<std::int32_t>, std::int32_t>;

template <class V> [[gnu::always_inline]] inline bits_of<V> to_bits(const V& v) {
    if constexpr (is_batch_v<V>) return xsimd::bitwise_cast<xsimd::batch<std::int32_t>>(v);
    else return std::bit_cast<std::int32_t>(v);
}
template <class V> [[gnu::always_inline]] inline V from_bits(const bits_of<V>& b) {
    if constexpr (is_batch_v<V>) return xsimd::bitwise_cast<V>(b);
    else return std::bit_cast<V>(b);
}

/// -|x| for float (one OR, and NaN stays NaN).
template <class V> [[gnu::always_inline]] inline V neg_abs_f32(const V& x) {
    return from_bits<V>(to_bits(x) | bits_of<V>(std::int32_t(0x80000000u)));
}

// ---------------------------------------------------------------- float kernels, shared by scalar and batch
// Each runs the same operation sequence on float and Batch<float>, so a tail computed by the scalar
// path equals the vector body bit for bit. The coefficients are minimax fits for relative error
// (Lawson-weighted least squares), rounded to float; the error bounds quoted at the public
// functions are measured over every float input against double references.

/// p * 2^n, for p in [0.7, 1.5] and integral n in [-150, 129], rounded once (so denormal results
/// are correctly rounded, 2^n beyond 2^128 gives inf). t is the 1.5*2^23 + n of the reduction,
/// whose low bits hold n as an integer.
template <class V> [[gnu::always_inline]] inline V scale_pow2_f32(const V& p, [[maybe_unused]] const V& n, const V& t) {
#if XSIMD_WITH_AVX512F
    if constexpr (is_zmm_v<V>) return V(_mm512_scalef_ps(p, n));
    else
#endif
    {
        // Two steps so that each factor is a normal float: p * 2^n1 is exact, the second product
        // rounds once, exactly like a single correctly rounded scaling. The second is an FMA with
        // a zero addend where there is one (the same rounding): Zen 5 takes a MUL whose result is
        // denormal or underflows to 0 through microcode, which made every batch holding such a
        // lane (exp of -inf: masked softmax) 2.3x slower; its FMA has no such penalty
        // (bench/simd_probe.cpp, kiln_simd_probe_avx2).
        using I = bits_of<V>;
        const I ni = to_bits(t) - I(0x4B400000);
        const I n1 = ni >> 1;
        const I n2 = ni - n1;
        const V e1 = from_bits<V>((n1 << 23) + I(0x3F800000));
        const V e2 = from_bits<V>((n2 << 23) + I(0x3F800000));
        if constexpr (has_fma) return fmadd(p * e1, e2, V(0.0f));
        else return p * e1 * e2;
    }
}

/// q(r) with e^r - 1 = r + r^2 q(r) to relative error 1.3e-8 on |r| <= ln2/2.
template <class V> [[gnu::always_inline]] inline V expm1_poly_f32(const V& r) {
    V q = fmadd(V(0x1.6bec08p-10f), r, V(0x1.122772p-7f));
    q = fmadd(q, r, V(0x1.555674p-5f));
    q = fmadd(q, r, V(0x1.5554bp-3f));
    return fmadd(q, r, V(0x1.fffffep-2f));
}

/// 2^n for integral n in [-126, 127] (inf from 128), with t as in scale_pow2_f32.
template <class V> [[gnu::always_inline]] inline V pow2_f32([[maybe_unused]] const V& n, const V& t) {
#if XSIMD_WITH_AVX512F
    if constexpr (is_zmm_v<V>) return V(_mm512_scalef_ps(V(1.0f), n));
    else
#endif
    {
        using I = bits_of<V>;
        return from_bits<V>((to_bits(t) << 23) + I(0x3F800000));
    }
}

/// e^x for x already in [-104, 89] (or NaN).
template <class V> [[gnu::always_inline]] inline V exp_core_f32(const V& x) {
    // n = rint(x / ln2) by the 1.5*2^23 shift: one rounding, and t's low mantissa bits are n.
    const V shift(0x1.8p23f);
    const V t = fmadd(x, V(0x1.715476p+0f), shift);
    const V n = t - shift;
    // ln2 split so that n * ln2_hi is exact even without FMA.
    V r = fmadd(n, V(-0x1.62e4p-1f), x);
    r = fmadd(n, V(-0x1.7f7d1cp-20f), r);
    // e^r = 1 + r + r^2 (c2 + ... + c6 r^4) on |r| <= ln2/2, relative error 3.1e-9.
    V p = fmadd(V(0x1.6a243ap-10f), r, V(0x1.1239ep-7f));
    p = fmadd(p, r, V(0x1.5558f2p-5f));
    p = fmadd(p, r, V(0x1.555492p-3f));
    p = fmadd(p, r, V(0x1.fffffcp-2f));
    p = fmadd(p, r, V(1.0f));
    p = fmadd(p, r, V(1.0f));
    return scale_pow2_f32(p, n, t);
}

template <class V> inline V exp_f32(const V& x) {
    // Beyond these every float result is 0 or inf; clamping keeps n small and r finite.
    return exp_core_f32(clamp_keep_nan(x, V(-104.0f), V(89.0f)));
}

/// Whether any lane of a comparison holds (a scalar comparison is its one lane).
template <class M> [[gnu::always_inline]] inline bool any_lane(const M& m) {
    if constexpr (std::is_same_v<M, bool>) return m;
    else return xsimd::any(m);
}
/// Whether every lane of a comparison holds.
template <class M> [[gnu::always_inline]] inline bool all_lanes(const M& m) {
    if constexpr (std::is_same_v<M, bool>) return m;
    else return xsimd::all(m);
}

// Denormal operands and results are microcoded on x86 (Zen 5: a division by or of a denormal, a
// MUL whose result is denormal; 1.8-3.4x slower batches in kiln_simd_probe). Where a formula would
// make one out of an ordinary input, the few batches holding such a lane take a second path that
// computes on a safe value instead and selects the exact answer; the test (one compare, on the
// input, off the critical path) is all ordinary batches pay.

template <class V> inline V expm1_core_f32(const V& x) {
    // expm1 rounds to -1 below -17.33 and overflows past 88.7228.
    const V xc = clamp_keep_nan(x, V(-18.0f), V(89.0f));
    const V shift(0x1.8p23f);
    const V t = fmadd(xc, V(0x1.715476p+0f), shift);
    const V n = t - shift;
    V r = fmadd(n, V(-0x1.62e4p-1f), xc);
    r = fmadd(n, V(-0x1.7f7d1cp-20f), r);
    const V em_r = fmadd(r * r, expm1_poly_f32(r), r);
    // 2^n (e^r - 1) + (2^n - 1) keeps the relative precision of small results; once n > 24 the
    // -1 is below half an ULP and 2^n may overflow, so e^r is scaled as in exp.
    const V two_n = pow2_f32(n, t);
    const V small = fmadd(two_n, em_r, two_n - V(1.0f));
    const V large = scale_pow2_f32(em_r + V(1.0f), n, t);
    // expm1 has the sign of x; OR-ing it in only matters for -0, which the fma turns into +0.
    using I = bits_of<V>;
    const V m = sel(n > V(24.0f), large, small);
    return from_bits<V>(to_bits(m) | (to_bits(x) & I(std::int32_t(0x80000000u))));
}

template <class V> inline V expm1_f32(const V& x) {
    // Below 2^-60 in magnitude expm1 x is x, and r * r would be denormal: such lanes compute on 0.
    using I = bits_of<V>;
    const auto tiny = from_bits<V>(to_bits(x) & I(0x7FFFFFFF)) < V(0x1p-60f);
    if (any_lane(tiny)) return sel(tiny, x, expm1_core_f32(sel(tiny, V(0.0f), x)));
    return expm1_core_f32(x);
}

template <class V> inline V sigmoid_f32(const V& x) {
    // e = e^-|x| never overflows; for x < 0, e/(1+e) keeps full relative precision down to the
    // denormals where 1/(1+e^-x) would already have hit inf and returned 0.
    const V e = exp_core_f32(max_keep_nan(V(-104.0f), neg_abs_f32(x)));
    const V one(1.0f);
    const V num = sel(x < V(0.0f), e, one);
    if (any_lane(x < V(-87.0f))) {
        // e may be denormal (x < -87.34): then 1 + e rounds to 1 and the result is e itself;
        // those lanes divide 1 instead of a denormal
        const auto tiny = (e < V(std::numeric_limits<float>::min())) & (x < V(0.0f));
        return sel(tiny, e, sel(tiny, one, num) / (one + e));
    }
    return num / (one + e);
}

/// tanh a for 0 <= a < 0.625 as a + a^3 P(a^2) (Cephes' tanhf coefficients): max 0.72 ULP with FMA
/// over every float there, and no division.
template <class V> [[gnu::always_inline]] inline V tanh_small_f32(const V& a) {
    const V s = a * a;
    V p = fmadd(V(-0x1.75e1d4p-8f), s, V(0x1.52269cp-6f));
    p = fmadd(p, s, V(-0x1.b83c5ap-5f));
    p = fmadd(p, s, V(0x1.110726p-3f));
    p = fmadd(p, s, V(-0x1.555532p-2f));
    return fmadd(p * s, a, a);
}

/// tanh of |x| = ax, with the sign of x.
template <class V> inline V tanh_core_f32(const V& ax, const V& x) {
    using I = bits_of<V>;
    const V sign = from_bits<V>(to_bits(x) & I(std::int32_t(0x80000000u)));
    // Below 0.625 an odd polynomial (each lane takes it whatever its neighbours are, so a value
    // does not depend on where it falls in a batch); a batch with no such lane skips it, and one
    // with only such lanes skips the division below.
    const auto small = ax < V(0.625f);
    if (all_lanes(small)) return from_bits<V>(to_bits(tanh_small_f32(ax)) | to_bits(sign));
    // tanh|x| = m / (m + 2) with m = e^2|x| - 1: no cancellation anywhere (m keeps full relative
    // precision near 0), and m's own error fades as m grows. Past |x| = 9.0109 tanh rounds to 1.
    const V a = min_keep_nan(V(9.02f), ax);
    const V y = a + a;
    const V shift(0x1.8p23f);
    const V t = fmadd(y, V(0x1.715476p+0f), shift);
    const V n = t - shift;
    // One ln2 constant is enough: n <= 26, and for n > 0 the error of m barely reaches tanh.
    const V r = fmadd(n, V(-0x1.62e43p-1f), y);
    const V em_r = fmadd(r * r, expm1_poly_f32(r), r);
    const V two_n = pow2_f32(n, t);
    // e^y - 1 = 2^n (e^r - 1) + (2^n - 1), where 2^n - 1 is exact for n <= 24.
    const V m = fmadd(two_n, em_r, two_n - V(1.0f));
    V th = m / (m + V(2.0f));
    if (any_lane(small)) th = sel(small, tanh_small_f32(ax), th);
    return from_bits<V>(to_bits(th) | to_bits(sign));
}

template <class V> inline V tanh_f32(const V& x) {
    // Below 2^-60 tanh x rounds to x, and r * r and m / (m + 2) would be denormal: such lanes
    // compute on 0.
    using I = bits_of<V>;
    const V ax = from_bits<V>(to_bits(x) & I(0x7FFFFFFF));
    const auto tiny = ax < V(0x1p-60f);
    if (any_lane(tiny)) return sel(tiny, x, tanh_core_f32(sel(tiny, V(0.0f), ax), x));
    return tanh_core_f32(ax, x);
}

template <class V> inline V erf_f32(const V& x) {
    // erf|x| = a P(a^2) / Q(a^2), relative error 2.5e-8 on [0, 4]; past 3.9193 erf rounds to 1.
    // Rounding in P and Q can push the quotient a hair above 1, hence the final min.
    using I = bits_of<V>;
    const V xc = min_keep_nan(V(4.0f), from_bits<V>(to_bits(x) & I(0x7FFFFFFF)));
    const V s = xc * xc;
    V p = fmadd(V(0x1.0aa92cp-19f), s, V(0x1.2a63c6p-12f));
    p = fmadd(p, s, V(0x1.fd0066p-9f));
    p = fmadd(p, s, V(0x1.b302ap-5f));
    p = fmadd(p, s, V(0x1.8c61b6p-3f));
    p = fmadd(p, s, V(0x1.20dd74p+0f));
    V q = fmadd(V(0x1.39e734p-15f), s, V(0x1.36cad2p-10f));
    q = fmadd(q, s, V(0x1.f2502ap-7f));
    q = fmadd(q, s, V(0x1.d8798ap-4f));
    q = fmadd(q, s, V(0x1.027ccp-1f));
    q = fmadd(q, s, V(1.0f));
    const V e = min_keep_nan(V(1.0f), (xc * p) / q);
    return from_bits<V>(to_bits(e) | (to_bits(x) & I(std::int32_t(0x80000000u))));
}

/// f applied lane by lane (for what has no good vector form).
template <class T, class F> inline Batch<T> per_lane(F f, const Batch<T>& a) {
    alignas(Batch<T>::arch_type::alignment()) T la[width<T>];
    a.store_aligned(la);
    for (std::size_t i = 0; i < width<T>; ++i) la[i] = f(la[i]);
    return Batch<T>::load_aligned(la);
}

template <class T, class F> inline Batch<T> per_lane(F f, const Batch<T>& a, const Batch<T>& b) {
    alignas(Batch<T>::arch_type::alignment()) T la[width<T>], lb[width<T>];
    a.store_aligned(la);
    b.store_aligned(lb);
    for (std::size_t i = 0; i < width<T>; ++i) la[i] = f(la[i], lb[i]);
    return Batch<T>::load_aligned(la);
}

// xsimd 8.1's double exp and expm1 go wrong at both ends of the range: they flush results below
// 2^-1022 to zero, and from x = 709.44 on they build 2^1024 and overflow before e^r < 1 could pull
// the result back. There e^x = (e^(x/2))^2: one squaring of a < 1 ULP result, single-rounded into
// the denormals. Rare lanes, so the fix-up runs only when a batch holds one.
inline Batch<double> exp_f64(const Batch<double>& x) {
    const Batch<double> e = xsimd::exp(x);
    const auto edge = (x <= Batch<double>(-708.3964185322641)) | (x > Batch<double>(709.43));
    if (!xsimd::any(edge)) return e;
    const Batch<double> h = xsimd::exp(x * Batch<double>(0.5));
    return xsimd::select(edge, h * h, e);
}
inline Batch<double> expm1_f64(const Batch<double>& x) {
    const Batch<double> e = xsimd::expm1(x);
    const auto big = x > Batch<double>(709.43);  // where e^x - 1 == e^x
    if (!xsimd::any(big)) return e;
    return xsimd::select(big, exp_f64(x), e);
}

/// xsimd 8.1's double log is wrong for denormal x; log(x 2^54) - 54 ln2 is not.
inline Batch<double> log_f64(const Batch<double>& x) {
    using B = Batch<double>;
    const auto tiny = (x < B(std::numeric_limits<double>::min())) & (x > B(0.0));
    if (!xsimd::any(tiny)) return xsimd::log(x);
    const B scaled = xsimd::log(xsimd::select(tiny, x * B(0x1p54), x));
    return xsimd::select(tiny, scaled - B(37.42994775023705), scaled);
}

/// x^y for double lanes holding float values, with C's special cases. In double, y log2|x| and its
/// 2^ carry a relative error near 1e-14, far below a float ULP.
inline Batch<double> pow_f32_in_f64(const Batch<double>& x, const Batch<double>& y) {
    using D = Batch<double>;
    const D ax = xsimd::abs(x);
    D r = xsimd::exp2(y * xsimd::log2(ax));
    // odd integers; xsimd 8.1's is_odd tests (y - 1) / 2, which rounds for |y| >= 2^53
    const auto odd = xsimd::is_flint(y) & !xsimd::is_flint(y * D(0.5));
    r = xsimd::select(odd, xsimd::copysign(r, x), r);  // (-0)^-1 = -inf included
    const auto finite_negative = (x < D(0.0)) & (x > D(-std::numeric_limits<double>::infinity()));
    const auto non_integral = !(xsimd::is_flint(y) | xsimd::isinf(y));  // NaN y goes here too
    r = xsimd::select(finite_negative & non_integral, D(std::numeric_limits<double>::quiet_NaN()), r);
    const auto one = (y == D(0.0)) | (x == D(1.0)) | ((ax == D(1.0)) & xsimd::isinf(y));
    return xsimd::select(one, D(1.0), r);
}

/// Float pow through double halves (xsimd 8.1 has no float-double widening of its own).
inline Batch<float> pow_f32(const Batch<float>& x, const Batch<float>& y) {
    constexpr std::size_t w = width<float>, h = width<double>;
    static_assert(w == 2 * h);
    constexpr std::size_t align = Batch<float>::arch_type::alignment();
    alignas(align) float xs[w], ys[w];
    alignas(align) double xd[w], yd[w];
    x.store_aligned(xs);
    y.store_aligned(ys);
    for (std::size_t i = 0; i < w; ++i) xd[i] = xs[i], yd[i] = ys[i];
    for (std::size_t i = 0; i < w; i += h) {
        pow_f32_in_f64(Batch<double>::load_aligned(xd + i), Batch<double>::load_aligned(yd + i)).store_aligned(xd + i);
    }
    for (std::size_t i = 0; i < w; ++i) xs[i] = static_cast<float>(xd[i]);
    return Batch<float>::load_aligned(xs);
}

/// a^e in wrapping integer arithmetic; negative e gives 0 except for a = 1 or -1.
template <class T> inline T int_pow(T a, T e) {
    if (e < 0) return a == 1 ? T(1) : a == -1 ? ((e & 1) ? T(-1) : T(1)) : T(0);
    using U = std::make_unsigned_t<T>;
    U r = 1, b = static_cast<U>(a);
    for (; e != 0; e >>= 1) {
        if (e & 1) r *= b;
        b *= b;
    }
    return static_cast<T>(r);
}

// Division-family kernels, one scalar function each (the batch versions run them lane by lane: x86
// has no integer division instructions, and an exact float fmod has no short vector form).
// Integer division by zero gives 0 in all three (numpy's choice; torch raises ZeroDivisionError,
// which a kernel cannot do per element), and division by -1 is done without the division that
// traps for INT_MIN / -1: the quotient wraps, the remainder is 0.

/// C's a % b (sign of the dividend).
template <class T> inline T int_fmod(T a, T b) { return (b == 0 || b == -1) ? T(0) : static_cast<T>(a % b); }
/// Python's a % b (sign of the divisor).
template <class T> inline T int_remainder(T a, T b) {
    const T r = int_fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
}
/// a / b rounded toward -inf.
template <class T> inline T int_floor_divide(T a, T b) {
    if (b == 0) return T(0);
    if (b == -1) return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(a));
    const T q = static_cast<T>(a / b), r = static_cast<T>(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
}
/// fmod(a, b) + b when the signs differ (torch.remainder for floats).
template <class T> inline T float_remainder(T a, T b) {
    const T m = std::fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
/// floor(a / b) computed as torch's div_floor_floating: from the exact fmod, so it is the floor of
/// the true quotient (a / b rounded first can round up to the next integer); x / 0 is IEEE's.
template <class T> inline T float_floor_divide(T a, T b) {
    if (b == 0) return a / b;
    const T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T fl = std::floor(div);
    if (div - fl > T(0.5)) fl += T(1);
    return fl;
}

inline constexpr bool has_native_rounding = XSIMD_WITH_SSE4_1 || XSIMD_WITH_AVX || XSIMD_WITH_AVX512F;

/// xsimd's SSE2 floor/ceil go through int conversion and lose the sign of -0 (and of ceil(-0.5)).
/// Both functions keep the sign of their argument, so it is put back.
template <class V> inline V with_sign_of(const V& r, const V& x) {
    if constexpr (has_native_rounding) return r;
    else return xsimd::copysign(r, x);
}

}  // namespace impl

// ------------------------------------------------------------------ float math
// Errors are |result - exact| in ULPs of the exact value (denormal spacing below the normal
// range), against double / long double references. "Every float" bounds come from running all
// 2^32 inputs (AVX-512 and SSE2 builds); the rest from tests/test_simd_math.cpp's sweeps, which
// assert all of them. Without FMA (plain x86-64) the f32 kernels lose a little; both figures given.

/// e^x. f32: max 0.91 ULP with FMA, 1.17 without (every float): denormal results included,
/// inf from 88.7228394, 0 below -103.9721. f64: xsimd (patched at both ends of the range), max 1 ULP,
/// 2.5 ULP for x > 709.43; scalar std::exp.
template <real_value V> V exp(V x) {
    if constexpr (std::is_same_v<scalar_of<V>, float>) return impl::exp_f32(x);
    else if constexpr (is_batch_v<V>) return impl::exp_f64(x);
    else return std::exp(x);
}

/// 1 / (1 + e^-x), computed as e/(1+e) with e = e^-|x| for x < 0 so that tiny results keep their
/// precision. f32: max 2.41 ULP (every float, with or without FMA). f64: same formula, max 2.5 ULP.
template <real_value V> V sigmoid(V x) {
    if constexpr (std::is_same_v<scalar_of<V>, float>) {
        return impl::sigmoid_f32(x);
    } else {
        V a;
        if constexpr (is_batch_v<V>) a = -xsimd::abs(x);
        else a = -std::fabs(x);
        const V e = simd::exp(a);
        const V one(1.0);
        return impl::sel(x < V(0.0), e, one) / (one + e);
    }
}

/// tanh. f32: max 1.5 ULP with FMA (every float; an odd polynomial below 0.625, 0.72 ULP there),
/// within 2.65 without, exactly +-1 from |x| = 9.0109, odd. f64: xsimd (max 1.3 ULP) / std::tanh (max 2.2 ULP).
template <real_value V> V tanh(V x) {
    if constexpr (std::is_same_v<scalar_of<V>, float>) return impl::tanh_f32(x);
    else if constexpr (is_batch_v<V>) return xsimd::tanh(x);
    else return std::tanh(x);
}

/// erf. f32: max 5.83 ULP with FMA, 6.38 without (every float; relative error < 4e-7), never
/// beyond +-1, exactly +-1 from |x| = 4, odd. f64: std::erf, lane by lane in batches (xsimd 8.1's
/// is off by up to ~70 ULP), max 1.5 ULP.
template <real_value V> V erf(V x) {
    if constexpr (std::is_same_v<scalar_of<V>, float>) return impl::erf_f32(x);
    else if constexpr (is_batch_v<V>) return impl::per_lane<double>([](double a) { return std::erf(a); }, x);
    else return std::erf(x);
}

/// e^x - 1. f32: the exp kernel's reduction, max 1.59 ULP with FMA, 1.72 without (every float),
/// -1 below -17.33, inf from 88.7228394. f64: xsimd (patched above 709.43) / std::expm1, max 2.5 ULP.
template <real_value V> V expm1(V x) {
    if constexpr (std::is_same_v<scalar_of<V>, float>) return impl::expm1_f32(x);
    else if constexpr (is_batch_v<V>) return impl::expm1_f64(x);
    else return std::expm1(x);
}

// The rest are xsimd's batch functions and std:: for scalars, so the two paths may differ in the
// last bit.

/// Natural log. max 1 ULP (f64 batches patched for denormal x).
template <real_value V> V log(V x) {
    if constexpr (std::is_same_v<V, Batch<double>>) return impl::log_f64(x);
    else if constexpr (is_batch_v<V>) return xsimd::log(x);
    else return std::log(x);
}
/// log(1 + x). max 1 ULP.
template <real_value V> V log1p(V x) {
    if constexpr (is_batch_v<V>) return xsimd::log1p(x);
    else return std::log1p(x);
}
/// Correctly rounded.
template <real_value V> V sqrt(V x) {
    if constexpr (is_batch_v<V>) return xsimd::sqrt(x);
    else return std::sqrt(x);
}
/// 1 / sqrt(x) as two correctly rounded operations (max 1.5 ULP), not the 12/14-bit estimate
/// instructions; scalar and batch agree bit for bit.
template <real_value V> V rsqrt(V x) { return V(scalar_of<V>(1)) / simd::sqrt(x); }
namespace impl {

enum class Trig { sin, cos, tan };

template <Trig F> inline Batch<float> xsimd_trig(const Batch<float>& x) {
    if constexpr (F == Trig::sin) return xsimd::sin(x);
    else if constexpr (F == Trig::cos) return xsimd::cos(x);
    else return xsimd::tan(x);
}

/// sin, cos or tan of a float batch. xsimd 8.1 reduces |x| <= 64 pi in vector code but sends a
/// whole batch lane by lane through a double reduction routine once one lane is larger, infinite
/// or NaN (kiln_simd_probe on Zen 5: 7-12x its vector time for |x| in [300, 8e5], arguments as
/// common as sinusoidal position encodings' positions; 4-6x for inf and NaN; 100-200x past 1e6,
/// where it runs Payne-Hanek). Here infinities and NaN become NaN without it (about 1x), and |x|
/// up to 2^19 pi/2 is reduced in double, vectorized (2-4.7x): x - k pi/2 with pi/2
/// in three parts (the first two of 33 bits, so k * part is exact for k < 2^20), then xsimd's
/// kernels on the reduced float r in [-pi/4, pi/4] and the quadrant k mod 4 picks the result.
/// Larger arguments keep xsimd's exact reduction.
template <Trig F> inline Batch<float> trig_f32(const Batch<float>& x) {
    using BF = Batch<float>;
    using BD = Batch<double>;
    const BF ax = xsimd::abs(x);
    if (xsimd::all(ax <= BF(201.0f))) return xsimd_trig<F>(x);  // xsimd's vector reduction (64 pi)
    const auto finite = ax <= BF(std::numeric_limits<float>::max());
    if (!xsimd::all(finite))
        return xsimd::select(finite, trig_f32<F>(xsimd::select(finite, x, BF(0.0f))), BF(std::numeric_limits<float>::quiet_NaN()));
    if (xsimd::any(ax > BF(823549.0f))) return xsimd_trig<F>(x);  // beyond k < 2^19: exact, lane by lane
    constexpr std::size_t w = width<float>, h = width<double>;
    alignas(64) float xf[w];
    alignas(64) double xd[w], kd[w];
    x.store_aligned(xf);
    for (std::size_t i = 0; i < w; ++i) xd[i] = xf[i];
    for (std::size_t o = 0; o < w; o += h) {
        const BD d = BD::load_aligned(xd + o);
        const BD k = xsimd::nearbyint(d * BD(0x1.45f306dc9c883p-1));  // 2 / pi
        BD r = fmadd(k, BD(-0x1.921fb544p+0), d);                      // exact: k * part has <= 53 bits
        r = fmadd(k, BD(-0x1.0b4611a6p-34), r);
        r = fmadd(k, BD(-0x1.3198a2e037073p-69), r);
        r.store_aligned(xd + o);
        k.store_aligned(kd + o);
    }
    // per lane, from k mod 4: whether the result is the other function of r, and its sign
    // (sin: s, c, -s, -c for k mod 4 = 0..3; cos: c, -s, -c, s; tan: t, -1/t, t, -1/t)
    alignas(64) float rf[w], other[w], negate[w];
    for (std::size_t i = 0; i < w; ++i) {
        rf[i] = static_cast<float>(xd[i]);
        const std::int64_t q = static_cast<std::int64_t>(kd[i]) & 3;
        other[i] = static_cast<float>(q & 1);
        negate[i] = F == Trig::sin ? static_cast<float>(q >> 1) : F == Trig::cos ? static_cast<float>(q == 1 || q == 2) : 0.0f;
    }
    const BF r = BF::load_aligned(rf);
    const auto odd = BF::load_aligned(other) != BF(0.0f), neg = BF::load_aligned(negate) != BF(0.0f);
    if constexpr (F == Trig::tan) {
        const BF t = xsimd::tan(r);
        return xsimd::select(odd, BF(-1.0f) / t, t);  // tan(r + pi/2) = -1 / tan r
    } else {
        const BF sr = xsimd::sin(r), cr = xsimd::cos(r);
        const BF v = F == Trig::sin ? xsimd::select(odd, cr, sr) : xsimd::select(odd, sr, cr);
        return xsimd::select(neg, -v, v);
    }
}

}  // namespace impl

/// sin. max 2.5 ULP (checked to |x| = 8e5 and at 1e30); float batches vectorized to |x| = 8e5.
template <real_value V> V sin(V x) {
    if constexpr (std::is_same_v<V, Batch<float>>) return impl::trig_f32<impl::Trig::sin>(x);
    else if constexpr (is_batch_v<V>) return xsimd::sin(x);
    else return std::sin(x);
}
/// cos. max 2.5 ULP (checked to |x| = 8e5 and at 1e30); float batches vectorized to |x| = 8e5.
template <real_value V> V cos(V x) {
    if constexpr (std::is_same_v<V, Batch<float>>) return impl::trig_f32<impl::Trig::cos>(x);
    else if constexpr (is_batch_v<V>) return xsimd::cos(x);
    else return std::cos(x);
}
/// tan. max 3.5 ULP (checked to |x| = 8e5 and at 1e30); float batches vectorized to |x| = 8e5.
template <real_value V> V tan(V x) {
    if constexpr (std::is_same_v<V, Batch<float>>) return impl::trig_f32<impl::Trig::tan>(x);
    else if constexpr (is_batch_v<V>) return xsimd::tan(x);
    else return std::tan(x);
}
/// Exact.
template <real_value V> V floor(V x) {
    if constexpr (is_batch_v<V>) return impl::with_sign_of(xsimd::floor(x), x);
    else return std::floor(x);
}
/// Exact.
template <real_value V> V ceil(V x) {
    if constexpr (is_batch_v<V>) return impl::with_sign_of(xsimd::ceil(x), x);
    else return std::ceil(x);
}
/// Round half to even (torch.round, nearbyint under the default rounding mode). Exact.
template <real_value V> V round(V x) {
    if constexpr (is_batch_v<V>) return xsimd::nearbyint(x);
    else return std::nearbyint(x);
}

/// x^y with C's special cases (pow(x, 0) = 1 even for NaN x, pow(1, y) = 1, (-8)^(1/3) = NaN...).
/// xsimd 8.1's pow is exp(y log x), which gets pow(0, 0), pow(NaN, 0) and pow(1, NaN) wrong and
/// loses ~|y log x| ULPs, so: f32 batches run log2 / exp2 in double, max 0.5 ULP + 1e-14 relative
/// (correctly rounded but for rare double-rounding ties; scalars use std::pow, < 1 ULP); f64 goes
/// lane by lane through std::pow (< 1 ULP, ~25 ns an element). Integers: wrapping repeated
/// squaring, lane by lane; y < 0 gives 0 unless x is 1 or -1.
template <kernel_value V> V pow(V x, V y) {
    using T = scalar_of<V>;
    if constexpr (std::is_same_v<V, Batch<float>>) {
        return impl::pow_f32(x, y);
    } else if constexpr (std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>([](T a, T b) { return std::pow(a, b); }, x, y);
        else return std::pow(x, y);
    } else {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::int_pow<T>, x, y);
        else return impl::int_pow(x, y);
    }
}

// ------------------------------------------------------------------ every compute type

/// C's fmod: a - trunc(a / b) * b, exact; the sign of a. Floats: x fmod 0 and inf fmod y are NaN.
/// Integers: x fmod 0 is 0 (see int_fmod).
template <kernel_value V> V fmod(V a, V b) {
    using T = scalar_of<V>;
    if constexpr (std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>([](T x, T y) { return std::fmod(x, y); }, a, b);
        else return std::fmod(a, b);
    } else {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::int_fmod<T>, a, b);
        else return impl::int_fmod(a, b);
    }
}
/// Python's / torch's a % b: a - floor(a / b) * b, the sign of b (floats: fmod corrected by b when
/// the signs differ). Integers: x % 0 is 0.
template <kernel_value V> V remainder(V a, V b) {
    using T = scalar_of<V>;
    if constexpr (std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::float_remainder<T>, a, b);
        else return impl::float_remainder(a, b);
    } else {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::int_remainder<T>, a, b);
        else return impl::int_remainder(a, b);
    }
}
/// floor(a / b) (torch.floor_divide, Python's //). Integers: rounds toward -inf, x // 0 is 0.
template <kernel_value V> V floor_divide(V a, V b) {
    using T = scalar_of<V>;
    if constexpr (std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::float_floor_divide<T>, a, b);
        else return impl::float_floor_divide(a, b);
    } else {
        if constexpr (is_batch_v<V>) return impl::per_lane<T>(impl::int_floor_divide<T>, a, b);
        else return impl::int_floor_divide(a, b);
    }
}

/// -x (integers wrap: -INT_MIN == INT_MIN; neg(+0.0) is -0.0).
template <kernel_value V> V neg(V x) {
    using T = scalar_of<V>;
    if constexpr (is_batch_v<V> && std::is_floating_point_v<T>) {
        return x ^ V(T(-0.0));  // xsimd 8.1 negates as 0 - x on AVX-512, which keeps +0 positive
    } else if constexpr (is_batch_v<V> || std::is_floating_point_v<T>) {
        return -x;
    } else {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(U(0) - static_cast<U>(x));
    }
}

/// |x| (integers wrap: |INT_MIN| == INT_MIN).
template <kernel_value V> V abs(V x) {
    using T = scalar_of<V>;
    if constexpr (is_batch_v<V>) return xsimd::abs(x);
    else if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
    else return x < 0 ? simd::neg(x) : x;
}

/// max, NaN if either is NaN (torch.maximum). Equal values (+0 / -0) give b.
template <kernel_value V> V max(V a, V b) {
    using T = scalar_of<V>;
    if constexpr (!std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return xsimd::max(a, b);
        else return a > b ? a : b;
    } else if constexpr (is_batch_v<V>) {
        // MAXPS(a, b) already returns b when either is NaN; only a NaN a needs fixing.
        return xsimd::select(xsimd::isnan(a), a, xsimd::max(a, b));
    } else {
        return (a > b || a != a) ? a : b;
    }
}

/// min, NaN if either is NaN (torch.minimum). Equal values (+0 / -0) give b.
template <kernel_value V> V min(V a, V b) {
    using T = scalar_of<V>;
    if constexpr (!std::is_floating_point_v<T>) {
        if constexpr (is_batch_v<V>) return xsimd::min(a, b);
        else return a < b ? a : b;
    } else if constexpr (is_batch_v<V>) {
        return xsimd::select(xsimd::isnan(a), a, xsimd::min(a, b));
    } else {
        return (a < b || a != a) ? a : b;
    }
}

/// -1, 0 or +1; NaN stays NaN and a zero keeps its sign.
template <kernel_value V> V sign(V x) {
    using T = scalar_of<V>;
    const V zero(T(0));
    if constexpr (std::is_floating_point_v<T>) {
        return impl::sel(x > zero, V(T(1)), impl::sel(x < zero, V(T(-1)), x));
    } else {
        return impl::sel(x > zero, V(T(1)), impl::sel(x < zero, V(T(-1)), zero));
    }
}

/// max(x, 0); NaN stays NaN (relu(-0) may be either zero).
template <kernel_value V> V relu(V x) { return impl::max_keep_nan(V(scalar_of<V>(0)), x); }

/// a where c is nonzero (NaN counts as nonzero), else b.
template <kernel_value V> V select(V c, V a, V b) { return impl::sel(impl::nonzero(c), a, b); }

// Comparisons give T(1) or T(0); NaN compares false except for ne.
template <kernel_value V> V eq(V a, V b) { return impl::as_value<V>(a == b); }
template <kernel_value V> V ne(V a, V b) { return impl::as_value<V>(!(a == b)); }
template <kernel_value V> V lt(V a, V b) { return impl::as_value<V>(a < b); }
template <kernel_value V> V le(V a, V b) { return impl::as_value<V>(a <= b); }
template <kernel_value V> V gt(V a, V b) { return impl::as_value<V>(a > b); }
template <kernel_value V> V ge(V a, V b) { return impl::as_value<V>(a >= b); }

// Logical ops read nonzero (NaN included) as true and give T(1) or T(0).
template <kernel_value V> V logical_and(V a, V b) { return impl::as_value<V>(impl::nonzero(a) && impl::nonzero(b)); }
template <kernel_value V> V logical_or(V a, V b) { return impl::as_value<V>(impl::nonzero(a) || impl::nonzero(b)); }
template <kernel_value V> V logical_not(V a) { return impl::as_value<V>(!impl::nonzero(a)); }

}  // namespace kiln::detail::simd
