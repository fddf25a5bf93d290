// numpy_fn fused exactly as kiln_bench runs it on CUDA, synchronized per call; median of many calls; and its statements one by one.
#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using kiln::Tensor;
template <class F> double med(F f, int n) {
    f(); kiln::cuda::synchronize();
    std::vector<double> t;
    for (int i = 0; i < n; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        f(); kiln::cuda::synchronize();
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
Tensor numpy_fn_fused(const Tensor& X, const Tensor& Y) {
    auto norm = [&](const Tensor& A) {
        const Tensor mu = kiln::mean(A, 0, true);
        const Tensor sd = kiln::std(A, 0, true, 0.0);
        return Tensor((A - mu) / kiln::where(sd == 0.0, 1.0, sd));
    };
    const Tensor Xn = norm(X), Yn = norm(Y);
    const Tensor r = kiln::sum(Xn.unsqueeze(2) * Yn.unsqueeze(1), {1, 2});
    return Tensor(kiln::exp(kiln::clamp(r, -1.0, 1.0)) + kiln::sum(Xn * Xn + Yn * Yn, 1) * 0.001);
}
int main() {
    const auto cu = kiln::Device::cuda();
    kiln::manual_seed(5);
    const Tensor X = kiln::randn({1024, 640}).to(cu), Y = Tensor(kiln::randn({1024, 640}) * 0.1).to(cu);
    Tensor out;
    for (int rep = 0; rep < 3; ++rep) {
        std::printf("numpy_fn fused   %8.2f us\n", med([&] { out = numpy_fn_fused(X, Y); }, 2000));
        const Tensor Xn = numpy_fn_fused(X, Y);
        std::printf("  mean           %8.2f us\n", med([&] { out = kiln::mean(X, 0, true); }, 1000));
        std::printf("  std            %8.2f us\n", med([&] { out = kiln::std(X, 0, true, 0.0); }, 1000));
        std::printf("  outer sum      %8.2f us\n", med([&] { out = kiln::sum(X.unsqueeze(2) * Y.unsqueeze(1), {1, 2}); }, 500));
        std::printf("  sum(xx+yy)     %8.2f us\n", med([&] { out = kiln::sum(X * X + Y * Y, 1); }, 1000));
    }
}
