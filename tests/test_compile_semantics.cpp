// kiln::compile semantics that must match eager exactly: full and dynamic reductions followed by
// work of other shapes, writes into views and into arguments and captured tensors
// (functionalization), several outputs from one kernel, expression results, and compiles that
// do not block calls of cached programs.
#include <doctest/doctest.h>

#include <kiln/kiln.hpp>

#include "test_util.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <tuple>
#include <vector>

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

using kiln_test::maxdiff;

/// Runs fn compiled and eagerly (as written) on the same arguments; returns the largest difference.
template <class F, class... A>
double compiled_vs_eager(F fn, const A&... args) {
    auto c = kiln::compile(fn);
    const Tensor got = c(args...);
    const Tensor want = fn(args...);
    CHECK(got.dtype() == want.dtype());
    return maxdiff(got, want);
}

}  // namespace

TEST_CASE("reductions to a scalar and reductions followed by work of another shape compile (no InternalError)") {
    kiln::manual_seed(13);
    const Tensor x = kiln::randn({3, 4});
    // each of these threw "fuser: row member %N cannot be stored" on the CPU and on CUDA
    CHECK(compiled_vs_eager([](const Tensor& t) { return kiln::mean(t); }, x) < 1e-6);
    CHECK(compiled_vs_eager([](const Tensor& t) { return Tensor(kiln::tan(kiln::min(t))); }, x) < 1e-6);
    const Tensor big = kiln::randn({6, 4});
    CHECK(compiled_vs_eager([](const Tensor& t) { return Tensor(kiln::max(t, 0) * -0.75); }, big.slice(0, 0, 6, 2)) == 0);
    const Tensor a = kiln::randn({1, 1}), b = kiln::randn({1, 1});
    CHECK(compiled_vs_eager([](const Tensor& p, const Tensor& q) { return kiln::mean(p * q, 1); }, a, b) < 1e-6);
    CHECK(compiled_vs_eager([](const Tensor& t) { return Tensor(kiln::sum(t, {}, true) - t.slice(0, 0, 1)); }, x) < 1e-6);
    CHECK(compiled_vs_eager([](const Tensor& t) { return Tensor(kiln::max(t, 0) * 2); }, x) == 0);
    // cross-entropy with the target logit picked by a one-hot mask
    const Tensor logits = kiln::randn({5, 7});
    const Tensor target = kiln::randint(0, 7, {5, 1}, DType::i64);
    auto xent = [](const Tensor& l, const Tensor& t) {
        const Tensor picked = kiln::sum(kiln::where(kiln::arange(7) == t, l, 0.0), 1);
        return Tensor(kiln::logsumexp(l, 1) - picked);
    };
    CHECK(compiled_vs_eager(xent, logits, target) < 1e-6);
    // and against a float64 loop reference
    const Tensor got = kiln::compile(xent)(logits, target);
    for (int r = 0; r < 5; ++r) {
        double m = -1e300, s = 0;
        for (int c = 0; c < 7; ++c) m = std::max(m, static_cast<double>(logits.at<float>({r, c})));
        for (int c = 0; c < 7; ++c) s += std::exp(static_cast<double>(logits.at<float>({r, c})) - m);
        const double want = std::log(s) + m - logits.at<float>({r, static_cast<std::int64_t>(target.at<std::int64_t>({r, 0}))});
        CHECK(std::abs(got.item<double>(r) - want) < 1e-5);
    }
}

TEST_CASE("a mean over a dim that became dynamic divides by the size of each call") {
    auto f = kiln::compile([](const Tensor& t) { return kiln::mean(t, -2, true); });
    auto v = kiln::compile([](const Tensor& t) { return kiln::var(t, {0, 2}); });
    for (const Shape& s : {Shape{7, 13, 16}, Shape{3, 33, 64}, Shape{2, 64, 16}, Shape{5, 9, 3}}) {
        const Tensor t = kiln::randn(s);
        CHECK(maxdiff(f(t), kiln::mean(t, -2, true)) < 1e-5);
        CHECK(maxdiff(v(t), kiln::var(t, {0, 2})) < 1e-4);
    }
    CHECK(f.compiles() == 2);  // the third size reuses the dynamic program (and divides by its size)
    CHECK(v.compiles() == 2);
}

TEST_CASE("writes into views inside compile are functionalized: slices, steps, copy_, fill_, clone") {
    const Tensor u = kiln::randn({6, 7});
    // the numpy stencil un[1:-1, 1:-1] = expr, on a clone
    auto stencil = [](const Tensor& uu) {
        Tensor un = uu.clone();
        un.slice(0, 1, -1).slice(1, 1, -1).assign(uu.slice(0, 1, -1).slice(1, 1, -1) * 0.5 + uu.slice(0, 0, -2).slice(1, 1, -1) * 0.25 +
                                                  uu.slice(0, 2, uu.size(0)).slice(1, 1, -1) * 0.25);
        return un;
    };
    auto cs = kiln::compile(stencil);
    CHECK(maxdiff(cs(u), stencil(u)) == 0);
    CHECK(cs.graph_breaks().empty());  // clone() is traced, not a graph break
    CHECK(maxdiff(cs(u), stencil(u)) == 0);  // the cached program
    // copy_ of a traced value into an interior strided slice, and a step slice
    auto interior = [](const Tensor& x) {
        Tensor y = Tensor(x * 1.0);
        y.slice(0, 1, -1).slice(1, 1, -1).copy_(Tensor(x.slice(0, 0, -2).slice(1, 1, -1) * 2));
        y.slice(1, 0, 7, 3).fill_(-1.5);
        return y;
    };
    CHECK(compiled_vs_eager(interior, u) == 0);
    // a view taken before a write sees the write; transposed writes
    auto seen = [](const Tensor& x) {
        Tensor y = x.clone();
        const Tensor v = y.slice(0, 0, 2);
        y.slice(0, 1, 3).fill_(7);
        y.t().slice(0, 1, 2).assign(y.t().slice(0, 0, 1) + 100);
        return Tensor(v + 1);
    };
    CHECK(compiled_vs_eager(seen, u) == 0);
    // a tensor made inside the function and filled by slices (what cat does): fresh on every call
    auto cat = [](const Tensor& a, const Tensor& b) {
        Tensor z = kiln::zeros({a.size(0) + b.size(0) + 1, a.size(1)});
        z.slice(0, 0, a.size(0)).copy_(a);
        z.slice(0, a.size(0), a.size(0) + b.size(0)).assign(z.slice(0, a.size(0), a.size(0) + b.size(0)) + b * 2);
        return z;
    };
    const Tensor a = kiln::randn({2, 3}), b = kiln::randn({3, 3});
    auto cc = kiln::compile(cat);
    for (int i = 0; i < 3; ++i) CHECK(maxdiff(cc(a, b), cat(a, b)) == 0);
}

TEST_CASE("writes into arguments and captured tensors are written back after every call, as eager") {
    // into a view of an argument: the caller's tensor changes
    auto fn = [](const Tensor& x) {
        x.slice(0, 1, 3).slice(1, 0, 4, 2).assign(x.slice(0, 0, 2).slice(1, 1, 5, 2) * 10);
        return Tensor(x * 2);
    };
    Tensor a = kiln::randn({4, 5});
    Tensor b = a.clone();
    auto c = kiln::compile(fn);
    for (int i = 0; i < 3; ++i) {
        const Tensor ra = c(a), rb = fn(b);
        CHECK(maxdiff(ra, rb) == 0);
        CHECK(maxdiff(a, b) == 0);
    }
    // an optimizer-like update of a captured tensor, three steps
    Tensor w = kiln::randn({8}), w_ref = w.clone();
    const Tensor g = kiln::randn({8});
    auto step = [&g](Tensor& p) { return [&p, &g](const Tensor& lr) { p.assign(p - g * lr); return Tensor(p * 1.0); }; };
    auto cstep = kiln::compile(step(w));
    auto estep = step(w_ref);
    const Tensor lr = kiln::full({1}, 0.1);
    for (int i = 0; i < 3; ++i) {  // (the fused statement and the compiled kernel may round an ulp apart)
        CHECK(maxdiff(cstep(lr), estep(lr)) < 1e-6);
        CHECK(maxdiff(w, w_ref) < 1e-6);
    }
    CHECK(cstep.compiles() == 1);
    // reading the captured tensor's memory on the host after a traced write sees the write
    Tensor s = kiln::randn({4}), s_ref = s.clone();
    auto rd = [](Tensor& p) { return [&p](const Tensor& x) { p.assign(p + x); const float v = p.item<float>(0); return Tensor(x * v); }; };
    auto crd = kiln::compile(rd(s));
    auto erd = rd(s_ref);
    const Tensor x = kiln::randn({4});
    for (int i = 0; i < 3; ++i) {
        CHECK(maxdiff(crd(x), erd(x)) == 0);
        CHECK(maxdiff(s, s_ref) == 0);
    }
    // a write, a graph break, more writes: every segment's writes land
    auto brk = [](const Tensor& t) {
        Tensor y = t.clone();
        y.slice(0, 0, 1).assign(y.slice(0, 1, 2) * 3);
        const float sum = kiln::sum(y).item<float>();
        y.slice(0, 2, 3).fill_(sum);
        t.slice(0, 3, 4).fill_(sum);
        return y;
    };
    Tensor p = kiln::randn({4, 3}), q = p.clone();
    auto cb = kiln::compile(brk);
    for (int i = 0; i < 2; ++i) {
        CHECK(maxdiff(cb(p), brk(q)) == 0);
        CHECK(maxdiff(p, q) == 0);
    }
    CHECK(cb.graph_breaks().size() == 1);
}

TEST_CASE("dynamic programs: a slice that covered a dim at trace time stays a slice; dims equal at trace time may part") {
    // x[0:2] of a size-2 dim is not the whole dim once the dim is dynamic (found by test_fuzz.cpp)
    auto f = kiln::compile([](const Tensor& x) { return Tensor(x.t().slice(-1, -2, x.size(0)) * 1.0); });
    for (const Shape& s : {Shape{4, 6}, Shape{2, 5}, Shape{13, 5}, Shape{7, 3}}) {
        const Tensor x = kiln::randn(s);
        const Tensor got = f(x);
        CHECK(got.shape() == Shape{s[1], 2});
        CHECK(maxdiff(got, Tensor(x.t().slice(-1, -2, x.size(0)) * 1.0)) == 0);
    }
    // traced at C == D == 2, then called with C = 2, D = 6: a value over D is not a row over C
    auto fn = [](const Tensor& x0, const Tensor& x1) {
        const Tensor t = kiln::sum(Tensor(kiln::logsumexp(x1, -1) * 2), 0, true);
        return Tensor(t + x0);
    };
    auto g = kiln::compile(fn);
    for (const auto& [c, d] : {std::pair{12, 7}, std::pair{2, 2}, std::pair{2, 6}, std::pair{5, 9}}) {
        const Tensor x0 = kiln::randn({d}), x1 = kiln::randn({c, d});
        CHECK(maxdiff(g(x0, x1), fn(x0, x1)) < 1e-5);
    }
}

TEST_CASE("clones are copies: writing into the source later does not change a returned clone") {
    auto fn = [](const Tensor& x) {
        const Tensor c = x.clone();
        x.slice(0, 0, 1).fill_(123);
        return c;
    };
    Tensor a = kiln::randn({5}), b = a.clone();
    auto c = kiln::compile(fn);
    const Tensor got = c(a), want = fn(b);
    CHECK(maxdiff(got, want) == 0);
    CHECK(maxdiff(a, b) == 0);
    CHECK(got.storage() != a.storage());
}

TEST_CASE("results that are distinct tensors in eager stay distinct memory after CSE; one tensor returned twice stays one") {
    const Tensor x = kiln::randn({4, 5});
    auto f = kiln::compile([](const Tensor& t) { return std::tuple{Tensor(t * 2.0), Tensor(t * 2.0), t.clone(), t.clone()}; });
    auto [a, b, c, d] = f(x);
    CHECK(a.storage() != b.storage());
    CHECK(c.storage() != d.storage());
    a.fill_(0.0);
    c.fill_(0.0);
    CHECK(maxdiff(b, Tensor(x * 2.0)) == 0);
    CHECK(maxdiff(d, x) == 0);
    // the same tensor (and a view of it) returned twice alias, as in eager
    auto g = kiln::compile([](const Tensor& t) {
        const Tensor y = t * 3.0;
        return std::tuple{y, y.t()};
    });
    auto [p, q] = g(x);
    CHECK(p.storage() == q.storage());
    p.fill_(1.0);
    CHECK(maxdiff(q, kiln::ones({5, 4})) == 0);
}

TEST_CASE("a write into an argument that another argument shares memory with is a CompileError, not a wrong value") {
    auto fn = [](const Tensor& a, const Tensor& b) {
        a.slice(0, 0, 1).fill_(1.0);
        return Tensor(b * 2.0);  // eager reads the 1s through b when b is a
    };
    auto f = kiln::compile(fn);
    Tensor x = kiln::randn({2, 3}), y = kiln::randn({2, 3});
    const Tensor y0 = y.clone();
    CHECK(maxdiff(f(x, y), Tensor(y0 * 2.0)) == 0);  // distinct arguments: compiled
    CHECK_THROWS_AS(f(x, x), kiln::CompileError);     // the cached program refuses the aliased call
    CHECK_THROWS_AS(kiln::compile(fn)(y, y.slice(0, 0, 1)), kiln::CompileError);  // and so does a first trace
    // a captured tensor that the function writes into, passed as an argument too
    Tensor w = kiln::zeros({3});
    auto g = kiln::compile([&w](const Tensor& t) {
        w.fill_(5.0);
        return Tensor(t + 1.0);
    });
    CHECK(maxdiff(g(y), Tensor(y + 1.0)) == 0);
    CHECK_THROWS_AS(g(w), kiln::CompileError);
}

TEST_CASE("bools compile as eager computes them: sums, bool + bool (logical or), fills, conversions on writes") {
    kiln::manual_seed(3);
    const Tensor b = kiln::randint(0, 2, {9}, DType::boolean), b2 = kiln::randint(0, 2, {1, 7}, DType::boolean);
    CHECK(kiln::compile([](const Tensor& t) { return kiln::sum(t); })(b).item<std::int64_t>() == kiln::sum(b).item<std::int64_t>());
    CHECK(maxdiff(kiln::compile([](const Tensor& t) { return kiln::sum(t, 0); })(b2), kiln::sum(b2, 0)) == 0);
    // True + True is True (torch); written into a float tensor it is 1, not 2
    Tensor d = kiln::zeros({9}, DType::f64);
    d.assign(b + b);
    CHECK(maxdiff(d, kiln::cast(b, DType::f64)) == 0);
    CHECK(maxdiff(kiln::compile([](const Tensor& t) { return Tensor(kiln::cast(t + t, DType::f32) * 3); })(b),
                  Tensor(kiln::cast(b, DType::f32) * 3)) == 0);
    auto fill = kiln::compile([](const Tensor& t) { Tensor c = t.clone(); c.slice(-1, -2, t.size(-1)).fill_(1); return c; });
    const Tensor filled = fill(kiln::zeros({2, 4}, DType::boolean));
    for (std::int64_t i = 0; i < 8; ++i) CHECK(filled.item<int>(i) == (i % 4 >= 2 ? 1 : 0));
    auto conv = kiln::compile([](const Tensor& x, const Tensor& y) { x.slice(0, 0, x.size(0), 2).assign(y); return Tensor(x * 1); });
    Tensor xf = kiln::randn({5});
    const Tensor r = conv(xf, kiln::full({}, 1.0, DType::boolean));
    CHECK(r.item<float>(0) == 1.0f);
    CHECK(xf.item<float>(4) == 1.0f);
}

TEST_CASE("several outputs that share work are one kernel (Black-Scholes call and put)") {
    const std::int64_t n = 4096;
    const Tensor S = kiln::rand({n}) * 50 + 50, K = kiln::rand({n}) * 50 + 50, T = kiln::rand({n}) + 0.25;
    const double r = 0.02, vol = 0.3;
    auto ncdf = [](const auto& z) { return 0.5 * (1.0 + kiln::erf(z * 0.7071067811865476)); };
    auto bs = [&](const Tensor& s, const Tensor& k, const Tensor& t) {
        const Tensor sq = Tensor(kiln::sqrt(t) * vol);
        const Tensor d1 = Tensor((kiln::log(s / k) + t * (r + 0.5 * vol * vol)) / sq);
        const Tensor d2 = Tensor(d1 - sq);
        const Tensor disc = Tensor(k * kiln::exp(t * -r));
        const Tensor call = Tensor(s * ncdf(d1) - disc * ncdf(d2));
        const Tensor put = Tensor(disc * ncdf(-d2) - s * ncdf(-d1));
        return std::make_tuple(call, put);
    };
    auto c = kiln::compile(bs);
    const auto [call, put] = c(S, K, T);
    const auto [call_ref, put_ref] = bs(S, K, T);
    CHECK(maxdiff(call, call_ref) < 1e-5);
    CHECK(maxdiff(put, put_ref) < 1e-5);
    CHECK(c.kernels() == 1);
    // put-call parity against a float64 reference: C - P = S - K exp(-rT)
    for (std::int64_t i = 0; i < n; i += 97)
        CHECK(std::abs((call.item<double>(i) - put.item<double>(i)) -
                       (S.item<double>(i) - K.item<double>(i) * std::exp(-r * T.item<double>(i)))) < 1e-3);
}

TEST_CASE("compiled functions may return expressions, also inside tuples and vectors") {
    const Tensor x = kiln::randn({4, 6}), b = kiln::randn({6});
    auto f = kiln::compile([](const Tensor& t, const Tensor& bb) { return kiln::softmax(t, -1) + kiln::sum(t, -1, true) * bb; });
    const Tensor got = f(x, b);
    CHECK(maxdiff(got, Tensor(kiln::softmax(x, -1) + kiln::sum(x, -1, true) * b)) < 1e-6);
    auto g = kiln::compile([](const Tensor& t) { return std::make_tuple(t * 2, kiln::exp(t), t); });
    const auto [two, ex, same] = g(x);
    CHECK(maxdiff(two, Tensor(x * 2)) == 0);
    CHECK(maxdiff(ex, Tensor(kiln::exp(x))) == 0);
    CHECK(maxdiff(same, x) == 0);
    auto h = kiln::compile([](const Tensor& t) { return std::vector{t + 1, t + 2}; });  // one expression type
    const std::vector<Tensor> v = h(x);
    REQUIRE(v.size() == 2);
    CHECK(maxdiff(v[1], Tensor(x + 2)) == 0);
    auto n = kiln::compile([](const Tensor& t) { return t * 3; }, {.backend = kiln::Backend::none});
    CHECK(maxdiff(n(x), Tensor(x * 3)) == 0);
}

TEST_CASE("a compile does not block calls whose programs are cached") {
    // the custom backend stands in for a slow compile (NVRTC can take 100 ms or more)
    std::atomic<bool> slow{false}, compiling{false};
    kiln::Options opt;
    opt.backend = kiln::Backend::custom;
    opt.dynamic = kiln::Dynamic::off;
    opt.custom_backend = [&](const kiln::ir::Graph&) -> kiln::Executable {
        if (slow) {
            compiling = true;
            for (int i = 0; i < 400 && compiling; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            compiling = false;  // finished (released by the test, or after 2 s)
        }
        return [](const std::vector<Tensor>& in) { return std::vector<Tensor>{Tensor(in[0] + 1)}; };
    };
    auto f = kiln::compile([](const Tensor& t) { return Tensor(t + 1); }, opt);
    const Tensor warm = kiln::zeros({4});
    CHECK(f(warm).item<float>(0) == 1.0f);  // cached from here on
    slow = true;
    std::thread compiler([&] { CHECK(f(kiln::zeros({5})).item<float>(4) == 1.0f); });
    while (!compiling) std::this_thread::yield();
    // 16 threads on the cached shape all finish calls while the other compile is still running
    std::atomic<int> done{0};
    std::vector<std::thread> callers;
    for (int i = 0; i < 16; ++i)
        callers.emplace_back([&] {
            for (int k = 0; k < 10; ++k) CHECK(f(warm).item<float>(0) == 1.0f);
            ++done;
        });
    for (auto& t : callers) t.join();
    const bool finished_while_compiling = compiling;
    compiling = false;  // let the slow compile finish
    compiler.join();
    CHECK(done == 16);
    CHECK(finished_while_compiling);
    CHECK(f.compiles() == 2);
    // a second caller of a shape in flight waits for that compile instead of compiling it again
    compiling = false;
    std::thread first([&] { (void)f(kiln::zeros({6})); });
    while (!compiling) std::this_thread::yield();
    std::thread second([&] { CHECK(f(kiln::zeros({6})).item<float>(5) == 1.0f); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    compiling = false;
    first.join();
    second.join();
    CHECK(f.compiles() == 3);
}

TEST_CASE("a tensor the compiled function makes is fresh on every call: writes into it never go into its memory in place") {
    // read-modify-write of a slice of memory the function made (once at trace time): eager sees
    // zeros there on every call, so must the compiled program (its memory stays untouched)
    auto f = [](const Tensor& b) {
        Tensor z = kiln::zeros({6, 3});
        z.slice(0, 2, 5).assign(z.slice(0, 2, 5) + b * 2);
        return z;
    };
    // the same after a first write (a chain of writes into it), and a whole write read back
    auto g = [](const Tensor& b) {
        Tensor z = kiln::zeros({4, 3});
        z.slice(0, 0, 1).copy_(b.slice(0, 0, 1));
        z.copy_(Tensor(z + b));
        return Tensor(z * 1.0);
    };
    const Tensor b = kiln::randn({3, 3}), c = kiln::randn({4, 3});
    auto cf = kiln::compile(f);
    auto cg = kiln::compile(g);
    for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(maxdiff(cf(b), f(b)) == 0);
        CHECK(maxdiff(cg(c), g(c)) == 0);
    }
}
