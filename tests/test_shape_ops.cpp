// Composites (triu, tril, masked_fill, one_hot, rms_norm) and movement / combination ops (cat,
// stack, split, chunk, pad, roll, gather, take_along_dim, scatter, scatter_add): each against a
// float64 loop reference written here, over dtypes, broadcasting and non-contiguous inputs, eager
// and under kiln::compile.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <kiln/kiln.hpp>
#include <string>
#include <vector>

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

/// Element i (row-major logical order) of t as a double.
double at(const Tensor& t, std::int64_t i) { return t.item<double>(i); }

/// Row-major coordinates of flat index i in shape s.
std::vector<std::int64_t> coords(const Shape& s, std::int64_t i) {
    std::vector<std::int64_t> c(static_cast<std::size_t>(s.rank()));
    for (int d = s.rank() - 1; d >= 0; --d) {
        c[static_cast<std::size_t>(d)] = i % s[d];
        i /= s[d];
    }
    return c;
}
/// Flat row-major index of coordinates c in shape s.
std::int64_t flat(const Shape& s, const std::vector<std::int64_t>& c) {
    std::int64_t f = 0;
    for (int d = 0; d < s.rank(); ++d) f = f * s[d] + c[static_cast<std::size_t>(d)];
    return f;
}

/// Checks got == want elementwise (exactly unless tol > 0), with its shape and dtype.
void check_equal(const Tensor& got, const Shape& shape, DType dtype, const std::vector<double>& want, double tol = 0) {
    REQUIRE(got.shape() == shape);
    CHECK(got.dtype() == dtype);
    REQUIRE(static_cast<std::int64_t>(want.size()) == got.numel());
    int bad = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
        const double g = at(got, i), w = want[static_cast<std::size_t>(i)];
        const bool ok = tol == 0 ? (g == w || (std::isnan(g) && std::isnan(w))) : std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w));
        if (!ok && bad++ < 5) FAIL_CHECK("element " << i << ": got " << g << ", want " << w);
    }
    CHECK(bad == 0);
}

/// A (rows, cols) tensor of dtype with distinct nonzero values, seen through a transpose (so it is
/// not contiguous) when `transposed`.
Tensor sample(Shape shape, DType dtype, bool transposed, std::uint64_t seed) {
    kiln::Generator g(seed);
    if (transposed) std::swap(shape[shape.rank() - 1], shape[shape.rank() - 2]);
    Tensor t = Tensor(kiln::round(kiln::randn(shape, DType::f64, g) * 20.0) + 0.5).to(dtype);
    if (dtype == DType::boolean) t = Tensor(kiln::randn(shape, DType::f64, g) > 0.0);
    return transposed ? t.transpose(-1, -2) : t;
}

}  // namespace

// ---------------------------------------------------------------- triu / tril

TEST_CASE("triu and tril keep the right triangle for every diagonal, dtype and layout") {
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::boolean, DType::bf16})
        for (bool tr : {false, true})
            for (std::int64_t diag : {-3, -1, 0, 1, 2, 7}) {
                INFO(kiln::dtype_name(dt) << (tr ? " transposed" : "") << " diagonal " << diag);
                const Tensor x = sample({2, 5, 6}, dt, tr, 11);
                std::vector<double> up, lo;
                for (std::int64_t i = 0; i < x.numel(); ++i) {
                    const auto c = coords(x.shape(), i);
                    const double v = at(x, i);
                    up.push_back(c[2] - c[1] >= diag ? v : 0.0);
                    lo.push_back(c[2] - c[1] <= diag ? v : 0.0);
                }
                check_equal(kiln::triu(x, diag), x.shape(), dt, up);
                check_equal(kiln::tril(x, diag), x.shape(), dt, lo);
                check_equal(kiln::eager(kiln::triu(x, diag)), x.shape(), dt, up);
            }
}

TEST_CASE("triu of an expression fuses into the statement; a 1-D tensor is a ShapeError") {
    const Tensor x = kiln::randn({4, 4});
    const Tensor y = kiln::triu(x * 2.0) + 1.0;
    for (std::int64_t i = 0; i < 16; ++i)
        CHECK(at(y, i) == (i % 4 >= i / 4 ? static_cast<double>(x.item<float>(i) * 2.0f + 1.0f) : 1.0));
    CHECK_THROWS_AS((void)kiln::triu(kiln::randn({4})), kiln::ShapeError);
}

// ---------------------------------------------------------------- masked_fill

TEST_CASE("masked_fill: broadcast masks, x's dtype kept, values converted") {
    const Tensor x = sample({3, 4}, DType::f32, true, 3);
    const Tensor mask = Tensor(kiln::randn({4}) > 0.0);  // broadcasts over rows
    std::vector<double> want;
    for (std::int64_t i = 0; i < 12; ++i) want.push_back(at(mask, i % 4) != 0 ? -INFINITY : at(x, i));
    check_equal(kiln::masked_fill(x, mask, -INFINITY), {3, 4}, DType::f32, want);

    const Tensor xi = sample({3, 4}, DType::i32, false, 4);
    want.clear();
    for (std::int64_t i = 0; i < 12; ++i) want.push_back(at(mask, i % 4) != 0 ? 7.0 : at(xi, i));
    check_equal(kiln::masked_fill(xi, mask, 7.9), {3, 4}, DType::i32, want);  // 7.9 -> int32 7 (truncation)

    // a mask with more dims broadcasts the result, as torch's out-of-place masked_fill
    const Tensor m3 = Tensor(kiln::randn({2, 1, 4}) > 0.0);
    const Tensor r = kiln::masked_fill(x, m3, 0.5);
    REQUIRE(r.shape() == Shape{2, 3, 4});
    for (std::int64_t i = 0; i < r.numel(); ++i) {
        const auto c = coords(r.shape(), i);
        CHECK(at(r, i) == (at(m3, c[0] * 4 + c[2]) != 0 ? 0.5 : at(x, c[1] * 4 + c[2])));
    }
    const Tensor b = sample({3, 4}, DType::boolean, false, 5);
    CHECK(kiln::masked_fill(b, mask, true).dtype() == DType::boolean);
}

// ---------------------------------------------------------------- one_hot

TEST_CASE("one_hot: int64 rows, num_classes inferred or given, int32 indices") {
    const Tensor idx = kiln::randint(0, 5, {3, 4});
    const Tensor oh = kiln::one_hot(idx, 6);
    std::vector<double> want;
    for (std::int64_t i = 0; i < 12; ++i)
        for (std::int64_t k = 0; k < 6; ++k) want.push_back(at(idx, i) == static_cast<double>(k) ? 1 : 0);
    check_equal(oh, {3, 4, 6}, DType::i64, want);
    const std::int64_t hi = kiln::max(idx).item<std::int64_t>();
    CHECK(kiln::one_hot(idx).shape() == Shape{3, 4, hi + 1});
    check_equal(kiln::one_hot(idx.to(DType::i32).t(), 6).transpose(0, 1), {3, 4, 6}, DType::i64, want);
}

// ---------------------------------------------------------------- rms_norm

TEST_CASE("rms_norm matches a float64 reference: one and two normalized dims, weight, default eps") {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
        INFO(kiln::dtype_name(dt));
        const Tensor x = kiln::randn({3, 4, 5}, dt);
        const Tensor w = kiln::randn({5}, dt);
        const Tensor w2 = kiln::randn({4, 5}, dt);
        const double eps_default = dt == DType::f64 ? std::ldexp(1.0, -52) : dt == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -23);
        const double tol = dt == DType::f64 ? 1e-12 : dt == DType::bf16 ? 1e-2 : 2e-6;
        for (int nd : {1, 2}) {
            const std::int64_t row = nd == 1 ? 5 : 20;
            for (bool with_w : {false, true}) {
                for (std::optional<double> eps : {std::optional<double>{}, std::optional<double>{0.25}}) {
                    std::vector<double> want;
                    for (std::int64_t r = 0; r < 60 / row; ++r) {
                        double ss = 0;
                        for (std::int64_t k = 0; k < row; ++k) ss += at(x, r * row + k) * at(x, r * row + k);
                        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(row) + (eps ? *eps : eps_default));
                        for (std::int64_t k = 0; k < row; ++k) {
                            const double wk = !with_w ? 1.0 : nd == 1 ? at(w, k) : at(w2, k);
                            want.push_back(at(x, r * row + k) * inv * wk);
                        }
                    }
                    const Shape ns = nd == 1 ? Shape{5} : Shape{4, 5};
                    const Tensor got = kiln::rms_norm(x, ns, with_w ? (nd == 1 ? w : w2) : Tensor{}, eps);
                    check_equal(got, x.shape(), dt, want, tol);
                }
            }
        }
    }
    // a zero row stays zero (eps keeps the rsqrt finite)
    const Tensor z = kiln::rms_norm(kiln::zeros({2, 3}), {3});
    for (std::int64_t i = 0; i < 6; ++i) CHECK(at(z, i) == 0.0);
}

// ---------------------------------------------------------------- cat / stack / split / chunk

TEST_CASE("cat along every dim, with promotion, non-contiguous pieces and torch's empty 1-D tensors") {
    const Tensor a = sample({2, 3, 4}, DType::f32, true, 1);
    const Tensor b = sample({2, 5, 4}, DType::i32, false, 2).slice(2, 0, 4);
    const Tensor c = sample({2, 1, 4}, DType::f64, false, 3);
    const Tensor r = kiln::cat({a, b, c}, 1);
    REQUIRE(r.shape() == Shape{2, 9, 4});
    CHECK(r.dtype() == DType::f64);
    for (std::int64_t i = 0; i < r.numel(); ++i) {
        const auto k = coords(r.shape(), i);
        const std::int64_t j = k[1];
        const double want = j < 3 ? at(a, flat(a.shape(), {k[0], j, k[2]}))
                            : j < 8 ? at(b, flat(b.shape(), {k[0], j - 3, k[2]}))
                                    : at(c, flat(c.shape(), {k[0], 0, k[2]}));
        CHECK(at(r, i) == want);
    }
    for (std::int64_t d : {0, -1}) {
        const Tensor p = kiln::randn({2, 3, 4}), q = kiln::randn({2, 3, 4}).transpose(0, 0);
        const Tensor s = kiln::cat({p, q, kiln::zeros({0})}, d);
        const int dd = d < 0 ? 2 : 0;
        CHECK(s.size(dd) == 2 * p.size(dd));
        for (std::int64_t i = 0; i < s.numel(); ++i) {
            auto k = coords(s.shape(), i);
            const bool second = k[static_cast<std::size_t>(dd)] >= p.size(dd);
            if (second) k[static_cast<std::size_t>(dd)] -= p.size(dd);
            CHECK(at(s, i) == at(second ? q : p, flat(p.shape(), k)));
        }
    }
    CHECK(kiln::cat({kiln::ones({2}, DType::boolean), kiln::zeros({1}, DType::boolean)}).dtype() == DType::boolean);
}

TEST_CASE("stack inserts the new dim anywhere; split and chunk give views that tile the tensor") {
    const Tensor a = kiln::randn({3, 4}), b = kiln::randn({3, 4}).t().contiguous().t();
    for (std::int64_t d : {0, 1, 2, -1}) {
        const Tensor s = kiln::stack({a, b}, d);
        const int dd = d < 0 ? 2 : static_cast<int>(d);
        REQUIRE(s.size(dd) == 2);
        for (std::int64_t i = 0; i < s.numel(); ++i) {
            auto k = coords(s.shape(), i);
            const std::int64_t which = k[static_cast<std::size_t>(dd)];
            k.erase(k.begin() + dd);
            CHECK(at(s, i) == at(which ? b : a, flat(a.shape(), k)));
        }
    }
    const Tensor x = kiln::randn({4, 10});
    const auto parts = kiln::split(x, 4, 1);
    REQUIRE(parts.size() == 3);
    CHECK(parts[2].shape() == Shape{4, 2});
    CHECK(parts[1].storage() == x.storage());  // a view
    CHECK(at(parts[1], 5) == at(x, 1 * 10 + 4 + 1));
    const auto sized = kiln::split(x, std::vector<std::int64_t>{1, 0, 3}, 0);
    REQUIRE(sized.size() == 3);
    CHECK(sized[1].numel() == 0);
    CHECK(at(sized[2], 0) == at(x, 10));
    const auto ch = kiln::chunk(x, 3, -1);  // ceil(10 / 3) = 4: pieces 4, 4, 2
    REQUIRE(ch.size() == 3);
    CHECK(ch[0].size(1) == 4);
    CHECK(ch[2].size(1) == 2);
    CHECK(kiln::chunk(x, 6, 1).size() == 5);  // torch: pieces of 2, fewer than asked
    CHECK(kiln::cat(ch, 1).shape() == x.shape());
    CHECK(kiln::chunk(kiln::zeros({0, 2}), 3).size() == 3);
}

// ---------------------------------------------------------------- pad / roll

TEST_CASE("pad: constant mode, pairs from the last dim, negative pads crop") {
    const Tensor x = sample({2, 3, 4}, DType::f32, true, 9);
    for (const std::vector<std::int64_t>& pads : std::vector<std::vector<std::int64_t>>{
             {1, 2}, {0, 0, 2, 1}, {1, 1, 1, 1, 1, 1}, {-1, 2, 1, -2}, {-2, -2}}) {
        INFO("pads of size " << pads.size() << " starting " << pads[0]);
        Shape s = x.shape();
        std::vector<std::int64_t> lo(3, 0);
        for (std::size_t p = 0; p < pads.size() / 2; ++p) {
            const int d = 2 - static_cast<int>(p);
            s[d] += pads[2 * p] + pads[2 * p + 1];
            lo[static_cast<std::size_t>(d)] = pads[2 * p];
        }
        std::vector<double> want;
        for (std::int64_t i = 0; i < s.numel(); ++i) {
            auto k = coords(s, i);
            bool inside = true;
            for (int d = 0; d < 3; ++d) {
                k[static_cast<std::size_t>(d)] -= lo[static_cast<std::size_t>(d)];
                inside = inside && k[static_cast<std::size_t>(d)] >= 0 && k[static_cast<std::size_t>(d)] < x.size(d);
            }
            want.push_back(inside ? at(x, flat(x.shape(), k)) : -2.5);
        }
        check_equal(kiln::pad(x, pads, -2.5), s, DType::f32, want);
    }
    const Tensor i = kiln::pad(kiln::ones({2}, DType::i64), {1, 1});
    check_equal(i, {4}, DType::i64, {0, 1, 1, 0});
}

TEST_CASE("roll: one or several dims, negative and large shifts, flattened") {
    const Tensor x = sample({3, 5}, DType::i64, true, 21);
    for (std::int64_t s0 : {0, 1, -2, 7})
        for (std::int64_t s1 : {0, 3, -6}) {
            std::vector<double> want;
            for (std::int64_t i = 0; i < 15; ++i) {
                const auto k = coords(x.shape(), i);
                const std::int64_t r = ((k[0] - s0) % 3 + 3) % 3, c = ((k[1] - s1) % 5 + 5) % 5;
                want.push_back(at(x, r * 5 + c));
            }
            check_equal(kiln::roll(x, {s0, s1}, {0, 1}), {3, 5}, DType::i64, want);
        }
    std::vector<double> want;
    for (std::int64_t i = 0; i < 15; ++i) want.push_back(at(x, ((i - 4) % 15 + 15) % 15));
    check_equal(kiln::roll(x, 4), {3, 5}, DType::i64, want);
    want.clear();
    for (std::int64_t i = 0; i < 15; ++i) want.push_back(at(x, (i / 5) * 5 + ((i % 5) + 1) % 5));
    check_equal(kiln::roll(x, -1, 1), {3, 5}, DType::i64, want);
}

// ---------------------------------------------------------------- gather / scatter

TEST_CASE("gather along every dim matches a loop; strided x and index, int32 index, 0-dim") {
    const Tensor x = sample({4, 5, 6}, DType::f64, true, 31);
    for (int d = 0; d < 3; ++d) {
        Shape is{3, 4, 5};
        is[d] = 7;  // larger than x along d is fine; the other dims must not exceed x's
        const Tensor idx = kiln::randint(0, x.size(d), {is[2], is[1], is[0]}).permute({2, 1, 0});  // strided
        const Tensor got = kiln::gather(x, d, idx);
        std::vector<double> want;
        for (std::int64_t i = 0; i < idx.numel(); ++i) {
            auto k = coords(idx.shape(), i);
            k[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(at(idx, i));
            want.push_back(at(x, flat(x.shape(), k)));
        }
        check_equal(got, idx.shape(), DType::f64, want);
        check_equal(kiln::gather(x.to(DType::f16), d, idx.to(DType::i32)), idx.shape(), DType::f16,
                    [&] { std::vector<double> h; for (double v : want) h.push_back(static_cast<float>(kiln::half(static_cast<float>(v)))); return h; }());
    }
    const Tensor s = kiln::gather(kiln::arange(5, DType::i64), 0, kiln::full({}, 3, DType::i64));
    CHECK(s.rank() == 0);
    CHECK(s.item<std::int64_t>() == 3);
}

TEST_CASE("take_along_dim broadcasts outside dim, or works on the flattened tensors") {
    const Tensor x = kiln::randn({4, 6});
    const Tensor idx = kiln::argmax(x, 1, true);  // (4, 1)
    const Tensor m = kiln::take_along_dim(x, idx, 1);
    const Tensor ref = kiln::max(x, 1, true);
    check_equal(m, {4, 1}, DType::f32, [&] { std::vector<double> v; for (int i = 0; i < 4; ++i) v.push_back(at(ref, i)); return v; }());
    // (2, 1) indices along dim 0 broadcast over x's 6 columns: out[i][j] = x[idx[i][0]][j]
    const Tensor ri = kiln::randint(0, 4, {2, 1});
    std::vector<double> want;
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 6; ++j) want.push_back(at(x, static_cast<std::int64_t>(at(ri, i)) * 6 + j));
    check_equal(kiln::take_along_dim(x, ri, 0), {2, 6}, DType::f32, want);
    // no dim: the flattened tensors
    const Tensor fi = kiln::randint(0, 24, {5});
    want.clear();
    for (std::int64_t i = 0; i < 5; ++i) want.push_back(at(x.t(), static_cast<std::int64_t>(at(fi, i))));
    check_equal(kiln::take_along_dim(x.t(), fi), {5}, DType::f32, want);
    CHECK_THROWS_AS((void)kiln::take_along_dim(x, kiln::randint(0, 4, {1, 3}), 0), kiln::ShapeError);
}

TEST_CASE("scatter, scatter with a value, scatter_add with repeated indices match loops") {
    const Tensor x = sample({5, 4}, DType::f32, true, 41);
    const Tensor src = sample({3, 6}, DType::f32, false, 42).slice(1, 0, 6, 2);  // (3, 3) strided
    for (int d = 0; d < 2; ++d) {
        // scatter: distinct indices per column (dim 0) or row (dim 1), so the result is determined
        Tensor idx = d == 0 ? Tensor(kiln::arange(3, DType::i64).view({3, 1}).expand({3, 3}) * 1 + 1)
                            : Tensor(kiln::arange(3, DType::i64).view({1, 3}).expand({3, 3}) + 1);
        idx = idx.contiguous();
        std::vector<double> want(20);
        for (std::int64_t i = 0; i < 20; ++i) want[static_cast<std::size_t>(i)] = at(x, i);
        for (std::int64_t i = 0; i < 9; ++i) {
            auto k = coords(idx.shape(), i);
            const double v = at(src, i);
            k[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(at(idx, i));
            want[static_cast<std::size_t>(flat(x.shape(), k))] = v;
        }
        check_equal(kiln::scatter(x, d, idx, src), x.shape(), DType::f32, want);
        // a value
        std::vector<double> wv(20);
        for (std::int64_t i = 0; i < 20; ++i) wv[static_cast<std::size_t>(i)] = at(x, i);
        for (std::int64_t i = 0; i < 9; ++i) {
            auto k = coords(idx.shape(), i);
            k[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(at(idx, i));
            wv[static_cast<std::size_t>(flat(x.shape(), k))] = -1.5;
        }
        check_equal(kiln::scatter(x, d, idx, -1.5), x.shape(), DType::f32, wv);
        // scatter_add with random (repeating) indices, in float64 and int64
        const Tensor ridx = kiln::randint(0, x.size(d), {3, 3});
        for (DType dt : {DType::f64, DType::i64}) {
            const Tensor xd = x.to(dt), sd = src.to(dt);
            std::vector<double> wa(20);
            for (std::int64_t i = 0; i < 20; ++i) wa[static_cast<std::size_t>(i)] = at(xd, i);
            for (std::int64_t i = 0; i < 9; ++i) {
                auto k = coords(ridx.shape(), i);
                k[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(at(ridx, i));
                wa[static_cast<std::size_t>(flat(x.shape(), k))] += at(sd, i);
            }
            check_equal(kiln::scatter_add(xd, d, ridx, sd), x.shape(), dt, wa, dt == DType::f64 ? 1e-15 : 0);
        }
    }
    // x itself is never written
    const Tensor before = x.clone();
    (void)kiln::scatter(x, 0, kiln::zeros({1, 1}, DType::i64), kiln::ones({1, 1}));
    for (std::int64_t i = 0; i < 20; ++i) CHECK(at(x, i) == at(before, i));
}

// ---------------------------------------------------------------- under kiln::compile

TEST_CASE("compiled == eager: triu, masked_fill, one_hot, rms_norm, gather, scatter_add") {
    const Tensor x = kiln::randn({4, 6}), w = kiln::randn({6});
    const Tensor mask = Tensor(kiln::randn({6}) > 0.0);
    const Tensor idx = kiln::randint(0, 6, {4, 3}), cls = kiln::randint(0, 5, {4});
    auto f = kiln::compile([&](const Tensor& a, const Tensor& i, const Tensor& c) {
        const Tensor t = kiln::triu(a, 1) + kiln::tril(a * 2.0, -1);
        const Tensor m = kiln::masked_fill(t, mask, 0.25);
        const Tensor r = kiln::rms_norm(m, {6}, w);
        const Tensor g = kiln::gather(r, 1, i);
        const Tensor s = kiln::scatter_add(r, 1, i, g);
        return std::make_tuple(Tensor(s * 1.0), kiln::one_hot(c, 5), g);
    });
    const auto [s, oh, g] = f(x, idx, cls);
    const Tensor t = kiln::triu(x, 1) + kiln::tril(x * 2.0, -1);
    const Tensor r = kiln::rms_norm(Tensor(kiln::masked_fill(t, mask, 0.25)), {6}, w);
    const Tensor g0 = kiln::gather(r, 1, idx);
    const Tensor s0 = kiln::scatter_add(r, 1, idx, g0);
    for (std::int64_t k = 0; k < s.numel(); ++k) CHECK(at(s, k) == doctest::Approx(at(s0, k)).epsilon(1e-6));
    for (std::int64_t k = 0; k < g.numel(); ++k) CHECK(at(g, k) == doctest::Approx(at(g0, k)).epsilon(1e-6));
    const Tensor oh0 = kiln::one_hot(cls, 5);
    REQUIRE(oh.shape() == oh0.shape());
    for (std::int64_t k = 0; k < oh.numel(); ++k) CHECK(at(oh, k) == at(oh0, k));
}

TEST_CASE("gather and scatter under automatic dynamic shapes check each call's sizes; scatter values are told apart exactly") {
    // the second size makes dim 0 symbolic; later calls must check indices against their own size
    auto g = kiln::compile([](const Tensor& x, const Tensor& i) { return kiln::gather(x, 0, i); });
    auto s = kiln::compile([](const Tensor& x, const Tensor& i) { return kiln::scatter(x, 0, i, Tensor(x * 2.0)); });
    for (std::int64_t rows : {64, 48, 32}) {
        const Tensor x = kiln::randn({rows, 3}), ok = kiln::randint(0, rows, {5, 3});
        const Tensor want = kiln::gather(x, 0, ok);
        const Tensor got = g(x, ok);
        REQUIRE(got.shape() == want.shape());
        for (std::int64_t k = 0; k < got.numel(); ++k) CHECK(at(got, k) == at(want, k));
        const Tensor bad = kiln::full({2, 3}, static_cast<double>(rows + 8), DType::i64);  // in range of the first size
        CHECK_THROWS_AS(g(x, bad), kiln::ValueError);
        CHECK_THROWS_AS(s(x, bad), kiln::ValueError);
    }
    // scatters of values that print alike with 6 decimals stay two different calls
    const Tensor x = kiln::zeros({2, 2}, DType::f64), i = kiln::zeros({1, 2}, DType::i64);
    auto two = kiln::compile([&](const Tensor& t) { return std::make_tuple(kiln::scatter(t, 0, i, 0.0), kiln::scatter(t, 0, i, 1e-9)); });
    const auto [a, b] = two(x);
    CHECK(at(a, 0) == 0.0);
    CHECK(at(b, 0) == 1e-9);
}

TEST_CASE("compiled == eager: cat, stack, pad, roll") {
    const Tensor a = kiln::randn({3, 4}), b = kiln::randn({2, 4});
    auto f = kiln::compile([](const Tensor& p, const Tensor& q) {
        const Tensor c = kiln::cat({p * 2.0, q}, 0);
        const Tensor s = kiln::stack({p, Tensor(p + 1.0)}, 1);
        const Tensor d = kiln::pad(p, {1, 2, 0, 1}, -1.0);
        const Tensor r = kiln::roll(p, {1, -1}, {0, 1});
        return std::make_tuple(c, s, d, r);
    });
    const auto [c, s, d, r] = f(a, b);
    const Tensor c0 = kiln::cat({Tensor(a * 2.0), b}, 0), s0 = kiln::stack({a, Tensor(a + 1.0)}, 1);
    const Tensor d0 = kiln::pad(a, {1, 2, 0, 1}, -1.0), r0 = kiln::roll(a, {1, -1}, {0, 1});
    for (const auto& [got, want] : {std::pair{c, c0}, std::pair{s, s0}, std::pair{d, d0}, std::pair{r, r0}}) {
        REQUIRE(got.shape() == want.shape());
        for (std::int64_t k = 0; k < got.numel(); ++k) CHECK(at(got, k) == at(want, k));
    }
}
