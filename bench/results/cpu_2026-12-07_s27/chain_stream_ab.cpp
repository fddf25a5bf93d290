#include <kiln/kiln.hpp>
#include "/work/main/bench/hand_cpu.hpp"
#include <dlfcn.h>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <thread>
using kiln::Tensor;
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t);
int main(int argc, char** argv) {
    const std::int64_t n = (argc > 3 ? atol(argv[3]) : 16) << 20; const int T = argc > 4 ? atoi(argv[4]) : 1;
    kiln::manual_seed(1);
    const Tensor x = Tensor(kiln::randn({n}) * 2.0);
    Fn f1 = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel");
    Fn f2 = (Fn)dlsym(dlopen(argv[2], RTLD_NOW), "kiln_kernel");
    auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    std::vector<double> a, b, c; Tensor y1, y2, y3;
    auto run = [&](Fn fn) { Tensor o = kiln::empty({n}); const int64_t sh[1] = {n}, st[2] = {1, 1}; const double sc[3] = {1.5, 0.5, 0.1};
        void* p[2] = {x.data_ptr(), o.data_ptr()};
        if (T == 1) fn(p, sh, st, sc, 0, n); else { std::thread th([&]{ fn(p, sh, st, sc, n / 2, n); }); fn(p, sh, st, sc, 0, n / 2); th.join(); } return o; };
    for (int i = 0; i < 25; ++i) {
        a.push_back(tm([&] { Tensor o = kiln::empty({n}); if (T == 1) kiln_bench_hand::chain_range(x.data<float>(), o.data<float>(), 0, n); else { std::thread th([&]{ kiln_bench_hand::chain_range(x.data<float>(), o.data<float>(), n/2, n); }); kiln_bench_hand::chain_range(x.data<float>(), o.data<float>(), 0, n/2); th.join(); } y1 = o; }));
        b.push_back(tm([&] { y2 = run(f1); }));
        c.push_back(tm([&] { y3 = run(f2); }));
    }
    for (auto* v : {&a, &b, &c}) std::sort(v->begin(), v->end());
    std::printf("T %d n %ldM: hand %.3f  %s %.3f  %s %.3f ms (medians)\n", T, (long)(n >> 20), a[12], argv[1], b[12], argv[2], c[12]);
}
