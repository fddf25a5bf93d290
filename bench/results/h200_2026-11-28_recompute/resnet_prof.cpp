// Probe (sessions 9-10): one ResNet-18 training step of kiln_bench's workload between cuProfilerStart
// and cuProfilerStop, for `ncu --profile-from-start off`; also times steps back to back.
#include <chrono>
#include <cstdio>
#include <dlfcn.h>
#include <string>
#include "../../bench/train_workloads.hpp"
#include <kiln/compile.hpp>

int main(int argc, char** argv) {
    const std::string method = argc > 1 ? argv[1] : "compiled";
    const std::int64_t batch = argc > 2 ? std::atoll(argv[2]) : 16;
    void* cu = dlopen("libcuda.so.1", RTLD_NOW);
    auto start = reinterpret_cast<int (*)()>(dlsym(cu, "cuProfilerStart"));
    auto stop = reinterpret_cast<int (*)()>(dlsym(cu, "cuProfilerStop"));
    kiln::cuda::set_allow_tf32(true);
    auto t = kiln_bench::make_trainer("resnet18_train", kiln::Device::cuda(), kiln_bench::Plain{}, batch);
    std::function<kiln::Tensor()> step;
    using F = std::function<kiln::Tensor(const kiln::Tensor&, const kiln::Tensor&)>;
    std::shared_ptr<kiln::Compiled<F>> c;
    if (method == "eager") step = [&] { return t.step(t.x, t.y); };
    else {
        kiln::Options o;
        if (method == "reduce_overhead") o.mode = kiln::Mode::reduce_overhead;
        c = std::make_shared<kiln::Compiled<F>>(kiln::compile(F([&t](const kiln::Tensor& x, const kiln::Tensor& y) { return t.step(x, y); }), o));
        step = [&] { return (*c)(t.x, t.y); };
    }
    const auto c0 = std::chrono::steady_clock::now();
    step().item<float>();
    std::printf("%s batch %lld: first step %.1f ms (trace, compile, run)\n", method.c_str(), (long long)batch,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
    for (int i = 0; i < 3; ++i) step().item<float>();
    for (int r = 0; r < 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        kiln::Tensor l;
        for (int i = 0; i < 20; ++i) l = step();
        l.item<float>();
        std::printf("%s batch %lld: %.1f us per step (20 back to back)\n", method.c_str(), (long long)batch,
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20);
    }
    start();
    step().item<float>();
    stop();
    std::printf("kernels per step: %d\n", c ? c->kernels() : 0);
}
