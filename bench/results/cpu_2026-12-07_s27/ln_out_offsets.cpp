#include <kiln/kiln.hpp>
#include "/work/main/bench/hand_cpu.hpp"
#include <dlfcn.h>
#include <chrono>
#include <algorithm>
#include <cstdio>
using kiln::Tensor;
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t, int64_t);
int main(int argc, char** argv) {
    const std::int64_t R = 8192, C = 1024;
    kiln::manual_seed(4);
    const Tensor x = kiln::randn({R, C}), w = kiln::randn({C}), bias = kiln::randn({C});
    Fn fn = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel");
    std::printf("x %% 4096 = %ld, w %ld b %ld\n", (long)((uintptr_t)x.data_ptr() % 4096), (long)((uintptr_t)w.data_ptr() % 4096), (long)((uintptr_t)bias.data_ptr() % 4096));
    Tensor big = kiln::empty({R * C + 4096});
    auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    for (int off : {0, 16, 64, 256, 512, 1024, 2048}) {
        float* o = big.data<float>() + off;
        std::vector<double> a, b;
        for (int i = 0; i < 25; ++i) {
            a.push_back(tm([&] { kiln_bench_hand::layernorm_rows(x.data<float>(), w.data<float>(), bias.data<float>(), o, C, 0, R); }));
            b.push_back(tm([&] { const int64_t os[1] = {R}, st[4] = {C, 0, 0, C}; const double sc[1] = {1e-5};
                             void* p[4] = {x.data_ptr(), w.data_ptr(), bias.data_ptr(), o}; fn(p, os, st, sc, C, 0, R); }));
        }
        std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
        std::printf("out %% 4096 = %4ld: hand %.3f  generated %.3f ms\n", (long)((uintptr_t)o % 4096), a[12], b[12]);
    }
}
