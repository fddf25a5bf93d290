// kiln::compile: tracing, passes, fusion (kernel counts), guards and caches, dynamic shapes,
// graph breaks, backends, diagnostics, and a random-graph fuzzer against eager.
#include <doctest/doctest.h>

#include <kiln/kiln.hpp>
#include <kiln/fuse/fuser.hpp>  // the fuser's plans, inspected directly
#include <kiln/passes/pipeline.hpp>  // the passes, run directly

#include "test_util.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using kiln::DType;
using kiln::Tensor;

namespace {

using kiln_test::maxdiff;

using kiln_test::LogCapture;

}  // namespace

namespace {

/// Traces fn over tensors like args into an optimized graph.
template <class F>
kiln::ir::Graph traced_graph(const std::vector<Tensor>& args, F&& fn) {
    kiln::trace::Tracer tr(nullptr, true);
    kiln::trace::ActiveScope scope(&tr);
    std::vector<Tensor> in;
    for (const Tensor& a : args) in.push_back(tr.input(a));
    const std::vector<Tensor> outs = fn(in);
    kiln::ir::Graph g = tr.graph();
    for (const Tensor& o : outs) g.outputs.push_back(tr.node_of(o));
    return kiln::passes::run_pipeline(g, {});
}

/// The optimized graph of fn, planned, with the GEMM absorbing its epilogues (as the CUDA
/// backend does).
template <class F>
std::pair<kiln::ir::Graph, kiln::fuse::Plan> epilogue_plan(const std::vector<Tensor>& args, F&& fn) {
    kiln::ir::Graph opt = traced_graph(args, std::forward<F>(fn));
    kiln::fuse::Plan plan = kiln::fuse::plan(opt);
    kiln::fuse::absorb_matmul_epilogues(opt, plan);
    return {std::move(opt), std::move(plan)};
}


}  // namespace

TEST_CASE("fuser: a GEMM takes bias, relu, gelu_tanh and exact gelu epilogues and nothing else") {
    using kiln::fuse::Group;
    const Tensor x = kiln::randn({16, 32}), w = kiln::randn({32, 8}), b = kiln::randn({8}), b2 = kiln::randn({1, 8});
    const Tensor x3 = kiln::randn({2, 16, 32}), full = kiln::randn({16, 8}), v = kiln::randn({32});
    auto mm = [](const std::vector<Tensor>& a) { return kiln::matmul(a[0], a[1]); };
    struct Case {
        const char* what;
        std::vector<Tensor> args;
        std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
        int kernels;             // after absorption
        bool bias;               // the matmul group took the bias
        kiln::Act act;           // ... and this activation
    };
    using kiln::Act;
    // the exact gelu as ops/composites.hpp writes it, with a constant of one's own choosing
    auto gelu_with = [](const Tensor& t, double c) { return Tensor(t * 0.5 * (1.0 + kiln::erf(t * c))); };
    const std::vector<Case> cases = {
        {"gelu_tanh(x@w + b)", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu_tanh(mm(a) + a[2]))}; }, 1, true, Act::gelu_tanh},
        {"relu(b + x@w), bias (1, n)", {x, w, b2}, [&](const auto& a) { return std::vector{Tensor(kiln::relu(a[2] + mm(a)))}; }, 1, true, Act::relu},
        {"x@w + b", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(mm(a) + a[2])}; }, 1, true, Act::none},
        {"relu(x@w)", {x, w}, [&](const auto& a) { return std::vector{Tensor(kiln::relu(mm(a)))}; }, 1, false, Act::relu},
        {"batched gelu_tanh(x3@w + b)", {x3, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu_tanh(mm(a) + a[2]))}; }, 1, true, Act::gelu_tanh},
        // not epilogues: a full matrix, a second use of the product, more work after the activation,
        // a dtype change, a vector operand, and an activation the library lacks
        {"x@w + full", {x, w, full}, [&](const auto& a) { return std::vector{Tensor(mm(a) + a[2])}; }, 2, false, Act::none},
        {"x@w returned too", {x, w, b}, [&](const auto& a) { const Tensor m = mm(a); return std::vector{m, Tensor(m + a[2])}; }, 2, false, Act::none},
        {"gelu_tanh(x@w + b) * 2", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu_tanh(mm(a) + a[2]) * 2.0)}; }, 2, false, Act::none},
        {"x@w + b (f64 bias)", {x, w, b.to(DType::f64)}, [&](const auto& a) { return std::vector{Tensor(mm(a) + a[2])}; }, 2, false, Act::none},
        {"x@v + b", {x, v, kiln::randn({16})}, [&](const auto& a) { return std::vector{Tensor(mm(a) + a[2])}; }, 2, false, Act::none},
        {"sigmoid(x@w + b)", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::sigmoid(mm(a) + a[2]))}; }, 2, false, Act::none},
        // the exact gelu's composite, after the bias or straight after the product; not with another constant,
        // with work after it, or with its pre-activation read elsewhere (the bias alone is absorbed then)
        {"gelu(x@w + b)", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu(mm(a) + a[2]))}; }, 1, true, Act::gelu},
        {"gelu(x@w)", {x, w}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu(mm(a)))}; }, 1, false, Act::gelu},
        {"x@w*0.5*(1+erf(x@w*0.6))", {x, w, b}, [&](const auto& a) { return std::vector{gelu_with(Tensor(mm(a) + a[2]), 0.6)}; }, 2, false, Act::none},
        {"gelu(x@w + b) - 1", {x, w, b}, [&](const auto& a) { return std::vector{Tensor(kiln::gelu(mm(a) + a[2]) - 1.0)}; }, 2, false, Act::none},
        {"gelu(x@w + b), x@w + b returned", {x, w, b}, [&](const auto& a) { const Tensor h = Tensor(mm(a) + a[2]); return std::vector{Tensor(kiln::gelu(h)), h}; }, 2, true, Act::none},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        const auto [g, plan] = epilogue_plan(c.args, c.fn);
        CHECK(plan.kernels() == c.kernels);
        const Group& M = plan.groups[0];
        REQUIRE(M.kind == Group::Kind::matmul);
        CHECK((M.bias >= 0) == c.bias);
        CHECK(M.act_kind == c.act);
        CHECK((M.act >= 0) == (c.act != Act::none));
        if (c.kernels == 1) {
            CHECK(M.outputs == std::vector<int>{g.outputs[0]});
            if (c.bias) CHECK(std::find(M.leaves.begin(), M.leaves.end(), M.bias) != M.leaves.end());
            for (int j : M.nodes) CHECK(plan.group_of[static_cast<std::size_t>(j)] == 0);
        }
    }
}

TEST_CASE("fuser: elementwise work on a reduction without keepdim joins its row group only when it is per row") {
    // (5, 5) sum over axis 1 without keepdim is (5,): broadcast against (5, 5) it varies along the
    // columns, not per row, so x - s cannot be computed row by row
    const Tensor x = kiln::randn({5, 5});
    auto f = kiln::compile([](const Tensor& t) { return Tensor(t - kiln::sum(t, {1})); });
    CHECK(maxdiff(f(x), kiln::eager(x - kiln::sum(x, {1}))) < 1e-6);
    auto g = kiln::compile([](const Tensor& t) { return Tensor(t - kiln::sum(t, {0})); });  // per column: fine
    CHECK(maxdiff(g(x), kiln::eager(x - kiln::sum(x, {0}))) < 1e-6);
    // global average pooling of channels-last activations, then a matmul (ResNet's head)
    const Tensor h = kiln::randn({2, 2, 2, 8}), w = kiln::randn({8, 3});
    auto pool = kiln::compile([&](const Tensor& t) { return kiln::matmul(kiln::mean(kiln::relu(t), {1, 2}), w); });
    CHECK(maxdiff(pool(h), kiln::matmul(kiln::mean(kiln::relu(h), {1, 2}), w)) < 1e-5);
}

TEST_CASE("fuser: a group reads at most max_inputs tensors, so a sum of many tensors splits and stays right") {
    std::vector<Tensor> xs;
    for (int i = 0; i < 40; ++i) xs.push_back(i % 3 ? kiln::randn({6, 7}) : kiln::randn({7}));  // some broadcast rows
    auto flat = [](const std::vector<Tensor>& v) {
        Tensor s = v[0];
        for (std::size_t i = 1; i < v.size(); ++i) s = Tensor(s + v[i] * static_cast<double>(i % 4 + 1));
        return std::vector<Tensor>{Tensor(kiln::tanh(s)), kiln::sum(s, 1, true)};
    };
    auto rows = [](const std::vector<Tensor>& v) {  // a row group with many producers and consumers
        Tensor s = v[0];
        for (std::size_t i = 1; i < 20; ++i) s = Tensor(s + v[i]);
        Tensor y = kiln::softmax(s, -1);
        for (std::size_t i = 20; i < v.size(); ++i) y = Tensor(y * (v[i] + 2.0));
        return std::vector<Tensor>{y, Tensor(y - 1.0)};
    };
    for (int limit : {4, 9, 24})
    for (int which : {0, 1}) {
        INFO("max_inputs " << limit << (which ? ", row group" : ", elementwise"));
        const std::function<std::vector<Tensor>(const std::vector<Tensor>&)> body =
            which ? std::function<std::vector<Tensor>(const std::vector<Tensor>&)>(rows) : flat;
        const std::vector<Tensor> want = body(std::vector<Tensor>(xs));  // eager statements
        // the plan itself: every group reads at most `limit` tensors
        const kiln::ir::Graph opt = traced_graph(xs, body);
        const kiln::fuse::Plan plan = kiln::fuse::plan(opt, {.max_inputs = limit, .max_nodes = 1000});
        int widest = 0;
        for (const auto& G : plan.groups) widest = std::max(widest, static_cast<int>(G.leaves.size()));
        CHECK(widest <= limit);
        CHECK(plan.kernels() >= 40 / limit);
        auto f = kiln::compile(body, {.limits = {.max_inputs = limit, .max_nodes = 1000}});
        const std::vector<Tensor> got = f(xs);
        CHECK(f.kernels() == plan.kernels());
        CHECK(maxdiff(got[0], want[0]) < 1e-5);
        CHECK(maxdiff(got[1], want[1]) < 1e-4);
    }
}

TEST_CASE("kernel counts: a+b+c is 1, softmax 1, layer_norm 1, matmul+bias+gelu is the GEMM plus 1") {
    const Tensor a = kiln::randn({16, 32}), b = kiln::randn({32}), c = kiln::randn({16, 32});
    auto abc = kiln::compile([](const Tensor& x, const Tensor& y, const Tensor& z) { return Tensor(x + y + z); });
    CHECK(maxdiff(abc(a, b, c), kiln::eager(a + b + c)) == 0);
    CHECK(abc.kernels() == 1);

    auto sm = kiln::compile([](const Tensor& x) { return kiln::softmax(x, -1); });
    CHECK(maxdiff(sm(a), kiln::softmax(a, -1)) < 1e-6);
    CHECK(sm.kernels() == 1);

    const Tensor w = kiln::randn({32}), bias = kiln::randn({32});
    auto ln = kiln::compile([&](const Tensor& x) { return kiln::layer_norm(x, 1, w, bias); });
    CHECK(maxdiff(ln(a), kiln::layer_norm(a, 1, w, bias)) < 1e-5);
    CHECK(ln.kernels() == 1);

    const Tensor w1 = kiln::randn({32, 64}), b1 = kiln::randn({64});
    auto mlp = kiln::compile([&](const Tensor& x) { return Tensor(kiln::gelu_tanh(kiln::matmul(x, w1) + b1)); });
    CHECK(maxdiff(mlp(a), Tensor(kiln::gelu_tanh(kiln::matmul(a, w1) + b1))) < 1e-6);
    CHECK(mlp.kernels() == 2);

    auto lsm = kiln::compile([](const Tensor& x) { return kiln::log_softmax(x, 1); });
    CHECK(maxdiff(lsm(a), kiln::log_softmax(a, 1)) < 1e-5);
    CHECK(lsm.kernels() == 1);
}

TEST_CASE("eager row composites (softmax, log_softmax, layer_norm, rms_norm) run as one compiled program, against a float64 loop") {
    // rows of a (rows, n) tensor in double, the loop a user would write
    auto rows_ref = [](const Tensor& x, const std::function<void(const double*, double*, std::int64_t)>& row) {
        const Tensor xd = x.to(DType::f64).contiguous();
        Tensor y = kiln::zeros(xd.shape(), DType::f64);
        const std::int64_t n = xd.size(-1), r = xd.numel() / n;
        for (std::int64_t i = 0; i < r; ++i) row(xd.data<double>() + i * n, y.data<double>() + i * n, n);
        return y;
    };
    auto softmax_row = [](bool log) {
        return [log](const double* x, double* y, std::int64_t n) {
            double m = -INFINITY, s = 0;
            for (std::int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
            for (std::int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
            for (std::int64_t j = 0; j < n; ++j) y[j] = log ? x[j] - m - std::log(s) : std::exp(x[j] - m) / s;
        };
    };
    const Tensor w = kiln::randn({96}), b = kiln::randn({96});
    auto norm_row = [&](bool rms, double eps) {
        return [&, rms, eps](const double* x, double* y, std::int64_t n) {
            double mu = 0, v = 0;
            if (!rms)
                for (std::int64_t j = 0; j < n; ++j) mu += x[j] / static_cast<double>(n);
            for (std::int64_t j = 0; j < n; ++j) v += (x[j] - mu) * (x[j] - mu) / static_cast<double>(n);
            for (std::int64_t j = 0; j < n; ++j)
                y[j] = (x[j] - mu) / std::sqrt(v + eps) * w.data<float>()[j] + (rms ? 0.0 : b.data<float>()[j]);
        };
    };
    const kiln::detail::RowCompositeStats before = kiln::detail::row_composite_stats();
    std::int64_t calls = 0;
    for (std::int64_t rows : {7, 130, 1031}) {
        const Tensor x = Tensor(kiln::randn({rows, 96}) * 4);
        CHECK(maxdiff(kiln::softmax(x, -1), rows_ref(x, softmax_row(false))) < 1e-6);
        CHECK(maxdiff(kiln::log_softmax(x, 1), rows_ref(x, softmax_row(true))) < 1e-5);
        CHECK(maxdiff(kiln::layer_norm(x, 1, w, b, 1e-5), rows_ref(x, norm_row(false, 1e-5))) < 1e-4);
        CHECK(maxdiff(kiln::rms_norm(x, kiln::Shape{96}, w, 1e-6), rows_ref(x, norm_row(true, 1e-6))) < 1e-4);
        calls += 4;
    }
    // a transposed operand, softmax over a leading axis, and bf16
    const Tensor xt = kiln::randn({96, 50}).t();
    CHECK(maxdiff(kiln::softmax(xt, 1), rows_ref(xt.contiguous(), softmax_row(false))) < 1e-6);
    const Tensor x0 = kiln::randn({40, 6});
    CHECK(maxdiff(kiln::softmax(x0, 0).t(), rows_ref(x0.t().contiguous(), softmax_row(false))) < 1e-6);
    const Tensor xb = kiln::randn({33, 96}).to(DType::bf16);
    const Tensor yb = kiln::layer_norm(xb, 1, w, b);
    CHECK(yb.dtype() == DType::f32);  // bf16 x with f32 weight promotes, as the statements do
    CHECK(maxdiff(yb, rows_ref(xb, norm_row(false, 1e-5))) < 1e-4);
    calls += 3;
    // an expression operand (softmax(scores * scale), layer_norm(x + residual)) is evaluated once,
    // then the composite's program
    const Tensor s = kiln::randn({130, 96});
    CHECK(maxdiff(kiln::softmax(s * 0.5 + 1, -1), rows_ref(Tensor(s * 0.5 + 1), softmax_row(false))) < 1e-6);
    CHECK(maxdiff(kiln::layer_norm(s + s, 1, w, b, 1e-5), rows_ref(Tensor(s + s), norm_row(false, 1e-5))) < 1e-4);
    calls += 2;
    const kiln::detail::RowCompositeStats after = kiln::detail::row_composite_stats();
    if (std::getenv("KILN_EAGER_COMPOSITES") && std::string(std::getenv("KILN_EAGER_COMPOSITES")) == "0") {
        CHECK(after.calls == before.calls);
    } else {
        CHECK(after.calls - before.calls == calls);
        // 4 ops over 3 row counts: the second count makes the rows dynamic, the third reuses it; the
        // transposed, leading-axis and bf16 calls are programs of their own
        CHECK(after.programs - before.programs <= 4 * 2 + 3);
    }
    // what autograd records, and what a trace sees, take the statements
    const Tensor p = kiln::randn({5, 96}).requires_grad_();
    kiln::sum(kiln::softmax(p, -1)).backward();
    CHECK(p.grad().defined());
    auto traced = kiln::compile([](const Tensor& v) { return kiln::softmax(v, -1); });
    CHECK(maxdiff(traced(p.detach()), kiln::softmax(p.detach(), -1)) < 1e-6);
    CHECK(kiln::detail::row_composite_stats().calls == after.calls + (after.calls == before.calls ? 0 : 1));
    // a bad axis is the reduction's error, naming softmax and this line
    CHECK_THROWS_AS(kiln::softmax(xt, 2), kiln::ShapeError);
}

TEST_CASE("one graph spans statements, loops and helper calls") {
    const Tensor x = kiln::randn({64});
    auto helper = [](const Tensor& t) { return Tensor(kiln::tanh(t) * 0.5); };
    auto f = kiln::compile([&](const Tensor& in) {
        Tensor y = in;
        for (int i = 0; i < 4; ++i) y = helper(y + 1.0);
        return y;
    });
    Tensor ref = x;
    for (int i = 0; i < 4; ++i) ref = kiln::eager(kiln::tanh(ref + 1.0) * 0.5);
    CHECK(maxdiff(f(x), ref) < 1e-6);
    CHECK(f.kernels() == 1);
}

TEST_CASE("a shared subexpression is computed once; dead code disappears") {
    const Tensor x = kiln::randn({8, 8});
    auto f = kiln::compile([](const Tensor& t) {
        const Tensor unused = Tensor(kiln::sin(t) * 3);  // never returned
        (void)unused;
        return Tensor(kiln::exp(t * 2) + kiln::exp(t * 2) * kiln::exp(t * 2));
    });
    CHECK(maxdiff(f(x), kiln::eager(kiln::exp(x * 2) + kiln::exp(x * 2) * kiln::exp(x * 2))) < 1e-6);
    const std::string g = f.graph();
    INFO(g);
    std::size_t exps = 0;
    for (std::size_t p = g.find("exp("); p != std::string::npos; p = g.find("exp(", p + 1)) ++exps;
    CHECK(exps == 1);
    CHECK(g.find("sin(") == std::string::npos);
    CHECK(f.kernels() == 1);
}

TEST_CASE("simplify: identities and cast chains vanish; a sum over a broadcast product is factored") {
    const Tensor x = kiln::randn({6, 5});
    auto f = kiln::compile([](const Tensor& t) { return Tensor(kiln::cast(kiln::cast(t * 1.0 + 0.0, DType::f64), DType::f32)); });
    const Tensor y = f(x);
    CHECK(maxdiff(y, x) == 0);
    // the arithmetic and the casts vanish; what is left is the copy that keeps the result out of
    // the argument's memory (eager returns a new tensor too)
    CHECK(f.kernels() == 1);
    CHECK(f.graph().find("copy(") != std::string::npos);
    CHECK(f.graph().find("mul(") == std::string::npos);
    CHECK(f.graph().find("cast(") == std::string::npos);
    CHECK(y.storage() != x.storage());

    const Tensor a = kiln::randn({7, 40}), b = kiln::randn({7, 30});
    auto outer = kiln::compile([](const Tensor& p, const Tensor& q) {
        return kiln::sum(p.unsqueeze(2) * q.unsqueeze(1), {1, 2});
    });
    const Tensor ref = kiln::sum(kiln::eager(a.unsqueeze(2) * b.unsqueeze(1)), {1, 2});
    CHECK(maxdiff(outer(a, b), ref) < 1e-5);
    const std::string g = outer.graph();
    INFO(g);
    CHECK(g.find("(7, 40, 30)") == std::string::npos);  // the product is never formed
}

TEST_CASE("compiled == eager for every op of the table (broadcast operands)") {
    kiln::manual_seed(5);
    const Tensor pos = Tensor(kiln::rand({5, 7}) + 0.5), neg = Tensor(kiln::randn({7}) * 2);
    const Tensor cond = Tensor(kiln::randn({5, 7}) > 0.0);
    kiln::ops::for_each_op([&](auto tag) {
        using Op = typename decltype(tag)::type;
        SUBCASE(std::string(Op::name).c_str()) {
            auto build = [&](const Tensor& p, const Tensor& q, const Tensor& c) {
                if constexpr (Op::rule == kiln::ops::DTypeRule::where) return Tensor(kiln::expr::make<Op>(DType::f32, c, p, q));
                else if constexpr (Op::rule == kiln::ops::DTypeRule::logical) {
                    if constexpr (Op::arity == 1) return Tensor(kiln::expr::make<Op>(DType::f32, c));
                    else return Tensor(kiln::expr::make<Op>(DType::f32, c, p > 1.0));
                } else if constexpr (Op::rule == kiln::ops::DTypeRule::cast) {
                    return Tensor(kiln::expr::make<Op>(DType::bf16, p * q));
                } else if constexpr (Op::arity == 1) {
                    return Tensor(kiln::expr::make<Op>(DType::f32, p * 0.5));
                } else {
                    return Tensor(kiln::expr::make<Op>(DType::f32, p, q));
                }
            };
            auto f = kiln::compile([&](const Tensor& p, const Tensor& q, const Tensor& c) { return build(p, q, c); });
            const Tensor got = f(pos, neg, cond);
            const Tensor want = build(pos, neg, cond);
            CHECK(got.dtype() == want.dtype());
            CHECK(maxdiff(got, want) == 0);
        }
    });
}

TEST_CASE("guards: each change recompiles exactly as expected") {
    auto f = kiln::compile([](const Tensor& x) { return Tensor(x * 2 + 1); }, {.dynamic = kiln::Dynamic::off});
    const Tensor a = kiln::randn({4, 8});
    (void)f(a);
    (void)f(kiln::randn({4, 8}));  // same guards: no recompile
    CHECK(f.compiles() == 1);
    (void)f(kiln::randn({4, 8}, DType::f64));  // dtype
    CHECK(f.compiles() == 2);
    (void)f(a.t());  // layout (strided)
    CHECK(f.compiles() == 3);
    (void)f(kiln::randn({4, 8, 1}));  // rank
    CHECK(f.compiles() == 4);
    (void)f(kiln::randn({5, 8}));  // size, dynamic off
    CHECK(f.compiles() == 5);
    (void)f(kiln::randn({4, 8}, DType::f64));  // cached
    CHECK(f.compiles() == 5);

    auto g = kiln::compile([](const Tensor& x, double s) { return Tensor(x * s); });
    CHECK(maxdiff(g(a, 2.0), Tensor(a * 2.0)) == 0);
    CHECK(maxdiff(g(a, 3.0), Tensor(a * 3.0)) == 0);  // numbers are guarded by value
    CHECK(g.compiles() == 2);
}

TEST_CASE("automatic dynamic: the second size makes the dim symbolic, a third size reuses the program") {
    LogCapture logs("recompiles");
    auto f = kiln::compile([](const Tensor& x) { return Tensor(kiln::exp(x) - x); });
    for (std::int64_t n : {32, 64, 128, 1000, 7}) {
        const Tensor x = kiln::randn({n, 3});
        CHECK(maxdiff(f(x), kiln::eager(kiln::exp(x) - x)) < 1e-6);
    }
    CHECK(f.compiles() == 2);
    CHECK(logs.contains("recompiling: argument 0 dim 0 was 32, now 64; marking dim 0 dynamic"));
    (void)f(kiln::randn({1, 3}));  // size 1 stays specialized
    CHECK(f.compiles() == 3);

    auto on = kiln::compile([](const Tensor& x) { return kiln::softmax(x, -1); }, {.dynamic = kiln::Dynamic::on});
    for (std::int64_t n : {8, 16, 24}) {
        const Tensor x = kiln::randn({n, 10});
        CHECK(maxdiff(on(x), kiln::softmax(x, -1)) < 1e-6);
    }
    CHECK(on.compiles() == 1);
}

TEST_CASE("dynamic shapes through views: permutes, splits and slices of other dims follow; a sliced or merged dynamic dim specializes") {
    struct Case {
        const char* name;
        std::function<Tensor(const Tensor&, const Tensor&)> fn;
        int compiles;  // after five sizes: 2 when the views follow the batch dim, 5 when they cannot
    };
    const std::vector<Case> cases = {
        {"transpose", [](const Tensor& x, const Tensor& m) { return Tensor(kiln::exp(x.t()) * m.t() + 1); }, 2},
        {"split of a static dim",
         [](const Tensor& x, const Tensor& m) { return kiln::sum(Tensor(x * m).reshape({x.shape()[0], 3, 4}), 2); }, 2},
        {"permute after a split",
         [](const Tensor& x, const Tensor& m) { return Tensor(x.reshape({-1, 2, 6}).permute({2, 0, 1}) * 2 + m.reshape({-1, 2, 6}).permute({2, 0, 1})); }, 2},
        {"slice and step of a static dim",
         [](const Tensor& x, const Tensor& m) { return Tensor(x.slice(1, 1, 11, 3) - m.slice(1, 0, 4)); }, 2},
        {"unsqueeze, then a row reduction",
         [](const Tensor& x, const Tensor& m) { return kiln::softmax(Tensor(x.unsqueeze(1) + m.unsqueeze(1)), -1); }, 2},
        {"a slice of the dynamic dim", [](const Tensor& x, const Tensor& m) { return Tensor(x.slice(0, 0, 5) + m.slice(0, 1, 6)); }, 5},
        {"a merge of the dynamic dim", [](const Tensor& x, const Tensor& m) { return Tensor(x.reshape({-1}) * m.reshape({-1})); }, 5},
    };
    for (const Case& c : cases) {
        INFO(c.name);
        LogCapture logs("recompiles");
        auto f = kiln::compile(c.fn);
        for (std::int64_t n : {32, 64, 128, 1000, 7}) {
            INFO("batch " << n);
            const Tensor x = kiln::randn({n, 12}), m = kiln::randn({n, 12});
            const Tensor got = f(x, m), want = c.fn(x, m);
            REQUIRE(got.shape() == want.shape());
            CHECK(maxdiff(got.contiguous(), want.contiguous()) < 1e-5);
        }
        CHECK(f.compiles() == c.compiles);
        if (c.compiles == 2) CHECK(logs.contains("argument 1 dim 0 was 32, now 64; marking dim 0 dynamic"));
    }
    // symbolic dims that do not fit together at run time: a ShapeError naming the op and shapes
    auto add = kiln::compile([](const Tensor& a, const Tensor& b) { return Tensor(a + b); }, {.dynamic = kiln::Dynamic::on});
    (void)add(kiln::randn({4, 3}), kiln::randn({4, 3}));
    CHECK_THROWS_WITH_AS((void)add(kiln::randn({5, 3}), kiln::randn({6, 3})), doctest::Contains("add of operands"), kiln::ShapeError);
    CHECK(add.compiles() == 1);
    CHECK(maxdiff(add(kiln::ones({6, 3}), kiln::ones({6, 3})), kiln::full({6, 3}, 2.0)) == 0);  // nothing left broken
    // the same for a matrix product whose inner dims stop matching (ir::matmul_shapes, the rule eager uses too)
    auto mm = kiln::compile([](const Tensor& a, const Tensor& b) { return kiln::matmul(a, b); }, {.dynamic = kiln::Dynamic::on});
    const Tensor a = kiln::randn({4, 3}), b = kiln::randn({3, 5});
    CHECK(maxdiff(mm(a, b), kiln::matmul(a, b)) < 1e-5);
    CHECK_THROWS_AS((void)mm(kiln::randn({4, 6}), kiln::randn({7, 5})), kiln::ShapeError);
    const Tensor a2 = kiln::randn({2, 6}), b2 = kiln::randn({6, 9});
    CHECK(maxdiff(mm(a2, b2), kiln::matmul(a2, b2)) < 1e-5);  // and a size that fits still runs
}

TEST_CASE("the recompile limit: fall back to eager with one warning, or throw") {
    auto f = kiln::compile([](const Tensor& x) { return Tensor(x + 1); },
                           {.dynamic = kiln::Dynamic::off, .recompile_limit = 2});
    for (std::int64_t n = 2; n < 6; ++n) {
        const Tensor x = kiln::randn({n});
        CHECK(maxdiff(f(x), Tensor(x + 1)) == 0);
    }
    CHECK(f.compiles() == 2);
    CHECK(f.fell_back_to_eager());

    auto g = kiln::compile([](const Tensor& x) { return Tensor(x + 1); },
                           {.dynamic = kiln::Dynamic::off, .recompile_limit = 2, .stance = kiln::Stance::error});
    (void)g(kiln::randn({2}));
    (void)g(kiln::randn({3}));
    CHECK_THROWS_AS((void)g(kiln::randn({4})), kiln::RecompileLimitError);
}

TEST_CASE("graph breaks: item() in a traced function splits the graph; results follow the data") {
    LogCapture logs("graph_breaks");
    auto f = kiln::compile([](const Tensor& x) {
        const Tensor y = Tensor(x * 2);
        if (kiln::sum(y).item<float>() > 0) return Tensor(y + 1);  // a value-dependent branch
        return Tensor(y - 1);
    });
    const Tensor p = Tensor(kiln::abs(kiln::randn({10})) + 0.1), n = Tensor(-p);
    CHECK(maxdiff(f(p), Tensor(p * 2 + 1)) < 1e-6);
    CHECK(maxdiff(f(n), Tensor(n * 2 - 1)) < 1e-6);
    CHECK(maxdiff(f(p), Tensor(p * 2 + 1)) < 1e-6);
    CHECK(f.graph_breaks().size() == 1);
    CHECK(logs.contains("graph break (item()) at test_compile.cpp:"));

    auto full = kiln::compile([](const Tensor& x) { return Tensor(x * kiln::sum(x).item<float>()); }, {.fullgraph = true});
    try {
        (void)full(p);
        FAIL("no GraphBreakError");
    } catch (const kiln::GraphBreakError& e) {
        CHECK(std::string(e.what()).find("test_compile.cpp:") != std::string::npos);
        CHECK(std::string(e.what()).find("fullgraph") != std::string::npos);
    }
}

TEST_CASE("backends: none (as written), eager (one kernel per op, like kiln::eager), custom") {
    const Tensor x = kiln::randn({32});
    auto body = [](const Tensor& t) { return Tensor(kiln::exp(t) * 2 + t); };
    auto e = kiln::compile(body, {.backend = kiln::Backend::none});
    auto gr = kiln::compile(body, {.backend = kiln::Backend::eager});
    auto fu = kiln::compile(body);
    const Tensor ref = kiln::eager(kiln::exp(x) * 2 + x);
    CHECK(maxdiff(e(x), ref) == 0);
    CHECK(maxdiff(gr(x), ref) == 0);
    CHECK(maxdiff(fu(x), ref) == 0);
    CHECK(e.kernels() == 0);   // nothing captured
    CHECK(gr.kernels() == 3);  // exp, mul, add: one kernel each, as kiln::eager runs the expression
    CHECK(fu.kernels() == 1);
    CHECK(kiln::Backend::graph == kiln::Backend::eager);  // the former name still compiles

    int seen_nodes = 0;
    kiln::Options opt;
    opt.backend = kiln::Backend::custom;
    opt.custom_backend = [&](const kiln::ir::Graph& g) -> kiln::Executable {
        seen_nodes = g.size();
        return [](const std::vector<Tensor>& in) { return std::vector<Tensor>{Tensor(in[0] * 0 + 42)}; };
    };
    auto cu = kiln::compile(body, opt);
    CHECK(cu(x).item<float>(3) == 42.0f);
    CHECK(seen_nodes > 3);
}

TEST_CASE("results: tuples and vectors of tensors; numbers as guards") {
    const Tensor x = kiln::randn({4}), y = kiln::randn({4});
    auto f = kiln::compile([](const Tensor& a, const std::vector<Tensor>& v) {
        return std::make_tuple(Tensor(a + v[0]), std::vector<Tensor>{Tensor(a * v[1]), a});
    });
    auto [s, rest] = f(x, std::vector<Tensor>{y, y});
    CHECK(maxdiff(s, Tensor(x + y)) == 0);
    REQUIRE(rest.size() == 2);
    CHECK(maxdiff(rest[0], Tensor(x * y)) == 0);
    CHECK(rest[1].is_same(x));  // an input returned as is
}

namespace {
struct Batch {  // an aggregate argument: tensors, a number (a guard) and a vector of tensors
    Tensor x, w;
    float scale;
    std::vector<Tensor> extra;
};
struct Heads {  // an aggregate result
    Tensor y, z;
    std::array<Tensor, 2> pair;
};
}  // namespace

TEST_CASE("aggregates: plain structs of tensors, numbers and containers as arguments and results") {
    static_assert(kiln::detail::field_count<Batch>() == 4 && kiln::detail::field_count<Heads>() == 3);
    const Tensor x = kiln::randn({3, 5}), w = kiln::randn({5}), e = kiln::randn({3, 1});
    auto f = kiln::compile([](const Batch& b) {
        Tensor s = Tensor(b.x * b.w * b.scale);
        for (const Tensor& t : b.extra) s = Tensor(s + t);
        return Heads{s, Tensor(kiln::exp(s)), {b.w, Tensor(s - 1)}};
    });
    Batch b{x, w, 2.0f, {e, e}};
    Heads h = f(b);
    const Tensor ref = kiln::eager(x * w * 2.0f + e + e);
    CHECK(maxdiff(h.y, ref) < 1e-6);
    CHECK(maxdiff(h.z, kiln::eager(kiln::exp(ref))) < 1e-6);
    CHECK(h.pair[0].is_same(w));  // an input returned as is
    CHECK(maxdiff(h.pair[1], kiln::eager(ref - 1)) < 1e-6);
    CHECK(f.compiles() == 1);
    (void)f(Batch{kiln::randn({3, 5}), w, 2.0f, {e, e}});  // same guards
    CHECK(f.compiles() == 1);
    b.scale = 3.0f;  // a number field is guarded by value
    h = f(b);
    CHECK(f.compiles() == 2);
    CHECK(maxdiff(h.y, kiln::eager(x * w * 3.0f + e + e)) < 1e-6);
    b.extra.push_back(e);  // a vector field's size is guarded too
    h = f(b);
    CHECK(f.compiles() == 3);
    CHECK(maxdiff(h.y, kiln::eager(x * w * 3.0f + e + e + e)) < 1e-6);
}

TEST_CASE("concurrent first calls compile once") {
    auto f = kiln::compile([](const Tensor& x) { return Tensor(kiln::sin(x) + 1); });
    const Tensor x = kiln::randn({1000});
    std::vector<std::thread> ts;
    std::vector<double> diffs(4, 1);
    for (int i = 0; i < 4; ++i) ts.emplace_back([&, i] { diffs[static_cast<std::size_t>(i)] = maxdiff(f(x), Tensor(kiln::sin(x) + 1)); });
    for (auto& t : ts) t.join();
    for (double d : diffs) CHECK(d == 0);
    CHECK(f.compiles() == 1);
}

TEST_CASE("tracing errors: bad shapes name the op and the user's line; escaped tracing tensors are caught") {
    auto f = kiln::compile([](const Tensor& x) { return Tensor(x + kiln::ones({3})); });
    try {
        (void)f(kiln::ones({4}));
        FAIL("no error");
    } catch (const kiln::ShapeError& e) {
        CHECK(std::string(e.what()).find("kiln::add:") == 0);
        CHECK(std::string(e.what()).find("test_compile.cpp:") != std::string::npos);
    }
    Tensor leaked;
    auto g = kiln::compile([&](const Tensor& x) {
        leaked = Tensor(x * 2);
        return leaked;
    });
    (void)g(kiln::ones({2}));
    CHECK_THROWS_AS((void)Tensor(leaked + 1), kiln::Error);
    // inside a later traced call (whose tracer may even sit at the same address) it is caught too
    auto h = kiln::compile([&](const Tensor& x) { return Tensor(x + leaked); });
    CHECK_THROWS_AS((void)h(kiln::ones({2})), kiln::Error);
}

// ------------------------------------------------------------------------------------- fuzzer
namespace {

/// A random program over tensors: a list of steps, each an op on earlier values. The same
/// program runs eagerly (each statement materialized) and compiled.
struct Program {
    struct Step {
        int op, a, b, axis;
    };
    std::vector<Step> steps;
    int outputs = 1;

    template <class Eval>
    std::vector<Tensor> run(const std::vector<Tensor>& in, Eval&& eval) const {
        std::vector<Tensor> v = in;
        for (const Step& s : steps) {
            const Tensor& x = v[static_cast<std::size_t>(s.a)];
            const Tensor& y = v[static_cast<std::size_t>(s.b)];
            Tensor r;
            switch (s.op) {
                case 0: r = eval(x + y); break;
                case 1: r = eval(x * y); break;
                case 2: r = eval(x - y * 0.5); break;
                case 3: r = eval(kiln::maximum(x, y)); break;
                case 4: r = eval(kiln::tanh(x)); break;
                case 5: r = eval(kiln::sigmoid(x) * 2.0); break;
                case 6: r = eval(kiln::where(x > y, x, y * 0.25)); break;
                case 7: r = eval(kiln::abs(x) + 1.0); break;
                case 8: r = kiln::sum(x, s.axis % std::max(1, x.rank()), true); break;
                case 9: r = kiln::max(x, s.axis % std::max(1, x.rank()), true); break;
                case 10: r = kiln::softmax(x, -1); break;
                case 11: r = x.rank() >= 2 ? x.transpose(0, 1) : x.unsqueeze(0); break;
                case 12: r = eval(kiln::cast(kiln::cast(x, DType::bf16), DType::f32)); break;
                case 13: r = eval(kiln::cast(x * 3.0, DType::i32) + y); break;  // integer math mid-graph
                case 14: r = eval(kiln::cast(x, DType::f64) * y - 1); break;
                default: r = eval(kiln::exp(x * 0.1)); break;
            }
            v.push_back(r);
        }
        return std::vector<Tensor>(v.end() - outputs, v.end());
    }
};

/// Shapes that broadcast with (R, C): (R, C), (C,), (R, 1), (1, C).
kiln::Shape random_shape(std::mt19937& rng, std::int64_t R, std::int64_t C) {
    switch (rng() % 4) {
        case 0: return {R, C};
        case 1: return {C};
        case 2: return {R, 1};
        default: return {1, C};
    }
}

}  // namespace

TEST_CASE("fuzzer: random expression DAGs over f32/f64/i32/i64 inputs compiled == eager (fixed seeds; KILN_FUZZ_LONG=1 for more)") {
    const char* long_mode = std::getenv("KILN_FUZZ_LONG");
    const int graphs = long_mode && *long_mode == '1' ? 50000 : 2000;
    int mismatches = 0, compared = 0, int_outputs = 0, f64_outputs = 0;
    for (int seed = 0; seed < graphs; ++seed) {
        std::mt19937 rng(static_cast<unsigned>(seed));
        const std::int64_t R = 1 + static_cast<std::int64_t>(rng() % 9), C = 1 + static_cast<std::int64_t>(rng() % 13);
        const int nin = 1 + static_cast<int>(rng() % 3);
        std::vector<Tensor> in;
        kiln::manual_seed(static_cast<std::uint64_t>(seed));
        // inputs of mixed dtypes: promotion, compute-type conversions and integer kernels
        for (int i = 0; i < nin; ++i) {
            const kiln::Shape sh = random_shape(rng, R, C);
            switch (rng() % 5) {
                case 0: in.push_back(kiln::randint(-5, 6, sh, DType::i32)); break;
                case 1: in.push_back(kiln::randint(-5, 6, sh, DType::i64)); break;
                case 2: in.push_back(kiln::randn(sh, DType::f64)); break;
                default: in.push_back(kiln::randn(sh)); break;
            }
        }
        Program p;
        const int nsteps = 1 + static_cast<int>(rng() % 8);
        for (int s = 0; s < nsteps; ++s) {
            const int avail = nin + s;
            p.steps.push_back({static_cast<int>(rng() % 16), static_cast<int>(rng() % avail), static_cast<int>(rng() % avail),
                               static_cast<int>(rng() % 2)});
        }
        p.outputs = 1 + static_cast<int>(rng() % 2);
        std::vector<Tensor> want;
        try {
            want = p.run(in, [](const auto& e) { return kiln::eager(e); });
        } catch (const kiln::Error& e) {
            // operands that do not broadcast, or an op the dtype does not allow: compiled throws too
            auto f = kiln::compile([&](const std::vector<Tensor>& xs) { return p.run(xs, [](const auto& e) { return Tensor(e); }); });
            INFO("seed " << seed << ": eager threw " << e.what());
            CHECK_THROWS_AS((void)f(in), kiln::Error);
            continue;
        }
        auto f = kiln::compile([&](const std::vector<Tensor>& xs) { return p.run(xs, [](const auto& e) { return Tensor(e); }); });
        const std::vector<Tensor> got = f(in);
        REQUIRE(got.size() == want.size());
        ++compared;
        for (std::size_t k = 0; k < got.size(); ++k) {
            int_outputs += kiln::is_integral(got[k].dtype());
            f64_outputs += got[k].dtype() == DType::f64;
            const double d = got[k].dtype() != want[k].dtype() ? 1e9 : maxdiff(got[k].contiguous(), want[k].contiguous());
            if (!(d < 1e-5)) {
                ++mismatches;
                INFO("seed " << seed << " output " << k << " diff " << d << " dtypes " << kiln::dtype_name(got[k].dtype()) << " / "
                              << kiln::dtype_name(want[k].dtype()) << "\n" << f.graph());
                CHECK(d < 1e-5);
            }
        }
        if (mismatches > 5) break;
    }
    CHECK(mismatches == 0);
    MESSAGE(compared << " of " << graphs << " random graphs compared (the rest do not broadcast); " << int_outputs
                     << " integer and " << f64_outputs << " float64 outputs");
    CHECK(compared > graphs / 2);
    CHECK(int_outputs > graphs / 20);
    CHECK(f64_outputs > graphs / 20);
}

TEST_CASE("explain() reports graphs, breaks, kernels; DOT export has one cluster per kernel") {
    const Tensor x = kiln::randn({8, 16});
    const std::string r = kiln::explain([](const Tensor& t) { return kiln::softmax(Tensor(t * 2), -1); }, x);
    INFO(r);
    CHECK(r.find("graphs: 1") != std::string::npos);
    CHECK(r.find("graph breaks: 0") != std::string::npos);
    CHECK(r.find("kernels: 1") != std::string::npos);
    CHECK(r.find("row {") != std::string::npos);
    const std::string b = kiln::explain([](const Tensor& t) { return Tensor(t * t.item<float>(0)); }, x);
    CHECK(b.find("graph breaks: 1") != std::string::npos);
    CHECK(b.find("test_compile.cpp:") != std::string::npos);

    auto f = kiln::compile([](const Tensor& t) { return Tensor(kiln::exp(kiln::matmul(t, t.t())) + 1); });
    (void)f(x);
    const std::string dot = f.dot();
    CHECK(dot.find("digraph kiln") == 0);
    CHECK(dot.find("subgraph cluster_0") != std::string::npos);
    CHECK(dot.find("subgraph cluster_1") != std::string::npos);
    CHECK(dot.find("matmul(") != std::string::npos);
}

TEST_CASE("KILN_LOGS=compile_times: a compile's phases; on the CPU no compile waves and no library-call lines") {
    // (the CPU runs each library call where it comes, so its host time is the work, not plans:
    // those lines are CUDA's, test_cuda_ops.cpp; the gather here takes over 1 ms on the CPU)
    const Tensor x = kiln::randn({512, 4096}), table = kiln::randn({256, 4096});
    const Tensor ids = kiln::randint(0, 256, {512, 4096}, kiln::DType::i64);
    std::vector<std::string> lines;
    kiln::debug::Logs::instance().set_sink([&](const std::string& l) { lines.push_back(l); });
    kiln::debug::Logs::instance().set("compile_times");
    auto f = kiln::compile([](const Tensor& a, const Tensor& t, const Tensor& i) {
        return Tensor(kiln::exp(kiln::gather(Tensor(t * 3.25), 0, i)) + a);  // a library call between two kernels
    });
    const Tensor y = f(x, table, ids);
    (void)f(x, table, ids);
    kiln::debug::Logs::instance().set("");
    kiln::debug::Logs::instance().set_sink({});
    CHECK(kiln_test::maxdiff(y, Tensor(kiln::exp(kiln::gather(Tensor(table * 3.25), 0, ids)) + x)) < 1e-5);
    int compiles = 0;
    for (const std::string& l : lines) {
        INFO(l);
        CHECK(l.rfind("[kiln:compile_times] ", 0) == 0);
        CHECK(l.find("compile wave") == std::string::npos);
        CHECK(l.find("] call ") == std::string::npos);
        compiles += l.find("compile of ") != std::string::npos ? 1 : 0;
        if (l.find("compile of ") != std::string::npos) {
            CHECK(l.find("trace ") != std::string::npos);
            CHECK(l.find("first run (host side) ") != std::string::npos);
        }
    }
    CHECK(compiles == 1);  // the first call only
}

TEST_CASE("memory planning: a steady-state call allocates only its outputs; dead intermediates share buffers") {
    const Tensor x = kiln::randn({64, 128}), w = kiln::randn({128, 128});
    // several materialized intermediates: a matmul operand, values read by two row groups...
    auto f = kiln::compile([&](const Tensor& t) {
        const Tensor a = Tensor(kiln::exp(t * 0.1));
        const Tensor s1 = kiln::softmax(Tensor(a + 1), -1);
        const Tensor b = Tensor(kiln::tanh(s1) + a);  // a is read by two groups
        const Tensor s2 = kiln::softmax(b, 0);
        return Tensor(s2 * 2 + kiln::sum(a, -1, true));
    });
    auto ref = [&](const Tensor& t) {
        const Tensor a = Tensor(kiln::exp(t * 0.1));
        const Tensor s1 = kiln::softmax(Tensor(a + 1), -1);
        const Tensor b = Tensor(kiln::tanh(s1) + a);
        const Tensor s2 = kiln::softmax(b, 0);
        return Tensor(s2 * 2 + kiln::sum(a, -1, true));
    };
    CHECK(maxdiff(f(x), ref(x)) < 1e-5);
    CHECK(maxdiff(f(x), ref(x)) < 1e-5);  // the second call runs on the planned buffers
    const auto before = kiln::host_allocator_stats().allocations;
    const Tensor out = f(x);
    const auto after = kiln::host_allocator_stats().allocations;
    CHECK(after - before == 1);  // the output only
    CHECK(maxdiff(out, ref(x)) < 1e-5);
    (void)w;

    // with dynamic shapes each recent input shape keeps its instance: a repeated size also
    // allocates only its output, and going back to an earlier size finds its instance again
    auto d = kiln::compile(ref, {.dynamic = kiln::Dynamic::on});
    for (std::int64_t rows : {64, 48, 64, 48}) {
        const Tensor t = kiln::randn({rows, 128});
        CHECK(maxdiff(d(t), ref(t)) < 1e-5);
        const auto b0 = kiln::host_allocator_stats().allocations;
        const Tensor o = d(t);
        CHECK(kiln::host_allocator_stats().allocations - b0 == 1);
        CHECK(maxdiff(o, ref(t)) < 1e-5);
    }
    CHECK(d.compiles() == 1);
}
