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
    auto compiled = kiln::compile([&](const Tensor& v) { return kiln::layer_norm(v, 1, w, bias); });
    Fn fn = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel");
    kiln::set_num_threads(1);
    Tensor y1, y2, y3;
    std::vector<double> a, b, c;
    auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    for (int i = 0; i < 5; ++i) y1 = compiled(x);
    for (int i = 0; i < 60; ++i) {
        a.push_back(tm([&] { y1 = compiled(x); }));
        b.push_back(tm([&] { Tensor o = kiln::empty({R, C}); kiln_bench_hand::layernorm_rows(x.data<float>(), w.data<float>(), bias.data<float>(), o.data<float>(), C, 0, R); y2 = o; }));
        c.push_back(tm([&] { Tensor o = kiln::empty({R, C}); const int64_t os[1] = {R}, st[4] = {C, 0, 0, C}; const double sc[1] = {1e-5};
                             void* p[4] = {x.data_ptr(), w.data_ptr(), bias.data_ptr(), o.data_ptr()}; fn(p, os, st, sc, C, 0, R); y3 = o; }));
    }
    for (auto* v : {&a, &b, &c}) std::sort(v->begin(), v->end());
    std::printf("compiled %.3f  hand(fresh) %.3f  generated .so direct(fresh) %.3f ms (medians; mins %.3f %.3f %.3f)\n", a[30], b[30], c[30], a[0], b[0], c[0]);
}
