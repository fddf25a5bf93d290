// CUDA: statements written into strided views, and kiln::compile's semantics on a device (full
// and dynamic reductions, writes into views, arguments and captured tensors, several outputs in
// one kernel, CUDA graphs with writes), each against the same computation on the CPU. Every test
// returns early with a MESSAGE where no GPU is present.
#include <doctest/doctest.h>

#include <kiln/kiln.hpp>

#include "test_util.hpp"

#include <cmath>
#include <tuple>
#include <vector>

using kiln::Device;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

Tensor dev(const Tensor& t) { return t.to(Device::cuda()); }

using kiln_test::maxdiff;

}  // namespace

TEST_CASE("cuda: a statement written into a strided view (eager, fused, copy_, fill_) matches the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor h = kiln::randn({9, 12}), src = kiln::randn({4, 4});
    Tensor d = dev(h), c = h.clone();
    // every other row and column of an interior block, and a transposed view
    d.slice(0, 1, 9, 2).slice(1, 2, 12, 3).assign(dev(src) * 2 + 1);
    c.slice(0, 1, 9, 2).slice(1, 2, 12, 3).assign(src * 2 + 1);
    CHECK(maxdiff(d, c) == 0);
    d.t().slice(0, 0, 3).copy_(dev(h).t().slice(0, 3, 6));
    c.t().slice(0, 0, 3).copy_(h.t().slice(0, 3, 6));
    CHECK(maxdiff(d, c) == 0);
    d.slice(1, 0, 12, 5).fill_(-3.25);
    c.slice(1, 0, 12, 5).fill_(-3.25);
    CHECK(maxdiff(d, c) == 0);
    // an eager op into a view, with a dtype change and a broadcast source
    d.slice(0, 0, 2).assign(kiln::eager(kiln::cast(dev(kiln::arange(12)), DType::f32)));
    c.slice(0, 0, 2).assign(kiln::eager(kiln::cast(kiln::arange(12), DType::f32)));
    CHECK(maxdiff(d, c) == 0);
}

TEST_CASE("cuda: reductions to a scalar and followed by work of another shape compile and match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = kiln::randn({3, 4}), big = kiln::randn({6, 4});
    auto mean_all = [](const Tensor& t) { return kiln::mean(t); };
    auto tan_min = [](const Tensor& t) { return Tensor(kiln::tan(kiln::min(t))); };
    auto strided = [](const Tensor& t) { return Tensor(kiln::max(t, 0) * -0.75); };
    auto keep_minus_row = [](const Tensor& t) { return Tensor(kiln::sum(t, {}, true) - t.slice(0, 0, 1)); };
    auto col_max = [](const Tensor& t) { return Tensor(kiln::max(t, 0) * 2); };
    CHECK(maxdiff(kiln::compile(mean_all)(dev(x)), mean_all(x)) < 1e-6);
    CHECK(maxdiff(kiln::compile(tan_min)(dev(x)), tan_min(x)) < 1e-6);
    CHECK(maxdiff(kiln::compile(strided)(dev(big).slice(0, 0, 6, 2)), strided(big.slice(0, 0, 6, 2))) == 0);
    CHECK(maxdiff(kiln::compile(keep_minus_row)(dev(x)), keep_minus_row(x)) < 1e-6);
    CHECK(maxdiff(kiln::compile(col_max)(dev(x)), col_max(x)) == 0);
    const Tensor a = kiln::randn({1, 1}), b = kiln::randn({1, 1});
    auto mab = [](const Tensor& p, const Tensor& q) { return kiln::mean(p * q, 1); };
    CHECK(maxdiff(kiln::compile(mab)(dev(a), dev(b)), mab(a, b)) < 1e-6);
    // a mean over a dim that became dynamic
    auto f = kiln::compile([](const Tensor& t) { return kiln::mean(t, -2, true); });
    for (const Shape& s : {Shape{7, 13, 16}, Shape{3, 33, 64}, Shape{2, 64, 16}}) {
        const Tensor t = kiln::randn(s);
        CHECK(maxdiff(f(dev(t)), kiln::mean(t, -2, true)) < 1e-5);
    }
    CHECK(f.compiles() == 2);
}

TEST_CASE("cuda: writes into views, arguments and captured tensors inside compile match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    auto stencil = [](const Tensor& uu) {
        Tensor un = uu.clone();
        un.slice(0, 1, -1).slice(1, 1, -1).assign(uu.slice(0, 1, -1).slice(1, 1, -1) * 0.5 + uu.slice(0, 0, -2).slice(1, 1, -1) * 0.25);
        un.slice(1, 0, uu.size(1), 3).fill_(2);
        return un;
    };
    const Tensor u = kiln::randn({33, 65});
    auto cs = kiln::compile(stencil);
    for (int i = 0; i < 2; ++i) CHECK(maxdiff(cs(dev(u)), stencil(u)) == 0);
    CHECK(cs.graph_breaks().empty());
    // into an argument's view, then into a captured tensor (an optimizer-like step), 3 calls each
    auto fn = [](const Tensor& x) {
        x.slice(0, 1, 3).slice(1, 0, 4, 2).assign(x.slice(0, 0, 2).slice(1, 1, 5, 2) * 10);
        return Tensor(x * 2);
    };
    Tensor hx = kiln::randn({4, 5});
    Tensor dx = dev(hx);
    auto cf = kiln::compile(fn);
    for (int i = 0; i < 3; ++i) {
        CHECK(maxdiff(cf(dx), fn(hx)) == 0);
        CHECK(maxdiff(dx, hx) == 0);
    }
    Tensor hw = kiln::randn({1000});
    Tensor dw = dev(hw);
    const Tensor hg = kiln::randn({1000});
    const Tensor dg = dev(hg);
    auto step = [](Tensor& p, const Tensor& g) { return [&p, &g](const Tensor& lr) { p.assign(p - g * lr); return Tensor(p * 1.0); }; };
    auto cstep = kiln::compile(step(dw, dg));
    auto estep = step(hw, hg);
    for (int i = 0; i < 3; ++i) {
        CHECK(maxdiff(cstep(dev(kiln::full({1}, 0.1))), estep(kiln::full({1}, 0.1))) < 1e-6);
        CHECK(maxdiff(dw, hw) < 1e-6);
    }
}

TEST_CASE("cuda: Black-Scholes call and put are one kernel with two outputs" * doctest::skip(kiln_test::no_cuda())) {
    const std::int64_t n = 1 << 20;
    const Tensor S = kiln::rand({n}) * 50 + 50, K = kiln::rand({n}) * 50 + 50, T = kiln::rand({n}) + 0.25;
    auto ncdf = [](const auto& z) { return 0.5 * (1.0 + kiln::erf(z * 0.7071067811865476)); };
    auto bs = [&](const Tensor& s, const Tensor& k, const Tensor& t) {
        const Tensor sq = Tensor(kiln::sqrt(t) * 0.3);
        const Tensor d1 = Tensor((kiln::log(s / k) + t * 0.065) / sq);
        const Tensor d2 = Tensor(d1 - sq);
        const Tensor disc = Tensor(k * kiln::exp(t * -0.02));
        return std::make_tuple(Tensor(s * ncdf(d1) - disc * ncdf(d2)), Tensor(disc * ncdf(-d2) - s * ncdf(-d1)));
    };
    auto c = kiln::compile(bs);
    const auto [call, put] = c(dev(S), dev(K), dev(T));
    const auto [call_ref, put_ref] = bs(S, K, T);
    CHECK(c.kernels() == 1);
    CHECK(maxdiff(call, call_ref) < 1e-4);
    CHECK(maxdiff(put, put_ref) < 1e-4);
}

TEST_CASE("cuda: reduce_overhead replays programs that write into their arguments" * doctest::skip(kiln_test::no_cuda())) {
    auto fn = [](const Tensor& x, const Tensor& y) {
        x.slice(0, 0, 8).assign(x.slice(0, 0, 8) + y);
        return Tensor(kiln::sum(x.slice(0, 0, 8) * y) + kiln::sum(x));
    };
    Tensor hx = kiln::randn({16}), dx = dev(hx);
    const Tensor hy = kiln::randn({8}), dy = dev(hy);
    auto c = kiln::compile(fn, {.mode = kiln::Mode::reduce_overhead});
    for (int i = 0; i < 5; ++i) {  // run, capture, then replays
        const Tensor got = c(dx, dy);
        const Tensor want = fn(hx, hy);
        CHECK(std::abs(got.item<double>(0) - want.item<double>(0)) < 1e-4 * std::max(1.0, std::abs(want.item<double>(0))));
        CHECK(maxdiff(dx, hx) < 1e-6);
    }
}
