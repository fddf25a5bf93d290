// Autograd: every rule checked against central finite differences in float64 (torch's gradcheck
// is the model), the engine's semantics, its errors, losses, optimizers against their formulas,
// and a compiled training step against the eager one.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/backends/cuda/graph_stats.hpp>  // cuda::GraphStats

#include "test_util.hpp"

using namespace kiln;
using kiln_test::maxdiff;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Checks the gradients of sum(f(x) * w) (w fixed random weights, so every output element counts)
/// against central differences of step 1e-6 in float64. The inputs must be f64 CPU tensors.
void gradcheck(const std::string& what, const Fn& f, std::vector<Tensor> x, double tol = 1e-6) {
    CAPTURE(what);
    std::vector<Tensor> leaves;
    for (Tensor& t : x) {
        t = t.detach().clone();
        t.requires_grad_();
        leaves.push_back(t);
    }
    const Tensor y0 = f(x);
    REQUIRE(y0.requires_grad());
    manual_seed(7);
    const Tensor w = randn(y0.shape(), DType::f64);
    const Tensor loss = sum(y0 * w);
    const std::vector<Tensor> g = autograd::grad(loss, leaves);
    const no_grad off;
    auto value = [&]() { return sum(f(x) * w).item<double>(); };
    for (std::size_t i = 0; i < x.size(); ++i) {
        REQUIRE(g[i].defined());
        REQUIRE(g[i].shape() == x[i].shape());
        CHECK(g[i].dtype() == x[i].dtype());
        for (std::int64_t k = 0; k < x[i].numel(); ++k) {
            Tensor flat = x[i].reshape({-1});
            const double v = flat.item<double>(k);
            const double h = 1e-6 * std::max(1.0, std::abs(v));
            flat.at<double>({k}) = v + h;
            const double up = value();
            flat.at<double>({k}) = v - h;
            const double down = value();
            flat.at<double>({k}) = v;
            const double fd = (up - down) / (2 * h), an = g[i].reshape({-1}).item<double>(k);
            CAPTURE(i);
            CAPTURE(k);
            CHECK(std::abs(fd - an) <= tol * std::max(1.0, std::abs(fd)) * 10 + 1e-7);
        }
    }
}

Tensor uniform(const Shape& s, double lo, double hi) { return Tensor(rand(s, DType::f64) * (hi - lo) + lo); }

/// The input range of operand k of each differentiable table op for the gradient check: away from
/// the points where the op is not differentiable (abs at 0, relu at 0, hardswish at +-3,
/// remainder's jumps). An op missing here fails the sweep.
std::pair<double, double> grad_domain(std::string_view n, int k) {
    if (n == "log" || n == "sqrt" || n == "rsqrt" || n == "reciprocal") return {0.3, 2.5};
    if (n == "log1p") return {-0.5, 2.0};
    if (n == "tan") return {-1.2, 1.2};
    if (n == "pow") return k == 0 ? std::pair{0.4, 2.0} : std::pair{-1.5, 2.5};
    if (n == "div") return k == 0 ? std::pair{-2.0, 2.0} : std::pair{0.5, 2.0};
    if (n == "remainder" || n == "fmod") return k == 0 ? std::pair{0.1, 0.9} : std::pair{1.0, 1.5};  // a / b in (0.07, 0.9)
    if (n == "abs" || n == "relu") return {0.2, 2.0};  // one side of the kink per tensor; the other below
    if (n == "hardswish") return {-2.5, 2.5};
    for (std::string_view ok : {"neg", "exp", "expm1", "sin", "cos", "tanh", "erf", "sigmoid", "gelu_tanh", "copy", "add", "sub",
                                "mul", "maximum", "minimum", "where", "cast"})
        if (n == ok) return {-2.0, 2.0};
    FAIL("no gradient-check domain for op '" << n << "': add it to grad_domain");
    return {0, 0};
}

}  // namespace

TEST_CASE("autograd: every differentiable table op's rule matches finite differences (float64)") {
    manual_seed(1);
    int checked = 0;
    ops::for_each_op([&](auto tag) {
        using Op = typename decltype(tag)::type;
        if constexpr (Op::grad == ops::Grad::rule) {
            const std::string name(Op::name);
            std::vector<Tensor> x;
            for (int k = 0; k < Op::arity; ++k) {
                if (name == "where" && k == 0) {
                    x.push_back(Tensor(rand({3, 4}, DType::f64) > 0.5));
                    continue;
                }
                const auto [lo, hi] = grad_domain(name, k);
                x.push_back(uniform({3, 4}, lo, hi));
            }
            std::vector<Tensor> leaves = x;
            if (name == "where") leaves.erase(leaves.begin());
            const bool is_where = name == "where";
            const Tensor cond = is_where ? x[0] : Tensor();
            gradcheck(name, [&](const std::vector<Tensor>& v) -> Tensor {
                if constexpr (Op::arity == 1) {
                    if constexpr (std::is_same_v<Op, ops::Cast>) return Tensor(cast(v[0] * 1.0, DType::f64));
                    else return Tensor(expr::make<Op>(DType::f32, v[0]));
                } else if constexpr (Op::arity == 2) {
                    return Tensor(expr::make<Op>(DType::f32, v[0], v[1]));
                } else {
                    return Tensor(expr::make<Op>(DType::f32, cond, v[0], v[1]));
                }
            }, leaves);
            ++checked;
        }
    });
    CHECK(checked >= 30);
    // the other side of the kinks
    gradcheck("abs<0", [](const std::vector<Tensor>& v) { return Tensor(kiln::abs(v[0])); }, {uniform({5}, -2, -0.2)});
    gradcheck("relu<0", [](const std::vector<Tensor>& v) { return Tensor(relu(v[0]) + v[0]); }, {uniform({5}, -2, -0.2)});
    gradcheck("hardswish tails", [](const std::vector<Tensor>& v) { return Tensor(hardswish(v[0])); },
              {Tensor(uniform({6}, 3.2, 5) * where(arange(6) < 3, 1.0, -1.0))});
}

TEST_CASE("autograd: ties, zero-gradient and non-differentiable ops, cast and scalar operands") {
    Tensor a = full({3}, 2.0, DType::f64), b = full({3}, 2.0, DType::f64);
    a.requires_grad_();
    b.requires_grad_();
    sum(maximum(a, b)).backward();
    CHECK(a.grad().item<double>(0) == doctest::Approx(0.5));  // torch splits ties evenly
    CHECK(b.grad().item<double>(0) == doctest::Approx(0.5));
    Tensor x = uniform({4}, -2, 2);
    x.requires_grad_();
    const Tensor fl = kiln::floor(x * 3.0);
    CHECK(fl.requires_grad());  // zero gradient, still connected (torch)
    CHECK_FALSE(Tensor(x > 0).requires_grad());  // bool results are not differentiable
    Tensor y = sum(fl + x * 2.5);
    y.backward();
    for (int i = 0; i < 4; ++i) CHECK(x.grad().item<double>(i) == doctest::Approx(2.5));
    // cast to f32 and back: the gradient comes back as f64
    Tensor z = uniform({4}, -1, 1);
    z.requires_grad_();
    sum(cast(z, DType::f32) * 3.0f).backward();
    CHECK(z.grad().dtype() == DType::f64);
    CHECK(z.grad().item<double>(1) == doctest::Approx(3.0));
}

TEST_CASE("autograd: reductions and broadcasting match finite differences") {
    manual_seed(2);
    const Tensor x = uniform({3, 4, 5}, -2, 2);
    gradcheck("sum axes", [](const auto& v) { return sum(v[0], {0, 2}); }, {x});
    gradcheck("sum keepdim", [](const auto& v) { return sum(v[0] * v[0], 1, true); }, {x});
    gradcheck("mean", [](const auto& v) { return mean(v[0], {-1}); }, {x});
    gradcheck("var", [](const auto& v) { return var(v[0], {1}); }, {x});
    gradcheck("std", [](const auto& v) { return kiln::std(v[0], {2}); }, {x});
    gradcheck("max", [](const auto& v) { return max(v[0], 1); }, {x});
    gradcheck("min all", [](const auto& v) { return min(v[0]); }, {x});
    gradcheck("prod", [](const auto& v) { return prod(v[0], 1); }, {uniform({3, 4}, 0.5, 1.5)});
    gradcheck("logsumexp", [](const auto& v) { return logsumexp(v[0], {1}); }, {x});
    gradcheck("broadcast add/mul", [](const auto& v) { return Tensor(v[0] * v[1] + v[2]); },
              {uniform({3, 1, 5}, -1, 1), uniform({4, 1}, -1, 1), uniform({5}, -1, 1)});
    // prod with one and with two zeros in a row (torch's prod_backward)
    Tensor p = Tensor(arange(8, DType::f64).reshape({2, 4}) + 1.0);
    p.at<double>({0, 1}) = 0;
    p.at<double>({1, 0}) = 0;
    p.at<double>({1, 2}) = 0;
    p.requires_grad_();
    sum(prod(p, 1)).backward();
    CHECK(p.grad().at<double>({0, 1}) == doctest::Approx(1 * 3 * 4));
    CHECK(p.grad().at<double>({0, 0}) == 0);
    for (int j = 0; j < 4; ++j) CHECK(p.grad().at<double>({1, j}) == 0);
    // max with ties: split evenly
    Tensor t = Tensor(full({4}, 1.0, DType::f64));
    t.requires_grad_();
    max(t).backward();
    CHECK(t.grad().item<double>(2) == doctest::Approx(0.25));
}

TEST_CASE("autograd: composites, views, matmul, copies and library ops match finite differences") {
    manual_seed(3);
    const Tensor x = uniform({4, 6}, -2, 2);
    gradcheck("softmax", [](const auto& v) { return softmax(v[0], 1); }, {x});
    gradcheck("log_softmax", [](const auto& v) { return log_softmax(v[0], 0); }, {x});
    gradcheck("layer_norm", [](const auto& v) { return layer_norm(v[0], 1, v[1], v[2]); },
              {x, uniform({6}, 0.5, 1.5), uniform({6}, -1, 1)});
    gradcheck("rms_norm", [](const auto& v) { return rms_norm(v[0], {6}, v[1], 1e-5); }, {x, uniform({6}, 0.5, 1.5)});
    gradcheck("gelu silu softplus", [](const auto& v) { return Tensor(gelu(v[0]) + silu(v[0]) * softplus(v[0])); }, {x});
    gradcheck("views", [](const auto& v) {
        const Tensor t = v[0].reshape({2, 12}).transpose(0, 1).slice(0, 1, 11, 3).unsqueeze(0).expand({3, 4, 2});
        return Tensor(sum(t * t) + sum(v[0].select(1, 2)) * 2.0 + sum(v[0].permute({1, 0}).flatten().slice(0, 0, 5)));
    }, {x});
    gradcheck("matmul 2d", [](const auto& v) { return matmul(v[0], v[1]); }, {x, uniform({6, 3}, -1, 1)});
    gradcheck("matmul batched broadcast", [](const auto& v) { return matmul(v[0], v[1]); },
              {uniform({2, 1, 3, 4}, -1, 1), uniform({5, 4, 2}, -1, 1)});
    gradcheck("matmul batched, a transposed view (attention's k^T), broadcast", [](const auto& v) {
        return Tensor(matmul(v[0], v[1].transpose(-2, -1)) + matmul(v[0], v[2].transpose(-2, -1)));
    }, {uniform({2, 3, 4, 5}, -1, 1), uniform({2, 3, 6, 5}, -1, 1), uniform({3, 6, 5}, -1, 1)});
    gradcheck("matmul vectors", [](const auto& v) { return Tensor(matmul(v[0], v[1]) + sum(matmul(v[1], v[2])) + matmul(v[0], v[0])); },
              {uniform({4}, -1, 1), uniform({4, 3}, -1, 1), uniform({3}, -1, 1)});
    gradcheck("linear", [](const auto& v) { return nn::linear(v[0], v[1], v[2], Act::gelu_tanh); },
              {x, uniform({5, 6}, -1, 1), uniform({5}, -1, 1)});
    gradcheck("clone contiguous", [](const auto& v) { return Tensor(v[0].t().contiguous() * v[0].clone().t()); }, {x});
    gradcheck("cat stack", [](const auto& v) { return cat({v[0], stack({v[1], v[1]}, 0).reshape({2, 6}) * 2.0}, 0); },
              {x, uniform({6}, -1, 1)});
    gradcheck("pad roll", [](const auto& v) { return Tensor(pad(v[0], {1, -2, 0, 1}, 0.5) * roll(pad(v[0], {1, -2, 0, 1}), 2, 1)); }, {x});
    const Tensor idx = Tensor(randint(0, 6, {4, 3}));
    gradcheck("gather", [&](const auto& v) { return gather(v[0], 1, idx); }, {x});
    const Tensor distinct = Tensor(arange(3) * 2).unsqueeze(0).expand({4, 3}).contiguous();  // no repeats: scatter's winner is defined
    gradcheck("scatter / scatter_add", [&](const auto& v) {
        return Tensor(scatter(v[0], 1, distinct, v[1]) + scatter_add(v[0], 1, idx, v[1]));
    }, {x, uniform({4, 3}, -1, 1)});
    const Tensor ids = Tensor(randint(0, 5, {2, 3}));
    gradcheck("embedding", [&](const auto& v) { return nn::embedding(v[0], ids); }, {uniform({5, 4}, -1, 1)});
    gradcheck("assign into a non-leaf", [](const auto& v) {
        Tensor t = Tensor(v[0] * 2.0);
        t.assign(kiln::exp(v[0]) + 1.0);  // t's handle takes the new value's history
        return Tensor(t * v[0]);
    }, {x});
}

TEST_CASE("autograd: a BERT encoder layer (attention, layer norms, GELU) matches finite differences") {
    manual_seed(11);
    nn::BertLayer layer(8, 2, 16, 1e-5, {DType::f64});
    const Tensor x = uniform({2, 3, 8}, -1, 1);
    Tensor mask = Tensor(full({2, 1, 1, 3}, 1.0) > 0.0);  // a padding mask: the second sequence's last token
    mask.at<bool>({1, 0, 0, 2}) = false;
    gradcheck("bert layer: input", [&](const auto& v) { return layer(v[0], mask); }, {x});
    // parameters too: the attention's packed projection, the FFN's first weight and a norm's scale
    gradcheck("bert layer: weights", [&](const auto& v) {
        layer.self_attn.in_proj_weight = v[0];
        layer.linear1.weight = v[1];
        layer.norm1.weight = v[2];
        return layer(x, mask);
    }, {layer.self_attn.in_proj_weight, layer.linear1.weight, layer.norm1.weight});
}

TEST_CASE("autograd: losses match finite differences and torch's definitions") {
    manual_seed(4);
    const Tensor logits = uniform({5, 4}, -2, 2);
    Tensor target = Tensor(randint(0, 4, {5}));
    target.at<std::int64_t>({2}) = -100;
    gradcheck("mse_loss", [](const auto& v) { return nn::mse_loss(v[0], v[1]); }, {logits, uniform({5, 4}, -1, 1)});
    gradcheck("cross_entropy", [&](const auto& v) { return nn::cross_entropy(v[0], target); }, {logits});
    gradcheck("cross_entropy smoothing sum", [&](const auto& v) {
        return nn::cross_entropy(v[0], target, {nn::Reduction::sum, -100, 0.1});
    }, {logits});
    gradcheck("nll_loss none", [&](const auto& v) { return nn::nll_loss(log_softmax(v[0], 1), target, {nn::Reduction::none}); }, {logits});
    gradcheck("bce_with_logits", [](const auto& v) { return nn::binary_cross_entropy_with_logits(v[0], v[1]); },
              {logits, uniform({5, 4}, 0, 1)});
    // values against the definitions, computed here element by element
    const no_grad off;
    double ce = 0;
    int n = 0;
    for (int i = 0; i < 5; ++i) {
        const std::int64_t t = target.at<std::int64_t>({i});
        if (t == -100) continue;
        double lse = 0;
        for (int c = 0; c < 4; ++c) lse += std::exp(logits.at<double>({i, c}));
        ce += std::log(lse) - logits.at<double>({i, static_cast<int>(t)});
        ++n;
    }
    CHECK(nn::cross_entropy(logits, target).item<double>() == doctest::Approx(ce / n).epsilon(1e-12));
}

TEST_CASE("autograd: engine semantics (accumulation, no_grad, detach, kiln::grad, value_and_grad)") {
    Tensor x = full({3}, 2.0, DType::f64);
    x.requires_grad_();
    CHECK(x.is_leaf());
    Tensor y = Tensor(x * x);
    CHECK_FALSE(y.is_leaf());
    CHECK(y.grad_fn()->name() == "mul");
    sum(y).backward();
    sum(y).backward();  // gradients accumulate
    CHECK(x.grad().item<double>(0) == doctest::Approx(8.0));
    {
        const no_grad off;
        CHECK_FALSE(Tensor(x * 3.0).requires_grad());
    }
    CHECK_FALSE(x.detach().requires_grad());
    const Tensor g = autograd::grad(sum(Tensor(x * x * x)), {x})[0];
    CHECK(g.item<double>(1) == doctest::Approx(12.0));
    CHECK(x.grad().item<double>(0) == doctest::Approx(8.0));  // kiln::grad leaves grad() alone
    auto vg = value_and_grad([](const Tensor& a, const Tensor& b) { return sum(a * b); }, {0, 1});
    const auto [v, gs] = vg(full({2}, 3.0, DType::f64), full({2}, 4.0, DType::f64));
    CHECK(v.item<double>() == doctest::Approx(24.0));
    CHECK(gs[0].item<double>(0) == doctest::Approx(4.0));
    CHECK(gs[1].item<double>(0) == doctest::Approx(3.0));
    const Tensor d = kiln::grad([](const Tensor& a) { return sum(kiln::sin(a)); })(zeros({2}, DType::f64))[0];
    CHECK(d.item<double>(0) == doctest::Approx(1.0));
    // a non-leaf that needs grad: autograd::grad returns the gradient at that tensor
    Tensor w = full({2}, 1.5, DType::f64);
    w.requires_grad_();
    const Tensor mid = Tensor(w * 2.0);
    CHECK(autograd::grad(sum(mid * mid), {mid})[0].item<double>(0) == doctest::Approx(6.0));
}

TEST_CASE("autograd: post-accumulate hooks run once per backward, after the last gradient; queue_callback runs at the end") {
    Tensor w = full({2}, 1.5, DType::f64), u = full({2}, 2.0, DType::f64);
    w.requires_grad_();
    u.requires_grad_();
    std::vector<std::string> events;
    const int hw = autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& g) {
        events.push_back("w " + std::to_string(g.item<double>(0)));
        autograd::queue_callback([&] { events.push_back("end"); });
    });
    autograd::register_post_accumulate_grad_hook(u, [&](const Tensor& g) { events.push_back("u " + std::to_string(g.item<double>(0))); });
    // w reaches the loss three ways (w*w, w*u, w): its hook runs once, with the summed gradient
    sum(Tensor(w * w + w * u + w)).backward();
    REQUIRE(events.size() == 3);
    CHECK(events[0].rfind("u ", 0) == 0);  // u's last gradient comes before w's (w is also used alone, last)
    CHECK(events[1] == "w " + std::to_string(2 * 1.5 + 2.0 + 1.0));
    CHECK(events[2] == "end");  // after every hook
    events.clear();
    sum(Tensor(w * 3.0)).backward();  // accumulates onto the last gradient; u takes no part: its hook stays quiet
    REQUIRE(events.size() == 2);
    CHECK(events[0] == "w " + std::to_string(6.0 + 3.0));
    (void)autograd::grad(sum(Tensor(w * u)), {w});  // kiln::grad accumulates nothing: no hook
    CHECK(events.size() == 2);
    autograd::remove_post_accumulate_grad_hook(w, hw);
    sum(Tensor(w * 1.0)).backward();
    CHECK(events.size() == 2);
    CHECK_THROWS_WITH_AS(autograd::queue_callback([] {}), doctest::Contains("kiln::queue_callback: called outside a backward pass"), GradError);
    Tensor mid = Tensor(w * 2.0);
    CHECK_THROWS_WITH_AS(autograd::register_post_accumulate_grad_hook(mid, [](const Tensor&) {}), doctest::Contains("needs a leaf"), GradError);
}

TEST_CASE("autograd: set_grad_buffer makes backward write a new gradient into the given memory, eager and compiled") {
    for (const bool compiled : {false, true}) {
        CAPTURE(compiled);
        Tensor w = full({2, 3}, 1.5), u = full({3}, 2.0);
        w.requires_grad_();
        u.requires_grad_();
        Tensor memory = full({9}, -7.0);  // both gradients views of one tensor, as DataParallel's buckets
        autograd::set_grad_buffer(w, memory.slice(0, 0, 6).view({2, 3}));
        autograd::set_grad_buffer(u, memory.slice(0, 6, 9));
        auto step = [&](const Tensor& x) {
            nn::zero_grad({w, u});
            Tensor l = sum(Tensor(w * x + u));
            l.backward();
            return l.detach();
        };
        auto c = kiln::compile(step);
        for (int k = 1; k <= 3; ++k) {
            const Tensor x = Tensor(arange(0, 6).view({2, 3}) * static_cast<double>(k));
            (void)(compiled ? c(x) : step(x));
            REQUIRE(w.grad().defined());
            CHECK(w.grad().storage() == memory.storage());
            CHECK(u.grad().storage() == memory.storage());
            CHECK(maxdiff(memory.slice(0, 0, 6).view({2, 3}), x) == 0);   // d/dw = x
            CHECK(maxdiff(memory.slice(0, 6, 9), full({3}, 2.0)) == 0);  // d/du = 2 (two rows)
        }
    }
    // a gradient that exists is added to where it is; the buffer is only for a new one
    Tensor w = full({3}, 1.0);
    w.requires_grad_();
    Tensor buf = zeros({3});
    autograd::set_grad_buffer(w, buf);
    sum(Tensor(w * 2.0)).backward();
    sum(Tensor(w * 3.0)).backward();
    CHECK(w.grad().is_same(buf));
    CHECK(buf.item<double>(0) == 5.0);
    autograd::set_grad_buffer(w, Tensor());  // removed: the next new gradient has memory of its own
    w.set_grad(Tensor());
    sum(Tensor(w * 4.0)).backward();
    CHECK(w.grad().storage() != buf.storage());
    CHECK(buf.item<double>(0) == 5.0);
    CHECK_THROWS_WITH_AS(autograd::set_grad_buffer(w, zeros({4})), doctest::Contains("must match the parameter ((3,), float32, cpu)"), ShapeError);
    CHECK_THROWS_WITH_AS(autograd::set_grad_buffer(w, zeros({3}, DType::f64)), doctest::Contains("set_grad_buffer"), DTypeError);
    Tensor mid = Tensor(w * 2.0);
    CHECK_THROWS_WITH_AS(autograd::set_grad_buffer(mid, zeros({3})), doctest::Contains("needs a leaf"), GradError);
}

TEST_CASE("autograd: errors name the op, the dtype or shape, and the user's line") {
    Tensor x = full({3}, 1.0);
    x.requires_grad_();
    const Tensor y = Tensor(x * 2.0);
    try {
        y.backward();
        FAIL("no error");
    } catch (const GradError& e) {
        const std::string m = e.what();
        CHECK(m.find("kiln::backward") != std::string::npos);
        CHECK(m.find("(3,)") != std::string::npos);
        CHECK(m.find("test_autograd.cpp") != std::string::npos);
    }
    Tensor ints = zeros({2}, DType::i64);
    CHECK_THROWS_AS(ints.requires_grad_(), DTypeError);
    try {
        ints.requires_grad_();
    } catch (const DTypeError& e) {
        CHECK(std::string(e.what()).find("int64") != std::string::npos);
    }
    // saved for backward, then modified in place
    Tensor a = full({3}, 2.0);
    a.requires_grad_();
    Tensor b = full({3}, 3.0);
    const Tensor c = Tensor(a * b);  // mul saves b
    b.fill_(5.0);
    try {
        sum(c).backward();
        FAIL("no error");
    } catch (const GradError& e) {
        const std::string m = e.what();
        CHECK(m.find("mul") != std::string::npos);
        CHECK(m.find("modified in place") != std::string::npos);
        CHECK(m.find("test_autograd.cpp") != std::string::npos);
    }
    // an in-place write into a leaf that requires grad
    CHECK_THROWS_AS(a.assign(a + 1.0), GradError);
    CHECK_THROWS_AS(a.fill_(0), GradError);
    {
        const no_grad off;
        a.assign(a + 1.0);  // allowed: what optimizers do
    }
    CHECK(a.item<float>(0) == 3.0f);
    CHECK_THROWS_AS(sum(full({2}, 1.0)).backward(), GradError);  // nothing requires grad
    CHECK_THROWS_AS(y.backward(full({2}, 1.0)), ShapeError);
}

TEST_CASE("optimizers follow torch's formulas; clip_grad_norm; state round trip") {
    // one parameter, a fixed gradient each step, checked against the formulas written out here
    auto run = [](auto make, auto expect) {
        Tensor p = full({2}, 1.0);
        p.requires_grad_();
        auto opt = make(std::vector<Tensor>{p});
        double ref = 1.0;
        double state[3] = {0, 0, 0};
        for (int t = 1; t <= 3; ++t) {
            opt.zero_grad();
            sum(Tensor(p * 0.5 * t)).backward();  // gradient 0.5 t
            opt.step();
            ref = expect(ref, 0.5 * t, t, state);
            CHECK(p.item<float>(0) == doctest::Approx(ref).epsilon(1e-5));
        }
        return opt.state_dict();
    };
    run([](std::vector<Tensor> ps) { return nn::SGD(ps, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}); },
        [](double p, double g, int, double* s) {
            g += 0.01 * p;
            s[0] = s[1] == 0 ? g : 0.9 * s[0] + g;
            s[1] = 1;
            return p - 0.1 * (g + 0.9 * s[0]);
        });
    const auto st = run([](std::vector<Tensor> ps) { return nn::AdamW(ps, {.lr = 0.01}); },
                        [](double p, double g, int t, double* s) {
                            p *= 1 - 0.01 * 0.01;
                            s[0] = 0.9 * s[0] + 0.1 * g;
                            s[1] = 0.999 * s[1] + 0.001 * g * g;
                            return p - 0.01 * (s[0] / (1 - std::pow(0.9, t))) / (std::sqrt(s[1] / (1 - std::pow(0.999, t))) + 1e-8);
                        });
    CHECK(st.at("step").item<float>() == 3.0f);
    CHECK(st.count("0.exp_avg") == 1);
    run([](std::vector<Tensor> ps) { return nn::Adam(ps, {.lr = 0.01, .weight_decay = 0.1}); },
        [](double p, double g, int t, double* s) {
            g += 0.1 * p;
            s[0] = 0.9 * s[0] + 0.1 * g;
            s[1] = 0.999 * s[1] + 0.001 * g * g;
            return p - 0.01 * (s[0] / (1 - std::pow(0.9, t))) / (std::sqrt(s[1] / (1 - std::pow(0.999, t))) + 1e-8);
        });
    // state round trip
    Tensor q = full({2}, 1.0);
    q.requires_grad_();
    nn::AdamW a({q}, {});
    sum(q * q).backward();
    a.step();
    nn::AdamW b({full({2}, 1.0)}, {});
    b.load_state_dict(a.state_dict());
    CHECK(maxdiff(b.state_dict().at("0.exp_avg"), a.state_dict().at("0.exp_avg")) == 0);
    // clipping: norm 5 -> scaled to 1
    Tensor c = full({2}, 0.0);
    c.requires_grad_();
    sum(Tensor(c * Tensor(arange(2, DType::f32) * 1.0 + 3.0))).backward();  // gradient (3, 4)
    const Tensor norm = nn::clip_grad_norm({c}, 1.0);
    CHECK(norm.item<float>() == doctest::Approx(5.0f));
    CHECK(c.grad().item<float>(0) == doctest::Approx(0.6f).epsilon(1e-5));
    CHECK(c.grad().item<float>(1) == doctest::Approx(0.8f).epsilon(1e-5));
}

namespace {
/// Makes `to`'s parameters and buffers copies of `from`'s (load_state alone would share memory).
template <class M> void copy_weights(M& from, M& to) {
    const no_grad off;
    std::map<std::string, Tensor> copy;
    for (const auto& [k, t] : nn::state_dict(from)) copy.emplace(k, t.clone());
    nn::load_state(to, copy);
}
/// One training step: zero_grad, the loss, backward, the optimizer's step; the loss detached.
template <class L> Tensor train_step(nn::Optimizer& o, L&& loss_fn) {
    o.zero_grad();
    Tensor loss = loss_fn();
    loss.backward();
    o.step();
    return loss.detach();
}

/// The seed's regression: Linear(16, 64), ReLU, Linear(64, 1).
struct Regressor {
    nn::Linear fc1{16, 64}, fc2{64, 1};
    Tensor operator()(const Tensor& x) const { return fc2(Tensor(relu(fc1(x)))); }
    template <class F> void visit(const std::string& p, F&& f) {
        fc1.visit(p + "fc1.", f);
        fc2.visit(p + "fc2.", f);
    }
};
}  // namespace

TEST_CASE("a compiled training step (forward, loss, backward, AdamW) matches the eager one for 100 steps") {
    manual_seed(5);
    Regressor eager_m, comp_m;
    copy_weights(eager_m, comp_m);
    nn::AdamW eo(nn::parameters(eager_m), {.lr = 1e-2}), co(nn::parameters(comp_m), {.lr = 1e-2});
    auto step = [](Regressor& m, nn::Optimizer& o, const Tensor& x, const Tensor& y) {
        return train_step(o, [&] { return nn::mse_loss(m(x), y); });
    };
    auto compiled = compile([&](const Tensor& x, const Tensor& y) { return step(comp_m, co, x, y); }, {.fullgraph = true});
    manual_seed(6);
    const Tensor w_true = randn({16, 1});
    double first = 0, last = 0;
    for (int i = 0; i < 100; ++i) {
        const Tensor x = randn({128, 16});
        const Tensor y = Tensor(matmul(x, w_true) + 0.1 * randn({128, 1}));
        const float le = step(eager_m, eo, x, y).item<float>();
        const float lc = compiled(x, y).item<float>();
        CAPTURE(i);
        CHECK(lc == doctest::Approx(le).epsilon(1e-4));
        if (i == 0) first = le;
        last = le;
    }
    CHECK(last < 0.2 * first);  // it learns
    const auto pe = nn::state_dict(eager_m), pc = nn::state_dict(comp_m);
    for (const auto& [name, t] : pe) {
        CAPTURE(name);
        CHECK(maxdiff(pc.at(name), t) < 1e-3);
        CHECK(maxdiff(nn::named_parameters(comp_m).at(name).grad(), nn::named_parameters(eager_m).at(name).grad()) < 1e-3);
    }
    CHECK(compiled.compiles() == 1);
    // the whole step's kernel count on the CPU (a fusion change that moves it is a conscious one):
    // 5 GEMMs, the first one's bias and relu, the loss and its gradient (2 row kernels, 1 reduce),
    // the 2 weight gradients' writes into .grad (copies of GEMM results), and AdamW: one kernel per
    // parameter storing m, v and p in place (4), the step count and its two bias corrections (2),
    // and the hidden bias gradient's column sum as a reduce kernel over the relu gradient (which
    // the weight gradient's GEMM reads too; until 2026-12-07 a row group over columns held both,
    // transposing them: the fuser's column_rows, now off on the CPU).
    // The bias gradients' sums, the parameters and the moments are stored into their memory by the
    // kernels that compute them: their writes launch nothing
    CHECK(compiled.kernels() == 18);
}

namespace {
/// A random differentiable program over x (4, 5), b (5) and c (4, 1): elementwise ops with
/// broadcasting, reductions with keepdim, softmax, a matmul; the same program for one seed.
Tensor random_program(std::uint32_t seed, const Tensor& x, const Tensor& b, const Tensor& c) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint32_t>(n)); };
    std::vector<Tensor> v{x, b, c};
    for (int step = 0; step < 7; ++step) {
        const Tensor& p = v[static_cast<std::size_t>(pick(static_cast<int>(v.size())))];
        const Tensor& q = v[static_cast<std::size_t>(pick(static_cast<int>(v.size())))];
        switch (pick(12)) {
            case 0: v.push_back(Tensor(kiln::tanh(p) * q)); break;
            case 1: v.push_back(Tensor(kiln::sigmoid(p) + q * 0.5)); break;
            case 2: v.push_back(Tensor(kiln::sin(p) - kiln::exp(kiln::tanh(q)))); break;
            case 3: v.push_back(Tensor(maximum(p, q * 0.7) + minimum(p, q))); break;
            case 4: v.push_back(Tensor(p / (q * q + 1.0))); break;
            case 5: v.push_back(Tensor(gelu_tanh(p) * kiln::log(q * q + 1.0))); break;
            case 6: v.push_back(p.rank() ? sum(p, -1, true) : Tensor(p * 2.0)); break;
            case 7: v.push_back(p.rank() ? mean(p, 0, true) : Tensor(p + 1.0)); break;
            case 8: v.push_back(p.rank() ? max(p, -1, true) : Tensor(p * p)); break;
            case 9: v.push_back(p.rank() ? softmax(p, -1) : Tensor(kiln::exp(p))); break;
            case 10: v.push_back(Tensor(p.t().contiguous().t() * 1.5)); break;  // a permuted copy and back
            default: v.push_back(p.rank() == 2 && p.size(1) == 5 ? matmul(p, v[1].unsqueeze(1)) : Tensor(kiln::abs(p) + p)); break;
        }
    }
    Tensor loss = sum(v.back() * v.back());
    for (std::size_t i = 3; i < v.size(); ++i) loss = Tensor(loss + sum(v[i]) * 0.1);
    return loss;
}
}  // namespace

TEST_CASE("compiled gradients equal eager gradients on random programs (float64, 60 seeds)") {
    manual_seed(9);
    const Tensor x = uniform({4, 5}, -1.5, 1.5), b = uniform({5}, -1.5, 1.5), c = uniform({4, 1}, -1.5, 1.5);
    for (std::uint32_t seed = 0; seed < 60; ++seed) {
        CAPTURE(seed);
        auto grads = [seed](const Tensor& xi, const Tensor& bi, const Tensor& ci) {
            std::vector<Tensor> in{xi.detach(), bi.detach(), ci.detach()};
            for (Tensor& t : in) t.requires_grad_();
            const Tensor loss = random_program(seed, in[0], in[1], in[2]);
            std::vector<Tensor> g = autograd::grad(loss, in);
            for (std::size_t k = 0; k < g.size(); ++k)
                if (!g[k].defined()) g[k] = zeros(in[k].shape(), DType::f64);
            return std::tuple<Tensor, Tensor, Tensor, Tensor>{loss.detach(), g[0], g[1], g[2]};
        };
        const auto [le, ge0, ge1, ge2] = grads(x, b, c);
        for (bool cuda_like : {false, true}) {  // also with CUDA's fusion limits, on the CPU (as in the ResNet-18 test)
            CAPTURE(cuda_like);
            Options opt;
            opt.fullgraph = true;
            opt.limits.column_rows = !cuda_like;
            opt.limits.merge_reductions = opt.limits.recompute = cuda_like;
            auto compiled = compile(grads, opt);
            const auto [lc, gc0, gc1, gc2] = compiled(x, b, c);
            CHECK(maxdiff(lc, le) < 1e-9);
            CHECK(maxdiff(gc0, ge0) < 1e-9);
            CHECK(maxdiff(gc1, ge1) < 1e-9);
            CHECK(maxdiff(gc2, ge2) < 1e-9);
        }
    }
}

TEST_CASE("select's gradient: q, k and v of one packed tensor, an index selected twice, an infinite gradient kept in its slot; compiled == eager") {
    manual_seed(12);
    const Tensor w0 = uniform({2, 3, 3, 4}, -1, 1), c0 = uniform({2, 3, 4}, -1, 1);
    Tensor c = c0.clone();
    c.data<double>()[1] = std::numeric_limits<double>::infinity();  // its gradient stays in v's slot (no 0 * inf anywhere else)
    auto grad = [&c](const Tensor& wi) {
        Tensor w = wi.detach();
        w.requires_grad_();
        const Tensor h = w * 1.0;  // a recorded op between the leaf and the selects, as a projection is
        const Tensor q = h.select(2, 0), k = h.select(2, 1), v = h.select(2, 2), k2 = h.select(2, 1);
        const Tensor loss = Tensor(sum(q * k) + sum(v * c) + sum(k2) * 3.0);
        return autograd::grad(loss, {w})[0];
    };
    // the closed form: slot 0 gets k, slot 1 gets q + 3, slot 2 gets c
    Tensor ref = zeros({2, 3, 3, 4}, DType::f64);
    ref.select(2, 0).copy_(w0.select(2, 1));
    ref.select(2, 1).copy_(Tensor(w0.select(2, 0) + 3.0));
    ref.select(2, 2).copy_(c);
    const auto same = [](const Tensor& a, const Tensor& b) {
        REQUIRE(a.shape() == b.shape());
        for (std::int64_t i = 0; i < a.numel(); ++i) {
            const double x = a.item<double>(i), y = b.item<double>(i);
            if (!(x == y || std::abs(x - y) <= 1e-12)) return false;  // a NaN is never the same
        }
        return true;
    };
    const Tensor eager = grad(w0);
    CHECK(same(eager, ref));
    auto compiled = compile(grad, {.fullgraph = true});
    CHECK(same(compiled(w0), ref));
    CHECK(same(compiled(w0), ref));  // the replayed program
}

TEST_CASE("autograd on CUDA matches the CPU" * doctest::skip(kiln_test::no_cuda())) {
    manual_seed(8);
    const Tensor x = randn({8, 16}), w = randn({4, 16}), b = randn({4});
    const Tensor t = Tensor(randint(0, 4, {8}));
    auto grads = [&](Device d) {
        Tensor xd = x.to(d), wd = w.to(d), bd = b.to(d);
        for (Tensor* p : {&xd, &wd, &bd}) p->requires_grad_();
        const Tensor h = nn::linear(xd, wd, bd, Act::gelu_tanh);
        const Tensor loss = Tensor(nn::cross_entropy(Tensor(layer_norm(h, 1) * 2.0), t.to(d)) + sum(softmax(h, 0)) * 0.1);
        loss.backward();
        return std::vector<Tensor>{loss, xd.grad(), wd.grad(), bd.grad()};
    };
    const auto c = grads(Device::cpu()), g = grads(Device::cuda(0));
    for (std::size_t i = 0; i < c.size(); ++i) {
        CAPTURE(i);
        CHECK(g[i].device().is_cuda());
        CHECK(maxdiff(g[i], c[i]) < 1e-4);
    }
}

// ------------------------------------------------------------------ training layers
TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
    using A4 = std::array<std::uint32_t, 4>;
    CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
    CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("dropout: torch's semantics, a seeded Philox mask, its gradient, and compiled == eager") {
    const Tensor x = Tensor(rand({200, 500}) + 0.5);
    CHECK(nn::dropout(x, 0.3, false).storage() == x.storage());  // eval: x itself
    CHECK(nn::dropout(x, 0.0).storage() == x.storage());
    CHECK(maxdiff(nn::dropout(x, 1.0), zeros({200, 500})) == 0);
    manual_seed(42);
    const Tensor y = nn::dropout(x, 0.3);
    const Tensor kept = Tensor(y != 0.0);
    const double frac = mean(kept.to(DType::f64)).item<double>();
    CHECK(std::abs(frac - 0.7) < 0.01);  // 100000 draws: 5 standard deviations are 0.0072
    CHECK(maxdiff(Tensor(where(kept, x / 0.7, 0.0)), y) < 1e-6);  // survivors scaled by 1 / (1 - p)
    manual_seed(42);
    CHECK(maxdiff(nn::dropout(x, 0.3), y) == 0);  // the seed decides the mask
    CHECK(maxdiff(nn::dropout(x, 0.3), y) > 0);   // the next call draws new numbers
    // the mask follows kiln::philox_word for the generator's counters 0, 1, ...
    const Tensor k2 = kept.reshape({-1});
    for (std::int64_t i : {0, 1, 2, 777, 99999})
        CHECK(k2.item<bool>(i) == ((philox_word(42, static_cast<std::uint64_t>(i)) >> 8) >= nn::detail::dropout_threshold(0.3)));
    CHECK_THROWS_AS(nn::dropout(x, 1.5), ValueError);
    CHECK_THROWS_AS(nn::dropout(Tensor(randint(0, 3, {4})), 0.5), DTypeError);
    // the gradient is the mask times the scale
    Tensor xl = x.detach().clone();
    xl.requires_grad_();
    manual_seed(3);
    const Tensor yl = nn::dropout(xl, 0.25);
    sum(yl).backward();
    CHECK(maxdiff(xl.grad(), Tensor(where(yl != 0.0, 1.0 / 0.75, 0.0))) < 1e-6);
    // compiled and eager draw the same masks for one seed (two draws of one input differ)
    auto f = [](const Tensor& a) { return Tensor(nn::dropout(a, 0.5) + nn::dropout(a, 0.5) * 2.0); };
    auto cf = compile(f);
    manual_seed(9);
    const Tensor e1 = f(x), e2 = f(x);
    manual_seed(9);
    const Tensor c1 = cf(x), c2 = cf(x);
    CHECK(maxdiff(c1, e1) < 1e-6);
    CHECK(maxdiff(c2, e2) < 1e-6);
    CHECK(maxdiff(e1, e2) > 0);
    // a mask over a tensor the function captures (not an argument) is drawn anew on every call too
    auto cc = compile([&](const Tensor& a) { return Tensor(nn::dropout(x, 0.5) + a); });
    const Tensor zero = zeros({200, 500});
    CHECK(maxdiff(cc(zero), cc(zero)) > 0);
    // nn::Dropout follows train() / eval()
    nn::BertLayer layer(8, 2, 16);
    CHECK_FALSE(layer.dropout.training);
    nn::train(layer);
    CHECK(layer.dropout.training);
    nn::eval(layer);
    CHECK_FALSE(layer.dropout.training);
}

TEST_CASE("BatchNorm2d in training mode: batch statistics, running updates, gradients") {
    manual_seed(4);
    nn::BatchNorm2d bn(3, {DType::f64});
    bn.weight = uniform({3}, 0.5, 1.5);
    bn.bias = uniform({3}, -1, 1);
    const Tensor x = uniform({4, 3, 5, 6}, -2, 3);
    nn::train(bn);
    const Tensor y = bn(x);
    // reference in float64 by hand: per channel over (N, H, W)
    const Tensor mu = mean(x, {0, 2, 3}, true), var = mean(Tensor((x - mu) * (x - mu)), {0, 2, 3}, true);
    const Tensor ref = Tensor((x - mu) / kiln::sqrt(var + 1e-5) * bn.weight.view({3, 1, 1}) + bn.bias.view({3, 1, 1}));
    CHECK(maxdiff(y, ref) < 1e-12);
    CHECK(maxdiff(bn.running_mean, Tensor(mu.reshape({3}) * 0.1)) < 1e-12);
    CHECK(maxdiff(bn.running_var, Tensor(0.9 + var.reshape({3}) * (0.1 * 120.0 / 119.0))) < 1e-12);
    // the channels-last form is the same map
    CHECK(maxdiff(bn.nhwc(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}), y) < 1e-12);
    nn::eval(bn);
    const Tensor ye = bn(x);
    CHECK(maxdiff(ye, Tensor((x - bn.running_mean.view({3, 1, 1})) / kiln::sqrt(bn.running_var.view({3, 1, 1}) + 1e-5) *
                             bn.weight.view({3, 1, 1}) + bn.bias.view({3, 1, 1}))) < 1e-12);
    nn::train(bn);
    gradcheck("batch_norm train", [&](const auto& v) {
        bn.weight = v[1];
        bn.bias = v[2];
        return bn(v[0]);
    }, {uniform({3, 3, 2, 3}, -2, 2), bn.weight, bn.bias});
    // parameters exclude the running statistics; the state dict has them
    CHECK(nn::parameters(bn).size() == 2);
    CHECK(nn::state_dict(bn).size() == 4);
    CHECK_FALSE(bn.running_mean.requires_grad());
    CHECK_THROWS_AS(bn(uniform({1, 3, 1, 1}, 0, 1)), ValueError);
}

TEST_CASE("conv2d and max_pool2d gradients match finite differences") {
    manual_seed(12);
    nn::Window w;
    w.sh = 2, w.sw = 1, w.ph = 1, w.pw = 2, w.dh = 1, w.dw = 2;
    gradcheck("conv2d stride/padding/dilation + bias", [&](const auto& v) { return nn::conv2d(v[0], v[1], v[2], w); },
              {uniform({2, 3, 5, 6}, -1, 1), uniform({4, 3, 3, 2}, -1, 1), uniform({4}, -1, 1)});
    gradcheck("conv2d 1x1 stride 2, no bias", [&](const auto& v) {
        nn::Window s;
        s.sh = s.sw = 2;
        return nn::conv2d(v[0], v[1], Tensor{}, s);
    }, {uniform({2, 4, 5, 5}, -1, 1), uniform({3, 4, 1, 1}, -1, 1)});
    gradcheck("conv2d with residual and relu", [&](const auto& v) {
        nn::Window s;
        s.ph = s.pw = 1;
        return nn::detail::conv2d_nhwc(v[0], v[1], Tensor{}, s, Act::relu, std::source_location::current(), v[2]);
    }, {uniform({1, 4, 4, 2}, -1, 1), uniform({3, 2, 3, 3}, -1, 1), uniform({1, 4, 4, 3}, -1, 1)});
    // distinct values: every window has one maximum
    nn::Window p;
    p.kh = p.kw = 3;
    p.sh = p.sw = 2;
    p.ph = p.pw = 1;
    const Tensor distinct = Tensor(arange(2 * 3 * 7 * 6, DType::f64).reshape({2, 3, 7, 6}) * 0.37);
    const Tensor perm = Tensor(kiln::sin(distinct) * 3.0);
    gradcheck("max_pool2d", [&](const auto& v) { return nn::max_pool2d(v[0], p); }, {perm});
    // ties: the gradient goes to the first maximum of each window, as torch's does
    Tensor flat = zeros({1, 1, 4, 4}, DType::f64);
    flat.requires_grad_();
    nn::Window q;
    q.kh = q.kw = 2;
    q.sh = q.sw = 2;
    sum(nn::max_pool2d(flat, q)).backward();
    const Tensor expect = Tensor(arange(16, DType::f64).reshape({1, 1, 4, 4}) * 0.0);
    Tensor e = expect.clone();
    for (auto [r, c] : {std::pair{0, 0}, {0, 2}, {2, 0}, {2, 2}}) e.at<double>({0, 0, r, c}) = 1.0;
    CHECK(maxdiff(flat.grad(), e) == 0);
    // adaptive average pooling is a mean: its gradient by decomposition
    gradcheck("adaptive_avg_pool2d", [&](const auto& v) { return nn::adaptive_avg_pool2d(v[0], 2, 1); }, {uniform({1, 2, 4, 3}, -1, 1)});
}

namespace {
/// ResNet-18's compiled training step against eager; `cuda_like`: with CUDA's fusion limits, on
/// the CPU (column sums as reduce groups, sibling reductions joined: one group computing
/// BatchNorm's two gradient sums; producers recomputed).
void resnet18_trains(bool cuda_like, Device dev = Device::cpu()) {
    CAPTURE(cuda_like);
    CAPTURE(dev.str());
    Options opt;
    opt.fullgraph = true;
    if (cuda_like) {
        opt.limits.column_rows = false;
        opt.limits.merge_reductions = opt.limits.recompute = true;
    }
    manual_seed(21);
    nn::ResNet18 eager_m(10), comp_m(10);
    copy_weights(eager_m, comp_m);
    nn::to(eager_m, dev);
    nn::to(comp_m, dev);
    nn::train(eager_m);
    nn::train(comp_m);
    CHECK(eager_m.bn1.training);
    CHECK(eager_m.blocks[2].down_bn.training);
    CHECK(nn::parameters(eager_m).size() == 62);  // torchvision's resnet18 has 62 parameter tensors
    CHECK(nn::state_dict(eager_m).size() == 102);  // and 102 state-dict entries without num_batches_tracked
    nn::SGD eo(nn::parameters(eager_m), {.lr = 0.01, .momentum = 0.9}), co(nn::parameters(comp_m), {.lr = 0.01, .momentum = 0.9});
    auto step = [](nn::ResNet18& m, nn::Optimizer& o, const Tensor& x, const Tensor& y) {
        return train_step(o, [&] { return nn::cross_entropy(m(x), y); });
    };
    auto compiled = compile([&](const Tensor& x, const Tensor& y) { return step(comp_m, co, x, y); }, opt);
    manual_seed(22);
    // 24 x 24 images: layer3 at 2 x 2 and layer4 at 1 x 1 as with 32 x 32, in 56% of its convolutions
    // (each CPU case took 40 s under CI's sanitizers at 32 x 32). At 16 x 16 layer3 is 1 x 1 too, its
    // BatchNorms normalize 4 values each, and on CUDA the two steps drifted 5% apart by the fourth step.
    const Tensor x = randn({4, 3, 24, 24}).to(dev), y = Tensor(randint(0, 10, {4})).to(dev);
    float first = 0, last = 0;
    for (int i = 0; i < 4; ++i) {
        const float le = step(eager_m, eo, x, y).item<float>();
        const float lc = compiled(x, y).item<float>();
        CAPTURE(i);
        CHECK(lc == doctest::Approx(le).epsilon(2e-3));
        if (i == 0) first = le;
        last = le;
    }
    CHECK(last < first);  // the same batch four times: the loss falls
    CHECK(compiled.compiles() == 1);
    const std::string what = "resnet18 training step on " + dev.str() + (cuda_like ? " with CUDA's fusion limits: " : ": ") +
                             std::to_string(compiled.kernels()) + " kernels";
    MESSAGE(what);
    const auto pe = nn::state_dict(eager_m), pc = nn::state_dict(comp_m);
    for (const std::string name : {"conv1.weight", "bn1.running_mean", "layer4.1.bn2.running_var", "fc.weight", "fc.bias"}) {
        CAPTURE(name);
        CHECK(maxdiff(pc.at(name).cpu(), pe.at(name).cpu()) < 2e-3 * std::max(1.0, maxdiff(pe.at(name).cpu(), zeros(pe.at(name).shape()))));
    }
}
}  // namespace

// On cuDNN, conv2d copies its weight channels-last outside autograd (a detached view of the
// parameter): that copy must be recorded, not made once while tracing (the compiled step then
// ran its forward and backward data on the first step's weights: loss 6.90 against eager's 5.93
// at the bench's second step)
TEST_CASE("ResNet-18 trains on CUDA: a compiled step matches the eager one from step to step" * doctest::skip(kiln_test::no_cuda())) {
    resnet18_trains(true, Device::cuda(0));
}

TEST_CASE("ResNet-18 trains: a compiled SGD-momentum step matches the eager one, BatchNorm in training mode") {
    SUBCASE("the CPU's fusion limits") { resnet18_trains(false); }
    SUBCASE("CUDA's fusion limits") { resnet18_trains(true); }
}
/// Two convolutions (the channels-last weight case below).
struct TwoConvs {
    nn::Conv2d c1{6, 16, 3, 1, 1, false}, c2{16, 8, 3, 2, 1, true};
    Tensor operator()(const Tensor& x) const { return c2(kiln::relu(c1(x))); }
    template <class F> void visit(const std::string& prefix, F&& f) {
        c1.visit(prefix + "c1.", f);
        c2.visit(prefix + "c2.", f);
    }
};
TEST_CASE("a convolution's weight is stored channels-last: a training step copies no weight, gradients and state share its layout") {
    // dense_order / memory_order: the layouts that count as dense, and the order they give
    std::vector<std::int64_t> order;
    CHECK(dense_order(Shape{4, 3, 2, 2}, Strides{12, 1, 6, 3}, order));
    CHECK(order == std::vector<std::int64_t>{0, 2, 3, 1});
    CHECK(dense_order(Shape{3, 1, 5}, Strides{5, 99, 1}, order));  // a size-1 dim's stride is free
    CHECK_FALSE(dense_order(Shape{4, 3}, Strides{6, 1}, order));  // a slice: gaps
    CHECK_FALSE(dense_order(Shape{4, 3}, Strides{0, 1}, order));  // a broadcast: overlaps
    CHECK(memory_order(randn({3, 4}).t()) == std::vector<std::int64_t>{1, 0});
    CHECK(memory_order(randn({3, 4})).empty());

    manual_seed(31);
    auto channels_last = [](const Tensor& w) { return w.stride(1) == 1 && w.stride(3) == w.size(1) && w.stride(2) == w.size(1) * w.size(3); };
    TwoConvs cl, rm;
    copy_weights(cl, rm);
    CHECK(channels_last(cl.c1.weight));
    CHECK(channels_last(rm.c2.weight));  // load_state keeps the parameter's layout
    rm.visit("", [](const std::string&, Tensor& t) { t = t.contiguous(); });  // the same values row-major
    CHECK(rm.c1.weight.is_contiguous());
    CHECK(maxdiff(cl.c1.weight, rm.c1.weight) == 0);
    nn::SGD ocl(nn::parameters(cl), {.lr = 0.05, .momentum = 0.9}), orm(nn::parameters(rm), {.lr = 0.05, .momentum = 0.9});
    CHECK(ocl.state_dict().at("0.momentum_buffer").strides() == cl.c1.weight.strides());  // the state in the parameter's layout
    auto step = [](TwoConvs& m, nn::Optimizer& o, const Tensor& x, const Tensor& y) { return train_step(o, [&] { return nn::mse_loss(m(x), y); }); };
    auto ccl = compile([&](const Tensor& x, const Tensor& y) { return step(cl, ocl, x, y); }, {.fullgraph = true});
    auto crm = compile([&](const Tensor& x, const Tensor& y) { return step(rm, orm, x, y); }, {.fullgraph = true});
    const Tensor x = randn({2, 6, 9, 9}), y = randn({2, 8, 5, 5});
    for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        const float a = ccl(x, y).item<float>(), b = crm(x, y).item<float>();
        CHECK(a == doctest::Approx(b).epsilon(1e-6));
    }
    CHECK(maxdiff(cl.c1.weight, rm.c1.weight) < 1e-6);
    CHECK(maxdiff(cl.c2.bias, rm.c2.bias) < 1e-6);
    CHECK(channels_last(cl.c1.weight));  // updated in place, in its layout
    CHECK(cl.c1.weight.grad().strides() == cl.c1.weight.strides());
    // row-major weights cost each convolution a copy into channels-last per step, and their
    // updates write through other layouts: fewer kernels with the weights stored channels-last
    MESSAGE("kernels per step: channels-last weights " << ccl.kernels() << ", row-major " << crm.kernels());
    CHECK(ccl.kernels() < crm.kernels());
    // eager backward: the gradient in the parameter's layout as well
    TwoConvs e;
    copy_weights(cl, e);
    (void)nn::parameters(e);  // marks them to require grad
    nn::mse_loss(e(x), y).backward();
    CHECK(e.c1.weight.grad().strides() == e.c1.weight.strides());
    // moves and casts keep it
    nn::to(e, DType::f64);
    CHECK(channels_last(e.c2.weight));
    CHECK(maxdiff(e.c2.weight, Tensor(cl.c2.weight.to(DType::f64))) == 0);
}

TEST_CASE("a compiled program reads a parameter's current value, also through a copy or a parameter-only expression") {
    // a parameter (requires grad) is live memory for a trace: work on it alone is recorded, not
    // computed once while tracing (a training step writes it later in the same trace)
    manual_seed(21);
    const Tensor x = randn({2, 3, 8, 8});
    for (int k : {1, 3}) {  // the GEMM reads a view of the (channels-last) weight
        CAPTURE(k);
        nn::Conv2d conv(3, 4, k, 1, k / 2, true);
        conv.weight.requires_grad_();
        conv.bias.requires_grad_();
        auto f = [&](const Tensor& a) { return Tensor(sum(Tensor(conv(a) * conv(a))) + sum(Tensor(conv.weight * 2.0)) + sum(matmul(conv.bias, conv.bias))); };
        auto c = compile(f);
        CHECK(c(x).item<float>() == doctest::Approx(f(x).item<float>()).epsilon(1e-5));
        {
            const no_grad off;
            Tensor w = conv.weight, b = conv.bias;
            w.copy_(Tensor(w * 2.0));
            b.copy_(Tensor(b + 1.0));
        }
        CHECK(c(x).item<float>() == doctest::Approx(f(x).item<float>()).epsilon(1e-5));
        CHECK(c.compiles() == 1);
    }
    // a detached view of a parameter is the parameter's memory: work on it alone (a copy made
    // outside autograd, as conv2d's channels-last weight on cuDNN) is recorded too
    Tensor p = randn({4, 5});
    p.requires_grad_();
    auto g = [&](const Tensor& a) {
        const Tensor pt = [&] {
            const no_grad off;
            return p.detach().t().contiguous();
        }();
        return Tensor(sum(Tensor(a * pt)));
    };
    auto cg = compile(g);
    const Tensor a = randn({5, 4});
    CHECK(cg(a).item<float>() == doctest::Approx(g(a).item<float>()).epsilon(1e-5));
    {
        const no_grad off;
        p.copy_(Tensor(p * -3.0 + 1.0));
    }
    CHECK(cg(a).item<float>() == doctest::Approx(g(a).item<float>()).epsilon(1e-5));
    CHECK(cg.compiles() == 1);
}

TEST_CASE("training layers on CUDA: dropout masks (eager == compiled == replayed graphs), conv/pool/BatchNorm gradients" *
          doctest::skip(kiln_test::no_cuda())) {
    const Device gpu = Device::cuda(0);
    const Tensor x = Tensor(rand({64, 300}) + 0.5);
    // one seed, one mask: the device stream starts at the generator's counter
    manual_seed(77);
    const Tensor yc = nn::dropout(x, 0.4);
    manual_seed(77);
    const Tensor yg = nn::dropout(x.to(gpu), 0.4);
    CHECK(yg.device().is_cuda());
    CHECK(maxdiff(yg.cpu(), yc) < 1e-6);
    // every call draws anew, and eager, compiled and reduce_overhead (captured once, then replayed)
    // draw the same sequence of masks for one seed
    auto f = [](const Tensor& a) { return Tensor(nn::dropout(a, 0.5) * 3.0); };
    auto co = compile(f);
    auto ro = compile(f, {.mode = Mode::reduce_overhead});
    const Tensor xg = x.to(gpu);
    auto run = [&](auto&& g) {
        manual_seed(5);
        std::vector<Tensor> out;
        for (int i = 0; i < 6; ++i) out.push_back(g(xg).cpu());
        return out;
    };
    const std::size_t replays0 = cuda::graph_stats().replays;
    const auto e = run(f), c = run(co), r = run(ro);
    CHECK(cuda::graph_stats().replays - replays0 >= 3);
    for (std::size_t i = 0; i < e.size(); ++i) {
        CAPTURE(i);
        CHECK(maxdiff(c[i], e[i]) == 0);
        CHECK(maxdiff(r[i], e[i]) == 0);
        if (i > 0) CHECK(maxdiff(e[i], e[i - 1]) > 0);
    }
    // conv2d (stride, padding, bias), BatchNorm2d in training mode, relu, max_pool2d: loss and every
    // gradient on the GPU as on the CPU
    manual_seed(6);
    const Tensor x0 = randn({2, 3, 9, 9}), w0 = randn({8, 3, 3, 3}), b0 = randn({8}), g0 = Tensor(rand({8}) + 0.5);
    auto grads = [&](Device d) {
        Tensor xi = x0.to(d), w = w0.to(d), b = b0.to(d);
        nn::BatchNorm2d bn(8, {DType::f32, d});
        bn.weight = g0.to(d);
        nn::train(bn);
        for (Tensor* p : {&xi, &w, &b, &bn.weight}) p->requires_grad_();
        nn::Window win, pool;
        win.sh = win.sw = 2;
        win.ph = win.pw = 1;
        pool.kh = pool.kw = 3;
        pool.sh = pool.sw = 2;
        pool.ph = pool.pw = 1;
        const Tensor h = nn::max_pool2d(Tensor(relu(bn(nn::conv2d(xi, w, b, win)))), pool);
        const Tensor loss = sum(Tensor(h * h));
        loss.backward();
        return std::vector<Tensor>{loss, xi.grad(), w.grad(), b.grad(), bn.weight.grad(), bn.running_var};
    };
    const auto cg = grads(Device::cpu()), gg = grads(gpu);
    for (std::size_t i = 0; i < cg.size(); ++i) {
        CAPTURE(i);
        CHECK(gg[i].device().is_cuda());
        CHECK(maxdiff(gg[i].cpu(), cg[i]) < 1e-3 * std::max(1.0, maxdiff(cg[i], zeros(cg[i].shape()))));
    }
}

TEST_CASE("a training step under reduce_overhead replays its CUDA graph on every call" * doctest::skip(kiln_test::no_cuda())) {
    // the step writes its parameters in place: the graph's outputs include them, held by the model,
    // which must not keep an instance from replaying
    manual_seed(5);
    Regressor eager_m, comp_m;
    for (Regressor* m : {&eager_m, &comp_m}) nn::to(*m, Device::cuda(0));
    copy_weights(eager_m, comp_m);
    nn::AdamW eo(nn::parameters(eager_m), {.lr = 1e-2}), co(nn::parameters(comp_m), {.lr = 1e-2});
    auto step = [](Regressor& m, nn::Optimizer& o, const Tensor& x, const Tensor& y) {
        return train_step(o, [&] { return nn::mse_loss(m(x), y); });
    };
    auto ro = compile([&](const Tensor& x, const Tensor& y) { return step(comp_m, co, x, y); }, {.mode = Mode::reduce_overhead});
    manual_seed(6);
    const Tensor x = randn({128, 16}).cuda(), y = randn({128, 1}).cuda();
    const cuda::GraphStats before = cuda::graph_stats();
    Tensor lc;
    for (int i = 0; i < 12; ++i) {
        const float le = step(eager_m, eo, x, y).item<float>();
        lc = ro(x, y);  // held until the next call, as a training loop holds its loss
        CAPTURE(i);
        CHECK(lc.item<float>() == doctest::Approx(le).epsilon(1e-4));
    }
    const cuda::GraphStats after = cuda::graph_stats();
    CHECK(after.fallbacks - before.fallbacks == 1);  // the first call, which compiles
    CHECK(after.replays - before.replays == 11);
    CHECK(after.captures - before.captures <= 2);    // two instances alternate while the caller holds a loss
}
