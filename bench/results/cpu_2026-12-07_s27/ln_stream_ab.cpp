#include <kiln/kiln.hpp>
#include "/work/main/bench/hand_cpu.hpp"
#include <dlfcn.h>
#include <chrono>
#include <algorithm>
#include <cstdio>
using kiln::Tensor;
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t, int64_t);
int main(int argc, char** argv) {
    const std::int64_t R = argc > 3 ? atol(argv[3]) : 8192, C = 1024;
    kiln::manual_seed(4);
    const Tensor x = kiln::randn({R, C}), w = kiln::randn({C}), bias = kiln::randn({C});
    Fn f1 = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel");
    Fn f2 = (Fn)dlsym(dlopen(argv[2], RTLD_NOW), "kiln_kernel");
    auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    std::vector<double> a, b, c; Tensor y1, y2, y3;
    auto run = [&](Fn fn) { Tensor o = kiln::empty({R, C}); const int64_t os[1] = {R}, st[4] = {C, 0, 0, C}; const double sc[1] = {1e-5};
        void* p[4] = {x.data_ptr(), w.data_ptr(), bias.data_ptr(), o.data_ptr()}; fn(p, os, st, sc, C, 0, R); return o; };
    for (int i = 0; i < 60; ++i) {
        a.push_back(tm([&] { Tensor o = kiln::empty({R, C}); kiln_bench_hand::layernorm_rows(x.data<float>(), w.data<float>(), bias.data<float>(), o.data<float>(), C, 0, R); y1 = o; }));
        b.push_back(tm([&] { y2 = run(f1); }));
        c.push_back(tm([&] { y3 = run(f2); }));
    }
    for (auto* v : {&a, &b, &c}) std::sort(v->begin(), v->end());
    std::printf("rows %ld: hand %.3f  %s %.3f  %s %.3f ms (medians)\n", (long)R, a[30], argv[1], b[30], argv[2], c[30]);
}
