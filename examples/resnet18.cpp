// ResNet-18 at inference: eager (one kernel per op), then BatchNorm folded into the convolutions
// and the whole forward pass compiled.
//   example_resnet18 [--cuda] [--full]     (--full: batch 16, 3x224x224; default batch 2, 3x64x64)
#include "example_util.hpp"

#include <kiln/nn.hpp>

int main(int argc, char** argv) {
    const kiln::Device dev = example::device_from(argc, argv);
    const bool full = example::flag(argc, argv, "--full");
    const std::int64_t batch = full ? 16 : 2, side = full ? 224 : 64;
    kiln::manual_seed(0);
    kiln::nn::ResNet18 net(1000, {kiln::DType::f32, dev});
    const kiln::Tensor x = kiln::randn({batch, 3, side, side}).to(dev);

    auto eager = kiln::compile([&](const kiln::Tensor& t) { return net(t); }, {.backend = kiln::Backend::eager});
    kiln::Tensor ye = eager(x);
    const double te = example::median_ms([&] { ye = eager(x); }, dev, 3);

    kiln::nn::ResNet18 folded = net;
    folded.fold();
    auto compiled = kiln::compile([&](const kiln::Tensor& t) { return folded(t); });
    kiln::Tensor yc = compiled(x);
    const double tc = example::median_ms([&] { yc = compiled(x); }, dev, 3);
    std::printf("resnet18, batch %lld, 3x%lldx%lld on %s: %d kernels and library calls compiled (BatchNorm folded)\n",
                static_cast<long long>(batch), static_cast<long long>(side), static_cast<long long>(side), dev.str().c_str(),
                compiled.kernels());
    return example::report("resnet18", te, tc, example::max_rel_diff(yc, ye), 1e-4);
}
