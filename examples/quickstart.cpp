// quickstart: one statement is one fused pass; eager runs one kernel per op. Prints both
// timings and checks that they agree.
#include <kiln/kiln.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
    if (argc > 1) {  // runs on the CPU only: an option such as --cuda must not be ignored silently
        std::fprintf(stderr, "%s: takes no options (it runs on the CPU; the other examples take --cuda)\n", argv[0]);
        return 2;
    }
    using clock = std::chrono::steady_clock;
    kiln::manual_seed(0);
    const kiln::Tensor x = kiln::randn({1 << 20});
    const kiln::Tensor b = kiln::randn({1024});

    // An expression: nothing runs yet; the expression holds x by value.
    auto chain = kiln::relu(x * 1.5 + 0.5) * kiln::sigmoid(x) - kiln::tanh(x * 0.1) + kiln::exp(-x * x);

    auto t0 = clock::now();
    const kiln::Tensor fused = chain;  // one vectorized, multi-threaded pass
    auto t1 = clock::now();
    const kiln::Tensor eager = kiln::eager(chain);  // 12 kernels, 12 materialized tensors
    auto t2 = clock::now();

    const double diff = kiln::max(kiln::abs(fused - eager)).item<double>();
    std::printf("chain on 1M f32: fused %.0f us, eager %.0f us, max |fused - eager| = %.2g\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count(),
                std::chrono::duration<double, std::micro>(t2 - t1).count(), diff);

    // Broadcasting and reductions: a (1024, 1024) matrix plus a bias row, a GELU, then row softmax.
    const kiln::Tensor m = x.reshape({1024, 1024});
    const kiln::Tensor h = kiln::gelu_tanh(m + b);
    const kiln::Tensor p = kiln::softmax(h, -1);
    const double row_sum = kiln::mean(kiln::sum(p, -1)).item<double>();
    std::printf("softmax rows sum to %.6f; p[0, :4] = ", row_sum);
    std::cout << p.slice(0, 0, 1).slice(1, 0, 4) << "\n";

    // A reduction of an expression runs without materializing the product.
    const kiln::Tensor dot = kiln::sum(m * m, 1);
    std::printf("row norms^2 (first 3): %.3f %.3f %.3f\n", dot.item<float>(0), dot.item<float>(1), dot.item<float>(2));

    // A whole function as one program: traced once, fused, cached under guards.
    const kiln::Tensor w = kiln::randn({1024, 256}) * 0.03, bias = kiln::randn({256});
    auto layer = kiln::compile([&](const kiln::Tensor& in) {
        return kiln::softmax(kiln::gelu_tanh(kiln::matmul(in, w) + bias), -1);  // GEMM + 1 row kernel
    });
    auto t3 = clock::now();
    const kiln::Tensor y1 = layer(m);  // traces and compiles
    auto t4 = clock::now();
    const kiln::Tensor y2 = layer(m);  // cached program
    auto t5 = clock::now();
    const kiln::Tensor ref = kiln::softmax(kiln::gelu_tanh(kiln::matmul(m, w) + bias), -1);
    const double cdiff = kiln::max(kiln::abs(y2 - ref)).item<double>();
    std::printf("compiled layer: %d kernels, first call %.0f us, second %.0f us, max |compiled - expressions| = %.2g\n",
                layer.kernels(), std::chrono::duration<double, std::micro>(t4 - t3).count(),
                std::chrono::duration<double, std::micro>(t5 - t4).count(), cdiff);
    (void)y1;

    const bool ok = diff < 1e-5 && std::abs(row_sum - 1.0) < 1e-5 && cdiff < 1e-6 && layer.kernels() == 2;
    std::printf("%s\n", ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
