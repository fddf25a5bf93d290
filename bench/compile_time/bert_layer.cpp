// A translation unit with a BERT encoder layer compiled and run (bench/compile_time.sh times its build).
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>

#include <cstdio>

int main() {
    kiln::manual_seed(0);
    kiln::nn::BertLayer layer(128, 4, 512);
    const kiln::Tensor x = kiln::randn({2, 32, 128});
    auto compiled = kiln::compile([&](const kiln::Tensor& t) { return layer(t); });
    const kiln::Tensor y = compiled(x);
    const double diff = kiln::max(kiln::abs(y - layer(x))).item<double>();
    std::printf("bert layer: %d kernels, max |compiled - eager| = %.3g\n", compiled.kernels(), diff);
    return diff < 1e-3 ? 0 : 1;
}
