#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <random>
#include <vector>
#include <algorithm>
#include <cstdlib>
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t, int64_t);
int main(int argc, char** argv) {
    const int64_t R = 4096, C = 1024;
    std::vector<float> x(R * C), y(R * C), y2(R * C), ref(R*C); const bool alt = getenv("ALT") != nullptr;
    std::mt19937 g(1); std::normal_distribution<float> d(0, 3);
    for (auto& v : x) v = d(g);
    for (int a = 1; a < argc; ++a) {
        void* h = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL);
        if (!h) { std::printf("%s\n", dlerror()); return 1; }
        Fn f = (Fn)dlsym(h, "kiln_kernel");
        void* ptrs[2] = {x.data(), y.data()};
        int64_t oshape[1] = {R}, ostr[2] = {C, C};
        double sc[1] = {0};
        std::vector<double> ts;
        for (int r = 0; r < 30; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            ptrs[1] = (alt && (r & 1)) ? y2.data() : y.data();
            f(ptrs, oshape, ostr, sc, C, 0, R);
            ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ts.begin(), ts.end());
        double md = 0; if (a == 1) ref = y; else for (int64_t i = 0; i < R*C; ++i) md = std::max(md, (double)std::abs(y[i]-ref[i]));
        std::printf("%s: %.3f ms (min %.3f) maxdiff %.3g\n", argv[a], ts[15], ts[0], md);
    }
}
