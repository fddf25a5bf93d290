// Session 16 probe: a compiled training step's first call (KILN_LOGS=memory,compile_times) and,
// on CUDA, its peak device memory against the bytes in use before the step.
#include <chrono>
#include <cstdio>
#include <string>

#include "train_workloads.hpp"

using kiln::Tensor;

int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "bert_layer_train";
    const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
    const bool ro = argc > 3 && std::string(argv[3]) == "ro";
    const kiln::Device dev = cuda ? kiln::Device::cuda() : kiln::Device::cpu();
    if (cuda && name == "resnet18_train") kiln::cuda::set_allow_tf32(true);
    auto t = kiln_bench::make_trainer(name, dev);
    kiln::Options o;
    if (!cuda) {  // CUDA's fusion limits on the CPU
        o.limits.column_rows = false;
        o.limits.merge_reductions = o.limits.recompute = true;
    }
    if (ro) o.mode = kiln::Mode::reduce_overhead;
    auto c = kiln::compile(std::function<Tensor(const Tensor&, const Tensor&)>([&t](const Tensor& x, const Tensor& y) { return t.step(x, y); }), o);
    // one eager step first (as kiln_bench's eager row): gradients exist
    t.step(t.x, t.y).item<float>();
    std::size_t before = 0;
    if (cuda) {
        kiln::cuda::synchronize();
        before = kiln::cuda::memory_stats(0).bytes_in_use;
        kiln::cuda::reset_peak_memory_stats(0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const float l = c(t.x, t.y).item<float>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %s: first compiled step %.1f ms, loss %g\n", name.c_str(), cuda ? "cuda" : "cpu", ms, l);
    if (cuda) {
        kiln::cuda::synchronize();
        const auto first = kiln::cuda::memory_stats(0);
        kiln::cuda::reset_peak_memory_stats(0);
        for (int i = 0; i < 5; ++i) c(t.x, t.y);
        kiln::cuda::synchronize();
        const auto s = kiln::cuda::memory_stats(0);
#ifndef MEM_PROBE_OLD  // (built against a kiln before DeviceMemoryStats::peak_bytes_requested: -DMEM_PROBE_OLD)
        std::printf("%s: in use before %.1f MiB; first call's peak %.1f MiB; later calls' peak %.1f MiB in blocks, %.1f MiB requested "
                    "(in use then %.1f / %.1f requested); %d kernels\n",
                    name.c_str(), before / 1048576.0, first.peak_bytes_in_use / 1048576.0, s.peak_bytes_in_use / 1048576.0,
                    s.peak_bytes_requested / 1048576.0, s.bytes_in_use / 1048576.0, s.bytes_requested / 1048576.0, c.kernels());
#else
        std::printf("%s: in use before %.1f MiB; first call's peak %.1f MiB; later calls' peak %.1f MiB in blocks; %d kernels\n",
                    name.c_str(), before / 1048576.0, first.peak_bytes_in_use / 1048576.0, s.peak_bytes_in_use / 1048576.0, c.kernels());
#endif
    }
}
