// Core layer: dtypes and promotion, half/bfloat16, shapes and strides, every view, copies and
// conversions, factories and random numbers, element access, printing, and the host allocator.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <source_location>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

std::string dn(DType d) { return std::string(kiln::dtype_name(d)); }

/// A (2, 3, 4) int64 tensor whose element (i, j, k) is 100 + 12i + 4j + k: no zeros, all distinct.
Tensor base234() { return kiln::arange(100, 124, 1, DType::i64).view({2, 3, 4}); }
std::int64_t base_value(std::int64_t i, std::int64_t j, std::int64_t k) { return 100 + 12 * i + 4 * j + k; }

/// Multi-index of row-major flat index `flat` in shape s.
std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& s) {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
    for (int d = s.rank() - 1; d >= 0; --d) {
        idx[static_cast<std::size_t>(d)] = flat % s[d];
        flat /= s[d];
    }
    return idx;
}

/// Checks every element of t (in logical row-major order) against expected(multi-index).
void check_values(const Tensor& t, const std::function<double(const std::vector<std::int64_t>&)>& expected) {
    for (std::int64_t f = 0; f < t.numel(); ++f) {
        const auto idx = unravel(f, t.shape());
        INFO("flat index " << f << " of shape " << t.shape().str());
        CHECK(t.item<double>(f) == expected(idx));
    }
}

/// Element at a multi-index through the tensor's own strides (independent of item()).
template <class T>
T read_strided(const Tensor& t, const std::vector<std::int64_t>& idx) {
    std::int64_t off = 0;
    for (int d = 0; d < t.rank(); ++d) off += idx[static_cast<std::size_t>(d)] * t.strides()[d];
    T v;
    std::memcpy(&v, static_cast<const char*>(t.data_ptr()) + off * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
    return v;
}

/// Fresh random floats in [-4, 4) away from zero (|x| >= 0.25).
std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.25f, 4.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = (rng() & 1 ? 1.0f : -1.0f) * u(rng);
    return v;
}

Tensor from_vector(const std::vector<float>& v, const Shape& s) {
    Tensor t(s, DType::f32);
    REQUIRE(static_cast<std::int64_t>(v.size()) == t.numel());
    std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
    return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() &&
           std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

/// Restores the thread count a test changed.
struct ThreadCountGuard {
    int saved = kiln::num_threads();
    ~ThreadCountGuard() { kiln::set_num_threads(saved); }
};

}  // namespace

// ============================================================================ dtypes and promotion

TEST_CASE("promote_types follows torch.promote_types for every pair") {
    using enum DType;
    // rows and columns in the order boolean, i32, i64, f16, bf16, f32, f64 (torch's table)
    const DType table[7][7] = {
        {boolean, i32, i64, f16, bf16, f32, f64},
        {i32, i32, i64, f16, bf16, f32, f64},
        {i64, i64, i64, f16, bf16, f32, f64},
        {f16, f16, f16, f16, f32, f32, f64},
        {bf16, bf16, bf16, f32, bf16, f32, f64},
        {f32, f32, f32, f32, f32, f32, f64},
        {f64, f64, f64, f64, f64, f64, f64},
    };
    for (std::size_t a = 0; a < 7; ++a)
        for (std::size_t b = 0; b < 7; ++b) {
            const DType da = kiln::all_dtypes[a], db = kiln::all_dtypes[b];
            INFO(dn(da) << " + " << dn(db));
            CHECK(dn(kiln::promote_types(da, db)) == dn(table[a][b]));
        }
    static_assert(kiln::promote_types(DType::f16, DType::bf16) == DType::f32);
    static_assert(kiln::promote_types(DType::boolean, DType::i32) == DType::i32);
    static_assert(kiln::promote_types(DType::i32, DType::i64) == DType::i64);
    static_assert(kiln::promote_types(DType::i64, DType::f16) == DType::f16);
}

TEST_CASE("dtype names, sizes and categories") {
    const char* names[] = {"bool", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
    const std::size_t sizes[] = {1, 4, 8, 2, 2, 4, 8};
    for (std::size_t i = 0; i < 7; ++i) {
        CHECK(kiln::dtype_name(kiln::all_dtypes[i]) == names[i]);
        CHECK(kiln::dtype_size(kiln::all_dtypes[i]) == sizes[i]);
    }
    CHECK(kiln::dtype_of<kiln::half> == DType::f16);
    CHECK(kiln::dtype_of<kiln::bfloat16> == DType::bf16);
    CHECK(kiln::dtype_of<const double> == DType::f64);
    CHECK(kiln::is_floating(DType::bf16));
    CHECK_FALSE(kiln::is_floating(DType::i64));
    CHECK(kiln::is_integral(DType::i32));
    CHECK_FALSE(kiln::is_integral(DType::boolean));
}

TEST_CASE("result dtypes of tensor/scalar/0-d expressions (torch's result_type)") {
    const Tensor b = kiln::ones({4}, DType::boolean);
    const Tensor i32 = kiln::full({4}, 3, DType::i32);
    const Tensor i64 = kiln::full({4}, 5, DType::i64);
    const Tensor h = kiln::full({4}, 1.5, DType::f16);
    const Tensor bh = kiln::full({4}, 1.5, DType::bf16);
    const Tensor f = kiln::full({4}, 1.5, DType::f32);
    const Tensor d = kiln::full({4}, 1.5, DType::f64);
    const Tensor zd = kiln::full({}, 2.0, DType::f64);  // 0-d tensors
    const Tensor zi = kiln::full({}, 2, DType::i64);
    const Tensor zb = kiln::full({}, true, DType::boolean);

    // C++ numbers take part by category only, like Python scalars
    CHECK(dn((f * 2.0).dtype()) == "float32");
    CHECK(dn((f * 2).dtype()) == "float32");
    CHECK(dn((h * 2.0).dtype()) == "float16");
    CHECK(dn((bh + 2.0f).dtype()) == "bfloat16");
    CHECK(dn((d * 2.0f).dtype()) == "float64");
    CHECK(dn((i32 * 2.5).dtype()) == "float32");
    CHECK(dn((i32 + 2).dtype()) == "int32");
    CHECK(dn((i32 + (std::int64_t{1} << 40)).dtype()) == "int32");
    CHECK(dn((b + 1).dtype()) == "int64");
    CHECK(dn((b + 1.5).dtype()) == "float32");
    CHECK(dn((b + true).dtype()) == "bool");
    CHECK(dn((i64 * true).dtype()) == "int64");
    CHECK(dn((2.0 - i64).dtype()) == "float32");

    // tensors with dims promote among themselves
    CHECK(dn((i32 + i64).dtype()) == "int64");
    CHECK(dn((h + bh).dtype()) == "float32");
    CHECK(dn((i64 + h).dtype()) == "float16");
    CHECK(dn((b + i32).dtype()) == "int32");
    CHECK(dn((f + d).dtype()) == "float64");

    // 0-d tensors only matter when they are of a higher category
    CHECK(dn((f * zd).dtype()) == "float32");
    CHECK(dn((i32 + zi).dtype()) == "int32");
    CHECK(dn((i32 + zd).dtype()) == "float64");
    CHECK(dn((b + zi).dtype()) == "int64");
    CHECK(dn((h + zb).dtype()) == "float16");
    CHECK(dn((zi + 2.5).dtype()) == "float32");
    CHECK(dn((zi + zd).dtype()) == "float64");

    // op rules: true division and float math give the default float; comparisons give bool
    CHECK(dn((i32 / i32).dtype()) == "float32");
    CHECK(dn(kiln::exp(i64).dtype()) == "float32");
    CHECK(dn(kiln::sqrt(h).dtype()) == "float16");
    CHECK(dn((i32 < 2.5).dtype()) == "bool");
    CHECK(dn(kiln::where(b, i32, h).dtype()) == "float16");
    CHECK(dn(kiln::cast(f, DType::bf16).dtype()) == "bfloat16");

    // the evaluated tensors carry the dtype and the right values
    const Tensor r1 = i32 * 2.5;
    CHECK(dn(r1.dtype()) == "float32");
    CHECK(r1.item<float>(3) == 7.5f);
    const Tensor r2 = b + 1;
    CHECK(dn(r2.dtype()) == "int64");
    CHECK(r2.item<std::int64_t>(0) == 2);
    const Tensor r3 = i32 / i32 * 3.5;
    CHECK(dn(r3.dtype()) == "float32");
    CHECK(r3.item<float>(1) == 3.5f);
    const Tensor r4 = h * 2.0;
    CHECK(dn(r4.dtype()) == "float16");
    CHECK(r4.at<kiln::half>({2}).bits == kiln::half(3.0f).bits);
    const Tensor r5 = i32 + zd;
    CHECK(dn(r5.dtype()) == "float64");
    CHECK(r5.item<double>(0) == 5.0);
}

// ============================================================================ half and bfloat16

namespace {

/// Value of half bits b for 0 <= b <= 0x7c00, with 0x7c00 read as 65536 (the next step up).
double half_step_value(std::uint32_t b) { return b == 0x7c00u ? 65536.0 : static_cast<double>(kiln::half::to_float(static_cast<std::uint16_t>(b))); }
/// Value of bfloat16 bits b for 0 <= b <= 0x7f80, with 0x7f80 read as 2^128.
double bf16_step_value(std::uint32_t b) { return b == 0x7f80u ? std::ldexp(1.0, 128) : static_cast<double>(kiln::bfloat16::to_float(static_cast<std::uint16_t>(b))); }

/// Round-to-nearest-even reference by search over the sorted non-negative values of a 16-bit format.
std::uint16_t reference_round(float f, std::uint32_t inf_bits, double (*value)(std::uint32_t)) {
    const std::uint32_t sign = std::signbit(f) ? 0x8000u : 0u;
    const double a = std::fabs(static_cast<double>(f));
    if (a >= value(inf_bits)) return static_cast<std::uint16_t>(sign | inf_bits);
    std::uint32_t lo = 0, hi = inf_bits;  // value(lo) <= a < value(hi)
    while (hi - lo > 1) {
        const std::uint32_t mid = (lo + hi) / 2;
        (value(mid) <= a ? lo : hi) = mid;
    }
    const double dl = a - value(lo), dh = value(hi) - a;
    const std::uint32_t r = dl < dh ? lo : dh < dl ? hi : (lo & 1u ? hi : lo);
    return static_cast<std::uint16_t>(sign | r);
}

}  // namespace

TEST_CASE("half: every non-NaN bit pattern round-trips exactly through float") {
    int checked = 0;
    for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
        const auto h = static_cast<std::uint16_t>(b);
        const float f = kiln::half::to_float(h);
        const bool nan_bits = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
        if (nan_bits) {
            REQUIRE(std::isnan(f));
            REQUIRE(std::isnan(static_cast<float>(kiln::half(f))));  // stays NaN (never becomes inf)
            continue;
        }
        REQUIRE(kiln::half::from_float(f) == h);
        REQUIRE(kiln::half(f).bits == h);
        ++checked;
    }
    CHECK(checked == 65536 - 2 * 1023);
}

TEST_CASE("bfloat16: every non-NaN bit pattern round-trips exactly through float") {
    for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
        const auto h = static_cast<std::uint16_t>(b);
        const float f = kiln::bfloat16::to_float(h);
        CHECK(std::bit_cast<std::uint32_t>(f) == b << 16);  // the top half of a float, exactly
        if ((b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0) {
            REQUIRE(std::isnan(static_cast<float>(kiln::bfloat16(f))));
            continue;
        }
        REQUIRE(kiln::bfloat16::from_float(f) == h);
    }
}

TEST_CASE("half and bfloat16 round to nearest even: every midpoint, its neighbours, random floats") {
    // midpoints between consecutive representable values are exact floats
    for (std::uint32_t b = 0; b < 0x7c00u; ++b) {
        const double lo = half_step_value(b), hi = half_step_value(b + 1);
        const float mid = static_cast<float>((lo + hi) / 2);
        REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
        const std::uint16_t even = static_cast<std::uint16_t>(b & 1u ? b + 1 : b);
        REQUIRE(kiln::half::from_float(mid) == even);
        REQUIRE(kiln::half::from_float(-mid) == (even | 0x8000u));
        REQUIRE(kiln::half::from_float(std::nextafter(mid, 0.0f)) == b);
        REQUIRE(kiln::half::from_float(std::nextafter(mid, INFINITY)) == b + 1);
    }
    for (std::uint32_t b = 0; b < 0x7f80u; ++b) {
        const double lo = bf16_step_value(b), hi = bf16_step_value(b + 1);
        const float mid = static_cast<float>((lo + hi) / 2);
        REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
        const std::uint16_t even = static_cast<std::uint16_t>(b & 1u ? b + 1 : b);
        REQUIRE(kiln::bfloat16::from_float(mid) == even);
        REQUIRE(kiln::bfloat16::from_float(-mid) == (even | 0x8000u));
        REQUIRE(kiln::bfloat16::from_float(std::nextafter(mid, 0.0f)) == b);
        REQUIRE(kiln::bfloat16::from_float(std::nextafter(mid, INFINITY)) == b + 1);
    }
    // random bit patterns cover every exponent, float subnormals and overflow
    std::mt19937 rng(std::random_device{}());
    for (int n = 0; n < 200000; ++n) {
        const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
        if (std::isnan(f)) continue;
        INFO("float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(f));
        REQUIRE(kiln::half::from_float(f) == reference_round(f, 0x7c00u, half_step_value));
        REQUIRE(kiln::bfloat16::from_float(f) == reference_round(f, 0x7f80u, bf16_step_value));
    }
}

TEST_CASE("half and bfloat16: inf, nan, signed zero, subnormals and overflow") {
    using kiln::bfloat16;
    using kiln::half;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(half(inf).bits == 0x7c00);
    CHECK(half(-inf).bits == 0xfc00);
    CHECK(std::isnan(static_cast<float>(half(nan))));
    CHECK(std::isnan(static_cast<float>(half(std::bit_cast<float>(0x7f800001u)))));  // low payload bits only
    CHECK(half(-0.0f).bits == 0x8000);
    CHECK(half(65504.0f).bits == 0x7bff);
    CHECK(half(65519.99f).bits == 0x7bff);
    CHECK(half(65520.0f).bits == 0x7c00);  // the midpoint to the next step rounds (to even) to inf
    CHECK(half(1e9f).bits == 0x7c00);
    CHECK(half::to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
    CHECK(half::to_float(0x03ff) == 1023 * std::ldexp(1.0f, -24));  // largest subnormal
    CHECK(half::to_float(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
    CHECK(half(std::ldexp(1.0f, -25)).bits == 0x0000);  // tie between 0 and the smallest subnormal: even
    CHECK(half(std::ldexp(1.5f, -25)).bits == 0x0001);
    CHECK(half(-std::ldexp(1.0f, -26)).bits == 0x8000);  // underflow keeps the sign
    CHECK(half(std::ldexp(3.0f, -25)).bits == 0x0002);  // 1.5 subnormal steps: tie to even (2)
    CHECK(half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie below: to even 1.0
    CHECK(half(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);  // tie above: to even

    CHECK(bfloat16(inf).bits == 0x7f80);
    CHECK(bfloat16(-inf).bits == 0xff80);
    CHECK(std::isnan(static_cast<float>(bfloat16(nan))));
    CHECK(std::isnan(static_cast<float>(bfloat16(std::bit_cast<float>(0x7f800001u)))));
    CHECK(bfloat16(-0.0f).bits == 0x8000);
    CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up to inf
    CHECK(bfloat16(std::bit_cast<float>(0x00010000u)).bits == 0x0001);  // float subnormal, exact
    CHECK(bfloat16(std::bit_cast<float>(0x00018000u)).bits == 0x0002);  // tie: to even
    CHECK(bfloat16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80);  // 1 + half a step: to even 1.0
    CHECK(bfloat16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82);
    CHECK(static_cast<float>(bfloat16(3.140625f)) == 3.140625f);
}

// ============================================================================ shapes and strides

TEST_CASE("Shape::str formats like a Python tuple; contiguous strides") {
    CHECK(Shape{}.str() == "()");
    CHECK(Shape{5}.str() == "(5,)");
    CHECK(Shape{3, 4}.str() == "(3, 4)");
    CHECK(Shape{0, 7, 1}.str() == "(0, 7, 1)");
    CHECK(Shape{}.numel() == 1);
    CHECK(Shape{3, 0, 2}.numel() == 0);
    CHECK(Shape{1, 2, 3, 4, 5, 6, 7, 8}.rank() == 8);
    CHECK(kiln::contiguous_strides({2, 3, 4}).str() == "(12, 4, 1)");
    CHECK(kiln::contiguous_strides({7}).str() == "(1,)");
    CHECK(kiln::contiguous_strides({}).str() == "()");
    CHECK(kiln::contiguous_strides({2, 0, 3}).str() == "(3, 3, 1)");  // torch's strides for a zero dim
    const Tensor t(Shape{2, 3, 4}, DType::f64);
    CHECK(t.strides().str() == "(12, 4, 1)");
    CHECK(t.is_contiguous());
    CHECK(t.numel() == 24);
    CHECK(t.nbytes() == 24 * 8);
    CHECK(t.size(-1) == 4);
    CHECK(t.stride(0) == 12);
    CHECK(kiln::is_contiguous({3, 1, 4}, {4, 99, 1}));  // size-1 dims do not matter
    CHECK_FALSE(kiln::is_contiguous({3, 4}, {1, 3}));
}

TEST_CASE("shape size limits: element count, byte count and strides must fit in int64, with no overflow on the way") {
    const auto here = std::source_location::current();
    auto accepts = [&](const Shape& s, std::size_t element_size) {
        try {
            kiln::detail::check_shape(s, element_size, "test", here);
            return true;
        } catch (const kiln::ShapeError&) {
            return false;
        }
    };
    const std::int64_t g = std::int64_t{1} << 31, big = std::int64_t{1} << 40;
    CHECK(accepts({g, g}, 1));               // 2^62 one-byte elements fit
    CHECK_FALSE(accepts({g, g}, 2));         // 2^63 bytes do not
    CHECK(accepts({g, g / 2}, 2));           // 2^62 bytes do
    CHECK_FALSE(accepts({2 * g, g}, 1));     // 2^63 elements do not
    CHECK(accepts({big, 1 << 20, 0}, 4));    // zero elements, strides up to 2^60
    CHECK_FALSE(accepts({big, big, 0}, 4));  // zero elements, but its first stride would be 2^80
    CHECK_FALSE(accepts({3, -1}, 4));
    CHECK(accepts({}, 8));
    CHECK(accepts({0}, 8));
    CHECK(accepts({std::numeric_limits<std::int64_t>::max()}, 1));
    CHECK_FALSE(accepts({std::numeric_limits<std::int64_t>::max()}, 2));
    // Shape::numel of a shape no check has seen: ShapeError, not a wrapped count
    CHECK(Shape{g, g}.numel() == std::int64_t{1} << 62);
    CHECK_THROWS_AS((void)Shape({big, big}).numel(), kiln::ShapeError);
    CHECK(Shape({big, big, 0}).numel() == 0);
    CHECK(Shape({0, big, big}).numel() == 0);
    // strides of the largest shapes
    CHECK(kiln::contiguous_strides({g, g}).str() == "(2147483648, 1)");
    CHECK(kiln::contiguous_strides({2, g, g}).str() == "(4611686018427387904, 2147483648, 1)");
    // a view of an existing tensor whose element count is near the limit (expand allocates nothing)
    const Tensor one = kiln::ones({1, 1}, DType::boolean);
    const Tensor wide = one.expand({g, g});
    CHECK(wide.numel() == std::int64_t{1} << 62);
    CHECK(wide.nbytes() == std::size_t{1} << 62);
    CHECK(wide.strides().str() == "(0, 0)");
    CHECK(wide.at<bool>({g - 1, g - 1}));
}

// ============================================================================ views

TEST_CASE("view: new shapes over the same storage, -1 inferred, values and writes") {
    const Tensor base = base234();
    CHECK(base.strides().str() == "(12, 4, 1)");
    const Tensor v = base.view({6, 4});
    CHECK(v.shape().str() == "(6, 4)");
    CHECK(v.storage() == base.storage());
    check_values(v, [](const auto& ix) { return 100.0 + 4 * ix[0] + ix[1]; });
    const Tensor w = base.view({-1, 8});
    CHECK(w.shape().str() == "(3, 8)");
    CHECK(w.strides().str() == "(8, 1)");
    v.at<std::int64_t>({4, 3}) = -7;  // flat 19 = (1, 1, 3)
    CHECK(base.at<std::int64_t>({1, 1, 3}) == -7);
    CHECK(w.at<std::int64_t>({2, 3}) == -7);
    const Tensor r = base.reshape({4, 6});  // contiguous: reshape is a view
    CHECK(r.storage() == base.storage());
    CHECK(r.at<std::int64_t>({3, 1}) == -7);
    const Tensor f = base.flatten();
    CHECK(f.shape().str() == "(24,)");
    CHECK(f.storage() == base.storage());
    CHECK(f.at<std::int64_t>({23}) == 123);
    // a view of a slice whose merged dims are still contiguous
    const Tensor s = base234().slice(1, 1, 3);  // (2, 2, 4), strides (12, 4, 1)
    const Tensor sv = s.view({2, 8});
    CHECK(sv.strides().str() == "(12, 1)");
    check_values(sv, [](const auto& ix) { return static_cast<double>(base_value(ix[0], 1 + ix[1] / 4, ix[1] % 4)); });
    CHECK_THROWS_AS((void)s.view({16}), kiln::ShapeError);
}

TEST_CASE("view() refuses a non-contiguous layout; reshape() copies it") {
    const Tensor base = base234();
    const Tensor p = base.permute({2, 0, 1});  // (4, 2, 3)
    CHECK_THROWS_AS((void)p.view({24}), kiln::ShapeError);
    CHECK_THROWS_AS((void)p.view({8, 3}), kiln::ShapeError);  // dims 0 and 1 (strides 1, 12) do not merge
    CHECK_NOTHROW((void)p.view({4, 2, 3, 1}));  // adding a unit dim needs no copy
    const Tensor v = p.view({4, 6});  // dims 1 and 2 (strides 12, 4) do merge: a view
    CHECK(v.storage() == base.storage());
    CHECK(v.strides().str() == "(1, 4)");
    check_values(v, [](const auto& ix) { return static_cast<double>(base_value(ix[1] / 3, ix[1] % 3, ix[0])); });
    const Tensor r = p.reshape({8, 3});
    CHECK(r.storage() != base.storage());
    CHECK(r.is_contiguous());
    check_values(r, [](const auto& ix) { return static_cast<double>(base_value(ix[0] % 2, ix[1], ix[0] / 2)); });
    CHECK(p.reshape({4, 6}).storage() == base.storage());  // reshape copies only when it must
    const Tensor fl = base.transpose(0, 2).flatten();
    CHECK(fl.storage() != base.storage());
    check_values(fl, [](const auto& ix) {
        const std::int64_t f = ix[0];  // transposed shape (4, 3, 2): f = 6k + 2j + i
        return static_cast<double>(base_value(f % 2, f / 2 % 3, f / 6));
    });
}

TEST_CASE("permute, transpose and t(): strides swap, storage shared") {
    const Tensor base = base234();
    const Tensor p = base.permute({2, 0, 1});
    CHECK(p.shape().str() == "(4, 2, 3)");
    CHECK(p.strides().str() == "(1, 12, 4)");
    CHECK(p.storage() == base.storage());
    CHECK_FALSE(p.is_contiguous());
    check_values(p, [](const auto& ix) { return static_cast<double>(base_value(ix[1], ix[2], ix[0])); });
    const Tensor pn = base.permute({-1, 0, -2});  // negative dims count from the end
    CHECK(pn.shape().str() == "(4, 2, 3)");
    const Tensor tr = base.transpose(0, -1);
    CHECK(tr.shape().str() == "(4, 3, 2)");
    CHECK(tr.strides().str() == "(1, 4, 12)");
    check_values(tr, [](const auto& ix) { return static_cast<double>(base_value(ix[2], ix[1], ix[0])); });
    tr.at<std::int64_t>({3, 2, 1}) = -1;
    CHECK(base.at<std::int64_t>({1, 2, 3}) == -1);

    const Tensor m = kiln::arange(10, 22, 1, DType::i64).view({3, 4});
    const Tensor mt = m.t();
    CHECK(mt.shape().str() == "(4, 3)");
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 4; ++j) CHECK(mt.at<std::int64_t>({j, i}) == 10 + 4 * i + j);
    CHECK(mt.t().is_same(m));
    const Tensor vec = kiln::arange(5, DType::i64);
    CHECK(vec.t().is_same(vec));  // 1-D: unchanged
    CHECK_THROWS_AS((void)base.t(), kiln::ShapeError);
    CHECK_THROWS_AS((void)base.permute({0, 0, 1}), kiln::ShapeError);
    CHECK_THROWS_AS((void)base.permute({0, 1}), kiln::ShapeError);
}

TEST_CASE("slice: Python semantics with negative bounds, clamping, steps; a view") {
    const Tensor base = base234();
    const Tensor s = base.slice(2, 1, 4, 2);  // k = 1, 3
    CHECK(s.shape().str() == "(2, 3, 2)");
    CHECK(s.strides().str() == "(12, 4, 2)");
    CHECK(s.storage() == base.storage());
    check_values(s, [](const auto& ix) { return static_cast<double>(base_value(ix[0], ix[1], 1 + 2 * ix[2])); });
    const Tensor neg = base.slice(-1, -3, -1);  // k = 1, 2
    CHECK(neg.shape().str() == "(2, 3, 2)");
    check_values(neg, [](const auto& ix) { return static_cast<double>(base_value(ix[0], ix[1], 1 + ix[2])); });
    const Tensor every3 = base.slice(2, 0, 4, 3);  // k = 0, 3
    CHECK(every3.shape()[2] == 2);
    CHECK(every3.at<std::int64_t>({1, 2, 1}) == base_value(1, 2, 3));
    const Tensor clamped = base.slice(1, -100, 100);
    CHECK(clamped.shape().str() == "(2, 3, 4)");
    CHECK(clamped.is_same(base));
    const Tensor mid = base.slice(1, 1, 2);
    CHECK(mid.offset() == 4);
    CHECK(mid.at<std::int64_t>({1, 0, 2}) == base_value(1, 1, 2));
    CHECK(base.slice(1, 2, 1).shape().str() == "(2, 0, 4)");  // empty, never negative
    CHECK(base.slice(0, 5, 9).numel() == 0);
    // slices of slices compose
    const Tensor ss = base.slice(2, 1, 4).slice(2, 1, 3, 1).slice(1, -2, 3, 2);  // k = 2, 3; j = 1
    CHECK(ss.shape().str() == "(2, 1, 2)");
    check_values(ss, [](const auto& ix) { return static_cast<double>(base_value(ix[0], 1, 2 + ix[2])); });
    s.at<std::int64_t>({1, 0, 1}) = -5;
    CHECK(base.at<std::int64_t>({1, 0, 3}) == -5);
    CHECK_THROWS_AS((void)base.slice(0, 0, 2, 0), kiln::ValueError);
    CHECK_THROWS_AS((void)base.slice(0, 0, 2, -1), kiln::ValueError);
    CHECK_THROWS_AS((void)base.slice(3, 0, 1), kiln::ShapeError);
}

TEST_CASE("select drops an axis; negative indices count from the end") {
    const Tensor base = base234();
    const Tensor s = base.select(1, -1);
    CHECK(s.shape().str() == "(2, 4)");
    CHECK(s.storage() == base.storage());
    check_values(s, [](const auto& ix) { return static_cast<double>(base_value(ix[0], 2, ix[1])); });
    const Tensor s0 = base.select(0, 1).select(-1, 0);
    CHECK(s0.shape().str() == "(3,)");
    check_values(s0, [](const auto& ix) { return static_cast<double>(base_value(1, ix[0], 0)); });
    const Tensor scalar = s0.select(0, 2);
    CHECK(scalar.rank() == 0);
    CHECK(scalar.item<std::int64_t>() == base_value(1, 2, 0));
    CHECK_THROWS_AS((void)base.select(1, 3), kiln::ValueError);
    CHECK_THROWS_AS((void)base.select(1, -4), kiln::ValueError);
    CHECK_THROWS_AS((void)scalar.select(0, 0), kiln::ShapeError);
}

TEST_CASE("expand and broadcast_to: stride 0 on broadcast dims, -1 keeps a dim, storage shared") {
    const Tensor col = kiln::arange(7, 10, 1, DType::i64).view({3, 1});
    const Tensor e = col.expand({3, 4});
    CHECK(e.shape().str() == "(3, 4)");
    CHECK(e.strides().str() == "(1, 0)");
    CHECK(e.storage() == col.storage());
    check_values(e, [](const auto& ix) { return 7.0 + static_cast<double>(ix[0]); });
    const Tensor e2 = col.expand({-1, 5});
    CHECK(e2.shape().str() == "(3, 5)");
    CHECK(e2.strides()[1] == 0);
    const Tensor e3 = col.broadcast_to({2, 3, 4});
    CHECK(e3.shape().str() == "(2, 3, 4)");
    CHECK(e3.strides().str() == "(0, 1, 0)");
    check_values(e3, [](const auto& ix) { return 7.0 + static_cast<double>(ix[1]); });
    e.at<std::int64_t>({1, 3}) = 42;  // every broadcast copy is the same element
    CHECK(col.at<std::int64_t>({1, 0}) == 42);
    CHECK(e3.at<std::int64_t>({1, 1, 0}) == 42);
    // a materialized broadcast: contiguous() copies the repeated values
    const Tensor c = e3.contiguous();
    CHECK(c.is_contiguous());
    CHECK(c.storage() != col.storage());
    check_values(c, [](const auto& ix) { return ix[1] == 1 ? 42.0 : 7.0 + static_cast<double>(ix[1]); });
    CHECK_THROWS_AS((void)col.expand({3, 4}).expand({2, 4}), kiln::ShapeError);
    CHECK_THROWS_AS((void)col.expand({4}), kiln::ShapeError);
    CHECK_THROWS_AS((void)col.expand({-1, 3, 4}), kiln::ShapeError);
}

TEST_CASE("squeeze and unsqueeze") {
    const Tensor t = kiln::arange(1, 13, 1, DType::i64).view({1, 3, 1, 4});
    const Tensor sq = t.squeeze();
    CHECK(sq.shape().str() == "(3, 4)");
    CHECK(sq.strides().str() == "(4, 1)");
    CHECK(sq.storage() == t.storage());
    CHECK(t.squeeze(0).shape().str() == "(3, 1, 4)");
    CHECK(t.squeeze(-2).shape().str() == "(1, 3, 4)");
    CHECK(t.squeeze(1).shape().str() == "(1, 3, 1, 4)");  // not size 1: unchanged, like torch
    const Tensor m = kiln::arange(1, 13, 1, DType::i64).view({3, 4});
    const Tensor u0 = m.unsqueeze(0);
    CHECK(u0.shape().str() == "(1, 3, 4)");
    const Tensor u1 = m.unsqueeze(1);
    CHECK(u1.shape().str() == "(3, 1, 4)");
    const Tensor ue = m.unsqueeze(-1);
    CHECK(ue.shape().str() == "(3, 4, 1)");
    CHECK(m.unsqueeze(2).shape().str() == "(3, 4, 1)");
    check_values(u1, [](const auto& ix) { return 1.0 + static_cast<double>(4 * ix[0] + ix[2]); });
    check_values(ue, [](const auto& ix) { return 1.0 + static_cast<double>(4 * ix[0] + ix[1]); });
    CHECK(u1.is_contiguous());
    CHECK(u1.view({12}).storage() == m.storage());
    // unsqueeze of a transposed view keeps the values
    const Tensor ut = m.t().unsqueeze(1);
    CHECK(ut.shape().str() == "(4, 1, 3)");
    check_values(ut, [](const auto& ix) { return 1.0 + static_cast<double>(4 * ix[2] + ix[0]); });
    CHECK(ut.squeeze().is_same(m.t()));
    const Tensor scalar = kiln::full({}, 5, DType::i64);
    CHECK(scalar.unsqueeze(0).shape().str() == "(1,)");
    CHECK(scalar.squeeze().rank() == 0);
    CHECK_THROWS_AS((void)m.unsqueeze(3), kiln::ShapeError);
}

// ============================================================================ copies and conversions

TEST_CASE("contiguous() of a permuted tensor copies in logical order; of a contiguous one it is a no-op") {
    const Tensor base = base234();
    CHECK(base.contiguous().is_same(base));
    const Tensor p = base.permute({1, 2, 0});  // (3, 4, 2)
    const Tensor c = p.contiguous();
    CHECK(c.is_contiguous());
    CHECK(c.strides().str() == "(8, 2, 1)");
    CHECK(c.storage() != base.storage());
    check_values(c, [](const auto& ix) { return static_cast<double>(base_value(ix[2], ix[0], ix[1])); });
    for (std::int64_t f = 0; f < c.numel(); ++f)  // dense memory in row-major order
        CHECK(c.data<std::int64_t>()[f] == p.item<std::int64_t>(f));
    const Tensor strided = kiln::randn({8, 9}).slice(1, 1, 9, 3);
    const Tensor sc = strided.contiguous();
    for (std::int64_t f = 0; f < sc.numel(); ++f) CHECK(sc.data<float>()[f] == strided.item<float>(f));
}

TEST_CASE("clone is a deep copy, also of strided views") {
    const Tensor a = kiln::randn({5, 6});
    Tensor b = a.clone();
    CHECK(b.storage() != a.storage());
    CHECK(bitwise_equal(a, b));
    const float before = a.at<float>({2, 3});
    b.at<float>({2, 3}) = before + 1.0f;
    CHECK(a.at<float>({2, 3}) == before);
    const Tensor v = a.t().slice(0, 1, 6, 2);  // (3, 5), strided
    const Tensor vc = v.clone();
    CHECK(vc.is_contiguous());
    CHECK(vc.shape().str() == "(3, 5)");
    for (std::int64_t f = 0; f < v.numel(); ++f) CHECK(vc.item<float>(f) == v.item<float>(f));
    a.at<float>({0, 1}) = 1234.5f;
    CHECK(vc.at<float>({0, 0}) != 1234.5f);
}

TEST_CASE("to(dtype): truncation toward zero, nonzero -> true, rounding to half, widening") {
    const Tensor x = from_vector({2.7f, -2.7f, 0.5f, -0.5f, 100.9f, -100.9f, 7.0f, -0.0f}, {8});
    const Tensor xi = x.to(DType::i32);
    CHECK(dn(xi.dtype()) == "int32");
    const std::int32_t want_i[] = {2, -2, 0, 0, 100, -100, 7, 0};
    for (std::int64_t i = 0; i < 8; ++i) CHECK(xi.at<std::int32_t>({i}) == want_i[i]);
    const Tensor xl = x.to(DType::i64);
    for (std::int64_t i = 0; i < 8; ++i) CHECK(xl.at<std::int64_t>({i}) == want_i[i]);

    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const Tensor y = from_vector({0.0f, 0.5f, -3.0f, -0.0f, nan, inf, 1e-30f, 0.0f}, {8});
    const Tensor yb = y.to(DType::boolean);
    const bool want_b[] = {false, true, true, false, true, true, true, false};
    for (std::int64_t i = 0; i < 8; ++i) CHECK(yb.at<bool>({i}) == want_b[i]);
    const Tensor back = yb.to(DType::f32);
    for (std::int64_t i = 0; i < 8; ++i) CHECK(back.at<float>({i}) == (want_b[i] ? 1.0f : 0.0f));
    const Tensor ib = kiln::arange(-2, 3, 1, DType::i32).to(DType::boolean);  // -2 -1 0 1 2
    CHECK(ib.at<bool>({0}));
    CHECK_FALSE(ib.at<bool>({2}));
    CHECK(ib.at<bool>({4}));

    const auto vals = random_floats(1000, 11);
    const Tensor r = from_vector(vals, {1000});
    const Tensor rh = r.to(DType::f16), rbf = r.to(DType::bf16), rd = r.to(DType::f64);
    for (std::int64_t i = 0; i < 1000; ++i) {
        const float v = vals[static_cast<std::size_t>(i)];
        REQUIRE(rh.at<kiln::half>({i}).bits == kiln::half(v).bits);
        REQUIRE(rbf.at<kiln::bfloat16>({i}).bits == kiln::bfloat16(v).bits);
        REQUIRE(rd.at<double>({i}) == static_cast<double>(v));
    }
    const Tensor h2f = rh.to(DType::f32);
    for (std::int64_t i = 0; i < 1000; ++i) CHECK(h2f.at<float>({i}) == static_cast<float>(rh.at<kiln::half>({i})));
    // large values: f32 -> f16 overflows to inf; i64 -> f64 exact, -> f32 rounds
    CHECK(std::isinf(from_vector({70000.0f}, {1}).to(DType::f16).item<float>()));
    const Tensor big = kiln::full({2}, static_cast<double>((std::int64_t{1} << 40) + 1), DType::i64);
    CHECK(big.item<std::int64_t>(0) == (std::int64_t{1} << 40) + 1);
    CHECK(big.to(DType::f64).item<double>(1) == 1099511627777.0);
    CHECK(big.to(DType::f32).item<float>(1) == static_cast<float>(1099511627777.0));
    // a strided view converts in logical order; to() of the same dtype returns the same tensor
    const Tensor tv = r.view({20, 50}).t().to(DType::f64);
    CHECK(tv.shape().str() == "(50, 20)");
    CHECK(tv.at<double>({7, 3}) == static_cast<double>(vals[3 * 50 + 7]));
    CHECK(r.to(DType::f32).is_same(r));
}

TEST_CASE("fill_ sets every element of a tensor or of a strided view, converting the value") {
    Tensor m = kiln::full({4, 5}, 2.5);
    for (std::int64_t f = 0; f < m.numel(); ++f) REQUIRE(m.item<float>(f) == 2.5f);
    m.select(1, 2).fill_(-9.25);  // one column
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 5; ++j) CHECK(m.at<float>({i, j}) == (j == 2 ? -9.25f : 2.5f));
    m.slice(0, 1, 4, 2).slice(1, 0, 5, 4).fill_(7);  // rows 1, 3; cols 0, 4
    CHECK(m.at<float>({1, 0}) == 7.0f);
    CHECK(m.at<float>({3, 4}) == 7.0f);
    CHECK(m.at<float>({2, 0}) == 2.5f);
    CHECK(m.at<float>({1, 2}) == -9.25f);
    Tensor i = kiln::zeros({3}, DType::i32);
    i.fill_(3.99);
    CHECK(i.at<std::int32_t>({1}) == 3);
    Tensor b = kiln::zeros({3}, DType::boolean);
    b.fill_(0.25);
    CHECK(b.at<bool>({2}));
    Tensor h = kiln::zeros({100000}, DType::f16);  // large enough to run on several threads
    h.fill_(0.1);
    for (std::int64_t f = 0; f < h.numel(); f += 997) REQUIRE(h.at<kiln::half>({f}).bits == kiln::half(0.1f).bits);
    CHECK(h.at<kiln::half>({99999}).bits == kiln::half(0.1f).bits);
}

// ============================================================================ factories

TEST_CASE("arange: counts, negative steps, fractional steps, dtypes") {
    const Tensor a = kiln::arange(0, 10, 3);
    CHECK(a.shape().str() == "(4,)");
    check_values(a, [](const auto& ix) { return 3.0 * static_cast<double>(ix[0]); });
    const Tensor d = kiln::arange(10, 0, -3, DType::i32);
    CHECK(dn(d.dtype()) == "int32");
    CHECK(d.numel() == 4);
    check_values(d, [](const auto& ix) { return 10.0 - 3.0 * static_cast<double>(ix[0]); });
    CHECK(kiln::arange(0, 1, 0.1).numel() == 10);
    CHECK(kiln::arange(-3, 3).numel() == 6);
    CHECK(kiln::arange(5, 5).numel() == 0);
    CHECK(kiln::arange(1, 0, -0.25, DType::f64).numel() == 4);
    const Tensor f = kiln::arange(1.5, 4.0, 0.5, DType::f64);
    check_values(f, [](const auto& ix) { return 1.5 + 0.5 * static_cast<double>(ix[0]); });
    const Tensor n = kiln::arange(6);
    CHECK(dn(n.dtype()) == "int64");
    check_values(n, [](const auto& ix) { return static_cast<double>(ix[0]); });
    CHECK_THROWS_AS((void)kiln::arange(0, 10, -1), kiln::ValueError);
    CHECK_THROWS_AS((void)kiln::arange(0, 10, 0), kiln::ValueError);
    CHECK_THROWS_AS((void)kiln::arange(0, INFINITY, 1), kiln::ValueError);
}

TEST_CASE("linspace: exact endpoints, even spacing, 1 and 0 steps") {
    const Tensor a = kiln::linspace(0, 1, 5);
    check_values(a, [](const auto& ix) { return 0.25 * static_cast<double>(ix[0]); });
    const Tensor b = kiln::linspace(-1.3, 2.7, 7, DType::f64);
    CHECK(b.item<double>(0) == -1.3);
    CHECK(b.item<double>(6) == 2.7);
    for (std::int64_t i = 1; i < 6; ++i) CHECK(b.item<double>(i) == doctest::Approx(-1.3 + 4.0 * static_cast<double>(i) / 6).epsilon(1e-14));
    const Tensor c = kiln::linspace(0.1, 0.7, 1000);  // f32: both ends exactly the float of the bound
    CHECK(c.item<float>(0) == 0.1f);
    CHECK(c.item<float>(999) == 0.7f);
    for (std::int64_t i = 1; i < 1000; ++i) REQUIRE(c.item<float>(i) > c.item<float>(i - 1));
    const Tensor desc = kiln::linspace(5, -5, 11, DType::i64);
    check_values(desc, [](const auto& ix) { return 5.0 - static_cast<double>(ix[0]); });
    const Tensor one = kiln::linspace(3.5, 9, 1);
    CHECK(one.numel() == 1);
    CHECK(one.item<float>() == 3.5f);
    CHECK(kiln::linspace(0, 1, 0).numel() == 0);
    CHECK_THROWS_AS((void)kiln::linspace(0, 1, -1), kiln::ValueError);
}

TEST_CASE("zeros, ones, full, empty: shapes, dtypes, values") {
    for (DType d : kiln::all_dtypes) {
        INFO(dn(d));
        const Tensor z = kiln::zeros({3, 5}, d), o = kiln::ones({3, 5}, d), f = kiln::full({2, 2, 2}, 3, d);
        CHECK(z.shape().str() == "(3, 5)");
        CHECK(dn(o.dtype()) == dn(d));
        CHECK(z.is_contiguous());
        for (std::int64_t i = 0; i < 15; ++i) {
            CHECK(z.item<double>(i) == 0.0);
            CHECK(o.item<double>(i) == 1.0);
        }
        for (std::int64_t i = 0; i < 8; ++i) CHECK(f.item<double>(i) == (d == DType::boolean ? 1.0 : 3.0));
    }
    CHECK(kiln::full({4}, -2.75, DType::f64).item<double>(3) == -2.75);
    CHECK(kiln::full({4}, -2.75, DType::bf16).item<float>(3) == -2.75f);
    const Tensor e = kiln::empty({2, 0, 3});
    CHECK(e.numel() == 0);
    CHECK(e.defined());
    CHECK(kiln::full({}, 4.0).rank() == 0);
    CHECK(kiln::full({}, 4.0).item<float>() == 4.0f);
    CHECK_FALSE(Tensor().defined());
}

TEST_CASE("rand: uniform in [0, 1) for every float dtype, mean 1/2 and variance 1/12") {
    const std::int64_t n = 100000;
    const Tensor u = kiln::rand({n});
    double sum = 0, sq = 0, lo = 1, hi = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const double v = u.data<float>()[i];
        REQUIRE(v >= 0.0);
        REQUIRE(v < 1.0);
        sum += v;
        sq += v * v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    // standard errors for n = 1e5: mean 9.1e-4, variance 2.4e-4; tolerances are 5 of them
    CHECK(std::fabs(mean - 0.5) < 0.0046);
    CHECK(std::fabs(var - 1.0 / 12) < 0.0012);
    CHECK(lo < 1e-3);
    CHECK(hi > 0.999);
    for (DType d : {DType::f16, DType::bf16, DType::f64}) {
        INFO(dn(d));
        const Tensor t = kiln::rand({20000}, d);
        CHECK(dn(t.dtype()) == dn(d));
        double s = 0, mx = 0;
        for (std::int64_t i = 0; i < t.numel(); ++i) {
            const double v = t.item<double>(i);
            REQUIRE(v >= 0.0);
            REQUIRE(v < 1.0);  // never rounds up to 1 in the narrow dtypes
            s += v;
            mx = std::max(mx, v);
        }
        CHECK(std::fabs(s / 20000 - 0.5) < 0.013);  // 5 standard errors of 2.0e-3, plus bf16's grid bias of 2e-3
        CHECK(mx > 0.99);
    }
}

TEST_CASE("randn: mean 0, standard deviation 1, the normal's 68% within one sigma") {
    const std::int64_t n = 100000;
    const Tensor x = kiln::randn({n});
    double sum = 0, sq = 0;
    std::int64_t within = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const double v = x.data<float>()[i];
        REQUIRE(std::isfinite(v));
        sum += v;
        sq += v * v;
        within += std::fabs(v) < 1.0;
    }
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    // standard errors for n = 1e5: mean 3.2e-3, sd 2.2e-3, fraction 1.5e-3; tolerances are 5 of them
    CHECK(std::fabs(mean) < 0.016);
    CHECK(std::fabs(sd - 1.0) < 0.011);
    CHECK(std::fabs(static_cast<double>(within) / n - 0.682689) < 0.0074);
    const Tensor xd = kiln::randn({1000}, DType::f64);
    CHECK(dn(xd.dtype()) == "float64");
}

TEST_CASE("randint: integers in [low, high), every value hit, dtypes") {
    const Tensor r = kiln::randint(-3, 4, {20000});
    CHECK(dn(r.dtype()) == "int64");
    std::vector<int> hits(7, 0);
    for (std::int64_t i = 0; i < r.numel(); ++i) {
        const std::int64_t v = r.data<std::int64_t>()[i];
        REQUIRE(v >= -3);
        REQUIRE(v < 4);
        ++hits[static_cast<std::size_t>(v + 3)];
    }
    for (int h : hits) CHECK(std::abs(h - 20000 / 7) < 250);  // 5 binomial sds: sqrt(n p (1 - p)) = 49.5
    const Tensor r32 = kiln::randint(1000, 1002, {64}, DType::i32);
    CHECK(dn(r32.dtype()) == "int32");
    for (std::int64_t i = 0; i < 64; ++i) CHECK((r32.item<std::int32_t>(i) == 1000 || r32.item<std::int32_t>(i) == 1001));
    CHECK_THROWS_AS((void)kiln::randint(3, 3, {2}), kiln::ValueError);
}

TEST_CASE("manual_seed and Generator make draws reproducible; successive draws differ") {
    kiln::manual_seed(1234);
    const Tensor a = kiln::randn({1000});
    const Tensor a2 = kiln::randn({1000});
    kiln::manual_seed(1234);
    const Tensor b = kiln::randn({1000});
    CHECK(bitwise_equal(a, b));
    CHECK_FALSE(bitwise_equal(a, a2));
    kiln::manual_seed(1235);
    CHECK_FALSE(bitwise_equal(a, kiln::randn({1000})));

    kiln::Generator g(99);
    const Tensor u1 = kiln::rand({500}, DType::f64, g);
    const Tensor i1 = kiln::randint(0, 1000000, {500}, DType::i64, g);
    g.manual_seed(99);
    CHECK(bitwise_equal(u1, kiln::rand({500}, DType::f64, g)));
    CHECK(bitwise_equal(i1, kiln::randint(0, 1000000, {500}, DType::i64, g)));
    CHECK(g.seed() == 99);
    // a private generator does not disturb the default stream
    kiln::manual_seed(1234);
    kiln::Generator other(5);
    (void)kiln::randn({77}, DType::f32, other);
    CHECK(bitwise_equal(a, kiln::randn({1000})));
}

TEST_CASE("random factories give the same numbers with 1 and 2 threads") {
    ThreadCountGuard guard;
    const Shape big{3, 100003};  // above the parallel grain, not a multiple of the tile
    kiln::set_num_threads(1);
    kiln::manual_seed(77);
    const Tensor n1 = kiln::randn(big), u1 = kiln::rand(big, DType::bf16), i1 = kiln::randint(-50, 50, big);
    const Tensor ar1 = kiln::arange(0, 300000, 1, DType::f64), ls1 = kiln::linspace(-1, 1, 300001);
    kiln::set_num_threads(2);
    kiln::manual_seed(77);
    const Tensor n2 = kiln::randn(big), u2 = kiln::rand(big, DType::bf16), i2 = kiln::randint(-50, 50, big);
    const Tensor ar2 = kiln::arange(0, 300000, 1, DType::f64), ls2 = kiln::linspace(-1, 1, 300001);
    CHECK(kiln::num_threads() == 2);
    CHECK(bitwise_equal(n1, n2));
    CHECK(bitwise_equal(u1, u2));
    CHECK(bitwise_equal(i1, i2));
    CHECK(bitwise_equal(ar1, ar2));
    CHECK(bitwise_equal(ls1, ls2));
    CHECK(ar2.item<double>(299999) == 299999.0);
}

// ============================================================================ element access

TEST_CASE("at and item: negative indices, strided views, conversions, range checks") {
    const auto vals = random_floats(12, 3);
    const Tensor m = from_vector(vals, {3, 4});
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 4; ++j) CHECK(m.at<float>({i, j}) == vals[static_cast<std::size_t>(4 * i + j)]);
    CHECK(m.at<float>({-1, -1}) == vals[11]);
    CHECK(m.at<float>({-3, 1}) == vals[1]);
    CHECK(m.at<float>({1, -4}) == vals[4]);
    m.at<float>({-2, -2}) = 0.125f;
    CHECK(m.at<float>({1, 2}) == 0.125f);
    CHECK(read_strided<float>(m, {1, 2}) == 0.125f);
    const Tensor mt = m.t();
    for (std::int64_t f = 0; f < 12; ++f) CHECK(mt.item<float>(f) == m.at<float>({f % 3, f / 3}));
    CHECK(mt.item<double>(5) == static_cast<double>(m.at<float>({2, 1})));
    CHECK_THROWS_AS((void)m.at<float>({3, 0}), kiln::ValueError);
    CHECK_THROWS_AS((void)m.at<float>({0, -5}), kiln::ValueError);
    CHECK_THROWS_AS((void)m.at<float>({0}), kiln::ValueError);
    CHECK_THROWS_AS((void)m.at<float>({0, 0, 0}), kiln::ValueError);
    CHECK_THROWS_AS((void)m.at<double>({0, 0}), kiln::DTypeError);
    CHECK_THROWS_AS((void)m.item<float>(12), kiln::ValueError);
    CHECK_THROWS_AS((void)m.item<float>(-1), kiln::ValueError);
    CHECK_THROWS_AS((void)m.item<float>(), kiln::ValueError);

    const Tensor one = kiln::full({1, 1}, -6.5, DType::f64);
    CHECK(one.item<double>() == -6.5);
    CHECK(one.item<std::int32_t>() == -6);
    CHECK(one.item<bool>());
    const Tensor zero_d = kiln::full({}, 41, DType::i32);
    CHECK(zero_d.item<std::int64_t>() == 41);
    CHECK(zero_d.at<std::int32_t>({}) == 41);
    const Tensor h = kiln::full({2}, 0.1, DType::f16);
    CHECK(h.item<float>(1) == static_cast<float>(kiln::half(0.1f)));
    CHECK(kiln::ones({1}, DType::boolean).item<float>() == 1.0f);
}

// ============================================================================ printing

TEST_CASE("printing: torch's format for floats, ints, bools, 0-d, empty, strided and large tensors") {
    const Tensor f = from_vector({1.5f, 2.0f, -3.25f, 4.0f, 5.125f, 6.0f}, {2, 3});
    CHECK(kiln::to_string(f) == "tensor([[ 1.5000,  2.0000, -3.2500],\n        [ 4.0000,  5.1250,  6.0000]])");
    std::ostringstream os;
    os << f;
    CHECK(os.str() == kiln::to_string(f));
    CHECK(kiln::to_string(f.t()) ==
          "tensor([[ 1.5000,  4.0000],\n        [ 2.0000,  5.1250],\n        [-3.2500,  6.0000]])");
    CHECK(kiln::to_string(from_vector({1.0f, 2.0f, 3.0f}, {3})) == "tensor([1., 2., 3.])");
    CHECK(kiln::to_string(from_vector({1e-5f, 1.0f}, {2})) == "tensor([1.0000e-05, 1.0000e+00])");
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    CHECK(kiln::to_string(from_vector({1.5f, nan, -inf}, {3})) == "tensor([1.5000,    nan,   -inf])");

    Tensor i = kiln::zeros({3}, DType::i32);
    i.at<std::int32_t>({0}) = 1;
    i.at<std::int32_t>({1}) = -20;
    i.at<std::int32_t>({2}) = 3;
    CHECK(kiln::to_string(i) == "tensor([  1, -20,   3], dtype=kiln.int32)");
    const Tensor l = kiln::arange(1, 7, 1, DType::i64).view({2, 3});
    CHECK(kiln::to_string(l) == "tensor([[1, 2, 3],\n        [4, 5, 6]])");
    const Tensor l3 = kiln::arange(1, 9, 1, DType::i64).view({2, 2, 2});
    CHECK(kiln::to_string(l3) == "tensor([[[1, 2],\n         [3, 4]],\n\n        [[5, 6],\n         [7, 8]]])");

    const Tensor b = kiln::arange(0, 3, 1, DType::i32).to(DType::boolean);
    CHECK(kiln::to_string(b) == "tensor([False,  True,  True])");
    CHECK(kiln::to_string(kiln::full({}, 3.5)) == "tensor(3.5000)");
    CHECK(kiln::to_string(kiln::full({}, -7, DType::i64)) == "tensor(-7)");
    CHECK(kiln::to_string(kiln::full({}, true, DType::boolean)) == "tensor(True)");
    CHECK(kiln::to_string(kiln::full({2}, 0.5, DType::f64)) == "tensor([0.5000, 0.5000], dtype=kiln.float64)");
    CHECK(kiln::to_string(kiln::full({1}, 1.0, DType::f16)) == "tensor([1.], dtype=kiln.float16)");
    CHECK(kiln::to_string(kiln::zeros({0})) == "tensor([])");
    CHECK(kiln::to_string(kiln::zeros({0, 3})) == "tensor([], size=(0, 3))");
    CHECK(kiln::to_string(kiln::zeros({0}, DType::i32)) == "tensor([], dtype=kiln.int32)");
    CHECK(kiln::to_string(Tensor()) == "tensor(undefined)");

    const std::string big = kiln::to_string(kiln::arange(2000));
    CHECK(big.find("...") != std::string::npos);
    CHECK(big.size() < 120);
    CHECK(big.rfind("tensor([   0,    1,    2,", 0) == 0);
    CHECK(big.find("1997, 1998, 1999])") != std::string::npos);
    CHECK(big.find("1000") == std::string::npos);
    const std::string big2 = kiln::to_string(Tensor(kiln::arange(1000, 11000, 1).view({100, 100}) + 0.5));
    CHECK(big2.find("...") != std::string::npos);
    CHECK(big2.size() < 1000);
    CHECK(big2.rfind("tensor([[ 1000.5000,  1001.5000,  1002.5000, ...,", 0) == 0);
    CHECK(big2.find("10999.5000]])") != std::string::npos);
    CHECK(big2.find("6000.5000") == std::string::npos);
}

// ============================================================================ host memory

namespace {

/// Counts calls and checks that every block comes back with the size it was allocated with.
class CountingAllocator final : public kiln::Allocator {
public:
    void* allocate(std::size_t nbytes) override {
        void* p = ::operator new(nbytes, std::align_val_t{64});
        std::lock_guard lock(m_);
        ++allocs;
        live_[p] = nbytes;
        return p;
    }
    void deallocate(void* p, std::size_t nbytes) noexcept override {
        {
            std::lock_guard lock(m_);
            ++deallocs;
            auto it = live_.find(p);
            if (it == live_.end() || it->second != nbytes) ++mismatches;
            else live_.erase(it);
        }
        ::operator delete(p, std::align_val_t{64});
    }
    bool owns(const void* p) const {
        std::lock_guard lock(m_);
        return live_.count(const_cast<void*>(p)) != 0;
    }
    std::size_t live() const {
        std::lock_guard lock(m_);
        return live_.size();
    }
    int allocs = 0, deallocs = 0, mismatches = 0;

private:
    mutable std::mutex m_;
    std::map<void*, std::size_t> live_;
};

struct AllocatorGuard {
    explicit AllocatorGuard(kiln::Allocator* a) { kiln::set_host_allocator(a); }
    ~AllocatorGuard() { kiln::set_host_allocator(nullptr); }
};

}  // namespace

TEST_CASE("a custom host allocator serves new tensors and gets every block back") {
    CountingAllocator counting;
    {
        std::vector<Tensor> keep;
        {
            AllocatorGuard guard(&counting);
            CHECK(&kiln::host_allocator() == &counting);
            Tensor a = kiln::randn({10, 10});
            CHECK(counting.allocs == 1);
            CHECK(counting.owns(a.data_ptr()));
            const Tensor v = a.t().slice(0, 2, 8);  // views allocate nothing
            CHECK(counting.allocs == 1);
            Tensor y = v * 2.0 + 1.0;  // an evaluated expression: its output
            CHECK(counting.allocs == 2);
            CHECK(counting.owns(y.data_ptr()));
            CHECK(y.at<float>({1, 3}) == a.at<float>({3, 3}) * 2.0f + 1.0f);
            Tensor c = v.contiguous();
            CHECK(counting.allocs == 3);
            keep.push_back(c);  // outlives the guard
            y = Tensor();
            CHECK(counting.deallocs == 1);
        }
        CHECK(&kiln::host_allocator() != &counting);
        const Tensor after = kiln::ones({5});  // default allocator again
        CHECK_FALSE(counting.owns(after.data_ptr()));
        CHECK(counting.allocs == 3);
        CHECK(counting.live() == 1);  // keep[0]: tensors remember the allocator that made them
        CHECK(keep[0].at<float>({0, 0}) == keep[0].item<float>(0));
    }
    CHECK(counting.allocs == counting.deallocs);
    CHECK(counting.mismatches == 0);
    CHECK(counting.live() == 0);
}

TEST_CASE("the default host allocator: 64-byte alignment, cache hits on reuse, stats") {
    for (DType d : kiln::all_dtypes)
        for (std::int64_t n : {1, 3, 17, 63, 1000, 4097, 70001}) {
            const Tensor t = kiln::empty({n}, d);
            INFO(dn(d) << " x " << n);
            CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 64 == 0);
        }
    kiln::empty_host_cache();
    const kiln::AllocatorStats s0 = kiln::host_allocator_stats();
    CHECK(s0.bytes_cached == 0);
    const void* first = nullptr;
    kiln::AllocatorStats s1;
    {
        const Tensor a = kiln::empty({12345});
        first = a.data_ptr();
        s1 = kiln::host_allocator_stats();
        CHECK(s1.allocations == s0.allocations + 1);
        CHECK(s1.cache_hits == s0.cache_hits);
        CHECK(s1.bytes_in_use >= s0.bytes_in_use + 12345 * 4);
    }
    const auto s2 = kiln::host_allocator_stats();
    CHECK(s2.bytes_cached >= 12345 * 4);
    CHECK(s2.bytes_in_use == s0.bytes_in_use);
    {
        const Tensor b = kiln::empty({12345});  // the same size again: served from the cache
        const auto s3 = kiln::host_allocator_stats();
        CHECK(s3.cache_hits == s2.cache_hits + 1);
        CHECK(s3.allocations == s2.allocations + 1);
        CHECK(b.data_ptr() == first);
        CHECK(s3.bytes_in_use == s1.bytes_in_use);
        CHECK(s3.bytes_cached == s2.bytes_cached - (s1.bytes_in_use - s0.bytes_in_use));
        const Tensor c = kiln::empty({12345});  // the cached block is taken: a miss
        CHECK(kiln::host_allocator_stats().cache_hits == s3.cache_hits);
        CHECK(c.data_ptr() != b.data_ptr());
    }
    kiln::empty_host_cache();
    CHECK(kiln::host_allocator_stats().bytes_cached == 0);
}
