// the generated layer_norm row kernel against bench/hand_cpu.hpp's loop, one thread, alternating, same buffers
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include <random>
#include "/work/main/bench/hand_cpu.hpp"
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t, int64_t);
int main(int argc, char** argv) {
    const int64_t R = 8192, C = 1024;
    std::vector<float> x(R * C), w(C), b(C), y1(R * C), y2(R * C);
    std::mt19937 g(1); std::normal_distribution<float> nd;
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = nd(g);
    for (auto& v : b) v = nd(g);
    void* h = dlopen(argv[1], RTLD_NOW);
    Fn fn = (Fn)dlsym(h, "kiln_kernel");
    const int64_t oshape[1] = {R}, ostr[4] = {C, 0, 0, C};
    const double sc[1] = {1e-5};
    auto gen = [&] { void* p[4] = {x.data(), w.data(), b.data(), y1.data()}; fn(p, oshape, ostr, sc, C, 0, R); };
    auto hand = [&] { kiln_bench_hand::layernorm_rows(x.data(), w.data(), b.data(), y2.data(), C, 0, R); };
    for (int round = 0; round < 4; ++round) {
        std::vector<double> a, c;
        for (int i = 0; i < 30; ++i) {
            auto t0 = std::chrono::steady_clock::now(); if (round % 2) gen(); else hand(); auto t1 = std::chrono::steady_clock::now(); if (round % 2) hand(); else gen(); auto t2 = std::chrono::steady_clock::now();
            const double d1 = std::chrono::duration<double, std::milli>(t1 - t0).count(), d2 = std::chrono::duration<double, std::milli>(t2 - t1).count();
            a.push_back(round % 2 ? d1 : d2); c.push_back(round % 2 ? d2 : d1);
        }
        std::sort(a.begin(), a.end()); std::sort(c.begin(), c.end());
        double md = 0; for (int64_t i = 0; i < R * C; ++i) md = std::max(md, (double)std::fabs(y1[i] - y2[i]));
        std::printf("generated %.3f ms (min %.3f)  hand %.3f ms (min %.3f)  maxdiff %.2g\n", a[15], a[0], c[15], c[0], md);
    }
}
