// Shared by the examples: device choice from argv, a median timer and a closeness check.
#pragma once

#include <kiln/kiln.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace example {

inline bool flag(int argc, char** argv, const char* name) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return true;
    return false;
}

/// cuda:0 with `--cuda` on the command line, else the CPU. `--cuda` without a usable GPU is an
/// error (message on stderr, exit status 2), never a silent run on the CPU; so is an option other
/// than the examples' two (`--cuda`, `--full`), a typo included.
inline kiln::Device device_from(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--cuda") != 0 && std::strcmp(argv[i], "--full") != 0) {
            std::fprintf(stderr, "%s: unknown option '%s' (options: --cuda, --full)\n", argv[0], argv[i]);
            std::exit(2);
        }
    if (!flag(argc, argv, "--cuda")) return kiln::Device::cpu();
    try {
        (void)kiln::cuda::properties(0);  // throws DeviceError saying why there is no cuda:0
    } catch (const kiln::Error& e) {
        std::fprintf(stderr, "%s: --cuda was given but no CUDA device can be used: %s\n", argc > 0 ? argv[0] : "example",
                     e.what());
        std::exit(2);
    }
    return kiln::Device::cuda();
}

/// Median wall time of fn in milliseconds over `reps` calls after one warm-up (waits for the GPU).
inline double median_ms(const std::function<void()>& fn, kiln::Device dev, int reps = 5) {
    auto sync = [&] { if (dev.is_cuda()) kiln::cuda::synchronize(dev.index); };
    fn();
    sync();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        sync();
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/// Largest |a - b| relative to the largest |b|, on the CPU in float64.
inline double max_rel_diff(const kiln::Tensor& a, const kiln::Tensor& b) {
    const kiln::Tensor x = a.cpu().to(kiln::DType::f64).contiguous(), y = b.cpu().to(kiln::DType::f64).contiguous();
    double m = 0, s = 1e-30;
    for (std::int64_t i = 0; i < y.numel(); ++i) s = std::max(s, std::abs(y.data<double>()[i]));
    for (std::int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::abs(x.data<double>()[i] - y.data<double>()[i]));
    return m / s;
}

/// Prints eager vs compiled and returns the exit status: 0 when they agree within tol.
inline int report(const char* what, double eager_ms, double compiled_ms, double diff, double tol) {
    std::printf("%s: eager %.3f ms, compiled %.3f ms (%.2fx); max relative difference %.2e (tolerance %.0e): %s\n", what,
                eager_ms, compiled_ms, eager_ms / compiled_ms, diff, tol, diff <= tol ? "agree" : "DIFFER");
    return diff <= tol ? 0 : 1;
}

}  // namespace example
