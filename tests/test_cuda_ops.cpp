// The three front doors on a GPU: expression statements, eager ops and kiln::compile on CUDA
// tensors, checked against the CPU (and float64 where it matters); kernel counts, caches,
// streams and errors. Every test skips (with a message) where there is no CUDA device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/backends/cuda/cudnn.hpp>         // cuda::cudnn::available, conv_calls
#include <kiln/backends/cuda/graph_stats.hpp>   // cuda::GraphStats
#include <kiln/backends/cuda/kernel_cache.hpp>  // cache::kernel_cache_stats
#include <kiln/backends/cuda/small_gemm.hpp>    // small_gemm_limit, small_gemm_launches
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace kiln;

Tensor cu(const Tensor& t) { return t.to(Device::cuda()); }

/// ‖a − b‖ / ‖b‖ over float64 copies (both on the CPU); NaN where either has a NaN the other lacks.
double rel_err(const Tensor& a_in, const Tensor& b_in) {
    const Tensor a = a_in.cpu().to(DType::f64).contiguous(), b = b_in.cpu().to(DType::f64).contiguous();
    REQUIRE(a.shape() == b.shape());
    const double* pa = a.data<double>();
    const double* pb = b.data<double>();
    double num = 0, den = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        if (std::isnan(pa[i]) != std::isnan(pb[i])) return std::nan("");
        if (std::isnan(pa[i])) continue;
        num += (pa[i] - pb[i]) * (pa[i] - pb[i]);
        den += pb[i] * pb[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool equal(const Tensor& a, const Tensor& b) {
    const Tensor x = a.cpu(), y = b.cpu();
    if (!(x.shape() == y.shape()) || x.dtype() != y.dtype()) return false;
    for (std::int64_t i = 0; i < x.numel(); ++i)
        if (x.item<double>(i) != y.item<double>(i) && !(std::isnan(x.item<double>(i)) && std::isnan(y.item<double>(i)))) return false;
    return true;
}

/// Runs fn on CPU copies and CUDA copies of args; returns (cpu result, cuda result on the CPU).
template <class F>
std::pair<Tensor, Tensor> both(F&& fn, const std::vector<Tensor>& args) {
    std::vector<Tensor> d;
    for (const Tensor& a : args) d.push_back(cu(a));
    return {fn(args), fn(d).cpu()};
}

}  // namespace

TEST_CASE("cuda: an expression statement is one kernel and matches the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = randn({513, 257}), b = randn({257});
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
        INFO(dtype_name(dt));
        const Tensor xd = x.to(dt), bd = b.to(dt);
        auto f = [](const std::vector<Tensor>& a) {
            return Tensor(kiln::tanh(a[0] * 0.5 + a[1]) * kiln::sigmoid(a[0]) - kiln::exp(-kiln::abs(a[0])) / 3.0);
        };
        const auto before = cache::kernel_cache_stats();
        auto [c, g] = both(f, {xd, bd});
        CHECK(g.dtype() == dt);
        CHECK(rel_err(g, c) < (dt == DType::bf16 ? 1e-2 : dt == DType::f16 ? 2e-3 : 1e-5));
        // a second run of the same statement compiles nothing
        const auto mid = cache::kernel_cache_stats();
        (void)f({cu(xd), cu(bd)});
        const auto after = cache::kernel_cache_stats();
        CHECK(after.compiles + after.disk_hits == mid.compiles + mid.disk_hits);
        CHECK(mid.compiles + mid.disk_hits - before.compiles - before.disk_hits <= 1);  // one kernel for the statement
    }
}

TEST_CASE("cuda: statements of one expression type that read their tensors differently are different programs" *
          doctest::skip(kiln_test::no_cuda())) {
    // x * y + x and x * y + y have one C++ type, the same distinct inputs, shapes and dtypes: the
    // statement cache must still tell them apart (by which input each leaf reads)
    const Tensor x = randn({64, 33}), y = randn({64, 33});
    const Tensor xc = cu(x), yc = cu(y);
    auto first = [](const Tensor& a, const Tensor& b, const Tensor& c) { return Tensor(a * b + c); };
    const Tensor g1 = first(xc, yc, xc), g2 = first(xc, yc, yc), g3 = first(yc, xc, xc);
    CHECK(rel_err(g1, Tensor(x * y + x)) < 1e-6);
    CHECK(rel_err(g2, Tensor(x * y + y)) < 1e-6);
    CHECK(rel_err(g3, Tensor(y * x + x)) < 1e-6);
    // and a reduction of such a statement
    auto red = [](const Tensor& a, const Tensor& b, const Tensor& c) { return kiln::sum(a * b - c, {1}); };
    CHECK(rel_err(red(xc, yc, xc), kiln::sum(x * y - x, {1})) < 1e-5);
    CHECK(rel_err(red(xc, yc, yc), kiln::sum(x * y - y, {1})) < 1e-5);
}

TEST_CASE("cuda: transposed, strided, broadcast and misaligned operands" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor a = randn({300, 200}), c = randn({200, 1}), s = randn({301});
    const Tensor ad = cu(a), cd = cu(c), sd = cu(s);
    CHECK(rel_err(Tensor(ad.t() * 2 + cd), Tensor(a.t() * 2 + c)) < 1e-6);
    CHECK(rel_err(Tensor(ad.slice(1, 0, 200, 3) + 1), Tensor(a.slice(1, 0, 200, 3) + 1)) < 1e-6);
    CHECK(rel_err(Tensor(sd.slice(0, 1, 301) * 3), Tensor(s.slice(0, 1, 301) * 3)) < 1e-6);  // offset by one element
    CHECK(rel_err(Tensor(ad + sd.slice(0, 1, 201)), Tensor(a + s.slice(0, 1, 201))) < 1e-6);
    const Tensor one = cu(full({1}, 2.5));
    CHECK(rel_err(Tensor(ad * one), Tensor(a * 2.5)) < 1e-6);
    CHECK(rel_err(Tensor(kiln::sin(one) + kiln::cos(one)), Tensor(kiln::sin(full({1}, 2.5)) + kiln::cos(full({1}, 2.5)))) < 1e-6);
}

TEST_CASE("cuda: eager ops, one kernel each, agree with the fused statement" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = cu(randn({1000, 33})), y = cu(randn({33}));
    const auto e = kiln::exp(x) * y + kiln::tanh(x) - 1.5;
    CHECK(rel_err(eager(e), Tensor(e)) < 1e-6);
    const Tensor i = cu(randint(-50, 50, {77, 5}, DType::i32));
    CHECK(equal(Tensor(i * 3 - 7), Tensor(i.cpu() * 3 - 7)));
    CHECK(equal(Tensor(i > 0), Tensor(i.cpu() > 0)));
    CHECK(equal(Tensor(kiln::where(i > 0, i, -i)), Tensor(kiln::where(i.cpu() > 0, i.cpu(), -i.cpu()))));
}

TEST_CASE("cuda: reductions over every axis pattern, keepdim, and long rows (split)" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = randn({37, 41, 29});
    const Tensor xd = cu(x);
    for (const Axes& ax : {Axes{}, Axes{0}, Axes{1}, Axes{2}, Axes{0, 2}, Axes{1, 2}}) {
        for (bool keep : {false, true}) {
            CHECK(rel_err(sum(xd, ax, keep), sum(x, ax, keep)) < 1e-5);
            CHECK(rel_err(mean(xd * 2, ax, keep), mean(x * 2, ax, keep)) < 1e-5);
            CHECK(equal(kiln::max(xd, ax, keep), kiln::max(x, ax, keep)));
            CHECK(equal(kiln::min(xd, ax, keep), kiln::min(x, ax, keep)));
        }
    }
    CHECK(equal(argmax(xd, 1), argmax(x, 1)));
    CHECK(equal(argmin(xd, 2, true), argmin(x, 2, true)));
    CHECK(equal(argmax(xd), argmax(x)));
    CHECK(rel_err(prod(xd * 0.1 + 1, 2), prod(x * 0.1 + 1, 2)) < 1e-5);
    const Tensor big = randn({1 << 22});
    const Tensor bd = cu(big);
    CHECK(rel_err(sum(bd), sum(big.to(DType::f64))) < 1e-5);
    CHECK(rel_err(sum(bd * bd, 0, true), sum(Tensor(big * big).to(DType::f64), 0, true)) < 1e-5);
    CHECK(equal(kiln::max(bd), kiln::max(big)));
    const Tensor ints = randint(-5, 5, {1000, 7}, DType::i32);
    CHECK(equal(sum(cu(ints), 0), sum(ints, 0)));
    CHECK(sum(cu(ints), 0).dtype() == DType::i64);
}

TEST_CASE("cuda: split reductions (column sums over (N, H, W), few long rows) finish in one launch and match float64" *
          doctest::skip(kiln_test::no_cuda())) {
    // (N, H, W, C) sums over (0, 1, 2) are column reductions split into chunks; a few long rows
    // split too. The last block of each row combines the partials; the counters it leaves at 0
    // serve the next launch, so repeated calls, a compiled program and its CUDA graph agree.
    const Tensor x = randn({16, 28, 28, 64}), rows = randn({3, 300000});
    const Tensor xd = cu(x), rd = cu(rows);
    const Tensor x64 = x.to(DType::f64), r64 = rows.to(DType::f64), factors = Tensor(rows * 1e-3 + 1);
    for (int rep = 0; rep < 3; ++rep) {
        CHECK(rel_err(sum(xd, {0, 1, 2}), sum(x64, {0, 1, 2})) < 1e-5);
        CHECK(rel_err(mean(Tensor(xd * xd), {0, 1, 2}), mean(Tensor(x64 * x64), {0, 1, 2})) < 1e-5);
        CHECK(equal(kiln::max(xd, {0, 1, 2}), kiln::max(x, {0, 1, 2})));
        CHECK(equal(kiln::min(xd, {0, 1, 2}, true), kiln::min(x, {0, 1, 2}, true)));
        CHECK(rel_err(sum(rd, 1), sum(r64, 1)) < 1e-5);
        CHECK(equal(kiln::max(rd, 1), kiln::max(rows, 1)));
        // f32 products of 300000 factors land about 1e-4 from the exact product on both devices (the CPU's
        // too); a chunk left out or counted twice would move them by ~1e-2
        CHECK(rel_err(prod(cu(factors), 1), prod(factors.to(DType::f64), 1)) < 5e-4);
    }
    // deterministic: the same bits every call
    CHECK(equal(sum(xd, {0, 1, 2}), sum(xd, {0, 1, 2})));
    CHECK(equal(sum(rd, 1), sum(rd, 1)));
    for (Mode m : {Mode::normal, Mode::reduce_overhead}) {
        Options o;
        o.mode = m;
        auto f = compile([](const Tensor& a, const Tensor& b) {
            const Tensor mu = mean(a, {0, 1, 2});
            return Tensor(sum(Tensor((a - mu) * (a - mu)), {0, 1, 2}) + sum(sum(b, 1)));
        }, o);
        const Tensor mu64 = mean(x64, {0, 1, 2});
        const Tensor ref = Tensor(sum(Tensor((x64 - mu64) * (x64 - mu64)), {0, 1, 2}) + sum(sum(r64, 1)));
        for (int rep = 0; rep < 4; ++rep) CHECK(rel_err(f(xd, rd), ref) < 1e-5);
    }
}

TEST_CASE("cuda: column reductions over channel counts and lengths around the kernel's rounds match float64 (eager, compiled, "
          "reduce_overhead)" * doctest::skip(kiln_test::no_cuda())) {
    // the column kernel: 32 channels per warp (a last partial group), 8 warps x 16 positions per round
    // (lengths below, at and past a round), chunks finished by the last block; a per-channel operand
    // (loaded once per row) and a bf16 operand
    for (const auto& [L, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 40}, {7, 3}, {127, 33}, {128, 64}, {129, 100}, {3000, 257}, {50000, 64}, {200000, 8}, {2048, 600}}) {
        CAPTURE(L);
        CAPTURE(C);
        const Tensor x = randn({L, C}), m = randn({C}), y = randn({L, C});
        const Tensor x64 = x.to(DType::f64), m64 = m.to(DType::f64), y64 = y.to(DType::f64);
        const Tensor xd = cu(x), md = cu(m), yd = cu(y), yh = cu(y).to(DType::bf16);
        const Tensor ref_sum = sum(Tensor((x64 - m64) * y64), 0), ref_mean = mean(Tensor(x64 * x64), 0);
        CHECK(rel_err(sum(Tensor((xd - md) * yd), 0), ref_sum) < 1e-5);
        CHECK(rel_err(mean(Tensor(xd * xd), 0), ref_mean) < 1e-5);
        CHECK(equal(kiln::max(Tensor(xd - md), 0), kiln::max(Tensor(x - m), 0)));
        const Tensor ref_h = sum(Tensor(x64 * yh.cpu().to(DType::f64)), 0);
        CHECK(rel_err(sum(Tensor(xd * yh.to(DType::f32)), 0), ref_h) < 1e-5);
        for (Mode mode : {Mode::normal, Mode::reduce_overhead}) {
            Options o;
            o.mode = mode;
            auto f = compile([](const Tensor& a, const Tensor& b, const Tensor& c) { return sum(Tensor((a - b) * c), 0); }, o);
            for (int rep = 0; rep < 3; ++rep) CHECK(rel_err(f(xd, md, yd), ref_sum) < 1e-5);
        }
    }
}

TEST_CASE("cuda: sibling reductions in one kernel and recomputed producers (BatchNorm's backward; sums of one long row) match float64 "
          "(compiled, reduce_overhead)" * doctest::skip(kiln_test::no_cuda())) {
    // BatchNorm's backward over channels-last values, as batch_norm_train's rule writes it behind a
    // relu: the two column sums are one kernel (one output each), the relu's gradient and x-hat are
    // recomputed in it and in dx's kernel; channel counts with a partial warp group, lengths that
    // split into chunks finished by the last block, bf16 operands
    auto bn_backward = [](const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mu, const Tensor& var, const Tensor& w) {
        const double n = static_cast<double>(x.numel() / x.size(-1));
        const Tensor g = Tensor(kiln::where(y > 0, dy, 0.0));
        const Tensor db = sum(g, {0, 1, 2});
        const Tensor dw = sum(Tensor(g * ((x - mu) * rsqrt(var + 1e-5))), {0, 1, 2});
        const Tensor dx((g - db / n - (x - mu) * rsqrt(var + 1e-5) * (dw / n)) * (rsqrt(var + 1e-5) * w));
        return std::make_tuple(dx, dw, db);
    };
    for (const auto& [shape, dt] : std::vector<std::pair<Shape, DType>>{
             {{2, 7, 7, 64}, DType::f32}, {{3, 5, 5, 40}, DType::f32}, {{16, 28, 28, 64}, DType::f32}, {{4, 14, 14, 257}, DType::bf16}}) {
        CAPTURE(shape);
        CAPTURE(dt);
        const std::int64_t C = shape[3];
        const Tensor dy = randn(shape).to(dt), y = randn(shape).to(dt), x = randn(shape).to(dt);
        const Tensor mu = Tensor(randn({C}) * 0.1), var = Tensor(kiln::abs(randn({C})) + 0.5), w = randn({C});
        auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
        const auto [rdx, rdw, rdb] = bn_backward(f64(dy), f64(y), f64(x), f64(mu), f64(var), f64(w));
        const double tol = dt == DType::f32 ? 1e-4 : 1e-2;  // (bf16: the ops compute in f32; dx is stored in bf16)
        for (Mode mode : {Mode::normal, Mode::reduce_overhead}) {
            CAPTURE(mode);
            Options o;
            o.mode = mode;
            auto f = compile(bn_backward, o);
            for (int rep = 0; rep < 2; ++rep) {
                const auto [dx, dw, db] = f(cu(dy), cu(y), cu(x), cu(mu), cu(var), cu(w));
                CHECK(rel_err(db, rdb) < tol);
                CHECK(rel_err(dw, rdw) < tol);
                CHECK(rel_err(dx, rdx) < tol);
            }
            if (mode == Mode::normal) CHECK(f.kernels() <= 3);  // the sums, dx (and the per-channel factor, unless recomputed)
        }
    }
    // several reductions of one long row (split over blocks, the last block finishing each), and of a
    // few long rows: sum, sum of squares, max of |x|, a mean with a correction
    for (const Shape& shape : std::vector<Shape>{{3000001}, {5, 200003}}) {
        CAPTURE(shape);
        const Tensor x = Tensor(randn(shape) + 0.5), x64 = x.to(DType::f64);
        const int axis = shape.rank() - 1;
        auto stats = [axis](const Tensor& v) {
            return std::make_tuple(sum(v, {axis}), sum(Tensor(v * v), {axis}), kiln::max(Tensor(kiln::abs(v)), {axis}),
                                   mean(Tensor(v * 2.0), {axis}));
        };
        const auto [s, q, m, a] = stats(x64);
        for (Mode mode : {Mode::normal, Mode::reduce_overhead}) {
            CAPTURE(mode);
            Options o;
            o.mode = mode;
            auto f = compile(stats, o);
            for (int rep = 0; rep < 2; ++rep) {
                const auto [fs, fq, fm, fa] = f(cu(x));
                CHECK(rel_err(fs, s) < 1e-5);
                CHECK(rel_err(fq, q) < 1e-5);
                CHECK(rel_err(fm, m) < 1e-6);
                CHECK(rel_err(fa, a) < 1e-5);
            }
            if (mode == Mode::normal) CHECK(f.kernels() == 1);  // (at most 4 reductions per kernel)
        }
    }
}

TEST_CASE("cuda: softmax, log_softmax, layer_norm and logsumexp rows" * doctest::skip(kiln_test::no_cuda())) {
    for (std::int64_t L : {1, 7, 64, 1000, 4096, 5000}) {
        INFO("row length " << L);
        const Tensor x = randn({129, L}), w = randn({L}), b = randn({L});
        const Tensor xd = cu(x), wd = cu(w), bd = cu(b);
        CHECK(rel_err(softmax(xd, -1), softmax(x, -1)) < 1e-5);
        CHECK(rel_err(log_softmax(xd, -1), log_softmax(x, -1)) < 1e-5);
        CHECK(rel_err(layer_norm(xd, 1, wd, bd), layer_norm(x, 1, w, b)) < 1e-5);
        CHECK(rel_err(logsumexp(xd, 1), logsumexp(x, 1)) < 1e-5);
        CHECK(rel_err(softmax(xd, 0), softmax(x, 0)) < 1e-5);  // down the columns
    }
    const Tensor h = randn({64, 512}).to(DType::bf16);
    CHECK(rel_err(softmax(cu(h), -1), softmax(h, -1)) < 1e-2);
}

TEST_CASE("cuda: short rows (several rows per block, reduced by shuffles) at every lane count match the CPU" *
          doctest::skip(kiln_test::no_cuda())) {
    // Row lengths that give every lane count (1 to 32 threads per row) of the row and reduce
    // kernels and the block-per-row kernels next to them; row counts that leave the last block
    // partly empty (its spare lanes recompute the last row and store nothing).
    for (std::int64_t L : {1, 2, 3, 5, 9, 16, 17, 33, 64, 100, 128, 129, 256, 511, 512, 513, 2048}) {
        for (std::int64_t rows : {1, 63, 257}) {
            INFO("rows " << rows << " x row length " << L);
            const Tensor x = randn({rows, L}), w = randn({L}), b = randn({L});
            const Tensor xd = cu(x);
            CHECK(rel_err(softmax(xd, -1), softmax(x, -1)) < 1e-5);
            CHECK(rel_err(layer_norm(xd, 1, cu(w), cu(b)), layer_norm(x, 1, w, b)) < 1e-5);
            CHECK(rel_err(sum(xd * 2.0 + 1.0, {1}), sum(Tensor(x * 2.0 + 1.0).to(DType::f64), {1})) < 1e-5);
            // shifted so that no row's mean is near 0, where a relative error says nothing of the sum's accuracy
            CHECK(rel_err(mean(Tensor(xd + 3.0), {1}, true), mean(Tensor(x + 3.0).to(DType::f64), {1}, true)) < 1e-5);
            CHECK(equal(kiln::max(xd, {1}), kiln::max(x, {1})));
            CHECK(equal(argmin(xd, 1), argmin(x, 1)));
            // ties (the lowest index wins) and NaN (wins over every number) in arg-reductions
            Tensor ties = randint(0, 3, {rows, L}, DType::i32);
            CHECK(equal(argmax(cu(ties), 1), argmax(ties, 1)));
            CHECK(equal(sum(cu(ties), {1}), sum(ties, {1})));
            Tensor xn = x.clone();
            xn.data<float>()[(rows / 2) * L + L / 2] = std::nanf("");
            CHECK(equal(argmax(cu(xn), 1), argmax(xn, 1)));
        }
    }
}

TEST_CASE("cuda: matmul routes to cuBLASLt from kiln::matmul" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor a = randn({64, 48}), b = randn({48, 80});
    CHECK(rel_err(kiln::matmul(cu(a), cu(b)), kiln::matmul(a.to(DType::f64), b.to(DType::f64))) < 1e-5);
    CHECK_THROWS_AS(kiln::matmul(cu(a), b), DeviceError);
}

TEST_CASE("cuda: kiln::compile fuses the same kernels as on the CPU (and the exact gelu into the GEMM) and matches it" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor w1 = randn({64, 128}), b1 = randn({128}), w2 = randn({128, 32});
    const Tensor w1d = cu(w1), b1d = cu(b1), w2d = cu(w2);
    auto mlp = [](const Tensor& w1_, const Tensor& b1_, const Tensor& w2_) {
        return [=](const Tensor& x) { return softmax(kiln::matmul(Tensor(gelu(kiln::matmul(x, w1_) + b1_)), w2_), -1); };
    };
    auto fc = compile(mlp(w1, b1, w2));
    auto fg = compile(mlp(w1d, b1d, w2d));
    const Tensor x = randn({16, 64});
    const Tensor rc = fc(x), rg = fg(cu(x));
    CHECK(rg.device() == Device::cuda());
    CHECK(rel_err(rg, rc) < 1e-4);
    CHECK(fg.kernels() == fc.kernels() - 1);  // gelu(x @ w1 + b1) is the GEMM's epilogue on CUDA
    // a second size recompiles with dims dynamic, a third reuses it
    for (std::int64_t n : {16, 32, 48, 5}) {
        const Tensor xn = randn({n, 64});
        CHECK(rel_err(fg(cu(xn)), fc(xn)) < 1e-4);
    }
    CHECK(fg.compiles() == 2);
    // the graph backend (one kernel per op) agrees too
    auto gg = compile(mlp(w1d, b1d, w2d), {.backend = Backend::eager});
    CHECK(rel_err(gg(cu(x)), rc) < 1e-4);
}

TEST_CASE("cuda: bias, relu, gelu_tanh and gelu after a matmul run as GEMM epilogues, one library call" * doctest::skip(kiln_test::no_cuda())) {
    for (DType dt : {DType::f32, DType::bf16}) {
        CAPTURE(dtype_name(dt));
        const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
        const Tensor x = randn({2, 48, 64}).to(dt), w = randn({96, 64}).to(dt), b = randn({96}).to(dt);
        const Tensor xd = cu(x), wd = cu(w), bd = cu(b);
        // Linear as torch lays it out: x @ w.t() + b, the transpose read in place
        auto check = [&](auto fn, int kernels) {
            auto fc = compile(fn);
            auto fg = compile(fn);
            const Tensor rc = fc(x, w, b), rg = fg(xd, wd, bd);
            CHECK(rg.device() == Device::cuda());
            CHECK(rel_err(rg, rc) < tol);
            CHECK(fg.kernels() == kernels);
            // a second and third batch size: dims go dynamic, the epilogue stays
            for (std::int64_t n : {3, 5}) {
                const Tensor xn = randn({n, 48, 64}).to(dt);
                CHECK(rel_err(fg(cu(xn), wd, bd), fc(xn, w, b)) < tol);
            }
        };
        check([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(gelu_tanh(matmul(a, ww.t()) + bb)); }, 1);
        check([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(relu(bb + matmul(a, ww.t()))); }, 1);
        check([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(matmul(a, ww.t()) + bb); }, 1);
        check([](const Tensor& a, const Tensor& ww, const Tensor&) { return Tensor(relu(matmul(a, ww.t()))); }, 1);
        // the exact gelu, which cuBLASLt lacks: a pass after its product (96 rows: not the small kernel)
        check([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(gelu(matmul(a, ww.t()) + bb)); }, 1);
        // an epilogue cuBLASLt lacks stays one fused kernel after the GEMM
        check([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(sigmoid(matmul(a, ww.t()) + bb) * 2.0); }, 2);
    }
    // a batched left operand whose batch does not merge into its rows (a transposed batch)
    const Tensor x = randn({48, 3, 64}).transpose(0, 1), w = randn({64, 40}), b = randn({40});
    auto f = [](const Tensor& a, const Tensor& ww, const Tensor& bb) { return Tensor(gelu_tanh(matmul(a, ww) + bb)); };
    CHECK(rel_err(compile(f)(cu(x), cu(w), cu(b)), f(x, w, b)) < 1e-5);
    CHECK(rel_err(kiln::matmul(cu(x), cu(w)), kiln::matmul(x, w)) < 1e-5);
}

TEST_CASE("cuda: products of few rows run on the small kernel and match float64" * doctest::skip(kiln_test::no_cuda())) {
    auto& limit = cuda::detail::small_gemm_limit();
    auto& launches = cuda::detail::small_gemm_launches();
    const std::int64_t keep = limit.load();
    limit.store(64);
    struct Case { std::int64_t m, n, k; };
    // blocks of 8 warps (k up to 768), 16 (k 800; 2056 with 3 row tiles) and 32 (k 1544, 3072)
    const Case cases[] = {{1, 5, 8},    {3, 40, 72},      {8, 2304, 768}, {16, 77, 3072}, {17, 24, 40},
                          {64, 96, 264}, {33, 9, 16}, {2, 16, 800}, {40, 24, 2056}, {8, 768, 1544}};
    struct Epi { Act act; bool bias; };
    const Epi epis[] = {{Act::none, false}, {Act::none, true}, {Act::relu, true}, {Act::gelu_tanh, true}, {Act::gelu, true}, {Act::relu, false}};
    for (DType dt : {DType::bf16, DType::f16})
        for (const Case& c : cases)
            for (const Epi& e : epis) {
                CAPTURE(dtype_name(dt));
                CAPTURE(c.m);
                CAPTURE(c.n);
                CAPTURE(c.k);
                CAPTURE(act_name(e.act));
                CAPTURE(e.bias);
                // the inputs rounded to dt first, so that the float64 reference multiplies the same numbers
                const Tensor x = randn({c.m, c.k}).to(dt), w = randn({c.n, c.k}).to(dt), b = randn({c.n}).to(dt);
                Tensor ref = kiln::matmul(x.to(DType::f64), w.to(DType::f64).t());
                if (e.bias) ref = Tensor(ref + b.to(DType::f64));
                if (e.act == Act::relu) ref = Tensor(relu(ref));
                if (e.act == Act::gelu_tanh) ref = Tensor(gelu_tanh(ref));
                if (e.act == Act::gelu) ref = Tensor(gelu(ref));
                const Tensor bd = cu(b);
                const std::int64_t before = launches.load();
                const Tensor y = nn::linear(cu(x), cu(w), e.bias ? bd : Tensor(), e.act);
                CHECK(launches.load() == before + 1);
                CHECK(y.dtype() == dt);
                CHECK(rel_err(y, ref) < 1e-2);
                // the same product on cuBLASLt (the exact gelu in a pass after it) agrees to the output's rounding
                limit.store(0);
                const Tensor yl = nn::linear(cu(x), cu(w), e.bias ? bd : Tensor(), e.act);
                limit.store(64);
                CHECK(launches.load() == before + 1);
                CHECK(rel_err(y, yl) < 1e-2);
            }
    // what the kernel does not take goes to cuBLASLt, with the same results: k not a multiple of 8,
    // a misaligned row start, a row-major right operand, f32, more rows than the limit
    const Tensor x = randn({4, 12}).to(DType::bf16), w = randn({24, 12}).to(DType::bf16);
    const Tensor big = randn({4, 25}).to(DType::bf16);
    const std::int64_t before = launches.load();
    CHECK(rel_err(kiln::matmul(cu(x), cu(w).t()), kiln::matmul(x.to(DType::f64), w.to(DType::f64).t())) < 1e-2);
    const Tensor xo = cu(big).slice(1, 1, 25), wo = cu(randn({16, 24}).to(DType::bf16));
    CHECK(rel_err(kiln::matmul(xo, wo.t()), kiln::matmul(xo.cpu().to(DType::f64), wo.cpu().to(DType::f64).t())) < 1e-2);
    const Tensor wr = randn({24, 40}).to(DType::bf16), xr = randn({2, 24}).to(DType::bf16);
    CHECK(rel_err(kiln::matmul(cu(xr), cu(wr)), kiln::matmul(xr.to(DType::f64), wr.to(DType::f64))) < 1e-2);
    const Tensor xf = randn({2, 64}), wf = randn({32, 64});
    CHECK(rel_err(kiln::matmul(cu(xf), cu(wf).t()), kiln::matmul(xf.to(DType::f64), wf.to(DType::f64).t())) < 1e-5);
    CHECK(launches.load() == before);
    limit.store(keep);
    const Tensor xm = randn({keep + 1, 64}).to(DType::bf16), wm = randn({32, 64}).to(DType::bf16);
    CHECK(rel_err(kiln::matmul(cu(xm), cu(wm).t()), kiln::matmul(xm.to(DType::f64), wm.to(DType::f64).t())) < 1e-2);
    CHECK(launches.load() == before);
    // the exact gelu after cuBLASLt: a pass over the product (16-byte vectors, then a tail of 5)
    for (DType dt : {DType::bf16, DType::f32}) {
        const Tensor xg = randn({keep + 1, 40}).to(dt), wg = randn({13, 40}).to(dt), bg = randn({13}).to(dt);
        const Tensor ref = gelu(kiln::matmul(xg.to(DType::f64), wg.to(DType::f64).t()) + bg.to(DType::f64));
        CHECK(rel_err(nn::linear(cu(xg), cu(wg), cu(bg), Act::gelu), ref) < (dt == DType::f32 ? 1e-5 : 1e-2));
    }
    CHECK(launches.load() == before);
    // nn::Linear on 8 tokens (a batch-1 sentence) takes it, with its bias in the epilogue
    nn::Init o{DType::bf16, Device::cuda()};
    const nn::Linear lin(64, 48, true, Act::relu, o);
    const Tensor xt = randn({1, 8, 64}).to(DType::bf16);
    const Tensor yt = lin(cu(xt));
    CHECK(launches.load() == before + 1);
    CHECK(yt.shape() == Shape{1, 8, 48});
    CHECK(rel_err(yt, relu(kiln::matmul(xt.to(DType::f64), lin.weight.cpu().to(DType::f64).t()) + lin.bias.cpu().to(DType::f64))) < 1e-2);
}

TEST_CASE("cuda: on sm_90 kiln's kernels begin with griddepcontrol.wait and small launches go out for PDL" * doctest::skip(kiln_test::no_cuda())) {
    const int arch = cuda::properties(0).arch();
    auto f = compile([](const Tensor& x) { return Tensor(kiln::exp(x) * 2.0 + 1.0); });
    const Tensor x = randn({1000});
    CHECK(rel_err(f(cu(x)), Tensor(kiln::exp(x) * 2.0 + 1.0)) < 1e-6);
    auto& k = cuda::detail::pdl_kernels();
    const char* env = std::getenv("KILN_CUDA_PDL");
    const bool off = env && std::string(env) == "0";
    if (arch < 90 || off) {
        CHECK(k.fns.empty());
        MESSAGE("PDL off here (sm_" << arch << std::string(off ? ", KILN_CUDA_PDL=0" : "") << "): nothing is marked");
        return;
    }
    CHECK(!k.fns.empty());
    const long long half = static_cast<long long>(cuda::properties(0).sm_count) * 1024;
    CHECK(k.max_threads.load() == half);
    // the launch right after a library kernel goes out plainly, the next one with the attribute
    const cuda::CUfunction any = *k.fns.begin();
    CHECK(cuda::detail::is_pdl(any, 256));
    CHECK_FALSE(cuda::detail::is_pdl(any, half + 1));
    const Tensor m = kiln::matmul(cu(randn({64, 64})), cu(randn({64, 64})));
    CHECK(cuda::detail::library_tail() == cuda::current_stream(0));
    CHECK(rel_err(f(m.reshape({-1})), Tensor(kiln::exp(m.cpu().reshape({-1})) * 2.0 + 1.0)) < 1e-5);
    CHECK(cuda::detail::library_tail() == nullptr);
}

TEST_CASE("cuda: a compiled function with a graph break and views" * doctest::skip(kiln_test::no_cuda())) {
    auto f = compile([](const Tensor& x) {
        Tensor y = Tensor(x * 2).reshape({-1, 4}).t();
        if (sum(y).item<float>() > 0) return Tensor(y + 1);
        return Tensor(y - 1);
    });
    const Tensor x = randn({8, 4});
    const Tensor expect = [&] {
        Tensor y = Tensor(x * 2).reshape({-1, 4}).t();
        return sum(y).item<float>() > 0 ? Tensor(y + 1) : Tensor(y - 1);
    }();
    CHECK(rel_err(f(cu(x)), expect) < 1e-6);
    CHECK(rel_err(f(cu(x)), expect) < 1e-6);
}

TEST_CASE("cuda: a compiled program drops each intermediate after its last reader (peak memory is the live set)" *
          doctest::skip(kiln_test::no_cuda())) {
    constexpr std::int64_t n = 1024;
    constexpr std::size_t value_bytes = n * n * 4;  // 4 MiB per f32 value
    const Tensor x = cu(randn({n, n})), w = cu(Tensor(randn({n, n}) * (1.0 / 32)));
    auto chain = [&](const Tensor& t) {  // eight products: each a library call materializing its value
        Tensor h = t;
        for (int i = 0; i < 8; ++i) h = matmul(h, w);
        return h;
    };
    auto f = compile(chain);
    const Tensor expect = chain(x);
    CHECK(rel_err(f(x), expect) < 1e-5);  // compiles; kernels and cuBLASLt plans exist from here on
    cuda::synchronize(0);
    const std::size_t before = cuda::memory_stats(0).bytes_in_use;
    cuda::reset_peak_memory_stats(0);
    CHECK(cuda::memory_stats(0).peak_bytes_in_use == before);
    const Tensor y = f(x);
    cuda::synchronize(0);
    const std::size_t peak = cuda::memory_stats(0).peak_bytes_in_use - before;
    CHECK(peak >= 2 * value_bytes);                 // a product and its operand live together
    CHECK(peak <= 3 * value_bytes + (1u << 20));  // not eight values: each dropped after the product reading it
    CHECK(rel_err(y, expect) < 1e-5);
}

TEST_CASE("cuda: copy_, fill_ and assign into CUDA tensors" * doctest::skip(kiln_test::no_cuda())) {
    Tensor d = cu(zeros({10, 10}));
    const Tensor s = randn({10, 10});
    d.copy_(cu(s));
    CHECK(equal(d, s));
    d.assign(cu(s) * 2);
    CHECK(rel_err(d, Tensor(s * 2)) < 1e-7);
    d.copy_(cu(randn({10})).to(DType::f64));  // broadcast and convert
    CHECK(d.dtype() == DType::f32);
    d.fill_(3.0);
    CHECK(equal(d, full({10, 10}, 3.0)));
}

TEST_CASE("cuda: work follows the stream a StreamGuard selects" * doctest::skip(kiln_test::no_cuda())) {
    cuda::Stream s;
    const Tensor x = randn({1 << 20});
    Tensor r;
    {
        cuda::StreamGuard g(s);
        const Tensor xd = cu(x);
        r = Tensor(xd * 2 + 1);
        s.synchronize();
    }
    CHECK(rel_err(r, Tensor(x * 2 + 1)) < 1e-7);
}

TEST_CASE("cuda: statements from several threads" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = randn({4096});
    const Tensor expect = Tensor(kiln::sqrt(kiln::abs(x)) + 1);
    std::vector<std::thread> ts;
    std::vector<double> errs(4);
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            const Tensor r = Tensor(kiln::sqrt(kiln::abs(cu(x))) + 1);
            cuda::synchronize();
            errs[static_cast<std::size_t>(t)] = rel_err(r, expect);
        });
    for (auto& t : ts) t.join();
    for (double e : errs) CHECK(e < 1e-7);
}

TEST_CASE("cuda: mixing devices is a DeviceError naming both devices and the caller" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor a = cu(randn({4})), b = randn({4});
    try {
        (void)Tensor(a + b);
        FAIL("no DeviceError");
    } catch (const DeviceError& e) {
        const std::string m = e.what();
        CHECK(m.find("cuda:0") != std::string::npos);
        CHECK(m.find("cpu") != std::string::npos);
        CHECK(m.find("test_cuda_ops.cpp") != std::string::npos);
    }
}

TEST_CASE("cuda: reduce_overhead replays CUDA graphs, binds stable inputs and never overwrites held outputs" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor w = randn({64, 32}), b = randn({32});
    const Tensor wd = cu(w), bd = cu(b);
    auto fn = [&](const Tensor& x) { return Tensor(gelu_tanh(matmul(x, wd) + bd) * 2.0 + sum(softmax(x, -1), {-1}, true)); };
    auto ref_fn = [&](const Tensor& x) { return Tensor(gelu_tanh(matmul(x, w) + b) * 2.0 + sum(softmax(x, -1), {-1}, true)); };
    auto f = compile(fn, {.mode = Mode::reduce_overhead});
    const cuda::GraphStats s0 = cuda::graph_stats();

    // a stable input (the same tensor every call), rewritten in place between calls: each replay
    // reads the new contents; every result is kept, so no two calls may share output memory
    Tensor x = cu(randn({16, 64}));
    std::vector<Tensor> xs, ys;
    for (int i = 0; i < 6; ++i) {
        const Tensor xi = randn({16, 64});
        x.copy_(cu(xi));
        xs.push_back(xi);
        ys.push_back(f(x));
    }
    for (int i = 0; i < 6; ++i) {
        CAPTURE(i);
        CHECK(rel_err(ys[static_cast<std::size_t>(i)], ref_fn(xs[static_cast<std::size_t>(i)])) < 1e-5);
    }
    const cuda::GraphStats s1 = cuda::graph_stats();
    CHECK(s1.captures - s0.captures == 3);   // the default instance limit: all held, later calls ran without a graph
    CHECK(s1.replays - s0.replays == 3);
    CHECK(s1.fallbacks - s0.fallbacks == 3);  // the first call, and the calls with every instance's outputs held

    // the usual loop, y = f(x): two instances alternate, every call after the captures is a replay
    ys.clear();
    Tensor y;
    for (int i = 0; i < 20; ++i) {
        x.copy_(cu(xs[static_cast<std::size_t>(i % 6)]));
        y = f(x);
        CHECK(rel_err(y, ref_fn(xs[static_cast<std::size_t>(i % 6)])) < 1e-5);
    }
    const cuda::GraphStats s2 = cuda::graph_stats();
    CHECK(s2.captures == s1.captures);
    CHECK(s2.replays - s1.replays == 20);

    // a new input tensor every call (addresses change): copied into the instance's buffer
    auto g = compile(fn, {.mode = Mode::reduce_overhead});
    for (int i = 0; i < 5; ++i) {
        const Tensor xi = randn({16, 64});
        y = g(cu(xi));
        CHECK(rel_err(y, ref_fn(xi)) < 1e-5);
    }
    // freeing the allocator's cache keeps the graphs' memory
    cuda::empty_cache();
    for (int i = 0; i < 3; ++i) {
        const Tensor xi = randn({16, 64});
        y = g(cu(xi));
        CHECK(rel_err(y, ref_fn(xi)) < 1e-5);
        x.copy_(cu(xi));
        y = f(x);
        CHECK(rel_err(y, ref_fn(xi)) < 1e-5);
    }
    // a second shape gets graphs of its own
    const Tensor x2 = randn({40, 64});
    for (int i = 0; i < 3; ++i) CHECK(rel_err(f(cu(x2)), ref_fn(x2)) < 1e-5);
}

TEST_CASE("cuda: max_autotune and max_autotune_no_cudagraphs match eager; the first replays graphs, the second launches" *
          doctest::skip(kiln_test::no_cuda())) {
    const Tensor w1 = randn({64, 128}), b1 = randn({128}), w2 = randn({128, 48});
    const Tensor w1d = cu(w1), b1d = cu(b1), w2d = cu(w2);
    auto fn = [&](const Tensor& x) { return softmax(matmul(Tensor(gelu_tanh(matmul(x, w1d) + b1d)), w2d), -1); };
    auto ref_fn = [&](const Tensor& x) { return softmax(matmul(Tensor(gelu_tanh(matmul(x, w1) + b1)), w2), -1); };
    for (Mode mode : {Mode::max_autotune, Mode::max_autotune_no_cudagraphs}) {
        CAPTURE(static_cast<int>(mode));
        auto f = compile(fn, {.mode = mode});
        const cuda::GraphStats s0 = cuda::graph_stats();
        for (std::int64_t rows : {32, 32, 32, 32, 7, 7, 7}) {  // a second shape is tuned in its first call
            const Tensor x = randn({rows, 64});
            CHECK(rel_err(f(cu(x)), ref_fn(x)) < 1e-5);
        }
        const cuda::GraphStats s1 = cuda::graph_stats();
        if (mode == Mode::max_autotune) CHECK(s1.replays - s0.replays >= 3);
        else CHECK(s1.replays == s0.replays);
    }
    // row kernels' launch shapes are timed too (short rows: lanes per row; long rows: threads and
    // vectors per thread), and every shape gives the CPU's result (300 rows: more than the
    // multiprocessors of an H100 / H200 (132) or a B200 (148); below that small row kernels are
    // not timed: next)
    kiln_test::LogCapture logs("autotune");
    for (std::int64_t L : {9, 48, 1000, 4096}) {
        CAPTURE(L);
        auto f = compile([](const Tensor& x) { return softmax(x * 2.0, -1); }, {.mode = Mode::max_autotune_no_cudagraphs});
        const Tensor x = randn({300, L});
        for (int call = 0; call < 2; ++call) CHECK(rel_err(f(cu(x)), softmax(Tensor(x * 2.0), -1)) < 1e-5);
    }
    CHECK(logs.count("row kernel") == 4);  // once per shape: the second call reuses the choice
    CHECK(logs.count("not timed") == 0);
    // a new program (as in another process) reads each choice from the disk cache
    const int read_before = logs.count("(from ");
    for (std::int64_t L : {9, 48, 1000, 4096}) {
        auto f = compile([](const Tensor& x) { return softmax(x * 2.0, -1); }, {.mode = Mode::max_autotune_no_cudagraphs});
        const Tensor x = randn({300, L});
        CHECK(rel_err(f(cu(x)), softmax(Tensor(x * 2.0), -1)) < 1e-5);
    }
    CHECK(logs.count("(from ") - read_before == 4);
    // a small kernel of few rows (9 rows of 768, bert-base's LayerNorm at batch 1) keeps the
    // heuristic's shape, untimed (its latency in the chain is what counts), and is said so once
    const int untimed_before = logs.count("not timed");
    auto f = compile([](const Tensor& x) { return softmax(x * 2.0, -1); }, {.mode = Mode::max_autotune_no_cudagraphs});
    const Tensor x9 = randn({9, 768});
    for (int call = 0; call < 2; ++call) CHECK(rel_err(f(cu(x9)), softmax(Tensor(x9 * 2.0), -1)) < 1e-5);
    CHECK(logs.count("not timed") - untimed_before == 1);
}

TEST_CASE("cuda: nn blocks (Linear epilogues, BertLayer, Embedding) match the CPU: direct, compiled, reduce_overhead" * doctest::skip(kiln_test::no_cuda())) {
    manual_seed(21);
    nn::BertLayer cpu_layer(64, 4, 128);
    const Tensor x = randn({2, 16, 64});
    const Tensor ref = cpu_layer(x);
    for (DType dt : {DType::f32, DType::bf16}) {
        CAPTURE(dtype_name(dt));
        const double tol = dt == DType::f32 ? 1e-5 : 3e-2;
        nn::BertLayer layer = cpu_layer;
        nn::to(layer, dt);
        nn::to(layer, Device::cuda());
        const Tensor xd = cu(x.to(dt));
        CHECK(rel_err(layer(xd), ref) < tol);
        auto f = compile([&](const Tensor& t) { return layer(t); });
        auto r = compile([&](const Tensor& t) { return layer(t); }, {.mode = Mode::reduce_overhead});
        Tensor y;
        for (int i = 0; i < 4; ++i) {
            CHECK(rel_err(f(xd), ref) < tol);
            y = r(xd);
            CHECK(rel_err(y, ref) < tol);
        }
        MESSAGE("bert layer on CUDA (" << dtype_name(dt) << "): " << f.kernels() << " kernels");
    }
    // Linear's eager CUDA path is one cuBLASLt call with its epilogue
    const nn::Linear lin(64, 32, true, nn::Act::gelu_tanh);
    nn::Linear lind = lin;
    nn::to(lind, Device::cuda());
    CHECK(rel_err(lind(cu(x)), lin(x)) < 1e-5);
    // embedding rows gathered on the device, ids checked
    const nn::Embedding emb(50, 24);
    nn::Embedding embd = emb;
    nn::to(embd, Device::cuda());
    const Tensor ids = Tensor(kiln::floor(rand({3, 7}) * 50.0)).to(DType::i64);
    CHECK(equal(embd(cu(ids)), emb(ids)));
    CHECK(equal(nn::embedding(embd.weight.to(DType::bf16), cu(ids)), emb(ids).to(DType::bf16)));
    CHECK_THROWS_AS(embd(cu(Tensor(ids + 50))), ValueError);
    CHECK_THROWS_AS(embd(ids), DeviceError);
}

TEST_CASE("cuda: conv2d, pooling and ResNet-18 match the CPU: direct, compiled, reduce_overhead" * doctest::skip(kiln_test::no_cuda())) {
    manual_seed(22);
    for (std::int64_t k : {1, 3, 7}) {
        nn::Window win;
        win.sh = win.sw = 2;
        win.ph = win.pw = k / 2;
        const Tensor x = randn({2, 3, 15, 13}), w = randn({8, 3, k, k}), b = randn({8});
        const Tensor ref = nn::conv2d(x, w, b, win, nn::Act::relu);
        CHECK(rel_err(nn::conv2d(cu(x), cu(w), cu(b), win, nn::Act::relu), ref) < 1e-5);
        CHECK(rel_err(nn::conv2d(cu(x).to(DType::bf16), cu(w).to(DType::bf16), cu(b).to(DType::bf16), win, nn::Act::relu), ref) < 2e-2);
        nn::Window pool{3, 3, 2, 2, 1, 1, 1, 1};
        CHECK(equal(nn::max_pool2d(cu(x), pool), nn::max_pool2d(x, pool)));
    }
    nn::ResNet18 net(10);
    net.visit("", [](const std::string& name, Tensor& t) {
        if (name.ends_with("running_var")) t = Tensor(rand(t.shape()) + 0.5);
        else if (name.ends_with("running_mean")) t = Tensor(randn(t.shape()) * 0.1);
    });
    net.fold();
    const Tensor x = randn({2, 3, 64, 64});
    const Tensor ref = net(x);
    nn::ResNet18 gnet = net;
    nn::to(gnet, Device::cuda());
    const Tensor xd = cu(x);
    CHECK(rel_err(gnet(xd), ref) < 1e-4);
    auto f = compile([&](const Tensor& t) { return gnet(t); });
    auto r = compile([&](const Tensor& t) { return gnet(t); }, {.mode = Mode::reduce_overhead});
    Tensor y;
    for (int i = 0; i < 4; ++i) {
        CHECK(rel_err(f(xd), ref) < 1e-4);
        y = r(xd);
        CHECK(rel_err(y, ref) < 1e-4);
    }
    MESSAGE("resnet18 (BatchNorm folded) on CUDA: " << f.kernels() << " kernels and library calls");
}

TEST_CASE("cuda: cuDNN convolutions (bias, relu, residual, stride, dilation, dtypes) and the direct max pool match float64" * doctest::skip(kiln_test::no_cuda())) {
    MESSAGE("cuDNN: " << (cuda::cudnn::available() ? "version " + std::to_string(cuda::cudnn::version())
                                                   : "not used (" + cuda::cudnn::unavailable_reason() + ")"));
    manual_seed(23);
    struct Case {
        std::int64_t c, oc, kh, kw, s, p, d;
    };
    const std::size_t calls0 = cuda::cudnn::conv_calls();
    std::size_t expected_cudnn = 0;
    for (const Case cs : {Case{3, 16, 7, 7, 2, 3, 1}, Case{8, 8, 3, 3, 1, 1, 1}, Case{6, 12, 1, 1, 2, 0, 1}, Case{5, 4, 3, 2, 1, 2, 2},
                          Case{16, 32, 3, 3, 2, 1, 1}}) {
        nn::Window win;
        win.sh = win.sw = cs.s;
        win.ph = win.pw = cs.p;
        win.dh = win.dw = cs.d;
        win.kh = cs.kh, win.kw = cs.kw;
        const Tensor x = randn({2, 17, 14, cs.c}), w = randn({cs.oc, cs.c, cs.kh, cs.kw}), b = randn({cs.oc});
        const Shape ys{2, win.out_h(17), win.out_w(14), cs.oc};
        const Tensor z = randn(ys);
        const Tensor x64 = x.to(DType::f64), w64 = w.to(DType::f64), b64 = b.to(DType::f64), z64 = z.to(DType::f64);
        for (nn::Act act : {nn::Act::none, nn::Act::relu, nn::Act::gelu_tanh})
            for (int form = 0; form < 4; ++form) {  // bits: bias, residual
                CAPTURE(cs.c);
                CAPTURE(cs.kh);
                CAPTURE(static_cast<int>(act));
                CAPTURE(form);
                const Tensor bb = form & 1 ? b : Tensor{}, bb64 = form & 1 ? b64 : Tensor{};
                const Tensor zz = form & 2 ? z : Tensor{}, zz64 = form & 2 ? z64 : Tensor{};
                const Tensor ref = nn::detail::conv2d_nhwc(x64, w64, bb64, win, act, Loc::current(), zz64);
                const Tensor got = nn::detail::conv2d_nhwc(cu(x), cu(w), form & 1 ? cu(bb) : bb, win, act, Loc::current(),
                                                           form & 2 ? cu(zz) : zz);
                CHECK(got.shape() == ys);
                CHECK(rel_err(got, ref) < 1e-5);
                if (act != nn::Act::gelu_tanh) ++expected_cudnn;
                // bf16 and f16: cuDNN's tensor-core kernels (f32 accumulation)
                for (DType dt : {DType::bf16, DType::f16}) {
                    const Tensor g = nn::detail::conv2d_nhwc(cu(x).to(dt), cu(w).to(dt), form & 1 ? cu(bb).to(dt) : bb, win, act,
                                                             Loc::current(), form & 2 ? cu(zz).to(dt) : zz);
                    CHECK(rel_err(g, ref) < (dt == DType::bf16 ? 2e-2 : 4e-3));
                    if (act != nn::Act::gelu_tanh) ++expected_cudnn;
                }
            }
        // NCHW input (a permuted view) and f64 (cuDNN not used for float64)
        const Tensor xn = x.permute({0, 3, 1, 2}).contiguous();
        CHECK(rel_err(nn::conv2d(cu(xn), cu(w), cu(b), win, nn::Act::relu),
                      nn::conv2d(xn.to(DType::f64), w64, b64, win, nn::Act::relu)) < 1e-5);
        ++expected_cudnn;
        CHECK(rel_err(nn::conv2d(cu(x64).permute({0, 3, 1, 2}), cu(w64), cu(b64), win),
                      nn::conv2d(x64.permute({0, 3, 1, 2}), w64, b64, win)) < 1e-12);
    }
    // at least one cuDNN call per eligible conv (outside a capture an epilogue conv also warms the fused call once)
    if (cuda::cudnn::available()) CHECK(cuda::cudnn::conv_calls() - calls0 >= expected_cudnn);
    // f32 with TF32 allowed (tensor-core engines; through cuDNN's graph API with a cached plan)
    {
        nn::Window win;
        win.ph = win.pw = 1;
        win.kh = win.kw = 3;
        const Tensor x = randn({4, 12, 10, 32}), w = randn({48, 32, 3, 3}), b = randn({48});
        const Tensor ref = nn::detail::conv2d_nhwc(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64), win, nn::Act::relu, Loc::current());
        cuda::set_allow_tf32(true);
        const std::size_t c0 = cuda::cudnn::conv_calls();
        Tensor got;
        for (int i = 0; i < 3; ++i) got = nn::detail::conv2d_nhwc(cu(x), cu(w), cu(b), win, nn::Act::relu, Loc::current());
        cuda::set_allow_tf32(false);
        CHECK(rel_err(got, ref) < 5e-3);
        if (cuda::cudnn::available()) CHECK(cuda::cudnn::conv_calls() - c0 >= 3);
    }
    // compiled: the residual conv is one call node
    {
        nn::Window win;
        win.ph = win.pw = 1;
        win.kh = win.kw = 3;
        const Tensor x = cu(randn({2, 9, 9, 8})), w = cu(randn({8, 8, 3, 3})), b = cu(randn({8}));
        auto f = compile([&](const Tensor& t) { return nn::detail::conv2d_nhwc(t, w, b, win, nn::Act::relu, Loc::current(), t); });
        const Tensor ref = nn::detail::conv2d_nhwc(x.cpu().to(DType::f64), w.cpu().to(DType::f64), b.cpu().to(DType::f64), win,
                                                   nn::Act::relu, Loc::current(), x.cpu().to(DType::f64));
        CHECK(rel_err(f(x), ref) < 1e-5);
        CHECK(f.kernels() == 1);
        CHECK_THROWS_AS(nn::detail::conv2d_nhwc(x, w, b, win, nn::Act::relu, Loc::current(), cu(randn({2, 9, 9, 4}))), ShapeError);
    }
    // max pool: one thread per output on CUDA for f32/f64/i32/i64 (im2col for the 16-bit floats)
    for (const nn::Window pool : {nn::Window{3, 3, 2, 2, 1, 1, 1, 1}, nn::Window{2, 3, 1, 2, 0, 1, 2, 1}, nn::Window{7, 7, 7, 7, 0, 0, 1, 1}}) {
        Tensor x = randn({2, 5, 21, 14});
        x.data<float>()[17] = std::nanf("");
        for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16}) {
            CAPTURE(dtype_name(dt));
            const Tensor xt = dt == DType::i32 || dt == DType::i64 ? Tensor(x * 100.0).to(dt) : x.to(dt);
            CHECK(equal(nn::max_pool2d(cu(xt), pool), nn::max_pool2d(xt, pool)));
            CHECK(equal(nn::max_pool2d(cu(nn::detail::channels_last(xt)), pool), nn::max_pool2d(xt, pool)));
        }
    }
}

TEST_CASE("cuda: max_pool2d's gradient (argmax pass, then per-element sums) equals the CPU's decomposition" * doctest::skip(kiln_test::no_cuda())) {
    manual_seed(31);
    for (const nn::Window pool : {nn::Window{3, 3, 2, 2, 1, 1, 1, 1}, nn::Window{2, 3, 1, 2, 0, 1, 2, 1}, nn::Window{3, 3, 1, 1, 1, 1, 1, 1}}) {
        CAPTURE(pool.str());
        // rounded values: many windows hold ties, whose gradient goes to the first maximum
        const Tensor x0 = Tensor(kiln::round(randn({2, 5, 11, 9}) * 2.0));
        const Tensor gy = randn(nn::max_pool2d(x0, pool).shape());
        for (DType dt : {DType::f32, DType::f64}) {
            CAPTURE(dtype_name(dt));
            const auto grad_of = [&](const Tensor& x, const Tensor& g) {
                Tensor v = x.detach();
                v.requires_grad_();
                nn::max_pool2d(v, pool).backward(g);
                return v.grad().cpu();
            };
            const Tensor ref = grad_of(x0.to(dt), gy.to(dt));
            CHECK(kiln_test::maxdiff(grad_of(cu(x0.to(dt)), cu(gy.to(dt))), ref) == 0);
            // a channels-last input (the layout ResNet18 runs in)
            CHECK(kiln_test::maxdiff(grad_of(cu(nn::detail::channels_last(x0.to(dt))), cu(gy.to(dt))), ref) == 0);
            // compiled: the library op in the traced backward
            auto step = compile([&](const Tensor& x, const Tensor& g) {
                Tensor v = x.detach();
                v.requires_grad_();
                nn::max_pool2d(v, pool).backward(g);
                return v.grad();
            });
            const Tensor xc = cu(x0.to(dt)), gc = cu(gy.to(dt));
            CHECK(kiln_test::maxdiff(step(xc, gc).cpu(), ref) == 0);
            CHECK(kiln_test::maxdiff(step(xc, gc).cpu(), ref) == 0);
        }
    }
}

TEST_CASE("cuda: triu, tril, masked_fill, one_hot and rms_norm match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = randn({3, 5, 6}), w = randn({6});
    const Tensor mask = Tensor(randn({5, 1}) > 0.0);
    for (std::int64_t d : {-2, 0, 3}) {
        auto [c, g] = both([&](const std::vector<Tensor>& a) { return Tensor(kiln::triu(a[0], d) - kiln::tril(a[0] * 0.5, d)); }, {x});
        CHECK(equal(g, c));
    }
    auto [c1, g1] = both([&](const std::vector<Tensor>& a) { return Tensor(kiln::masked_fill(a[0], a[1], -1.5)); }, {x, mask});
    CHECK(equal(g1, c1));
    const Tensor idx = randint(0, 7, {4, 3});
    auto [c2, g2] = both([&](const std::vector<Tensor>& a) { return kiln::one_hot(a[0], 7); }, {idx});
    CHECK(equal(g2, c2));
    auto [c3, g3] = both([&](const std::vector<Tensor>& a) { return kiln::rms_norm(a[0], {6}, a[1]); }, {x, w});
    CHECK(rel_err(g3, c3) < 1e-6);
    CHECK(g3.dtype() == DType::f32);
}

TEST_CASE("cuda: cat, stack, split, chunk, pad and roll match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor a = randn({3, 4}), b = randn({2, 4}), c = randn({3, 4}).to(DType::f64);
    // along dim 0 every piece lands in a contiguous slice of the result
    auto [c0, g0] = both([](const std::vector<Tensor>& t) { return kiln::cat({t[0], t[1], t[2].slice(0, 0, 1)}, 0); }, {a, b, c});
    CHECK(g0.dtype() == DType::f64);
    CHECK(equal(g0, c0));
    auto [c1, g1] = both([](const std::vector<Tensor>& t) { return kiln::stack({t[0], t[1]}, 0); }, {a, c});
    CHECK(equal(g1, c1));
    const Tensor da = a.cuda();
    const auto parts = kiln::chunk(da, 2, 1);
    REQUIRE(parts.size() == 2);
    CHECK(parts[1].storage() == da.storage());
    CHECK(equal(parts[1], kiln::split(a, 2, 1)[1]));
    auto [c2, g2] = both([](const std::vector<Tensor>& t) { return kiln::roll(t[0], 2, 0); }, {a});
    CHECK(equal(g2, c2));
    // these write into non-contiguous slices of the result (columns)
    auto [c3, g3] = both([](const std::vector<Tensor>& t) { return kiln::cat({t[0], t[0]}, 1); }, {a});
    CHECK(equal(g3, c3));
    auto [c4, g4] = both([](const std::vector<Tensor>& t) { return kiln::pad(t[0], {1, 2, 1, 0}, 9.0); }, {a});
    CHECK(equal(g4, c4));
    auto [c5, g5] = both([](const std::vector<Tensor>& t) { return kiln::roll(t[0], {1, -1}, {0, 1}); }, {a});
    CHECK(equal(g5, c5));
}

TEST_CASE("cuda: gather, scatter, scatter_add and take_along_dim run as generated kernels and match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = randn({6, 7, 5}).transpose(0, 2);  // (5, 7, 6), strided
    for (int d = 0; d < 3; ++d) {
        Shape is{4, 6, 5};
        is[d] = 9;
        const Tensor idx = randint(0, x.size(d), is);
        auto [c, g] = both([&](const std::vector<Tensor>& t) { return kiln::gather(t[0], d, t[1]); }, {x, idx});
        CHECK(equal(g, c));
        auto [ci, gi] = both([&](const std::vector<Tensor>& t) { return kiln::gather(t[0].to(DType::i64), d, t[1].to(DType::i32)); }, {x, idx});
        CHECK(equal(gi, ci));
        // scatter with indices that never repeat along d: a permutation per line
        const Tensor perm = argmax(randn(x.shape()), d, true);  // one index per line: no repeats
        auto [cs, gs] = both([&](const std::vector<Tensor>& t) { return kiln::scatter(t[0], d, t[1], t[2]); },
                             {x, perm, Tensor(randn(perm.shape()))});
        CHECK(equal(gs, cs));
        auto [cv, gv] = both([&](const std::vector<Tensor>& t) { return kiln::scatter(t[0], d, t[1], 4.25); }, {x, perm});
        CHECK(equal(gv, cv));
        // scatter_add with repeats: float atomics may add in any order
        const Tensor src = randn(idx.shape());
        const Tensor ridx = randint(0, x.size(d), idx.shape());
        for (DType dt : {DType::f32, DType::f64, DType::i64, DType::i32, DType::bf16}) {
            INFO("scatter_add " << dtype_name(dt) << " dim " << d);
            const Tensor xd = Tensor(x * 8.0).to(dt), sd = Tensor(src * 8.0).to(dt);
            auto [ca, ga] = both([&](const std::vector<Tensor>& t) { return kiln::scatter_add(t[0], d, t[1], t[2]); }, {xd, ridx, sd});
            CHECK(rel_err(ga, ca) < (dt == DType::bf16 ? 1e-2 : 1e-6));
        }
    }
    const Tensor y = randn({4, 6});
    auto [ct, gt] = both([](const std::vector<Tensor>& t) { return kiln::take_along_dim(t[0], argmax(t[0], 1, true), 1); }, {y});
    CHECK(equal(gt, ct));
    CHECK_THROWS_AS((void)kiln::gather(cu(y), 1, cu(full({1, 1}, 6, DType::i64))), ValueError);
}

TEST_CASE("cuda: kiln::compile of the new ops matches eager, op by op" * doctest::skip(kiln_test::no_cuda())) {
    const std::vector<Tensor> args{cu(randn({3, 4})), cu(randn({2, 4})), cu(randint(0, 4, {3, 2})), cu(randn({4}))};
    using Fn = Tensor (*)(const std::vector<Tensor>&);
    const std::pair<const char*, Fn> cases[] = {
        {"cat", [](const std::vector<Tensor>& a) { return kiln::cat({Tensor(a[0] * 2.0), a[1]}, 0); }},
        {"stack", [](const std::vector<Tensor>& a) { return kiln::stack({a[0], Tensor(a[0] + 1.0)}, 0); }},
        {"pad", [](const std::vector<Tensor>& a) { return kiln::pad(a[0], {1, 1}); }},
        {"roll", [](const std::vector<Tensor>& a) { return kiln::roll(a[0], 1, 0); }},
        {"gather", [](const std::vector<Tensor>& a) { return kiln::gather(a[0], 1, a[2]); }},
        {"scatter_add", [](const std::vector<Tensor>& a) { return kiln::scatter_add(a[0], 1, a[2], Tensor(a[0] * 3.0)); }},
        {"rms_norm", [](const std::vector<Tensor>& a) { return kiln::rms_norm(a[0], {4}, a[3]); }},
        {"triu", [](const std::vector<Tensor>& a) { return Tensor(kiln::triu(a[0]) + 1.0); }},
        {"masked_fill", [](const std::vector<Tensor>& a) { return Tensor(kiln::masked_fill(a[0], a[3] > 0.0, 2.0)); }},
        {"one_hot", [](const std::vector<Tensor>& a) { return kiln::one_hot(a[2], 4); }},
        {"remainder", [](const std::vector<Tensor>& a) { return Tensor(a[0] % a[3] + kiln::floor_divide(a[0], 0.3)); }},
    };
    for (const auto& [cname, fn] : cases) {
        const std::string name = cname;
        INFO(name);
        const Tensor want = fn(args);
        try {
            auto f = compile([fn](const std::vector<Tensor>& a) { return fn(a); });
            const Tensor got = f(args);
            CHECK(got.device() == Device::cuda());
            CHECK(rel_err(got, want) < 1e-6);
        } catch (const Error& e) {
            FAIL_CHECK(name << " under kiln::compile on CUDA: " << std::string(e.what()));
        }
    }
}

namespace {
/// softmax(q k^T / sqrt(D) [mask]) v in float64 loops; q (B, H, Sq, D), k and v (B, H, Sk, D), mask
/// (kind 1: bool, 2: additive) of (B, H, Sq, Sk) values; a row with every key masked is NaN.
std::vector<double> ref_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask_in, int kind) {
    const Tensor q = q_in.cpu().to(DType::f64).contiguous(), k = k_in.cpu().to(DType::f64).contiguous(),
                 v = v_in.cpu().to(DType::f64).contiguous();
    const std::int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2), D = q.size(3);
    const Tensor m = kind == 0 ? Tensor() : mask_in.cpu().to(DType::f64).expand({B, H, Sq, Sk}).contiguous();
    std::vector<double> out(static_cast<std::size_t>(B * H * Sq * D));
    const double* Q = q.data<double>();
    const double* K = k.data<double>();
    const double* V = v.data<double>();
    for (std::int64_t bh = 0; bh < B * H; ++bh)
        for (std::int64_t i = 0; i < Sq; ++i) {
            std::vector<double> p(static_cast<std::size_t>(Sk));
            for (std::int64_t j = 0; j < Sk; ++j) {
                double s = 0;
                for (std::int64_t d = 0; d < D; ++d) s += Q[(bh * Sq + i) * D + d] * K[(bh * Sk + j) * D + d];
                s /= std::sqrt(static_cast<double>(D));
                if (kind != 0) {
                    const double mv = m.data<double>()[(bh * Sq + i) * Sk + j];
                    s = kind == 1 ? (mv != 0 ? s : -INFINITY) : s + mv;
                }
                p[static_cast<std::size_t>(j)] = s;
            }
            kiln_test::softmax_row_f64(p);  // NaN where every key is masked
            for (std::int64_t d = 0; d < D; ++d) {
                double o = 0;
                for (std::int64_t j = 0; j < Sk; ++j) o += p[static_cast<std::size_t>(j)] * V[(bh * Sk + j) * D + d];
                out[static_cast<std::size_t>((bh * Sq + i) * D + d)] = o;
            }
        }
    return out;
}
/// The largest |got - ref| over max |ref|, or infinity where got and ref disagree on NaN.
double rel_err_nan(const Tensor& got_in, const std::vector<double>& ref) {
    const Tensor got = got_in.cpu().to(DType::f64).contiguous();
    REQUIRE(static_cast<std::size_t>(got.numel()) == ref.size());
    double m = 0, scale = 1e-30;
    for (double r : ref)
        if (!std::isnan(r)) scale = std::max(scale, std::abs(r));
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double g = got.data<double>()[i];
        if (std::isnan(g) != std::isnan(ref[i])) return INFINITY;
        if (!std::isnan(g)) m = std::max(m, std::abs(g - ref[i]));
    }
    return m / scale;
}
}  // namespace

TEST_CASE("cuda: scaled_dot_product_attention in one kernel (rows in f32, tensor cores in f16/bf16) matches float64" *
          doctest::skip(kiln_test::no_cuda())) {
    manual_seed(31);
    struct Case {
        std::int64_t B, H, Sq, Sk, D;
    };
    // BERT's heads at batch 1 and over several tiles; cross attention (Sq != Sk, a partial key
    // tile); head dims padded to 16 (40), the largest (128), and small (8)
    // tiles (70 rows, 64 keys: two of each in f32); an odd head dim (7: no vector loads); short
    // sequences on tensor cores (a warp per 16 query rows, 16- and 32-key tiles: 8 and 9 keys, 16,
    // 17 and 19, 32), with query rows past the staged Q of a short key tile (33 rows, 16 keys)
    for (const Case c : {Case{1, 12, 8, 8, 64}, Case{2, 3, 130, 130, 64}, Case{2, 2, 5, 70, 32}, Case{1, 2, 65, 9, 40},
                         Case{1, 1, 3, 200, 128}, Case{2, 2, 17, 17, 8}, Case{1, 2, 70, 64, 64}, Case{2, 2, 17, 19, 7},
                         Case{1, 3, 16, 32, 64}, Case{1, 2, 33, 16, 128}, Case{2, 1, 40, 33, 64}})
        for (DType dt : {DType::f32, DType::f16, DType::bf16})
            for (int kind : {0, 1, 2, 3}) {  // no mask, bool (B, 1, 1, Sk), additive (B, 1, 1, Sk), bool (B, H, Sq, Sk) with a row all masked
                INFO("B " << c.B << " H " << c.H << " Sq " << c.Sq << " Sk " << c.Sk << " D " << c.D << " " << dtype_name(dt) << " mask kind " << kind);
                // q as a strided head view of (B, Sq, H, D) memory, k and v of one packed (B, Sk, 2, H, D) tensor
                const Tensor qd = cu(randn({c.B, c.Sq, c.H, c.D}).to(dt)).permute({0, 2, 1, 3});
                const Tensor kv = cu(randn({c.B, c.Sk, 2, c.H, c.D}).to(dt));
                const Tensor kd = kv.select(2, 0).permute({0, 2, 1, 3}), vd = kv.select(2, 1).permute({0, 2, 1, 3});
                Tensor mask;
                if (kind == 1 || kind == 2) {
                    Tensor keep = Tensor(rand({c.B, 1, 1, c.Sk}) < 0.7);
                    keep.at<bool>({0, 0, 0, 0}) = true;
                    mask = kind == 1 ? keep : Tensor(where(keep, 0.0, -10000.0)).to(dt == DType::f32 ? DType::f32 : dt);
                } else if (kind == 3) {
                    mask = Tensor(rand({c.B, c.H, c.Sq, c.Sk}) < 0.6);
                    for (std::int64_t j = 0; j < c.Sk; ++j) mask.at<bool>({0, 0, 0, j}) = false;
                }
                const int rkind = kind == 3 ? 1 : kind;
                const std::vector<double> ref = ref_attention(qd, kd, vd, mask, rkind);
                const Tensor md = mask.defined() ? cu(mask) : Tensor();
                const Tensor got = nn::scaled_dot_product_attention(qd, kd, vd, md);
                const double tol = dt == DType::f32 ? 2e-5 : dt == DType::f16 ? 4e-3 : 3e-2;
                CHECK(rel_err_nan(got, ref) < tol);
                // the one-kernel path leaves the heads in (B, Sq, H, D) memory: merging them is a view
                // (f32 takes one thread per query row, up to 64 keys; f16/bf16 tensor cores up to D = 128)
                const bool fused = dt != DType::f32 || (c.D <= 64 && c.Sk <= 64);
                CHECK(got.permute({0, 2, 1, 3}).is_contiguous() == (fused || c.H == 1));
                // compiled: the same kernel, the same numbers
                auto f = compile([&](const Tensor& a, const Tensor& b, const Tensor& v) { return nn::scaled_dot_product_attention(a, b, v, md); });
                if (fused) CHECK(equal(f(qd, kd, vd), got));
                else CHECK(rel_err_nan(f(qd, kd, vd), ref) < tol);
                CHECK(f.graph_breaks().empty());  // the kernel's choices never read a traced value
            }
    // a gradient: the decomposition, and its gradient flows
    Tensor q = cu(randn({1, 2, 5, 16})), k = cu(randn({1, 2, 5, 16})), v = cu(randn({1, 2, 5, 16}));
    q.requires_grad_();
    const Tensor y = nn::scaled_dot_product_attention(q, k, v);
    CHECK(!y.permute({0, 2, 1, 3}).is_contiguous());
    sum(y * y).backward();
    CHECK(q.grad().defined());
    CHECK(rel_err_nan(Tensor(y.detach()), ref_attention(q.detach(), k, v, Tensor(), 0)) < 2e-5);
}

TEST_CASE("cuda: optimizer steps over many parameters (a kernel per parameter, joined into combo launches) match the CPU" *
          doctest::skip(kiln_test::no_cuda())) {
    // sizes: one element, not a multiple of the vector width, and large enough for unrolled kernels
    const std::vector<Shape> shapes{{3}, {64}, {7, 5}, {128, 33}, {64, 3, 3, 3}, {1}, {100003}, {513}, {2, 2}, {40000}};
    int combos = 0, joined = 0;
    debug::Logs::instance().set_sink([&](const std::string& line) {
        const auto at = line.find("one launch for ");
        if (at == std::string::npos) return;
        ++combos;
        joined = std::max(joined, std::atoi(line.c_str() + at + 15));
    });
    debug::Logs::instance().set("combo");
    for (int which = 0; which < 2; ++which)
        for (const Mode mode : {Mode::normal, Mode::reduce_overhead}) {
            CAPTURE(which);
            CAPTURE(static_cast<int>(mode));
            manual_seed(11);
            std::vector<Tensor> pc, pg, wc, wg;
            for (const Shape& s : shapes) {
                const Tensor t = randn(s), w = randn(s);
                pc.push_back(t.clone());
                pg.push_back(cu(t));
                wc.push_back(w);
                wg.push_back(cu(w));
            }
            auto make = [&](const std::vector<Tensor>& ps) -> std::unique_ptr<nn::Optimizer> {
                if (which == 0) return std::make_unique<nn::SGD>(ps, nn::SGD::Options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true});
                return std::make_unique<nn::AdamW>(ps, nn::AdamW::Options{.lr = 1e-2});
            };
            const auto oc = make(pc), og = make(pg);
            // (the optimizer's handles of the parameters require grad; the updates are in place, so
            // pc and pg see them)
            auto step = [](nn::Optimizer& o, const std::vector<Tensor>& ws, const Tensor& x) {
                const std::vector<Tensor>& ps = o.params();
                o.zero_grad();
                Tensor loss = sum(Tensor(kiln::sin(ps[0] * x) * ws[0]));
                for (std::size_t i = 1; i < ps.size(); ++i) loss = Tensor(loss + sum(Tensor(kiln::sin(ps[i] * x) * ws[i])));
                loss.backward();
                o.step();
                return loss.detach();
            };
            auto compiled = compile([&](const Tensor& x) { return step(*og, wg, x); }, {.mode = mode});
            for (int i = 0; i < 4; ++i) {
                const Tensor x = full({}, 1.0 + 0.1 * i);
                const Tensor lc = step(*oc, wc, x), lg = compiled(cu(x));
                CHECK(rel_err(lg, lc) < 1e-5);
            }
            for (std::size_t i = 0; i < shapes.size(); ++i) {
                CAPTURE(i);
                CHECK(rel_err(pg[i], pc[i]) < 1e-5);
            }
        }
    debug::Logs::instance().set("");
    debug::Logs::instance().set_sink(nullptr);
    // the updates of the parameters with one kernel text ran as one launch (unless turned off)
    const char* off = std::getenv("KILN_CUDA_COMBO");
    if (off == nullptr || std::atoi(off) != 0) {
        CHECK(combos > 0);
        CHECK(joined >= 4);
    }
}

TEST_CASE("cuda: KILN_LOGS=compile_times logs the first run's compile waves and no waves once the kernels are loaded" *
          doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = cu(randn({8, 16})), table = cu(randn({10, 16}));
    const Tensor ids = cu(randint(0, 10, {8, 16}, DType::i64));
    // constants no other test uses: kernel texts not in the memory cache yet (the disk cache may
    // hold them: a wave also counts kernels read from there)
    auto f = compile([](const Tensor& a, const Tensor& t, const Tensor& i) {
        return Tensor(kiln::exp(kiln::gather(Tensor(t * 3.8125), 0, i)) * 1.0625 + a);  // a library call between two kernels
    });
    std::vector<std::string> lines;
    debug::Logs::instance().set_sink([&](const std::string& l) { lines.push_back(l); });
    debug::Logs::instance().set("compile_times");
    const Tensor y = f(x, table, ids);
    const std::size_t first = lines.size();
    (void)f(x, table, ids);
    debug::Logs::instance().set("");
    debug::Logs::instance().set_sink(nullptr);
    const Tensor xc = x.cpu(), tc = table.cpu(), ic = ids.cpu();
    CHECK(kiln_test::maxdiff(y.cpu(), Tensor(kiln::exp(kiln::gather(Tensor(tc * 3.8125), 0, ic)) * 1.0625 + xc)) < 1e-5);
    int waves = 0, compiles = 0;
    for (std::size_t k = 0; k < lines.size(); ++k) {
        INFO(lines[k]);
        const bool wave = lines[k].find("compile wave: ") != std::string::npos;
        waves += wave ? 1 : 0;
        compiles += lines[k].find("compile of ") != std::string::npos ? 1 : 0;
        CHECK((!wave || k < first));  // the second call finds every kernel loaded
        if (wave) CHECK(std::atoi(lines[k].c_str() + lines[k].find("compile wave: ") + 14) >= 1);
    }
    CHECK(waves >= 1);
    CHECK(compiles == 1);
}
