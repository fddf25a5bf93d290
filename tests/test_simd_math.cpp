// Checks kiln/tables/simd.hpp: documented error bounds, special values, scalar/batch agreement.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/tables/simd.hpp"

namespace {

namespace ks = kiln::detail::simd;

template <class T> using Lim = std::numeric_limits<T>;

// ------------------------------------------------------------------ error measure

/// Spacing of T at the (exact) value r; denormal spacing below the normal range.
template <class T> long double ulp_at(long double r) {
    r = std::fabs(r);
    if (r < Lim<T>::min()) return Lim<T>::denorm_min();
    int e = 0;
    std::frexp(r, &e);
    return std::ldexp(1.0L, e - Lim<T>::digits);
}

/// |y - ref| in ULPs of ref. NaN must meet NaN; where ref rounds to +-inf, y must be that inf.
template <class T> double ulp_error(T y, long double ref) {
    constexpr double miss = 1e30;
    if (std::isnan(ref)) return std::isnan(y) ? 0 : miss;
    if (std::isnan(y)) return miss;
    const T rounded = static_cast<T>(ref);
    if (std::isinf(rounded)) return y == rounded ? 0 : miss;
    if (std::isinf(y)) return miss;
    return static_cast<double>(std::fabs(static_cast<long double>(y) - ref) / ulp_at<T>(ref));
}

template <class T> bool same(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) && std::isnan(b)) return true;
        return std::memcmp(&a, &b, sizeof(T)) == 0;
    } else {
        return a == b;
    }
}

// ------------------------------------------------------------------ sweeps

/// n evenly spaced points of [lo, hi] plus every `step`-th bit pattern of T between them.
template <class T> std::vector<T> sweep_points(T lo, T hi, std::size_t n, std::uint64_t step) {
    std::vector<T> xs;
    xs.reserve(n + 1);
    for (std::size_t i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * static_cast<T>(i) / static_cast<T>(n));
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    // walk both signs by magnitude bit patterns
    const U max_bits = std::bit_cast<U>(Lim<T>::infinity());
    for (U u = 0; u < max_bits; u += static_cast<U>(step)) {
        const T v = std::bit_cast<T>(u);
        if (v >= lo && v <= hi) xs.push_back(v);
        if (-v >= lo && -v <= hi) xs.push_back(-v);
        if (max_bits - u <= step) break;
    }
    return xs;
}

struct SweepResult {
    double batch_ulp = 0, scalar_ulp = 0;
    double batch_worst_x = 0, scalar_worst_x = 0;
    std::size_t differ = 0;  ///< lanes where batch and scalar results differ (bitwise)
    double differ_x = 0;
};

/// Runs f over xs as batches and as scalars against ref (double for float, else long double).
template <class T, class F, class R> SweepResult run_sweep(const std::vector<T>& xs, F f, R ref) {
    constexpr std::size_t w = ks::width<T>;
    SweepResult res;
    alignas(64) T in[w], out[w];
    for (std::size_t i = 0; i < xs.size(); i += w) {
        for (std::size_t k = 0; k < w; ++k) in[k] = xs[std::min(i + k, xs.size() - 1)];
        ks::store_aligned(out, f(ks::load_aligned(in)));
        for (std::size_t k = 0; k < w; ++k) {
            const T x = in[k];
            // double is exact enough to grade float results and far faster than long double
            using Ref = std::conditional_t<std::is_same_v<T, float>, double, long double>;
            const long double r = ref(static_cast<Ref>(x));
            const T ys = f(x);
            const double ub = ulp_error<T>(out[k], r), us = ulp_error<T>(ys, r);
            if (ub > res.batch_ulp) res.batch_ulp = ub, res.batch_worst_x = static_cast<double>(x);
            if (us > res.scalar_ulp) res.scalar_ulp = us, res.scalar_worst_x = static_cast<double>(x);
            if (!same(ys, out[k])) {
                if (res.differ == 0) res.differ_x = static_cast<double>(x);
                ++res.differ;
            }
        }
    }
    return res;
}

/// Asserts the ULP bound on both paths and, for the shared float kernels, bitwise agreement.
template <class T, class F, class R>
void check_sweep(const char* what, const std::vector<T>& xs, double bound, bool bitwise, F f, R ref) {
    const SweepResult r = run_sweep<T>(xs, f, ref);
    const std::string name(what);
    INFO(name, ": batch max ", r.batch_ulp, " ULP at ", r.batch_worst_x, ", scalar max ", r.scalar_ulp, " ULP at ",
         r.scalar_worst_x, ", scalar != batch in ", r.differ, " lanes (first at ", r.differ_x, ")");
    CHECK(r.batch_ulp <= bound);
    CHECK(r.scalar_ulp <= bound);
    if (bitwise) CHECK(r.differ == 0);
}

/// Value of f at x through a full batch and through the scalar path; both must agree bitwise.
template <class T, class F> T both_paths(F f, T x) {
    const T b = f(ks::splat(x)).get(0);
    const T s = f(x);
    INFO("x = ", x, ": batch ", b, ", scalar ", s);
    CHECK(same(b, s));
    return b;
}

// Each kiln function as one generic callable, for scalars and batches alike.
constexpr auto abs_fn = [](auto v) { return ks::abs(v); };
constexpr auto cos_fn = [](auto v) { return ks::cos(v); };
constexpr auto eq_fn = [](auto a, auto b) { return ks::eq(a, b); };
constexpr auto erf_fn = [](auto v) { return ks::erf(v); };
constexpr auto exp_fn = [](auto v) { return ks::exp(v); };
constexpr auto expm1_fn = [](auto v) { return ks::expm1(v); };
constexpr auto ge_fn = [](auto a, auto b) { return ks::ge(a, b); };
constexpr auto gt_fn = [](auto a, auto b) { return ks::gt(a, b); };
constexpr auto le_fn = [](auto a, auto b) { return ks::le(a, b); };
constexpr auto log_fn = [](auto v) { return ks::log(v); };
constexpr auto log1p_fn = [](auto v) { return ks::log1p(v); };
constexpr auto logical_and_fn = [](auto a, auto b) { return ks::logical_and(a, b); };
constexpr auto logical_not_fn = [](auto v) { return ks::logical_not(v); };
constexpr auto logical_or_fn = [](auto a, auto b) { return ks::logical_or(a, b); };
constexpr auto lt_fn = [](auto a, auto b) { return ks::lt(a, b); };
constexpr auto max_fn = [](auto a, auto b) { return ks::max(a, b); };
constexpr auto min_fn = [](auto a, auto b) { return ks::min(a, b); };
constexpr auto ne_fn = [](auto a, auto b) { return ks::ne(a, b); };
constexpr auto neg_fn = [](auto v) { return ks::neg(v); };
constexpr auto relu_fn = [](auto v) { return ks::relu(v); };
constexpr auto rsqrt_fn = [](auto v) { return ks::rsqrt(v); };
constexpr auto sigmoid_fn = [](auto v) { return ks::sigmoid(v); };
constexpr auto sign_fn = [](auto v) { return ks::sign(v); };
constexpr auto sin_fn = [](auto v) { return ks::sin(v); };
constexpr auto sqrt_fn = [](auto v) { return ks::sqrt(v); };
constexpr auto tan_fn = [](auto v) { return ks::tan(v); };
constexpr auto tanh_fn = [](auto v) { return ks::tanh(v); };

// The f32 kernels' bounds (exhaustively measured) depend on whether the build has FMA.
constexpr bool with_fma = ks::impl::has_fma;
constexpr double exp_bound = with_fma ? 1.0 : 1.2;
constexpr double expm1_bound = with_fma ? 1.6 : 1.75;
constexpr double tanh_bound = with_fma ? 1.5 : 2.65;
constexpr double sigmoid_bound = 2.45;
constexpr double erf_bound = with_fma ? 5.85 : 6.4;

constexpr float finf = Lim<float>::infinity();
constexpr float fnan = Lim<float>::quiet_NaN();
constexpr double dinf = Lim<double>::infinity();
constexpr double dnan = Lim<double>::quiet_NaN();

/// 1 / (1 + e^-x) in the precision of x.
constexpr auto sigmoid_ref = [](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); };

}  // namespace

// ====================================================================== float kernels (shared scalar/batch)

TEST_CASE("simd exp f32: <= 1 ULP (1.2 without FMA) over [-104, 89], denormals, overflow, specials") {
    const auto xs = sweep_points<float>(-104.0f, 89.0f, 1 << 21, 997);
    check_sweep<float>("exp", xs, exp_bound, true, exp_fn, [](auto x) { return std::exp(x); });

    const auto f = exp_fn;
    CHECK(both_paths(f, 0.0f) == 1.0f);
    CHECK(both_paths(f, -0.0f) == 1.0f);
    CHECK(both_paths(f, finf) == finf);
    CHECK(both_paths(f, -finf) == 0.0f);
    CHECK(std::isnan(both_paths(f, fnan)));
    CHECK(both_paths(f, Lim<float>::denorm_min()) == 1.0f);
    CHECK(both_paths(f, -1e-30f) == 1.0f);
    // the largest argument with a finite result, and the next float (e^x > FLT_MAX + ULP/2)
    const float x_max = 88.72283172607421875f;
    CHECK(ulp_error(both_paths(f, x_max), std::exp((long double)x_max)) <= exp_bound);
    CHECK(both_paths(f, std::nextafter(x_max, 100.0f)) == finf);
    CHECK(both_paths(f, 1e30f) == finf);
    // normal/denormal boundary, deep denormals, the underflow to zero
    CHECK(ulp_error(both_paths(f, -87.33654f), std::exp((long double)-87.33654f)) <= exp_bound);
    CHECK(both_paths(f, -103.27893f) == Lim<float>::denorm_min());
    CHECK(both_paths(f, -104.0f) == 0.0f);
    CHECK(both_paths(f, -1e30f) == 0.0f);
    for (float x = -103.9f; x < -87.0f; x += 0.01f) {
        CHECK(ulp_error(both_paths(f, x), std::exp((long double)x)) <= exp_bound);
    }
}

TEST_CASE("simd expm1 f32: <= 1.6 ULP (1.75 without FMA), exact near 0, -1 and inf at the ends") {
    auto xs = sweep_points<float>(-20.0f, 89.0f, 1 << 21, 997);
    const auto small = sweep_points<float>(-1.0f, 1.0f, 1 << 20, 1u << 20);
    xs.insert(xs.end(), small.begin(), small.end());
    check_sweep<float>("expm1", xs, expm1_bound, true, expm1_fn, [](auto x) { return std::expm1(x); });

    const auto f = expm1_fn;
    CHECK(same(both_paths(f, -0.0f), -0.0f));
    CHECK(same(both_paths(f, 0.0f), 0.0f));
    CHECK(both_paths(f, Lim<float>::denorm_min()) == Lim<float>::denorm_min());
    CHECK(both_paths(f, 1e-20f) == 1e-20f);
    CHECK(both_paths(f, finf) == finf);
    CHECK(both_paths(f, -finf) == -1.0f);
    CHECK(both_paths(f, -18.0f) == -1.0f);
    CHECK(std::isnan(both_paths(f, fnan)));
    const float x_max = 88.72283172607421875f;  // the largest with a finite result
    CHECK(ulp_error(both_paths(f, x_max), std::expm1((long double)x_max)) <= expm1_bound);
    CHECK(both_paths(f, 88.72283935546875f) == finf);
}

TEST_CASE("simd tanh f32: <= 1.5 ULP (2.65 without FMA) over [-100, 100], odd, saturates to exactly +-1") {
    const auto xs = sweep_points<float>(-100.0f, 100.0f, 1 << 21, 499);
    check_sweep<float>("tanh", xs, tanh_bound, true, tanh_fn, [](auto x) { return std::tanh(x); });

    const auto f = tanh_fn;
    CHECK(same(both_paths(f, 0.0f), 0.0f));
    CHECK(same(both_paths(f, -0.0f), -0.0f));
    CHECK(both_paths(f, finf) == 1.0f);
    CHECK(both_paths(f, -finf) == -1.0f);
    CHECK(std::isnan(both_paths(f, fnan)));
    CHECK(both_paths(f, 9.0110f) == 1.0f);
    CHECK(both_paths(f, -9.0110f) == -1.0f);
    CHECK(both_paths(f, 1e30f) == 1.0f);
    // no cancellation near 0: denormals and tiny normals keep full relative precision
    for (float x : {Lim<float>::denorm_min(), 1e-40f, Lim<float>::min(), 1e-30f, 1e-10f, 3e-5f, -2e-3f}) {
        CHECK(ulp_error(both_paths(f, x), std::tanh((long double)x)) <= tanh_bound);
    }
    for (float x = 0.0f; x < 12.0f; x += 0.001f) CHECK(both_paths(f, -x) == -both_paths(f, x));
}

TEST_CASE("simd sigmoid f32: <= 2.45 ULP over [-104, 100] including denormal results") {
    const auto xs = sweep_points<float>(-104.0f, 100.0f, 1 << 21, 499);
    check_sweep<float>("sigmoid", xs, sigmoid_bound, true, sigmoid_fn, sigmoid_ref);

    const auto f = sigmoid_fn;
    CHECK(both_paths(f, 0.0f) == 0.5f);
    CHECK(both_paths(f, -0.0f) == 0.5f);
    CHECK(both_paths(f, finf) == 1.0f);
    CHECK(both_paths(f, -finf) == 0.0f);
    CHECK(std::isnan(both_paths(f, fnan)));
    CHECK(both_paths(f, 17.0f) == 1.0f);
    CHECK(both_paths(f, -104.0f) == 0.0f);
    CHECK(ulp_error(both_paths(f, -100.0f), sigmoid_ref(-100.0L)) <= sigmoid_bound);  // a denormal
    CHECK(ulp_error(both_paths(f, -88.0f), sigmoid_ref(-88.0L)) <= sigmoid_bound);
}

TEST_CASE("simd erf f32: <= 5.85 ULP (6.4 without FMA), |erf| <= 1, exactly +-1 from 4 on") {
    const auto xs = sweep_points<float>(-10.0f, 10.0f, 1 << 21, 499);
    check_sweep<float>("erf", xs, erf_bound, true, erf_fn, [](auto x) { return std::erf(x); });

    const auto f = erf_fn;
    CHECK(same(both_paths(f, 0.0f), 0.0f));
    CHECK(same(both_paths(f, -0.0f), -0.0f));
    CHECK(both_paths(f, finf) == 1.0f);
    CHECK(both_paths(f, -finf) == -1.0f);
    CHECK(std::isnan(both_paths(f, fnan)));
    CHECK(both_paths(f, 4.0f) == 1.0f);
    CHECK(both_paths(f, -4.0f) == -1.0f);
    CHECK(both_paths(f, 5.5f) == 1.0f);
    CHECK(both_paths(f, 1e30f) == 1.0f);
    for (float x : {Lim<float>::denorm_min(), 1e-40f, Lim<float>::min(), 1e-20f, 1e-5f}) {
        CHECK(ulp_error(both_paths(f, x), std::erf((long double)x)) <= erf_bound);
    }
    bool bounded = true;
    for (float x = 0.0f; x < 6.0f; x = std::nextafter(x + 1e-4f, 7.0f)) bounded = bounded && ks::erf(x) <= 1.0f;
    CHECK(bounded);
}

// ====================================================================== delegated float / double math

TEST_CASE("simd f32 log, log1p, sin, cos, tan, sqrt, rsqrt: documented bounds") {
    const auto pos = sweep_points<float>(0.0f, Lim<float>::max(), 1 << 20, 4099);
    const auto unit = sweep_points<float>(0.0f, 4.0f, 1 << 20, 1u << 14);
    check_sweep<float>("log", pos, 1.0, false, log_fn, [](auto x) { return std::log(x); });
    check_sweep<float>("log", unit, 1.0, false, log_fn, [](auto x) { return std::log(x); });
    const auto lp = sweep_points<float>(-1.0f, 1e30f, 1 << 20, 4099);
    check_sweep<float>("log1p", lp, 1.0, false, log1p_fn, [](auto x) { return std::log1p(x); });
    const auto trig = sweep_points<float>(-1e5f, 1e5f, 1 << 20, 4099);
    check_sweep<float>("sin", trig, 2.5, false, sin_fn, [](auto x) { return std::sin(x); });
    check_sweep<float>("cos", trig, 2.5, false, cos_fn, [](auto x) { return std::cos(x); });
    check_sweep<float>("tan", trig, 3.5, false, tan_fn, [](auto x) { return std::tan(x); });
    check_sweep<float>("sqrt", pos, 0.5, true, sqrt_fn, [](auto x) { return std::sqrt(x); });
    check_sweep<float>("rsqrt", pos, 1.5, true, rsqrt_fn, [](auto x) { return decltype(x)(1) / std::sqrt(x); });

    // the vector reduction in double (|x| from 64 pi to 2^19 pi/2), its ends, and beyond
    const auto wide = sweep_points<float>(-823549.0f, 823549.0f, 1 << 20, 4099);
    check_sweep<float>("sin", wide, 2.5, false, sin_fn, [](auto x) { return std::sin(x); });
    check_sweep<float>("cos", wide, 2.5, false, cos_fn, [](auto x) { return std::cos(x); });
    check_sweep<float>("tan", wide, 3.5, false, tan_fn, [](auto x) { return std::tan(x); });
    // the floats nearest a multiple of pi/2 in that range (the reduction's hardest cases: r tiny;
    // the 8 closest, found by rounding k pi/2 to float for every k < 2^19 in 50-digit decimals), and
    // the range's ends
    for (float x : {252.89820861816406f, 505.7964172363281f, 52516.43359375f, 1011.5928344726562f, 105032.8671875f,
                    2023.1856689453125f, 267058.9375f, 2238.384765625f, 201.0f, 201.1f, 823549.0f, 823550.0f}) {
        INFO("x = ", x);
        CHECK(ulp_error(ks::sin(ks::splat(x)).get(0), std::sin((long double)x)) <= 2.5);
        CHECK(ulp_error(ks::cos(ks::splat(x)).get(0), std::cos((long double)x)) <= 2.5);
        CHECK(ulp_error(ks::tan(ks::splat(x)).get(0), std::tan((long double)x)) <= 3.5);
    }
    // a batch mixing inf, NaN, huge and ordinary lanes: each lane gets its own value
    {
        alignas(64) float in[ks::width<float>];
        const float specials[] = {finf, -finf, fnan, 1e30f, 3000.5f, -0.75f, 1e6f, 250.0f};
        for (std::size_t i = 0; i < ks::width<float>; ++i) in[i] = specials[i % 8];
        const auto v = ks::Batch<float>::load_aligned(in);
        const ks::Batch<float> r[3] = {ks::sin(v), ks::cos(v), ks::tan(v)};
        for (std::size_t i = 0; i < ks::width<float>; ++i) {
            INFO("lane ", i, ", x = ", in[i]);
            CHECK(ulp_error(r[0].get(i), std::sin((long double)in[i])) <= 2.5);
            CHECK(ulp_error(r[1].get(i), std::cos((long double)in[i])) <= 2.5);
            CHECK(ulp_error(r[2].get(i), std::tan((long double)in[i])) <= 3.5);
        }
    }

    for (float x : {0.0f, -0.0f, finf, -finf, fnan, -1.0f, Lim<float>::denorm_min(), 1e30f, -1e30f}) {
        INFO("x = ", x);
        CHECK(ulp_error(ks::log(ks::splat(x)).get(0), std::log((long double)x)) <= 1.0);
        CHECK(ulp_error(ks::log1p(ks::splat(x)).get(0), std::log1p((long double)x)) <= 1.0);
        CHECK(ulp_error(ks::sqrt(ks::splat(x)).get(0), std::sqrt((long double)x)) <= 0.5);
        CHECK(ulp_error(ks::rsqrt(ks::splat(x)).get(0), 1.0L / std::sqrt((long double)x)) <= 1.5);
        CHECK(ulp_error(ks::sin(ks::splat(x)).get(0), std::sin((long double)x)) <= 2.5);
        CHECK(ulp_error(ks::cos(ks::splat(x)).get(0), std::cos((long double)x)) <= 2.5);
        CHECK(ulp_error(ks::tan(ks::splat(x)).get(0), std::tan((long double)x)) <= 3.5);
    }
}

TEST_CASE("simd f64 math: documented bounds and special values") {
    const std::size_t n = 1 << 17;
    const auto wide = sweep_points<double>(-746.0, 710.0, n, std::uint64_t(1) << 44);
    const auto below_top = sweep_points<double>(-746.0, 709.43, n, std::uint64_t(1) << 44);
    const auto top = sweep_points<double>(709.43, 709.8, 1 << 14, std::uint64_t(1) << 62);
    check_sweep<double>("exp", below_top, 1.1, false, exp_fn, [](auto x) { return std::exp(x); });
    check_sweep<double>("exp", top, 2.5, false, exp_fn, [](auto x) { return std::exp(x); });
    check_sweep<double>("expm1", wide, 2.5, false, expm1_fn, [](auto x) { return std::expm1(x); });
    check_sweep<double>("sigmoid", wide, 2.5, false, sigmoid_fn, sigmoid_ref);
    const auto mid = sweep_points<double>(-40.0, 40.0, n, std::uint64_t(1) << 44);
    check_sweep<double>("tanh", mid, 2.5, false, tanh_fn, [](auto x) { return std::tanh(x); });
    check_sweep<double>("erf", mid, 1.5, true, erf_fn, [](auto x) { return std::erf(x); });
    const auto pos = sweep_points<double>(0.0, Lim<double>::max(), n, std::uint64_t(1) << 44);
    check_sweep<double>("log", pos, 1.0, false, log_fn, [](auto x) { return std::log(x); });
    check_sweep<double>("log1p", sweep_points<double>(-1.0, 1e300, n, std::uint64_t(1) << 44), 1.0, false,
                        log1p_fn, [](auto x) { return std::log1p(x); });
    check_sweep<double>("sqrt", pos, 0.5, true, sqrt_fn, [](auto x) { return std::sqrt(x); });
    check_sweep<double>("rsqrt", pos, 1.5, true, rsqrt_fn, [](auto x) { return decltype(x)(1) / std::sqrt(x); });
    const auto trig = sweep_points<double>(-1e5, 1e5, n, std::uint64_t(1) << 44);
    check_sweep<double>("sin", trig, 2.5, false, sin_fn, [](auto x) { return std::sin(x); });
    check_sweep<double>("cos", trig, 2.5, false, cos_fn, [](auto x) { return std::cos(x); });
    check_sweep<double>("tan", trig, 3.5, false, tan_fn, [](auto x) { return std::tan(x); });

    const auto both = [](auto f, double x) {
        const double b = f(ks::splat(x)).get(0);
        INFO("x = ", x, ": batch ", b, ", scalar ", f(x));
        CHECK(same(b, f(x)));
        return b;
    };
    CHECK(both(exp_fn, -dinf) == 0.0);
    CHECK(both(exp_fn, dinf) == dinf);
    CHECK(std::isnan(both(exp_fn, dnan)));
    CHECK(both(exp_fn, -745.2) == 0.0);
    CHECK(both(exp_fn, -745.0) == Lim<double>::denorm_min());
    CHECK(both(tanh_fn, dinf) == 1.0);
    CHECK(both(tanh_fn, -dinf) == -1.0);
    CHECK(same(both(tanh_fn, -0.0), -0.0));
    CHECK(std::isnan(both(tanh_fn, dnan)));
    CHECK(both(erf_fn, dinf) == 1.0);
    CHECK(both(erf_fn, -dinf) == -1.0);
    CHECK(std::isnan(both(erf_fn, dnan)));
    CHECK(both(sigmoid_fn, dinf) == 1.0);
    CHECK(both(sigmoid_fn, -dinf) == 0.0);
    CHECK(std::isnan(both(sigmoid_fn, dnan)));
    CHECK(both(expm1_fn, -dinf) == -1.0);
    CHECK(both(log_fn, 0.0) == -dinf);
    CHECK(std::isnan(both(log_fn, -1.0)));
    CHECK(both(log1p_fn, -1.0) == -dinf);
    CHECK(std::isnan(both(sin_fn, dinf)));
    CHECK(both(rsqrt_fn, 0.0) == dinf);
}

// ====================================================================== rounding

TEST_CASE_TEMPLATE("simd floor, ceil, round (half to even) are exact and keep the sign of zero", T, float, double) {
    const T big = std::is_same_v<T, float> ? T(8388607.5) : T(4503599627370495.5);
    const std::vector<T> xs = {T(0.5),  T(1.5),   T(2.5),  T(-0.5),      T(-1.5),       T(-2.5),  T(0.3),
                               T(-0.3), T(0.7),   T(-0.7), T(0.0),       T(-0.0),       big,      -big,
                               T(1e30), T(-1e30), T(3.0),  Lim<T>::infinity(), -Lim<T>::infinity(), Lim<T>::quiet_NaN(),
                               Lim<T>::denorm_min(), -Lim<T>::denorm_min(), std::nextafter(T(0.5), T(0)),
                               T(-7.5), T(123456.5)};
    for (T x : xs) {
        INFO("x = ", x);
        CHECK(same(ks::floor(ks::splat(x)).get(0), std::floor(x)));
        CHECK(same(ks::floor(x), std::floor(x)));
        CHECK(same(ks::ceil(ks::splat(x)).get(0), std::ceil(x)));
        CHECK(same(ks::ceil(x), std::ceil(x)));
        CHECK(same(ks::round(ks::splat(x)).get(0), std::nearbyint(x)));
        CHECK(same(ks::round(x), std::nearbyint(x)));
    }
    CHECK(ks::round(T(2.5)) == T(2));
    CHECK(ks::round(ks::splat(T(-3.5))).get(0) == T(-4));
}

// ====================================================================== pow

TEST_CASE_TEMPLATE("simd pow for floats: C special cases, < 1 ULP", T, float, double) {
    const T inf = Lim<T>::infinity(), nan = Lim<T>::quiet_NaN();
    const std::vector<T> vals = {T(0), T(-0.0), T(1), T(-1), T(2), T(-2), T(0.5), T(-0.5), T(3), T(10.5), T(-3),
                                 T(1e-3), inf, -inf, nan, T(1e30), Lim<T>::denorm_min()};
    for (T a : vals) {
        for (T b : vals) {
            INFO("pow(", a, ", ", b, ")");
            const T expect = std::pow(a, b);
            const T got = ks::pow(ks::splat(a), ks::splat(b)).get(0);
            // f32 batches compute in double: same specials, same sign, within 0.5 ULP + 1e-14
            CHECK(ulp_error<T>(got, std::pow((long double)a, (long double)b)) <= 0.51);
            if (!std::isnan(expect)) CHECK(std::signbit(got) == std::signbit(expect));
            CHECK(same(ks::pow(a, b), expect));
        }
    }
    // accuracy over a grid of bases and exponents, negative bases with integral exponents included
    double worst = 0;
    constexpr std::size_t w = ks::width<T>;
    alignas(64) T xs[w], ys[w], out[w];
    std::size_t k = 0;
    for (int i = -300; i <= 300; ++i) {
        for (int j = -60; j <= 60; ++j) {
            xs[k] = T(i) * T(0.37);
            ys[k] = (i % 2 == 0) ? T(j) * T(0.55) : T(j);
            if (++k < w) continue;
            ks::store_aligned(out, ks::pow(ks::load_aligned(xs), ks::load_aligned(ys)));
            for (k = 0; k < w; ++k) {
                const long double ref = std::pow((long double)xs[k], (long double)ys[k]);
                worst = std::max(worst, ulp_error<T>(out[k], ref));
                worst = std::max(worst, ulp_error<T>(ks::pow(xs[k], ys[k]), ref));
            }
            k = 0;
        }
    }
    CHECK(worst <= 1.0);
    CHECK(ks::pow(nan, T(0)) == T(1));
    CHECK(ks::pow(T(1), nan) == T(1));
    CHECK(ks::pow(T(-2), T(3)) == T(-8));
    CHECK(std::isnan(ks::pow(T(-2), T(0.5))));
}

TEST_CASE_TEMPLATE("simd pow for integers wraps; negative exponents give 0 unless the base is +-1", T, std::int32_t,
                   std::int64_t) {
    const auto expected = [](T a, T e) -> T {
        if (e < 0) return a == 1 ? T(1) : a == -1 ? (e % 2 != 0 ? T(-1) : T(1)) : T(0);
        using U = std::make_unsigned_t<T>;
        U r = 1;
        for (T i = 0; i < e; ++i) r = static_cast<U>(r * static_cast<U>(a));
        return static_cast<T>(r);
    };
    const std::vector<T> bases = {0, 1, -1, 2, -2, 3, -3, 7, 10, Lim<T>::max(), Lim<T>::min()};
    const std::vector<T> exps = {0, 1, 2, 3, 5, 10, 31, 40, 63, 64, 100, -1, -2, -3, Lim<T>::min()};
    for (T a : bases) {
        for (T e : exps) {
            INFO("pow(", a, ", ", e, ")");
            const T want = e == Lim<T>::min() ? expected(a, T(-2)) : expected(a, e);
            CHECK(ks::pow(a, e) == want);
            CHECK(ks::pow(ks::splat(a), ks::splat(e)).get(0) == want);
        }
    }
    CHECK(ks::pow(T(2), T(10)) == T(1024));
    CHECK(ks::pow(T(-3), T(3)) == T(-27));
    CHECK(ks::pow(T(-1), T(-3)) == T(-1));
    CHECK(ks::pow(T(5), T(-1)) == T(0));
}

// ====================================================================== semantics for every compute type

namespace {

template <class T> std::vector<T> semantic_values() {
    if constexpr (std::is_floating_point_v<T>) {
        return {T(0), T(-0.0), T(1), T(-1), T(2.5), T(-2.5), T(1e30), Lim<T>::infinity(), -Lim<T>::infinity(),
                Lim<T>::quiet_NaN(), -Lim<T>::quiet_NaN(), Lim<T>::denorm_min(), T(-7)};
    } else {
        return {T(0), T(1), T(-1), T(2), T(-2), T(100), Lim<T>::max(), Lim<T>::min(), T(-7)};
    }
}

/// Every (a, b) pair through the batch path (lanes filled with consecutive pairs) and the scalar
/// path; both must equal want(a, b).
template <class T, class F, class W> void check_binary(const char* what, F f, W want) {
    constexpr std::size_t w = ks::width<T>;
    const auto vals = semantic_values<T>();
    const std::string name(what);
    std::vector<std::pair<T, T>> pairs;
    for (T a : vals)
        for (T b : vals) pairs.emplace_back(a, b);
    alignas(64) T la[w], lb[w], out[w];
    for (std::size_t i = 0; i < pairs.size(); i += w) {
        for (std::size_t k = 0; k < w; ++k) std::tie(la[k], lb[k]) = pairs[std::min(i + k, pairs.size() - 1)];
        ks::store_aligned(out, f(ks::load_aligned(la), ks::load_aligned(lb)));
        for (std::size_t k = 0; k < w; ++k) {
            const T expect = want(la[k], lb[k]);
            INFO(name, "(", la[k], ", ", lb[k], "): batch ", out[k], ", scalar ", f(la[k], lb[k]), ", want ", expect);
            CHECK(same(out[k], expect));
            CHECK(same(f(la[k], lb[k]), expect));
        }
    }
}

template <class T, class F, class W> void check_unary(const char* what, F f, W want) {
    const std::string name(what);
    for (T a : semantic_values<T>()) {
        const T expect = want(a);
        INFO(name, "(", a, "): batch ", f(ks::splat(a)).get(0), ", scalar ", f(a), ", want ", expect);
        CHECK(same(f(ks::splat(a)).get(0), expect));
        CHECK(same(f(a), expect));
    }
}

template <class T> bool is_nan(T v) {
    if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
    else return false;
}

}  // namespace

TEST_CASE_TEMPLATE("simd load, store, splat, width", T, float, double, std::int32_t, std::int64_t) {
    constexpr std::size_t w = ks::width<T>;
    static_assert(w == ks::Batch<T>::size && w >= 1);
    alignas(64) T src[w + 1], dst[w + 1];
    for (std::size_t i = 0; i <= w; ++i) src[i] = static_cast<T>(i + 1), dst[i] = T(0);
    ks::store(dst + 1, ks::load(src + 1));  // unaligned
    for (std::size_t i = 1; i <= w; ++i) CHECK(dst[i] == src[i]);
    ks::store_aligned(dst, ks::load_aligned(src));
    for (std::size_t i = 0; i < w; ++i) CHECK(dst[i] == src[i]);
    ks::store_aligned(dst, ks::splat(T(42)));
    for (std::size_t i = 0; i < w; ++i) CHECK(dst[i] == T(42));
}

TEST_CASE_TEMPLATE("simd neg, abs, sign, relu", T, float, double, std::int32_t, std::int64_t) {
    using U = std::make_unsigned_t<std::conditional_t<std::is_integral_v<T>, T, int>>;
    check_unary<T>("neg", neg_fn, [](T a) -> T {
        if constexpr (std::is_integral_v<T>) return static_cast<T>(U(0) - static_cast<U>(a));
        else return -a;
    });
    check_unary<T>("abs", abs_fn, [](T a) -> T {
        if constexpr (std::is_integral_v<T>) return a < 0 ? static_cast<T>(U(0) - static_cast<U>(a)) : a;
        else return std::fabs(a);
    });
    check_unary<T>("sign", sign_fn, [](T a) -> T {
        if (is_nan(a)) return a;
        return a > 0 ? T(1) : a < 0 ? T(-1) : a;
    });
    // relu(-0) may come back as +0 or -0 (compilers fold MAXPS on constants either way)
    check_unary<T>("relu", [](auto v) { return relu_fn(v) + decltype(v)(T(0)); },
                   [](T a) -> T { return a < T(0) ? T(0) : a + T(0); });
    if constexpr (std::is_integral_v<T>) {
        CHECK(ks::neg(Lim<T>::min()) == Lim<T>::min());
        CHECK(ks::abs(Lim<T>::min()) == Lim<T>::min());
    } else {
        CHECK(std::isnan(ks::relu(Lim<T>::quiet_NaN())));
        CHECK(std::isnan(ks::sign(ks::splat(Lim<T>::quiet_NaN())).get(0)));
    }
}

TEST_CASE_TEMPLATE("simd min, max propagate NaN from either side", T, float, double, std::int32_t, std::int64_t) {
    check_binary<T>("max", max_fn, [](T a, T b) -> T {
        if (is_nan(a)) return a;
        if (is_nan(b)) return b;
        return a > b ? a : b;
    });
    check_binary<T>("min", min_fn, [](T a, T b) -> T {
        if (is_nan(a)) return a;
        if (is_nan(b)) return b;
        return a < b ? a : b;
    });
    if constexpr (std::is_floating_point_v<T>) {
        const T nan = Lim<T>::quiet_NaN();
        CHECK(std::isnan(ks::max(nan, T(1))));
        CHECK(std::isnan(ks::max(T(1), nan)));
        CHECK(std::isnan(ks::min(ks::splat(nan), ks::splat(T(1))).get(0)));
        CHECK(std::isnan(ks::min(ks::splat(T(1)), ks::splat(nan)).get(0)));
    }
}

TEST_CASE_TEMPLATE("simd comparisons give T(1) / T(0), NaN compares false except ne", T, float, double, std::int32_t,
                   std::int64_t) {
    const auto b = [](bool v) { return v ? T(1) : T(0); };
    check_binary<T>("eq", eq_fn, [&](T x, T y) { return b(x == y); });
    check_binary<T>("ne", ne_fn, [&](T x, T y) { return b(x != y); });
    check_binary<T>("lt", lt_fn, [&](T x, T y) { return b(x < y); });
    check_binary<T>("le", le_fn, [&](T x, T y) { return b(x <= y); });
    check_binary<T>("gt", gt_fn, [&](T x, T y) { return b(x > y); });
    check_binary<T>("ge", ge_fn, [&](T x, T y) { return b(x >= y); });
    if constexpr (std::is_floating_point_v<T>) {
        const auto nan = ks::splat(Lim<T>::quiet_NaN());
        CHECK(ks::ne(nan, nan).get(0) == T(1));
        CHECK(ks::eq(nan, nan).get(0) == T(0));
        CHECK(ks::ne(nan, ks::splat(T(0))).get(0) == T(1));
        CHECK(ks::eq(T(0), T(-0.0)) == T(1));
    }
}

TEST_CASE_TEMPLATE("simd select and logical ops read nonzero (NaN too) as true", T, float, double, std::int32_t,
                   std::int64_t) {
    const auto b = [](bool v) { return v ? T(1) : T(0); };
    const auto truthy = [](T v) { return v != T(0); };  // NaN != 0 is true
    check_binary<T>("logical_and", logical_and_fn, [&](T x, T y) { return b(truthy(x) && truthy(y)); });
    check_binary<T>("logical_or", logical_or_fn, [&](T x, T y) { return b(truthy(x) || truthy(y)); });
    check_unary<T>("logical_not", logical_not_fn, [&](T x) { return b(!truthy(x)); });
    // select(c, a, b) with a = 11, b = 22 for every c
    check_unary<T>("select", [](auto c) { return ks::select(c, decltype(c)(T(11)), decltype(c)(T(22))); },
                   [&](T c) { return truthy(c) ? T(11) : T(22); });
    if constexpr (std::is_floating_point_v<T>) {
        const T nan = Lim<T>::quiet_NaN();
        CHECK(ks::select(nan, T(1), T(2)) == T(1));
        CHECK(ks::select(ks::splat(T(-0.0)), ks::splat(T(1)), ks::splat(T(2))).get(0) == T(2));
        CHECK(ks::logical_not(ks::splat(nan)).get(0) == T(0));
    }
}
