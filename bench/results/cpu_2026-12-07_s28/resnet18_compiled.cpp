#include <chrono>
#include <cstdio>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
int main(int argc, char** argv) {
    using kiln::Tensor;
    const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
    auto mod = std::make_shared<kiln::nn::ResNet18>(1000, kiln::nn::Init{kiln::DType::f32, kiln::Device::cpu()});
    mod->fold();
    const Tensor x = kiln::randn({16, 3, 224, 224});
    auto c = kiln::compile([mod](const Tensor& t) { return (*mod)(t); });
    c(x);
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        Tensor y = c(x);
        std::printf("%.1f ms\n", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
}
