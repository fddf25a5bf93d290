// nn blocks: each checked against a float64 reference written with loops, called directly and
// under kiln::compile, plus parameters (state_dict, load_state) and their errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <unistd.h>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <string>
#include <vector>

#include "kiln/nn/conv_cpu.hpp"       // the CPU kernels, called directly
#include "kiln/nn/conv_winograd.hpp"
#include "test_util.hpp"

namespace {

using namespace kiln;

double max_rel(const Tensor& a_in, const Tensor& b_in) {
    const Tensor a = a_in.cpu().to(DType::f64).contiguous(), b = b_in.cpu().to(DType::f64).contiguous();
    REQUIRE(a.shape() == b.shape());
    double m = 0, scale = 1e-30;
    for (std::int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::abs(b.data<double>()[i]));
    for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.data<double>()[i] - b.data<double>()[i]));
    return m / scale;
}

std::string message_of(auto&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

/// x (.., in) @ w^T + b in float64 with loops.
std::vector<double> ref_linear(const std::vector<double>& x, std::int64_t rows, std::int64_t in, const Tensor& w, const Tensor& b) {
    const std::int64_t out = w.size(0);
    std::vector<double> y(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t o = 0; o < out; ++o) {
            double s = b.defined() ? b.item<double>(o) : 0.0;
            for (std::int64_t i = 0; i < in; ++i) s += x[static_cast<std::size_t>(r * in + i)] * w.item<double>(o * in + i);
            y[static_cast<std::size_t>(r * out + o)] = s;
        }
    return y;
}

std::vector<double> values(const Tensor& t) {
    const Tensor c = t.cpu().to(DType::f64).contiguous();
    return {c.data<double>(), c.data<double>() + c.numel()};
}

Tensor from(const std::vector<double>& v, const Shape& s) {
    Tensor t = zeros(s, DType::f64);
    std::copy(v.begin(), v.end(), t.data<double>());
    return t;
}

void ref_layer_norm(std::vector<double>& x, std::int64_t rows, std::int64_t n, const nn::LayerNorm& ln) {
    for (std::int64_t r = 0; r < rows; ++r) {
        double mu = 0, var = 0;
        for (std::int64_t i = 0; i < n; ++i) mu += x[static_cast<std::size_t>(r * n + i)];
        mu /= static_cast<double>(n);
        for (std::int64_t i = 0; i < n; ++i) var += std::pow(x[static_cast<std::size_t>(r * n + i)] - mu, 2);
        var /= static_cast<double>(n);
        for (std::int64_t i = 0; i < n; ++i) {
            double& v = x[static_cast<std::size_t>(r * n + i)];
            v = (v - mu) / std::sqrt(var + ln.eps) * ln.weight.item<double>(i) + ln.bias.item<double>(i);
        }
    }
}

double ref_gelu_tanh(double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

/// Multi-head self-attention in float64: x (B, S, E); keep(b, i, j) false masks a position out.
std::vector<double> ref_mha(const Tensor& x, const nn::MultiheadAttention& m, const std::vector<char>& keep) {
    const std::int64_t B = x.size(0), S = x.size(1), E = x.size(2), H = m.num_heads, D = E / H;
    const std::vector<double> qkv = ref_linear(values(x), B * S, E, m.in_proj_weight, m.in_proj_bias);
    std::vector<double> a(static_cast<std::size_t>(B * S * E));
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < S; ++i) {
                std::vector<double> p(static_cast<std::size_t>(S));
                for (std::int64_t j = 0; j < S; ++j) {
                    double s = 0;
                    for (std::int64_t d = 0; d < D; ++d)
                        s += qkv[static_cast<std::size_t>((b * S + i) * 3 * E + h * D + d)] *
                             qkv[static_cast<std::size_t>((b * S + j) * 3 * E + E + h * D + d)];
                    s /= std::sqrt(static_cast<double>(D));
                    if (!keep.empty() && !keep[static_cast<std::size_t>((b * S + i) * S + j)]) s = -INFINITY;
                    p[static_cast<std::size_t>(j)] = s;
                }
                kiln_test::softmax_row_f64(p);
                for (std::int64_t d = 0; d < D; ++d) {
                    double o = 0;
                    for (std::int64_t j = 0; j < S; ++j)
                        o += p[static_cast<std::size_t>(j)] * qkv[static_cast<std::size_t>((b * S + j) * 3 * E + 2 * E + h * D + d)];
                    a[static_cast<std::size_t>((b * S + i) * E + h * D + d)] = o;
                }
            }
    return ref_linear(a, B * S, E, m.out_proj.weight, m.out_proj.bias);
}

}  // namespace

TEST_CASE("nn::Linear and nn::linear: bias, activations, layouts, errors") {
    manual_seed(11);
    const Tensor x = randn({3, 5, 16});
    for (const ActInfo& row : act_table) {  // every activation of the table
        const nn::Act act = row.act;
        for (bool bias : {true, false}) {
            const nn::Linear lin(16, 24, bias, act);
            std::vector<double> ref = ref_linear(values(x), 15, 16, lin.weight, lin.bias);
            for (double& v : ref)
                v = act == nn::Act::relu        ? std::max(v, 0.0)
                    : act == nn::Act::gelu_tanh ? ref_gelu_tanh(v)
                    : act == nn::Act::gelu      ? 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))
                                                : v;
            CHECK(max_rel(lin(x), from(ref, {3, 5, 24})) < 1e-6);
            auto f = compile([&](const Tensor& t) { return lin(t); });
            CHECK(max_rel(f(x), from(ref, {3, 5, 24})) < 1e-6);
        }
    }
    const nn::Linear lin(16, 24);
    CHECK_THROWS_AS(lin(randn({4, 15})), ShapeError);
    const std::string m = message_of([&] { lin(randn({4, 15})); });
    CHECK(m.find("in_features = 16") != std::string::npos);
    CHECK(m.find("test_nn.cpp") != std::string::npos);
    CHECK_THROWS_AS(nn::linear(x, randn({24}), {}), ShapeError);
    CHECK_THROWS_AS(nn::linear(x, randn({24, 16}), randn({23})), ShapeError);
}

TEST_CASE("the activation table: names, op ids, epilogue sets") {
    for (const ActInfo& row : act_table) {
        CHECK(act_info(row.act).name == row.name);
        if (row.op >= 0) {  // an op-table op: same name, and the op maps back to the activation
            CHECK(ops::op_name(static_cast<ops::OpId>(row.op)) == row.name);
            CHECK(act_of_op(static_cast<ops::OpId>(row.op)) == row.act);
        }
    }
    CHECK(act_of_op(ops::op_id<ops::Exp>) == std::nullopt);
    CHECK(act_info(Act::relu).gemm_epilogue);
    CHECK(act_info(Act::gelu).gemm_epilogue);  // not cuBLASLt's (its GELU is the tanh form): the small kernel's, or a pass after it
    CHECK_FALSE(act_info(Act::gelu_tanh).conv_epilogue);
    CHECK(act_name(Act::gelu_tanh) == "gelu_tanh");
}

TEST_CASE("nn::MultiheadAttention matches a float64 reference, with and without masks") {
    manual_seed(12);
    const std::int64_t B = 2, S = 7, E = 16, H = 4;
    const nn::MultiheadAttention mha(E, H);
    const Tensor x = randn({B, S, E});
    CHECK(max_rel(mha(x), from(ref_mha(x, mha, {}), {B, S, E})) < 1e-5);
    // a causal bool mask (true = attend), and the same as an additive float mask
    Tensor keep = zeros({S, S}, DType::boolean);
    std::vector<char> keep_v(static_cast<std::size_t>(B * S * S));
    for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t j = 0; j < S; ++j) {
            keep.at<bool>({i, j}) = j <= i;
            for (std::int64_t b = 0; b < B; ++b) keep_v[static_cast<std::size_t>((b * S + i) * S + j)] = j <= i;
        }
    const Tensor ref = from(ref_mha(x, mha, keep_v), {B, S, E});
    CHECK(max_rel(mha(x, keep), ref) < 1e-5);
    const Tensor additive = Tensor(where(keep, 0.0, -INFINITY));
    CHECK(max_rel(mha(x, additive), ref) < 1e-5);
    auto f = compile([&](const Tensor& t, const Tensor& mk) { return mha(t, mk); });
    CHECK(max_rel(f(x, keep), ref) < 1e-5);
    CHECK_THROWS_AS(mha(randn({B, S, E + 1})), ShapeError);
    CHECK_THROWS_AS(nn::MultiheadAttention(10, 3), ShapeError);
}

TEST_CASE("nn::BertLayer: direct, compiled and float64 agree; compiled is one graph of few kernels") {
    manual_seed(13);
    const std::int64_t B = 2, S = 6, E = 16, H = 2, F = 32;
    const nn::BertLayer layer(E, H, F);
    const Tensor x = randn({B, S, E});
    // float64 reference
    std::vector<double> h = ref_mha(x, layer.self_attn, {});
    const std::vector<double> xv = values(x);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += xv[i];
    ref_layer_norm(h, B * S, E, layer.norm1);
    std::vector<double> f1 = ref_linear(h, B * S, E, layer.linear1.weight, layer.linear1.bias);
    for (double& v : f1) v = ref_gelu_tanh(v);
    std::vector<double> y = ref_linear(f1, B * S, F, layer.linear2.weight, layer.linear2.bias);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += h[i];
    ref_layer_norm(y, B * S, E, layer.norm2);
    const Tensor ref = from(y, {B, S, E});

    CHECK(max_rel(layer(x), ref) < 1e-5);
    auto f = compile([&](const Tensor& t) { return layer(t); });
    CHECK(max_rel(f(x), ref) < 1e-5);
    CHECK(f.graph_breaks().empty());
    // 6 GEMMs (qkv, scores, context, out_proj, linear1, linear2), the softmax row kernel, two
    // residual layer norms, the bias adds and the gelu (and copies of non-contiguous views)
    MESSAGE("bert layer, compiled on the CPU: " << f.kernels() << " kernels");
    CHECK(f.kernels() <= 14);
    // another batch size reuses the program with dims made dynamic
    const Tensor x2 = randn({3, S, E});
    CHECK(max_rel(f(x2), layer(x2)) < 1e-5);
}

TEST_CASE("nn::Mlp, GELU, ReLU, Dropout, LayerNorm") {
    manual_seed(14);
    const nn::Mlp mlp(8, 32, 8);
    const Tensor x = randn({4, 8});
    std::vector<double> hdn = ref_linear(values(x), 4, 8, mlp.fc1.weight, mlp.fc1.bias);
    for (double& v : hdn) v = ref_gelu_tanh(v);
    const Tensor ref = from(ref_linear(hdn, 4, 32, mlp.fc2.weight, mlp.fc2.bias), {4, 8});
    CHECK(max_rel(mlp(x), ref) < 1e-6);
    CHECK(max_rel(compile([&](const Tensor& t) { return mlp(t); })(x), ref) < 1e-6);
    CHECK(max_rel(nn::GELU{}(x), Tensor(gelu(x))) == 0);
    CHECK(max_rel(nn::GELU{true}(x), Tensor(gelu_tanh(x))) == 0);
    CHECK(max_rel(nn::ReLU{}(x), Tensor(relu(x))) == 0);
    CHECK(nn::Dropout{0.5}(x).is_same(x));
    nn::LayerNorm ln(8, 1e-6);
    ln.weight = randn({8});
    ln.bias = randn({8});
    std::vector<double> lv = values(x);
    ref_layer_norm(lv, 4, 8, ln);
    CHECK(max_rel(ln(x), from(lv, {4, 8})) < 1e-5);
}

TEST_CASE("nn::Embedding: rows by id, any id shape, errors, and under compile (a call inside the graph)") {
    manual_seed(15);
    const nn::Embedding emb(10, 6);
    Tensor ids = zeros({2, 3}, DType::i64);
    const std::int64_t pick[] = {3, 0, 9, 9, 4, 1};
    for (int i = 0; i < 6; ++i) ids.data<std::int64_t>()[i] = pick[i];
    const Tensor e = emb(ids);
    CHECK(e.shape() == Shape{2, 3, 6});
    for (int i = 0; i < 6; ++i)
        for (int c = 0; c < 6; ++c) CHECK(e.item<double>(i * 6 + c) == emb.weight.item<double>(pick[i] * 6 + c));
    CHECK(max_rel(emb(ids.to(DType::i32)), e) == 0);
    ids.data<std::int64_t>()[4] = 10;
    const std::string m = message_of([&] { emb(ids); });
    CHECK(m.find("id 10 is out of range for an embedding of 10 rows") != std::string::npos);
    CHECK_THROWS_AS(emb(ids), ValueError);
    CHECK_THROWS_AS(emb(zeros({3})), DTypeError);
    ids.data<std::int64_t>()[4] = 4;
    // under compile: the gather is a library call inside the graph (no graph break), and each
    // call checks its ids
    auto f = compile([&](const Tensor& i) { return Tensor(emb(i) * 2.0 + 1.0); }, {.fullgraph = true});
    CHECK(max_rel(f(ids), Tensor(e * 2.0 + 1.0)) == 0);
    CHECK(f.graph_breaks().empty());
    ids.data<std::int64_t>()[0] = 7;
    CHECK(max_rel(f(ids), Tensor(emb(ids) * 2.0 + 1.0)) == 0);
    ids.data<std::int64_t>()[0] = -1;
    CHECK_THROWS_WITH_AS(f(ids), doctest::Contains("id -1 is out of range for an embedding of 10 rows"), ValueError);
    ids.data<std::int64_t>()[0] = 7;
    CHECK(max_rel(f(ids), Tensor(emb(ids) * 2.0 + 1.0)) == 0);  // the program still runs after the error
    // another id shape: the call's shape rule gives the result's shape
    const Tensor ids3 = ids.reshape({6});
    CHECK(f(ids3).shape() == Shape{6, 6});
    CHECK(max_rel(f(ids3), Tensor(emb(ids3) * 2.0 + 1.0)) == 0);
}

TEST_CASE("nn parameters: state_dict names, load_state round trip and its errors, dtype moves") {
    manual_seed(16);
    nn::BertLayer a(16, 2, 32), b(16, 2, 32);
    const auto sd = nn::state_dict(a);
    const std::vector<std::string> names = {"linear1.bias", "linear1.weight", "linear2.bias", "linear2.weight",
                                            "norm1.bias", "norm1.weight", "norm2.bias", "norm2.weight",
                                            "self_attn.in_proj_bias", "self_attn.in_proj_weight",
                                            "self_attn.out_proj.bias", "self_attn.out_proj.weight"};
    std::vector<std::string> got;
    for (const auto& [n, t] : sd) got.push_back(n);
    CHECK(got == names);
    const Tensor x = randn({2, 5, 16});
    CHECK(max_rel(a(x), b(x)) > 1e-3);
    nn::load_state(b, sd);
    CHECK(max_rel(a(x), b(x)) == 0);

    auto missing = sd;
    missing.erase("norm2.bias");
    CHECK(message_of([&] { nn::load_state(b, missing); }).find("missing parameter(s): 'norm2.bias'") != std::string::npos);
    auto extra = sd;
    extra.emplace("pooler.weight", zeros({2}));
    CHECK(message_of([&] { nn::load_state(b, extra); }).find("unexpected parameter(s): 'pooler.weight'") != std::string::npos);
    CHECK_NOTHROW(nn::load_state(b, extra, /*strict=*/false));
    auto wrong = sd;
    wrong["linear1.weight"] = zeros({16, 32});
    const std::string m = message_of([&] { nn::load_state(b, wrong); });
    CHECK(m.find("'linear1.weight' has shape (32, 16) but the loaded tensor has shape (16, 32)") != std::string::npos);
    CHECK_THROWS_AS(nn::load_state(b, wrong), ShapeError);

    // bf16 parameters: loaded values are converted to the parameter's dtype
    nn::BertLayer c(16, 2, 32);
    nn::to(c, DType::bf16);
    nn::load_state(c, sd);
    CHECK(c.linear1.weight.dtype() == DType::bf16);
    CHECK(max_rel(c(x.to(DType::bf16)), a(x)) < 5e-2);
}

TEST_CASE("nn parameters: a module saved to safetensors loads into another (load_state over load_safetensors)") {
    manual_seed(17);
    nn::BertLayer a(16, 2, 32), b(16, 2, 32);
    const auto path = std::filesystem::temp_directory_path() / ("kiln_test_nn_" + std::to_string(::getpid()) + ".safetensors");
    nn::save_safetensors(path, nn::state_dict(a), {{"format", "kiln"}});
    nn::load_state(b, nn::load_safetensors(path));
    const Tensor x = randn({2, 5, 16});
    CHECK(max_rel(a(x), b(x)) == 0);
    // a file of another model's shapes names the parameter and both shapes
    nn::BertLayer wide(32, 2, 32);
    CHECK_THROWS_AS(nn::load_state(wide, nn::load_safetensors(path)), ShapeError);
    std::filesystem::remove(path);
}

namespace {

/// conv2d in float64 with loops: x (N, C, H, W), w (OC, C, KH, KW).
Tensor ref_conv(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const nn::Window& win, bool relu_after) {
    const Tensor x = x_in.to(DType::f64).contiguous(), w = w_in.to(DType::f64).contiguous();
    const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), OC = w.size(0), KH = w.size(2), KW = w.size(3);
    nn::Window g = win;
    g.kh = KH;
    g.kw = KW;
    const std::int64_t OH = g.out_h(H), OW = g.out_w(W);
    Tensor y = zeros({N, OC, OH, OW}, DType::f64);
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t o = 0; o < OC; ++o)
            for (std::int64_t i = 0; i < OH; ++i)
                for (std::int64_t j = 0; j < OW; ++j) {
                    double s = b_in.defined() ? b_in.item<double>(o) : 0.0;
                    for (std::int64_t c = 0; c < C; ++c)
                        for (std::int64_t a = 0; a < KH; ++a)
                            for (std::int64_t b = 0; b < KW; ++b) {
                                const std::int64_t h = i * g.sh - g.ph + a * g.dh, ww = j * g.sw - g.pw + b * g.dw;
                                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                                s += x.data<double>()[((n * C + c) * H + h) * W + ww] * w.data<double>()[((o * C + c) * KH + a) * KW + b];
                            }
                    y.data<double>()[((n * OC + o) * OH + i) * OW + j] = relu_after ? std::max(s, 0.0) : s;
                }
    return y;
}

}  // namespace

TEST_CASE("nn::conv2d: strides, padding, dilation, bias, relu, non-contiguous input, compiled") {
    manual_seed(18);
    struct Case { std::int64_t k, s, p, d; bool bias, relu; };
    for (const Case c : {Case{3, 1, 1, 1, true, false}, Case{3, 2, 1, 1, false, true}, Case{1, 2, 0, 1, true, false},
                         Case{7, 2, 3, 1, false, false}, Case{3, 1, 2, 2, true, true}, Case{2, 3, 0, 1, true, false}}) {
        CAPTURE(c.k);
        CAPTURE(c.s);
        CAPTURE(c.p);
        CAPTURE(c.d);
        nn::Window win;
        win.sh = win.sw = c.s;
        win.ph = win.pw = c.p;
        win.dh = win.dw = c.d;
        const Tensor x = randn({2, 3, 11, 9}), w = randn({5, 3, c.k, c.k}), b = c.bias ? randn({5}) : Tensor{};
        const nn::Act act = c.relu ? nn::Act::relu : nn::Act::none;
        const Tensor ref = ref_conv(x, w, b, win, c.relu);
        CHECK(max_rel(nn::conv2d(x, w, b, win, act), ref) < 1e-5);
        // an NHWC-strided (channels-last) input, as convolutions themselves produce
        const Tensor x_cl = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
        CHECK(max_rel(nn::conv2d(x_cl, w, b, win, act), ref) < 1e-5);
        auto f = compile([&](const Tensor& t) { return Tensor(nn::conv2d(t, w, b, win, act) * 2.0); });
        CHECK(max_rel(f(x), Tensor(ref * 2.0)) < 1e-5);
        CHECK(f.graph_breaks().empty());
    }
    CHECK_THROWS_AS(nn::conv2d(randn({2, 4, 8, 8}), randn({5, 3, 3, 3})), ShapeError);
    CHECK_THROWS_AS(nn::conv2d(randn({4, 8, 8}), randn({5, 4, 3, 3})), ShapeError);
    CHECK(message_of([] { nn::conv2d(randn({1, 3, 2, 2}), randn({5, 3, 3, 3})); }).find("does not fit an input of (1, 3, 2, 2)") !=
          std::string::npos);
}

TEST_CASE("nn::conv2d on the CPU read in place from channels-last input: channel runs of 8 and tails, residual, relu, f64") {
    // the implicit GEMM (nn/conv_cpu.hpp's Im2colSource, on AVX-512 builds; im2col and a product
    // elsewhere) against float64 loops: channel counts with and without an 8-wide tail, output
    // channels past a 32-wide register tile, strides, padding, dilation, an input whose pixels are
    // further apart than its channels (a slice of wider channels-last memory), an NCHW input; few
    // channels (a first convolution's): a kernel row's taps packed as one run, in and out of the image
    manual_seed(28);
    struct Case { std::int64_t c, oc, k, s, p, d; bool bias, relu, res; DType dt; };
    for (const Case q : {Case{16, 24, 3, 1, 1, 1, true, true, true, DType::f32}, Case{20, 40, 3, 2, 1, 1, false, false, false, DType::f32},
                         Case{8, 33, 1, 1, 0, 1, true, false, true, DType::f32}, Case{12, 10, 3, 1, 2, 2, true, true, false, DType::f64},
                         Case{64, 64, 3, 1, 1, 1, true, true, true, DType::f32}, Case{3, 16, 7, 2, 3, 1, true, true, false, DType::f32},
                         Case{4, 9, 5, 1, 2, 1, true, false, true, DType::f32}, Case{2, 8, 7, 1, 3, 1, false, true, false, DType::f64}}) {
        CAPTURE(q.c);
        CAPTURE(q.oc);
        CAPTURE(q.k);
        CAPTURE(q.s);
        CAPTURE(dtype_name(q.dt));
        nn::Window win;
        win.sh = win.sw = q.s;
        win.ph = win.pw = q.p;
        win.dh = win.dw = q.d;
        const Tensor x = randn({2, q.c, 10, 12}).to(q.dt), w = randn({q.oc, q.c, q.k, q.k}).to(q.dt);
        const Tensor b = q.bias ? randn({q.oc}).to(q.dt) : Tensor{};
        Tensor ref = ref_conv(x, w, b, win, false);
        const Tensor z = q.res ? randn(ref.shape()).to(q.dt) : Tensor{};
        if (q.res) ref = Tensor(ref + z.to(DType::f64));
        if (q.relu) ref = Tensor(relu(ref));
        const nn::Act act = q.relu ? nn::Act::relu : nn::Act::none;
        const Tensor z_cl = q.res ? z.permute({0, 2, 3, 1}).contiguous() : Tensor{};
        const double tol = q.dt == DType::f64 ? 1e-12 : 1e-5;
        const Tensor x_cl = x.permute({0, 2, 3, 1}).contiguous();
        const Tensor y = nn::detail::conv2d_nhwc(x_cl, w, b, win, act, Loc::current(), z_cl);
        CHECK(max_rel(y.permute({0, 3, 1, 2}), ref) < tol);
        Tensor wide = zeros({2, 10, 12, q.c + 5}, q.dt);
        Tensor part = wide.slice(3, 2, 2 + q.c);
        part.copy_(x_cl);
        CHECK(max_rel(nn::detail::conv2d_nhwc(part, w, b, win, act, Loc::current(), z_cl).permute({0, 3, 1, 2}), ref) < tol);
        // an NCHW tensor viewed channels-last (a model's first convolution): channels H * W apart
        CHECK(max_rel(nn::detail::conv2d_nhwc(x.permute({0, 2, 3, 1}), w, b, win, act, Loc::current(), z_cl).permute({0, 3, 1, 2}), ref) <
              tol);
    }
    // no output channels, and no pixels: empty results of the right shape
    const Tensor xe = randn({2, 5, 6, 16});
    CHECK(nn::detail::conv2d_nhwc(xe, randn({0, 16, 3, 3}), Tensor{}, nn::Window{}, nn::Act::none, Loc::current()).shape() == Shape{2, 3, 4, 0});
    CHECK(nn::detail::conv2d_nhwc(randn({0, 5, 6, 16}), randn({8, 16, 3, 3}), randn({8}), nn::Window{}, nn::Act::relu, Loc::current()).shape() ==
          Shape{0, 3, 4, 8});
}

TEST_CASE("nn::conv2d on the CPU as Winograd F(2x2, 3x3): odd sizes, padding, tails, blocks of tiles, NaN, the cached weight") {
    // nn/conv_winograd.hpp against float64 loops, beside the direct implicit GEMM of the same case:
    // outputs of odd height and width (a tile half outside), padding 0, 1 and 2, channel counts off
    // the 16-wide vectors, enough tiles for several blocks, bias, residual and relu, a channels-last
    // input whose pixels are further apart than its channels
    if (!nn::detail::winograd_applies(zeros({1, 4, 4, 16}), 16, [] {
            nn::Window w;
            w.kh = w.kw = 3;
            return w;
        }()))
        return;  // not an AVX-512 build: conv2d never takes it (tested where it does)
    manual_seed(29);
    struct Case { std::int64_t n, c, oc, h, w, p; bool bias, relu, res; };
    for (const Case q : {Case{2, 16, 16, 8, 8, 1, true, true, true}, Case{1, 20, 33, 7, 9, 1, false, false, false},
                         Case{1, 17, 40, 5, 6, 0, true, false, true}, Case{1, 16, 16, 3, 3, 2, true, true, false},
                         Case{3, 35, 70, 30, 29, 1, true, true, true}, Case{2, 64, 48, 14, 14, 1, false, true, false}}) {
        CAPTURE(q.c);
        CAPTURE(q.oc);
        CAPTURE(q.h);
        CAPTURE(q.w);
        CAPTURE(q.p);
        nn::Window win;
        win.kh = win.kw = 3;
        win.ph = win.pw = q.p;
        const Tensor x = randn({q.n, q.c, q.h, q.w}), w = randn({q.oc, q.c, 3, 3});
        const Tensor b = q.bias ? randn({q.oc}) : Tensor{};
        Tensor ref = ref_conv(x, w, b, win, false);
        const Tensor z = q.res ? randn(ref.shape()) : Tensor{};
        if (q.res) ref = Tensor(ref + z.to(DType::f64));
        if (q.relu) ref = Tensor(relu(ref));
        const Tensor x_cl = x.permute({0, 2, 3, 1}).contiguous(), w_cl = w.permute({0, 2, 3, 1}).contiguous();
        const Tensor z_cl = q.res ? z.permute({0, 2, 3, 1}).contiguous() : Tensor{};
        const Tensor u = nn::detail::winograd_weights(w_cl);
        REQUIRE(nn::detail::winograd_applies(x_cl, q.oc, win));
        const Tensor yw = nn::detail::conv2d_cpu_winograd(x_cl, u, q.oc, b, z_cl, win, q.relu);
        const Tensor yd = nn::detail::conv2d_cpu_implicit(x_cl, w_cl, b, z_cl, win, q.relu ? nn::Act::relu : nn::Act::none, yw.shape());
        CHECK(max_rel(yw.permute({0, 3, 1, 2}), ref) < 1e-5);
        CHECK(max_rel(yd.permute({0, 3, 1, 2}), ref) < 1e-5);
        Tensor wide = zeros({q.n, q.h, q.w, q.c + 5});
        Tensor part = wide.slice(3, 3, 3 + q.c);
        part.copy_(x_cl);
        CHECK(max_rel(nn::detail::conv2d_cpu_winograd(part, u, q.oc, b, z_cl, win, q.relu).permute({0, 3, 1, 2}), ref) < 1e-5);
        // the library op (what conv2d_nhwc and compiled programs run) takes it here
        const Tensor y = nn::detail::conv2d_nhwc(x_cl, w, b, win, q.relu ? nn::Act::relu : nn::Act::none, Loc::current(), z_cl);
        if (nn::detail::winograd_on()) CHECK(max_rel(y, yw) == 0);
        CHECK(max_rel(y.permute({0, 3, 1, 2}), ref) < 1e-5);
    }
    // a NaN reaches the outputs whose windows hold it, and only those: the transforms add and
    // subtract, they never multiply an input by zero
    nn::Window win;
    win.kh = win.kw = 3;
    win.ph = win.pw = 1;
    Tensor xn = randn({1, 9, 10, 16});
    xn.data<float>()[(4 * 10 + 5) * 16 + 3] = std::nanf("");  // (h 4, w 5, c 3)
    const Tensor wn = randn({16, 3, 3, 16});
    const Tensor yn = nn::detail::conv2d_cpu_winograd(xn, nn::detail::winograd_weights(wn), 16, Tensor{}, Tensor{}, win, true);
    const Tensor yd = nn::detail::conv2d_cpu_implicit(xn, wn, Tensor{}, Tensor{}, win, nn::Act::relu, yn.shape());
    std::int64_t nans = 0;
    for (std::int64_t i = 0; i < yn.numel(); ++i) {
        const bool in_window = std::isnan(yd.data<float>()[i]);
        CHECK(std::isnan(yn.data<float>()[i]) == in_window);
        nans += in_window;
    }
    CHECK(nans == 9 * 16);
    // the op's transformed weight is kept while the weight is the same and unwritten: a write
    // through kiln (copy_) bumps its version and the next call transforms it again
    nn::detail::WinogradCache cache;
    Tensor wc = randn({16, 3, 3, 16});
    const Tensor u1 = cache.get(wc, wc);
    CHECK(cache.get(wc, wc).is_same(u1));
    wc.copy_(randn({16, 3, 3, 16}));
    const Tensor u2 = cache.get(wc, wc);
    CHECK(!u2.is_same(u1));
    CHECK(max_rel(u2, nn::detail::winograd_weights(wc)) == 0);
    CHECK(!cache.get(wc.clone(), wc).is_same(u2));  // other memory
    // and so in a compiled program whose captured weight the caller writes between calls
    Tensor wp = randn({24, 16, 3, 3});
    auto step = kiln::compile([&wp, win](const Tensor& x) { return nn::detail::conv2d_nhwc(x, wp, Tensor{}, win, nn::Act::none, Loc::current()); });
    const Tensor xc = randn({2, 6, 7, 16});
    CHECK(max_rel(step(xc).permute({0, 3, 1, 2}), ref_conv(xc.permute({0, 3, 1, 2}), wp, Tensor{}, win, false)) < 1e-5);
    wp.copy_(randn({24, 16, 3, 3}));
    CHECK(max_rel(step(xc).permute({0, 3, 1, 2}), ref_conv(xc.permute({0, 3, 1, 2}), wp, Tensor{}, win, false)) < 1e-5);
}

TEST_CASE("nn pooling: max_pool2d (padding never wins) and adaptive_avg_pool2d") {
    manual_seed(19);
    const Tensor x = Tensor(randn({2, 3, 9, 8}) - 5.0);  // all negative: a zero pad would win
    nn::Window win;
    win.kh = win.kw = 3;
    win.sh = win.sw = 2;
    win.ph = win.pw = 1;
    const Tensor m = nn::max_pool2d(x, win);
    CHECK(m.shape() == Shape{2, 3, 5, 4});
    for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t c = 0; c < 3; ++c)
            for (std::int64_t i = 0; i < 5; ++i)
                for (std::int64_t j = 0; j < 4; ++j) {
                    double best = -INFINITY;
                    for (std::int64_t a = 0; a < 3; ++a)
                        for (std::int64_t b = 0; b < 3; ++b) {
                            const std::int64_t h = 2 * i - 1 + a, w = 2 * j - 1 + b;
                            if (h >= 0 && h < 9 && w >= 0 && w < 8) best = std::max(best, x.at<float>({n, c, h, w}) * 1.0);
                        }
                    CHECK(m.item<double>(((n * 3 + c) * 5 + i) * 4 + j) == best);
                }
    // channels-last input (the CPU's direct pool; an NCHW input above goes through im2col): the
    // same values, f64 too, and a NaN taken by every window that holds it
    const Tensor x_cl = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    CHECK(max_rel(nn::max_pool2d(x_cl, win), m) == 0);
    CHECK(max_rel(nn::max_pool2d(x_cl.to(DType::f64), win), m) == 0);
    nn::Window dil = win;  // dilated, stride 1: the direct pool's tap offsets
    dil.sh = dil.sw = 1;
    dil.dh = dil.dw = 2;
    CHECK(max_rel(nn::max_pool2d(x_cl, dil), nn::max_pool2d(x, dil)) == 0);
    Tensor xn = x.permute({0, 2, 3, 1}).contiguous();
    xn.data<float>()[((1 * 9 + 4) * 8 + 4) * 3 + 2] = std::nanf("");  // (n 1, h 4, w 4, c 2)
    const Tensor mn = nn::max_pool2d(xn.permute({0, 3, 1, 2}), win);
    for (std::int64_t i = 0; i < 5; ++i)
        for (std::int64_t j = 0; j < 4; ++j) {
            const bool holds = std::abs(2 * i - 4) <= 1 && std::abs(2 * j - 4) <= 1;  // windows centred within 1 of (4, 4)
            CHECK(std::isnan(mn.at<float>({1, 2, i, j})) == holds);
            CHECK(mn.at<float>({1, 1, i, j}) == m.at<float>({1, 1, i, j}));
        }
    const Tensor a = nn::adaptive_avg_pool2d(x, 1, 1);
    CHECK(max_rel(a, mean(x, {2, 3}, true)) == 0);
    const Tensor a2 = nn::adaptive_avg_pool2d(x.slice(3, 0, 6), 3, 2);
    CHECK(a2.shape() == Shape{2, 3, 3, 2});
    CHECK(std::abs(a2.at<float>({1, 2, 2, 1}) - mean(x.slice(2, 6, 9).slice(3, 3, 6).select(0, 1).select(0, 2)).item<float>()) < 1e-5);
    CHECK_THROWS_AS(nn::adaptive_avg_pool2d(x, 2, 2), ShapeError);
    CHECK_THROWS_AS(nn::max_pool2d(x, nn::Window{3, 3, 1, 1, 2, 2, 1, 1}), ValueError);
}

TEST_CASE("nn::ResNet18: direct, compiled, BatchNorm folded into the convolutions, torchvision names") {
    manual_seed(20);
    nn::ResNet18 net(10);
    // non-trivial running statistics so that folding has work to do
    net.visit("", [](const std::string& name, Tensor& t) {
        if (name.ends_with("running_var")) t = Tensor(rand(t.shape()) + 0.5);
        else if (name.ends_with("running_mean") || (name.find("bn") != std::string::npos && name.ends_with("bias"))) t = Tensor(randn(t.shape()) * 0.1);
    });
    const auto sd = nn::state_dict(net);
    CHECK(sd.size() == 102);  // torchvision's 122 less the 20 num_batches_tracked counters (load_state skips those)
    CHECK(sd.count("layer2.0.downsample.1.running_var") == 1);
    CHECK(sd.count("layer4.1.conv2.weight") == 1);
    CHECK(sd.at("fc.weight").shape() == Shape{10, 512});
    const Tensor x = randn({2, 3, 32, 32});
    const Tensor y = net(x);
    CHECK(y.shape() == Shape{2, 10});
    auto f = compile([&](const Tensor& t) { return net(t); });
    CHECK(max_rel(f(x), y) < 1e-4);
    CHECK(f.graph_breaks().empty());
    nn::ResNet18 folded = net;
    folded.fold();
    CHECK(nn::state_dict(folded).count("bn1.weight") == 0);
    CHECK(max_rel(folded(x), y) < 1e-4);
    auto g = compile([&](const Tensor& t) { return folded(t); });
    CHECK(max_rel(g(x), y) < 1e-4);
    MESSAGE("resnet18 compiled on the CPU: " << f.kernels() << " kernels, folded " << g.kernels());
    CHECK(g.kernels() < f.kernels());
}

TEST_CASE("compile with freeze: BatchNorm2d (and relu) fold into the convolution before them; writes are then not seen") {
    manual_seed(23);
    auto random_bn = [](std::int64_t c) {
        nn::BatchNorm2d bn(c);
        bn.weight = Tensor(rand({c}) + 0.5);
        bn.bias = Tensor(randn({c}) * 0.1);
        bn.running_mean = Tensor(randn({c}) * 0.1);
        bn.running_var = Tensor(rand({c}) + 0.5);
        return bn;
    };
    nn::Conv2d conv(3, 8, 3, 1, 1);  // with a bias
    nn::Conv2d conv_nb(3, 8, 3, 2, 1, false);
    conv_nb.win.sh = 1;  // stride (1, 2)
    const nn::BatchNorm2d bn = random_bn(8);
    const Tensor x = randn({2, 3, 10, 9});
    // float64 reference: loops for the convolution, BatchNorm2d's formula in float64
    auto ref = [&](const nn::Conv2d& c, bool relu_after) {
        const Tensor y = ref_conv(x, c.weight, c.bias, c.win, false);
        auto per_c = [](const Tensor& p) { return p.to(DType::f64).view({p.size(0), 1, 1}); };
        const Tensor z = Tensor((y - per_c(bn.running_mean)) / kiln::sqrt(per_c(bn.running_var) + bn.eps) * per_c(bn.weight) + per_c(bn.bias));
        return relu_after ? Tensor(relu(z)) : z;
    };
    const std::string key = "conv2d(k=3x3, stride=1x1, padding=1x1, dilation=1x1, bias, relu)";
    auto nhwc = [](const Tensor& t) { return t.permute({0, 2, 3, 1}); };
    auto nchw = [](const Tensor& t) { return t.permute({0, 3, 1, 2}); };
    SUBCASE("conv -> BatchNorm2d -> relu, over NHWC (as ResNet18 runs) and NCHW (the modules), with and without a conv bias") {
        for (const bool channels_last : {true, false})
            for (const nn::Conv2d* c : {&conv, &conv_nb}) {
                CAPTURE(channels_last);
                CAPTURE(c->bias.defined());
                auto fn = [&, c](const Tensor& t) {
                    if (channels_last) return nchw(Tensor(relu(bn.nhwc(c->nhwc(nhwc(t))))));
                    return Tensor(relu(bn((*c)(t))));
                };
                auto plain = compile(fn);
                auto frozen = compile(fn, {.freeze = true});
                const Tensor r = ref(*c, true), eager = fn(x);
                CHECK(max_rel(eager, r) < 1e-5);
                CHECK(max_rel(plain(x), r) < 1e-5);
                CHECK(max_rel(frozen(x), r) < 1e-5);
                // the BatchNorm's elementwise work and the relu are gone: one call, no kernel of their own
                CHECK(frozen.kernels() < plain.kernels());
                CHECK(frozen.kernels() == 1);
                const std::string g = frozen.graph();
                CAPTURE(g);
                CHECK(g.find(c->bias.defined() ? key : "conv2d(k=3x3, stride=1x2, padding=1x1, dilation=1x1, bias, relu)") !=
                      std::string::npos);
                CHECK(g.find("sub(") == std::string::npos);
                CHECK(g.find("mul(") == std::string::npos);
                CHECK(g.find("rsqrt(") == std::string::npos);
                CHECK(plain.graph().find("sub(") != std::string::npos);
            }
    }
    SUBCASE("a write into running_mean between calls: seen without freeze, not seen with it (the program took a snapshot)") {
        nn::BatchNorm2d b2 = random_bn(8);
        auto fn = [&](const Tensor& t) { return nchw(Tensor(relu(b2.nhwc(conv.nhwc(nhwc(t)))))); };
        auto plain = compile(fn);
        auto frozen = compile(fn, {.freeze = true});
        const Tensor before = fn(x), frozen_before = frozen(x);
        CHECK(max_rel(plain(x), before) < 1e-6);
        b2.running_mean.fill_(0.75);  // in place: the captured tensor itself
        const Tensor after = fn(x);
        CHECK(max_rel(after, before) > 0.1);
        CHECK(max_rel(plain(x), after) < 1e-6);              // read at run time
        CHECK(max_rel(frozen(x), frozen_before) == 0);       // folded at compile time
        CHECK(max_rel(frozen(x), before) < 1e-5);
        CHECK(plain.compiles() == 1);
        CHECK(frozen.compiles() == 1);
    }
    SUBCASE("no fold: the convolution read twice, an operand that is not per channel; a prefix of the chain folds") {
        const Tensor hwc = randn({10, 9, 8});  // broadcast over (H, W, C): not one value per channel
        auto two_readers = [&](const Tensor& t) {
            const Tensor y = conv.nhwc(nhwc(t));
            return nchw(Tensor(bn.nhwc(y) + y));
        };
        auto not_per_channel = [&](const Tensor& t) { return nchw(Tensor(conv.nhwc(nhwc(t)) * hwc + 1.0)); };
        auto prefix = [&](const Tensor& t) { return nchw(Tensor((conv.nhwc(nhwc(t)) - bn.running_mean) * hwc)); };
        const Tensor y = ref_conv(x, conv.weight, conv.bias, conv.win, false);
        const Tensor hwc_nchw = hwc.to(DType::f64).permute({2, 0, 1});
        const Tensor mean_c = bn.running_mean.to(DType::f64).view({8, 1, 1});
        const std::vector<Tensor> refs{Tensor(ref(conv, false) + y), Tensor(y * hwc_nchw + 1.0), Tensor((y - mean_c) * hwc_nchw)};
        const std::vector<std::function<Tensor(const Tensor&)>> fns{two_readers, not_per_channel, prefix};
        for (std::size_t i = 0; i < fns.size(); ++i) {
            CAPTURE(i);
            auto plain = compile(fns[i]);
            auto frozen = compile(fns[i], {.freeze = true});
            CHECK(max_rel(plain(x), refs[i]) < 1e-5);
            CHECK(max_rel(frozen(x), refs[i]) < 1e-5);
            if (i < 2) {
                CHECK(frozen.graph() == plain.graph());  // the pass changed nothing
            } else {
                CHECK(frozen.graph().find("sub(") == std::string::npos);  // the mean went into the bias
                CHECK(frozen.graph().find("mul(") != std::string::npos);  // the (H, W, C) product stayed
            }
        }
    }
    SUBCASE("a graph-breaking function: the frozen segment is compiled once and reused") {
        auto fn = [&](const Tensor& t) {
            const float s = sum(t).item<float>();  // a graph break
            return nchw(Tensor(relu(bn.nhwc(conv.nhwc(nhwc(t)))) * (s == s ? 1.0 : 0.0)));
        };
        auto frozen = compile(fn, {.freeze = true});
        for (int i = 0; i < 3; ++i) CHECK(max_rel(frozen(x), ref(conv, true)) < 1e-5);
        CHECK(frozen.report().find("segments compiled: 2") != std::string::npos);
    }
    SUBCASE("an unfolded ResNet18: every BatchNorm folded, the result that of the uncompiled model") {
        nn::ResNet18 net(10);
        net.visit("", [](const std::string& name, Tensor& t) {
            if (name.ends_with("running_var")) t = Tensor(rand(t.shape()) + 0.5);
            else if (name.ends_with("running_mean") || (name.find("bn") != std::string::npos && name.ends_with("bias")))
                t = Tensor(randn(t.shape()) * 0.1);
            else if (name.find("bn") != std::string::npos && name.ends_with("weight")) t = Tensor(rand(t.shape()) + 0.5);
        });
        const Tensor xi = randn({2, 3, 32, 32});
        const Tensor y = net(xi);
        auto plain = compile([&](const Tensor& t) { return net(t); });
        auto frozen = compile([&](const Tensor& t) { return net(t); }, {.freeze = true});
        CHECK(max_rel(plain(xi), y) < 1e-4);
        CHECK(max_rel(frozen(xi), y) < 1e-4);
        const std::string g = frozen.graph();
        CHECK(g.find("rsqrt(") == std::string::npos);
        CHECK(g.find("sub(") == std::string::npos);
        CHECK(g.find("k=7x7, stride=2x2, padding=3x3, dilation=1x1, bias, relu)") != std::string::npos);  // the stem
        MESSAGE("resnet18 on the CPU: " << plain.kernels() << " kernels unfolded, " << frozen.kernels() << " frozen");
        CHECK(frozen.kernels() < plain.kernels());
    }
}
