// An MLP (Linear -> GELU -> Linear) at inference: eager (one kernel per op) vs kiln::compile.
//   example_mlp_inference [--cuda] [--full]     (--full: batch 64, 1024 -> 4096 -> 1024)
#include "example_util.hpp"

#include <kiln/nn.hpp>

int main(int argc, char** argv) {
    const kiln::Device dev = example::device_from(argc, argv);
    const bool full = example::flag(argc, argv, "--full");
    const std::int64_t batch = full ? 64 : 16, d = full ? 1024 : 256, hidden = full ? 4096 : 1024;
    kiln::manual_seed(0);
    const kiln::nn::Mlp mlp(d, hidden, d, {kiln::DType::f32, dev});
    const kiln::Tensor x = kiln::randn({batch, d}).to(dev);

    auto eager = kiln::compile([&](const kiln::Tensor& t) { return mlp(t); }, {.backend = kiln::Backend::eager});
    auto compiled = kiln::compile([&](const kiln::Tensor& t) { return mlp(t); });
    kiln::Tensor ye = eager(x), yc = compiled(x);
    const double te = example::median_ms([&] { ye = eager(x); }, dev);
    const double tc = example::median_ms([&] { yc = compiled(x); }, dev);
    std::printf("mlp %lld x %lld -> %lld -> %lld on %s, %d kernels compiled\n", static_cast<long long>(batch),
                static_cast<long long>(d), static_cast<long long>(hidden), static_cast<long long>(d), dev.str().c_str(),
                compiled.kernels());
    return example::report("mlp", te, tc, example::max_rel_diff(yc, ye), 1e-4);
}
