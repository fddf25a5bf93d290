// The seed's numpy function, written the way numpy code is: column-normalize X and Y, sum the
// outer product per row, clip, exp, plus a small penalty. kiln::compile factors the (1024, 640,
// 640) outer product into two row sums, so it never exists.
//   example_numpy_style [--cuda] [--full]     (--full: X, Y of (1024, 640); default (256, 160))
#include "example_util.hpp"

namespace {
using kiln::Tensor;

Tensor normalize_columns(const Tensor& x) {
    const Tensor mu = kiln::mean(x, {0}, true);
    const Tensor sd = kiln::sqrt(kiln::mean(kiln::square(x - mu), {0}, true));
    return Tensor((x - mu) / kiln::where(sd == 0.0, 1.0, sd));
}

Tensor numpy_fn(const Tensor& X, const Tensor& Y) {
    const Tensor xn = normalize_columns(X), yn = normalize_columns(Y);
    const std::int64_t n = X.size(0), p = X.size(1);
    // r[i] = sum_{j,k} xn[i, j] * yn[i, k], as numpy writes it: the 3-D outer product, summed
    const Tensor r = kiln::sum(xn.view({n, p, 1}) * yn.view({n, 1, p}), {1, 2});
    return Tensor(kiln::exp(kiln::clamp(r, -1.0, 1.0)) + 0.001 * kiln::sum(kiln::square(xn) + kiln::square(yn), {1}));
}
}  // namespace

int main(int argc, char** argv) {
    const kiln::Device dev = example::device_from(argc, argv);
    const bool full = example::flag(argc, argv, "--full");
    const std::int64_t n = full ? 1024 : 256, p = full ? 640 : 160;
    kiln::manual_seed(0);
    const Tensor X = kiln::randn({n, p}).to(dev), Y = Tensor(kiln::randn({n, p}) * 0.1).to(dev);
    auto eager = kiln::compile(numpy_fn, {.backend = kiln::Backend::none});  // the function as written, statement by statement
    auto compiled = kiln::compile(numpy_fn);
    Tensor ye = eager(X, Y), yc = compiled(X, Y);
    const double te = example::median_ms([&] { ye = eager(X, Y); }, dev, 3);
    const double tc = example::median_ms([&] { yc = compiled(X, Y); }, dev);
    std::printf("numpy_fn (%lld, %lld) on %s: %d kernels compiled\n", static_cast<long long>(n), static_cast<long long>(p),
                dev.str().c_str(), compiled.kernels());
    return example::report("numpy_fn", te, tc, example::max_rel_diff(yc, ye), 1e-3);
}
