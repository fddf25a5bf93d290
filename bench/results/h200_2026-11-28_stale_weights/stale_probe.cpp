// Session 16 probe: does a compiled training step follow its weights from step to step?
// Eager against compiled (same seed, same data), losses per step.
#include <cmath>
#include <cstdio>
#include <string>

#include "train_workloads.hpp"

using kiln::Tensor;

int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "resnet18_train";
    const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
    const kiln::Device dev = kiln::Device::cuda();
    auto te = kiln_bench::make_trainer(name, dev);
    auto tc = kiln_bench::make_trainer(name, dev);
    auto c = kiln::compile(std::function<Tensor(const Tensor&, const Tensor&)>([&tc](const Tensor& x, const Tensor& y) { return tc.step(x, y); }));
    double worst = 0;
    for (int i = 0; i < steps; ++i) {
        const float le = te.step(te.x, te.y).item<float>();
        const float lc = c(tc.x, tc.y).item<float>();
        const double rel = std::abs(le - lc) / std::max(1e-6f, std::abs(le));
        worst = std::max(worst, rel);
        std::printf("%s step %d: eager %.7f compiled %.7f rel %.2e\n", name.c_str(), i, le, lc, rel);
    }
    std::printf("%s: worst relative loss difference %.2e over %d steps\n", name.c_str(), worst, steps);
}
