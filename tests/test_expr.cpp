// Expression templates: one pass per statement, operands held by value, aliasing, mixed dtypes,
// reductions of expressions, composites, matmul; all against eager and float64 references.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <kiln/kiln.hpp>
#include <numeric>

#include "test_util.hpp"

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

using kiln_test::maxdiff;

std::size_t allocations() { return kiln::host_allocator_stats().allocations; }

}  // namespace

TEST_CASE("a statement is one pass: the fused chain allocates only its output") {
    const Tensor x = kiln::randn({300, 301});
    const Tensor y = kiln::randn({301});
    auto chain = kiln::relu(x * 1.5 + 0.5) * kiln::sigmoid(x) - kiln::tanh(x * 0.1) + kiln::exp(-x * x) + y;
    const std::size_t before = allocations();
    const Tensor fused = chain;
    CHECK(allocations() - before == 1);
    const std::size_t before_eager = allocations();
    const Tensor eag = kiln::eager(chain);
    CHECK(allocations() - before_eager == 13);  // one materialized result per op (13 ops), like torch eager
    CHECK(maxdiff(fused, eag) < 2e-6);
}

TEST_CASE("expressions hold their operands by value") {
    auto make = [] {
        const Tensor a = kiln::full({4, 5}, 2.0);
        const Tensor b = kiln::arange(0, 5, 1);
        return a * b + 1.0;  // a and b die here; the expression keeps their storage
    };
    const auto e = make();
    const Tensor t = e;
    for (std::int64_t j = 0; j < 5; ++j) CHECK(t.at<float>({3, j}) == doctest::Approx(2.0 * j + 1));
}

TEST_CASE("assign writes in place, and aliasing with the operands stays correct") {
    Tensor y = kiln::randn({64, 64});
    const Tensor x = kiln::randn({64, 64});
    const Tensor y0 = y.clone();
    void* const storage = y.data_ptr();
    y.assign(y * 2.0 + x);  // same element mapping: evaluated straight into y
    CHECK(y.data_ptr() == storage);
    CHECK(maxdiff(y, Tensor(y0 * 2.0 + x)) == 0);

    Tensor z = y.clone();
    z.assign(z.t() + 1.0);  // reads elements it overwrites: must go through a temporary
    CHECK(maxdiff(z, Tensor(y.t() + 1.0)) == 0);

    Tensor w = kiln::zeros({4, 6});
    w.slice(1, 0, 6, 2).assign(kiln::arange(0, 3, 1) + 1.0);  // broadcast a row into a strided view
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 6; ++j) CHECK(w.at<float>({i, j}) == (j % 2 == 0 ? j / 2 + 1.0f : 0.0f));
    CHECK_THROWS_AS(w.assign(kiln::arange(0, 5, 1) + 1.0), kiln::ShapeError);
}

TEST_CASE("strided and broadcast operands inside one fused statement") {
    const Tensor base = kiln::randn({40, 90});
    const Tensor a = base.slice(1, 1, 90, 3);  // (40, 30) with step 3
    const Tensor b = kiln::randn({30, 40}).t();  // transposed
    const Tensor c = kiln::randn({40, 1});       // broadcast along columns
    const Tensor d = kiln::randn({30}).to(DType::f64);  // broadcast rows, promotes to f64
    auto e = kiln::sin(a) * b + c / (1.0 + kiln::abs(d));
    const Tensor fused = e;
    CHECK(fused.dtype() == DType::f64);
    CHECK(maxdiff(fused, kiln::eager(e)) < 1e-12);
    for (std::int64_t i = 0; i < 40; i += 7)
        for (std::int64_t j = 0; j < 30; j += 5) {
            const double ref = std::sin(static_cast<double>(a.at<float>({i, j}))) * b.at<float>({i, j}) +
                               c.at<float>({i, 0}) / (1.0 + std::fabs(d.at<double>({j})));
            CHECK(fused.at<double>({i, j}) == doctest::Approx(ref).epsilon(1e-6));
        }
}

TEST_CASE("mixed compute types run through the tile interpreter and match eager") {
    const Tensor ai = kiln::randint(-50, 50, {33, 70}, DType::i32);
    const Tensor bi = kiln::randint(-50, 50, {70}, DType::i32);
    const Tensor l = kiln::randint(-5, 5, {33, 70}, DType::i64);
    const Tensor x = kiln::randn({33, 70});
    auto e1 = kiln::exp((ai + bi) * 0.01) * x;     // int add, then float math
    auto e2 = (l > 0) * x + kiln::cast(x * 3.0, DType::i32);  // i64 compare, f32 math, cast to int
    CHECK(maxdiff(Tensor(e1), kiln::eager(e1)) < 1e-6);
    CHECK(maxdiff(Tensor(e2), kiln::eager(e2)) == 0);
    for (std::int64_t i = 0; i < 33; i += 4) {
        const std::int64_t j = (i * 7) % 70;
        const double ref = (l.at<std::int64_t>({i, j}) > 0 ? x.at<float>({i, j}) : 0.0f) +
                           static_cast<std::int32_t>(x.at<float>({i, j}) * 3.0f);
        CHECK(Tensor(e2).at<float>({i, j}) == doctest::Approx(ref));
    }
}

TEST_CASE("integer statements run on the tile interpreter (one SIMD loop per float type only) and are exact") {
    // a statement whose ops all compute in i32 or i64 is lowered to the interpreter, which kiln
    // compiles once; only f32 and f64 trees get a SIMD loop instantiated per expression type
    const Tensor a = kiln::randint(-1000, 1000, {37, 65}, DType::i32);
    const Tensor b = kiln::randint(1, 50, {65}, DType::i32);
    const Tensor c = kiln::randint(-(1LL << 40), 1LL << 40, {37, 65}, DType::i64);
    auto e32 = kiln::floor_divide(a * b - 7, b) + kiln::abs(a) % b;  // i32: mul, sub, floor division, abs, remainder
    auto e64 = kiln::maximum(c * 3, c - 5) + (c > 0);
    const kiln::expr::EvalState ev32(kiln::expr::flatten(e32), kiln::expr::fused_of(e32), e32.info.shape);
    CHECK_FALSE(ev32.fused());
    CHECK(ev32.ct() == DType::i32);
    const kiln::expr::EvalState ev64(kiln::expr::flatten(e64), kiln::expr::fused_of(e64), e64.info.shape);
    CHECK_FALSE(ev64.fused());
    const Tensor r32 = e32, r64 = e64;
    REQUIRE(r32.dtype() == DType::i32);
    REQUIRE(r64.dtype() == DType::i64);
    CHECK(maxdiff(r32, kiln::eager(e32)) == 0);
    CHECK(maxdiff(r64, kiln::eager(e64)) == 0);
    for (std::int64_t i = 0; i < 37; i += 3)
        for (std::int64_t j = 0; j < 65; j += 5) {
            const std::int64_t av = a.at<std::int32_t>({i, j}), bv = b.at<std::int32_t>({j});
            const std::int64_t num = av * bv - 7;
            const std::int64_t fl = num / bv - ((num % bv != 0) && ((num < 0) != (bv < 0)) ? 1 : 0);  // floor division
            const std::int64_t rem = ((std::abs(av) % bv) + bv) % bv;
            CHECK(r32.at<std::int32_t>({i, j}) == fl + rem);
            const std::int64_t cv = c.at<std::int64_t>({i, j});
            CHECK(r64.at<std::int64_t>({i, j}) == std::max(cv * 3, cv - 5) + (cv > 0 ? 1 : 0));
        }
    // f32 and f64 trees keep their fused loop
    const Tensor x = kiln::randn({37, 65}), xd = kiln::randn({37, 65}, DType::f64);
    auto ef = x * 2 + 1;
    auto ed = kiln::exp(xd) - xd;
    CHECK(kiln::expr::EvalState(kiln::expr::flatten(ef), kiln::expr::fused_of(ef), ef.info.shape).fused() == (KILN_FUSED_LOOPS != 0));
    CHECK(kiln::expr::EvalState(kiln::expr::flatten(ed), kiln::expr::fused_of(ed), ed.info.shape).fused() == (KILN_FUSED_LOOPS != 0));
}

TEST_CASE("an expression's flat form: walk order, and the interpreter agrees with the fused loop (KILN_FUSED_LOOPS=0)") {
    const Tensor x = kiln::randn({33, 70}), y = kiln::randn({70}), xd = kiln::randn({33, 70}, DType::f64);
    auto e = kiln::where(x > y, kiln::sin(x) * 2.5, y - x) + kiln::exp(-(x * x));
    const kiln::expr::Flat f = kiln::expr::flatten(e);
    // post-order: operands left to right, then their node; scalars carry their reader's compute type
    using K = kiln::expr::Flat::Kind;
    std::string walk;
    for (const auto& it : f.items)
        walk += it.kind == K::tensor ? "t" + std::to_string(it.index)
                : it.kind == K::scalar ? "s" + std::to_string(it.index)
                                       : "(" + std::string(kiln::ops::op_name(it.op)) + ")";
    CHECK(walk == "t0t1(gt)t2(sin)s0(mul)t3t4(sub)(where)t5t6(mul)(neg)(exp)(add)");
    CHECK(f.leaves == 7);
    CHECK(f.scalars == 1);
    CHECK(f.items[5].parent_ct == DType::f32);
    CHECK(f.root().info == &e.info);
    // the same statement through the fused loop, the tile interpreter (what KILN_FUSED_LOOPS=0
    // gives every statement) and eager; and a reduction of it both ways
    auto check = [](const auto& expr) {
        const kiln::expr::Flat fl = kiln::expr::flatten(expr);
        const Tensor fused = expr;
        Tensor interp(expr.info.shape, expr.info.dtype);
        kiln::expr::evaluate_into(fl, kiln::expr::Fused{}, interp);
        CHECK(maxdiff(fused, interp) <= 1e-6);
        CHECK(maxdiff(fused, kiln::eager(expr)) <= 1e-6);
        const Tensor rf = kiln::detail::reduce_flat<kiln::ops::SumR>(fl, kiln::expr::fused_of(expr), {1}, false, std::source_location::current());
        const Tensor ri = kiln::detail::reduce_flat<kiln::ops::SumR>(fl, kiln::expr::Fused{}, {1}, false, std::source_location::current());
        CHECK(maxdiff(rf, ri) <= 1e-4);
    };
    check(e);
    check(kiln::exp(xd) * 0.5 - xd / 3);
    CHECK_FALSE(kiln::expr::EvalState(f, kiln::expr::Fused{}, e.info.shape).fused());
}

TEST_CASE("an add of bools inside a float expression is a logical or: in the fused loop where the type shows it, else on the tile interpreter") {
    const Tensor x = kiln::randn({29, 67}), y = kiln::randn({67});
    // True + True is True (torch): times x gives x, not 2x
    auto check_values = [&](const Tensor& r) {
        for (std::int64_t i = 0; i < 29; ++i)
            for (std::int64_t j = 0; j < 67; ++j) {
                const double xv = x.at<float>({i, j}), yv = y.at<float>({j});
                const double ref = ((xv > 0) || (yv > 0) ? xv : 0.0) + (xv > yv ? 0.5 : 0.0);
                CHECK(r.at<float>({i, j}) == doctest::Approx(ref).epsilon(1e-6));
            }
    };
    // compares added: bool-valued by their type (expr::StaticBool), so the fused loop computes the or
    auto e = kiln::cast((x > 0) + (y > 0), DType::f32) * x + (x > y) * 0.5;
    static_assert(kiln::expr::StaticBool<std::remove_cvref_t<decltype((x > 0) + (y > 0))>>::value);
    const kiln::expr::Flat f = kiln::expr::flatten(e);
    CHECK_FALSE(f.bool_add);
    CHECK(kiln::expr::EvalState(f, kiln::expr::fused_of(e), e.info.shape).fused() == (KILN_FUSED_LOOPS != 0));
    check_values(e);
    CHECK(maxdiff(Tensor(e), kiln::eager(e)) == 0);
    // bool tensors added: bool only by their dtypes, so the tree goes to the tile interpreter
    const Tensor bx = x > 0, by = y > 0;
    auto d = kiln::cast(bx + by, DType::f32) * x + (x > y) * 0.5;
    static_assert(!kiln::expr::StaticBool<std::remove_cvref_t<decltype(bx + by)>>::value);
    const kiln::expr::Flat fd = kiln::expr::flatten(d);
    CHECK(fd.bool_add);
    CHECK_FALSE(kiln::expr::EvalState(fd, kiln::expr::fused_of(d), d.info.shape).fused());
    check_values(d);
    CHECK(maxdiff(Tensor(d), kiln::eager(d)) == 0);
    // adds of floats: the fused loop's plain sums
    auto g = ((x * 2 + y) * x + 1) * y + x;
    const kiln::expr::Flat fg = kiln::expr::flatten(g);
    CHECK_FALSE(fg.bool_add);
    CHECK(kiln::expr::EvalState(fg, kiln::expr::fused_of(g), g.info.shape).fused() == (KILN_FUSED_LOOPS != 0));
    CHECK(maxdiff(Tensor(g), kiln::eager(g)) <= 2e-5);
}

TEST_CASE("type promotion: C++ numbers act like Python scalars") {
    const Tensor f = kiln::randn({3});
    const Tensor i = kiln::arange(0, 3, 1, DType::i32);
    const Tensor h = kiln::randn({3}).to(DType::f16);
    const Tensor b = kiln::ones({3}, DType::boolean);
    CHECK((f * 2).dtype() == DType::f32);
    CHECK((f * 2.0).dtype() == DType::f32);
    CHECK((i * 2).dtype() == DType::i32);
    CHECK((i * 2.5).dtype() == DType::f32);
    CHECK((i / 2).dtype() == DType::f32);
    CHECK((h + f).dtype() == DType::f32);
    CHECK((h * 3.0).dtype() == DType::f16);
    CHECK((b + 1).dtype() == DType::i64);
    CHECK((b & (f > 0)).dtype() == DType::boolean);
    CHECK(kiln::exp(i).dtype() == DType::f32);
    const Tensor zero_dim = kiln::full({}, 2.0, DType::f64);
    CHECK((f * zero_dim).dtype() == DType::f32);  // a 0-d tensor does not widen a dimensioned one
}

namespace {
/// Reference reductions on a 3-D float tensor with a plain loop in double.
double ref_reduce(const Tensor& x, unsigned mask, std::int64_t i0, std::int64_t i1, std::int64_t i2, int kind) {
    double acc = kind == 0 ? 0 : kind == 1 ? -INFINITY : 1;
    for (std::int64_t a = 0; a < x.size(0); ++a)
        for (std::int64_t b = 0; b < x.size(1); ++b)
            for (std::int64_t c = 0; c < x.size(2); ++c) {
                if (!(mask & 1) && a != i0) continue;
                if (!(mask & 2) && b != i1) continue;
                if (!(mask & 4) && c != i2) continue;
                const double v = x.at<float>({a, b, c});
                acc = kind == 0 ? acc + v : kind == 1 ? std::max(acc, v) : acc * v;
            }
    return acc;
}
}  // namespace

TEST_CASE("reductions over every axis subset, keepdim, against a float64 loop") {
    const Tensor x = Tensor(kiln::rand({5, 7, 300}) + 0.5);
    for (unsigned mask = 1; mask < 8; ++mask) {
        std::vector<std::int64_t> axes;
        for (int d = 0; d < 3; ++d)
            if (mask & (1u << d)) axes.push_back(d - 3);  // negative axes
        INFO("mask " << mask);
        const Tensor s = kiln::sum(x, axes, true), m = kiln::max(x, axes, true), p = kiln::prod(x * 0.0 + 1.001, axes, true);
        const Tensor mu = kiln::mean(x, axes);
        for (std::int64_t a = 0; a < s.size(0); ++a)
            for (std::int64_t b = 0; b < s.size(1); ++b)
                for (std::int64_t c = 0; c < s.size(2); c += 37) {
                    const double rs = ref_reduce(x, mask, a, b, c, 0);
                    CHECK(s.at<float>({a, b, c}) == doctest::Approx(rs).epsilon(1e-6));
                    CHECK(m.at<float>({a, b, c}) == static_cast<float>(ref_reduce(x, mask, a, b, c, 1)));
                }
        std::int64_t n = 1;
        for (auto ax : axes) n *= x.size(ax);
        // the base is the f32 nearest 1.001; f32 products of up to 10500 terms, relative error < 1e-4
        CHECK(p.item<double>(0) == doctest::Approx(std::pow(static_cast<double>(1.001f), static_cast<double>(n))).epsilon(1e-4));
        CHECK(mu.numel() * n == x.numel());
    }
}

TEST_CASE("a reduction of an expression does not materialize the expression") {
    const Tensor x = kiln::randn({256, 1000});
    const Tensor y = kiln::randn({256, 1000});
    const std::size_t before = allocations();
    const Tensor s = kiln::sum(x * y, 1);
    CHECK(allocations() - before == 1);  // only the (256,) result
    const Tensor ref = kiln::sum(kiln::eager(x * y), 1);
    CHECK(maxdiff(s, ref) < 1e-5);
    const Tensor full_sum = kiln::sum(x * y);
    double acc = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) acc += static_cast<double>(x.item<float>(i)) * y.item<float>(i);
    CHECK(full_sum.item<double>() == doctest::Approx(acc).epsilon(1e-6));
}

TEST_CASE("reduction dtypes, empty inputs and NaN") {
    const Tensor i = kiln::randint(-100, 100, {10, 20}, DType::i32);
    const Tensor si = kiln::sum(i, 1);
    CHECK(si.dtype() == DType::i64);
    std::int64_t r0 = 0;
    for (std::int64_t j = 0; j < 20; ++j) r0 += i.at<std::int32_t>({0, j});
    CHECK(si.at<std::int64_t>({0}) == r0);
    const Tensor bools = kiln::randn({1000}) > 0.0;
    std::int64_t count = 0;
    for (std::int64_t k = 0; k < 1000; ++k) count += bools.item<bool>(k);
    CHECK(kiln::sum(bools).item<std::int64_t>() == count);
    CHECK(kiln::max(i).dtype() == DType::i32);
    CHECK(kiln::sum(kiln::zeros({0, 3}), 0).item<double>(2) == 0);
    CHECK_THROWS_AS(kiln::max(kiln::zeros({0, 3}), 0), kiln::ValueError);
    Tensor x = kiln::randn({4, 50});
    x.at<float>({2, 17}) = NAN;
    CHECK(std::isnan(kiln::max(x, 1).item<float>(2)));
    CHECK(!std::isnan(kiln::max(x, 1).item<float>(1)));
    CHECK(kiln::argmax(x, 1).item<std::int64_t>(2) == 17);
    CHECK(std::isnan(kiln::sum(x).item<float>()));
}

TEST_CASE("argmax/argmin, var/std, logsumexp against references") {
    const Tensor x = kiln::randn({6, 333});
    const Tensor am = kiln::argmax(x, 1), an = kiln::argmin(x, -1, true);
    CHECK(an.shape() == Shape{6, 1});
    for (std::int64_t r = 0; r < 6; ++r) {
        std::int64_t best = 0, worst = 0;
        double mean = 0, lse_max = -INFINITY;
        for (std::int64_t c = 0; c < 333; ++c) {
            const float v = x.at<float>({r, c});
            if (v > x.at<float>({r, best})) best = c;
            if (v < x.at<float>({r, worst})) worst = c;
            mean += v / 333.0;
            lse_max = std::max(lse_max, static_cast<double>(v));
        }
        double ss = 0, se = 0;
        for (std::int64_t c = 0; c < 333; ++c) {
            ss += std::pow(x.at<float>({r, c}) - mean, 2);
            se += std::exp(x.at<float>({r, c}) - lse_max);
        }
        CHECK(am.at<std::int64_t>({r}) == best);
        CHECK(an.at<std::int64_t>({r, 0}) == worst);
        CHECK(kiln::var(x, 1).item<double>(r) == doctest::Approx(ss / 332).epsilon(1e-5));
        CHECK(kiln::var(x, 1, false, 0).item<double>(r) == doctest::Approx(ss / 333).epsilon(1e-5));
        CHECK(kiln::std(x, 1).item<double>(r) == doctest::Approx(std::sqrt(ss / 332)).epsilon(1e-5));
        CHECK(kiln::logsumexp(x, 1).item<double>(r) == doctest::Approx(lse_max + std::log(se)).epsilon(1e-6));
    }
    CHECK(kiln::argmax(x).item<std::int64_t>() == kiln::argmax(x.flatten(), 0).item<std::int64_t>());
    const Tensor neg_inf = kiln::full({2, 3}, -INFINITY);
    CHECK(kiln::logsumexp(neg_inf, 1).item<float>(0) == -INFINITY);
}

TEST_CASE("softmax, log_softmax and layer_norm against float64") {
    const Tensor x = Tensor(kiln::randn({17, 129}) * 3.0);
    const Tensor w = kiln::randn({129}), b = kiln::randn({129});
    const Tensor sm = kiln::softmax(x), lsm = kiln::log_softmax(x, 1), ln = kiln::layer_norm(x, 1, w, b);
    for (std::int64_t r = 0; r < 17; ++r) {
        double mx = -INFINITY, s = 0, mean = 0, var = 0;
        for (std::int64_t c = 0; c < 129; ++c) mx = std::max(mx, static_cast<double>(x.at<float>({r, c})));
        for (std::int64_t c = 0; c < 129; ++c) s += std::exp(x.at<float>({r, c}) - mx);
        for (std::int64_t c = 0; c < 129; ++c) mean += x.at<float>({r, c}) / 129.0;
        for (std::int64_t c = 0; c < 129; ++c) var += std::pow(x.at<float>({r, c}) - mean, 2) / 129.0;
        double row = 0;
        for (std::int64_t c = 0; c < 129; ++c) {
            const double v = x.at<float>({r, c});
            row += sm.at<float>({r, c});
            CHECK(sm.at<float>({r, c}) == doctest::Approx(std::exp(v - mx) / s).epsilon(1e-5));
            CHECK(lsm.at<float>({r, c}) == doctest::Approx(v - mx - std::log(s)).epsilon(1e-5));
            const double ref = (v - mean) / std::sqrt(var + 1e-5) * w.at<float>({c}) + b.at<float>({c});
            CHECK(ln.at<float>({r, c}) == doctest::Approx(ref).epsilon(1e-4));
        }
        CHECK(row == doctest::Approx(1.0).epsilon(1e-5));
    }
    CHECK_THROWS_AS(kiln::layer_norm(x, 1, kiln::ones({128})), kiln::ShapeError);
}

TEST_CASE("composites match their float64 definitions") {
    const Tensor x = Tensor(kiln::randn({2000}) * 4.0);
    const Tensor g = kiln::gelu(x), gt = kiln::gelu_tanh(x), si = kiln::silu(x), sp = kiln::softplus(Tensor(x * 8.0));
    const Tensor cl = kiln::clamp(x, -1.0, 2.0), sq = kiln::square(x);
    const Tensor a = kiln::randn({2000}), bb = kiln::randn({2000}), wt = kiln::rand({2000});
    const Tensor l1 = kiln::lerp(a, bb, 0.25), l2 = kiln::lerp(a, bb, 0.75), l3 = kiln::lerp(a, bb, wt);
    for (std::int64_t i = 0; i < 2000; i += 3) {
        const double v = x.item<double>(i);
        CHECK(g.item<double>(i) == doctest::Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).epsilon(1e-5));
        CHECK(gt.item<double>(i) == doctest::Approx(0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))).epsilon(1e-5));
        CHECK(si.item<double>(i) == doctest::Approx(v / (1 + std::exp(-v))).epsilon(1e-5));
        const double v8 = static_cast<float>(v * 8.0);
        CHECK(sp.item<double>(i) == doctest::Approx(v8 > 20 ? v8 : std::log1p(std::exp(v8))).epsilon(1e-5));
        CHECK(cl.item<double>(i) == std::min(std::max(v, -1.0), 2.0));
        CHECK(sq.item<double>(i) == doctest::Approx(v * v).epsilon(1e-6));
        const double av = a.item<double>(i), bv = bb.item<double>(i), wv = wt.item<double>(i);
        CHECK(l1.item<double>(i) == doctest::Approx(av + 0.25 * (bv - av)).epsilon(1e-5));
        CHECK(l2.item<double>(i) == doctest::Approx(av + 0.75 * (bv - av)).epsilon(1e-5));
        CHECK(l3.item<double>(i) == doctest::Approx(av + wv * (bv - av)).epsilon(1e-5));
    }
    CHECK(Tensor(kiln::lerp(a, bb, 1.0)).item<double>(5) == bb.item<double>(5));  // exact at the far end
    const Tensor with_nan = kiln::full({3}, NAN);
    CHECK(std::isnan(Tensor(kiln::clamp(with_nan, 0.0, 1.0)).item<float>(0)));
}

TEST_CASE("matmul: 2-D, vectors, broadcast batches, transposed layouts, integer and half dtypes") {
    auto naive = [](const Tensor& a, const Tensor& b) {  // (m,k) @ (k,n) in double
        Tensor c = kiln::zeros({a.size(0), b.size(1)}, DType::f64);
        for (std::int64_t i = 0; i < a.size(0); ++i)
            for (std::int64_t j = 0; j < b.size(1); ++j) {
                double s = 0;
                for (std::int64_t k = 0; k < a.size(1); ++k) s += a.item<double>(i * a.size(1) + k) * b.item<double>(k * b.size(1) + j);
                c.at<double>({i, j}) = s;
            }
        return c;
    };
    const Tensor a = kiln::randn({37, 19}), b = kiln::randn({19, 23});
    CHECK(maxdiff(kiln::matmul(a, b), naive(a, b)) < 1e-5);
    const Tensor at = kiln::randn({19, 37}).t(), bt = kiln::randn({23, 19}).t();  // column-major views
    CHECK(maxdiff(kiln::matmul(at, bt), naive(at.contiguous(), bt.contiguous())) < 1e-5);
    const Tensor v = kiln::randn({19});
    CHECK(kiln::matmul(a, v).shape() == Shape{37});
    CHECK(kiln::matmul(v, b).shape() == Shape{23});
    CHECK(kiln::matmul(v, v).shape() == Shape{});
    CHECK(kiln::matmul(v, v).item<double>() == doctest::Approx(kiln::sum(v * v).item<double>()).epsilon(1e-5));
    const Tensor ba = kiln::randn({2, 1, 5, 7}), bb = kiln::randn({3, 7, 4});
    const Tensor bc = kiln::matmul(ba, bb);
    CHECK(bc.shape() == Shape{2, 3, 5, 4});
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 3; ++j)
            CHECK(maxdiff(bc.select(0, i).select(0, j), naive(ba.select(0, i).select(0, 0).contiguous(), bb.select(0, j).contiguous())) < 1e-5);
    const Tensor ia = kiln::randint(-5, 5, {8, 9}, DType::i32), ib = kiln::randint(-5, 5, {9, 4}, DType::i32);
    const Tensor ic = kiln::matmul(ia, ib);
    CHECK(ic.dtype() == DType::i32);
    CHECK(maxdiff(ic, naive(ia, ib)) == 0);
    const Tensor ha = a.to(DType::f16), hb = b.to(DType::f16);
    const Tensor hc = kiln::matmul(ha, hb);
    CHECK(hc.dtype() == DType::f16);
    CHECK(maxdiff(hc, naive(ha, hb)) < 4e-3);
    const Tensor big_a = kiln::randn({300, 200}), big_b = kiln::randn({200, 100});  // threaded path
    CHECK(maxdiff(kiln::matmul(big_a, big_b), naive(big_a, big_b)) < 1e-4);
    // an expression operand is evaluated first, then multiplied
    CHECK(maxdiff(kiln::matmul(a * 2.0, b), Tensor(kiln::matmul(a, b) * 2.0)) < 1e-5);
}

TEST_CASE("matmul (kiln's CPU GEMM): block edges, strided, transposed and broadcast operands, f64, any thread count") {
    // reference in double over contiguous copies
    auto reference = [](const Tensor& a, const Tensor& b) {
        const Tensor ad = a.to(DType::f64).contiguous(), bd = b.to(DType::f64).contiguous();
        const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
        Tensor c = kiln::zeros({m, n}, DType::f64);
        const double* pa = static_cast<const double*>(ad.data_ptr());
        const double* pb = static_cast<const double*>(bd.data_ptr());
        double* pc = static_cast<double*>(c.data_ptr());
        for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t p = 0; p < k; ++p)
                for (std::int64_t j = 0; j < n; ++j) pc[i * n + j] += pa[i * k + p] * pb[p * n + j];
        return c;
    };
    auto check = [&](const Tensor& a, const Tensor& b, double tol) {
        const Tensor ref = reference(a, b);
        const double scale = std::sqrt(static_cast<double>(a.size(1)));
        for (int threads : {1, 2, 3}) {
            kiln::set_num_threads(threads);
            const Tensor c = kiln::matmul(a, b);
            INFO("m=" << a.size(0) << " k=" << a.size(1) << " n=" << b.size(1) << " threads=" << threads);
            CHECK(c.dtype() == a.dtype());
            CHECK(maxdiff(c, ref) < tol * scale);
        }
        kiln::set_num_threads(kiln::detail::default_thread_count());
    };
    // shapes (m, k, n) around the register tile (8 or 6 rows, 32 or 16 columns), the k block (1024
    // f32, 512 f64) and the row block (384 rows on AVX-512, 288 otherwise), and wide ones that
    // threads split by columns
    const std::vector<std::array<std::int64_t, 3>> shapes = {
        {1, 1, 1}, {2, 3, 2}, {7, 5, 33}, {8, 16, 32}, {9, 17, 31}, {15, 511, 47}, {16, 512, 64}, {17, 513, 65},
        {64, 300, 96}, {33, 1023, 20}, {24, 1024, 33}, {10, 1025, 40}, {289, 20, 50}, {385, 30, 70}, {9, 4, 2100}, {193, 3, 2050}};
    for (const auto& [m, k, n] : shapes) {
        check(kiln::randn({m, k}), kiln::randn({k, n}), 2e-6);                      // row-major
        check(kiln::randn({k, m}).t(), kiln::randn({n, k}).t(), 2e-6);              // both transposed (x @ W^T)
        check(kiln::randn({m, 2 * k}).slice(1, 0, 2 * k, 2), kiln::randn({k, 3 * n}).slice(1, 0, 3 * n, 3), 2e-6);  // strided
        check(kiln::randn({m, k}, DType::f64), kiln::randn({n, k}, DType::f64).t(), 1e-14);
    }
    // broadcast operands (stride 0), read in place
    check(kiln::randn({1, 40}).expand({37, 40}), kiln::randn({40, 1}).expand({40, 45}), 2e-6);
    // batched, with a broadcast batch dim
    const Tensor ba = kiln::randn({3, 1, 20, 30}), bb = kiln::randn({4, 50, 30}).transpose(1, 2);
    const Tensor bc = kiln::matmul(ba, bb);
    REQUIRE(bc.shape() == Shape{3, 4, 20, 50});
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 4; ++j)
            CHECK(maxdiff(bc.select(0, i).select(0, j), reference(ba.select(0, i).select(0, 0), bb.select(0, j))) < 1e-5);
    // batches fewer than the threads: each product split into blocks, at its batch's offsets
    for (int threads : {2, 3}) {
        kiln::set_num_threads(threads);
        const Tensor pa = kiln::randn({2, 200, 100}), pb = kiln::randn({2, 150, 100}).transpose(1, 2);
        const Tensor pc = kiln::matmul(pa, pb);
        for (std::int64_t i = 0; i < 2; ++i) CHECK(maxdiff(pc.select(0, i), reference(pa.select(0, i), pb.select(0, i))) < 1e-4);
    }
    kiln::set_num_threads(kiln::detail::default_thread_count());
    // NaN and infinity reach only the outputs whose row or column holds them (the zero padding of
    // partial tiles does not leak them)
    Tensor na = kiln::randn({9, 20}), nb = kiln::randn({20, 33});
    na.at<float>({8, 3}) = NAN;
    nb.at<float>({5, 32}) = INFINITY;
    const Tensor nc = kiln::matmul(na, nb);
    for (std::int64_t i = 0; i < 9; ++i)
        for (std::int64_t j = 0; j < 33; ++j) {
            const float v = nc.at<float>({i, j});
            if (i == 8) CHECK(std::isnan(v));
            else if (j == 32) CHECK(std::isinf(v));
            else CHECK(std::isfinite(v));
        }
    // (..., m, k) @ (k, n) folds the batch into the rows: rows that share one stride, and rows
    // that do not (a transposed batch), which are copied first
    const Tensor w2 = kiln::randn({30, 40}).t();
    const Tensor a4 = kiln::randn({2, 3, 5, 40});
    const Tensor c4 = kiln::matmul(a4, w2);
    REQUIRE(c4.shape() == Shape{2, 3, 5, 30});
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 3; ++j) CHECK(maxdiff(c4.select(0, i).select(0, j), reference(a4.select(0, i).select(0, j), w2)) < 1e-5);
    const Tensor a3 = kiln::randn({5, 3, 40}).transpose(0, 1);
    const Tensor c3 = kiln::matmul(a3, w2);
    REQUIRE(c3.shape() == Shape{3, 5, 30});
    for (std::int64_t i = 0; i < 3; ++i) CHECK(maxdiff(c3.select(0, i), reference(a3.select(0, i), w2)) < 1e-5);
    CHECK(kiln::matmul(kiln::randn({0, 4, 40}), w2).shape() == Shape{0, 4, 30});
    // the same bits whatever the thread count
    const Tensor x = kiln::randn({300, 500}), w = kiln::randn({700, 500});
    kiln::set_num_threads(1);
    const Tensor one = kiln::matmul(x, w.t());
    kiln::set_num_threads(2);
    const Tensor two = kiln::matmul(x, w.t());
    kiln::set_num_threads(kiln::detail::default_thread_count());
    CHECK(maxdiff(one, two) == 0);
}

TEST_CASE("results do not depend on the thread count") {
    const Tensor x = kiln::randn({512, 300});
    kiln::set_num_threads(1);
    const Tensor one = Tensor(kiln::gelu_tanh(x) * kiln::exp(-x));
    const Tensor s1 = kiln::sum(x, 1);
    kiln::set_num_threads(2);
    const Tensor two = Tensor(kiln::gelu_tanh(x) * kiln::exp(-x));
    const Tensor s2 = kiln::sum(x, 1);
    CHECK(maxdiff(one, two) == 0);
    CHECK(maxdiff(s1, s2) == 0);
}

TEST_CASE("matmul of broadcast (stride 0) operands reads each row and column correctly") {
    // expand() gives stride 0 along the broadcast dim: not a layout Eigen can map, so it is copied
    const Tensor row = kiln::arange(0, 1024, 1).reshape({1, 1024}).expand({4, 1024});
    const Tensor w = kiln::ones({1024, 2});
    const Tensor c = kiln::matmul(row, w);
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 2; ++j) CHECK(c.at<float>({i, j}) == doctest::Approx(1023.0 * 1024.0 / 2));
    const Tensor col = kiln::arange(1, 4, 1).reshape({3, 1}).expand({3, 5});  // each row constant
    const Tensor v = kiln::arange(0, 5, 1).reshape({5, 1});
    const Tensor d = kiln::matmul(col, v);
    for (std::int64_t i = 0; i < 3; ++i) CHECK(d.at<float>({i, 0}) == doctest::Approx(10.0 * static_cast<double>(i + 1)));
    const Tensor scalar_row = kiln::full({1, 1}, 2.0).expand({1, 6});  // rows == 1, column stride 0
    CHECK(kiln::matmul(scalar_row, kiln::ones({6, 1})).item<float>() == 12.0f);
}
