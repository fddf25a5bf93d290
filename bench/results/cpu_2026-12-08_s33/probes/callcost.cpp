#include <initializer_list>
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t);
int main(int argc, char** argv) {
    Fn g = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel"), h = (Fn)dlsym(dlopen(argv[2], RTLD_NOW), "kiln_kernel");
    const int64_t len = atoi(argv[3]);
    float* x = (float*)aligned_alloc(64, 4096 * 4); float* buf = (float*)aligned_alloc(64, 4096 * 4);
    for (int i = 0; i < 4096; ++i) x[i] = i * 0.001f;
    int64_t shape[1] = {1 << 30}, strides[2] = {1, 1};
    for (int rep = 0; rep < 3; ++rep)
        for (Fn f : {g, h}) {
            auto t0 = std::chrono::steady_clock::now();
            const int N = 2000000;
            for (int k = 0; k < N; ++k) { const int64_t b = (k & 7) * 256; void* p[2] = {x, buf - b}; f(p, shape, strides, nullptr, b, b + len); }
            auto t1 = std::chrono::steady_clock::now();
            printf("%s %.1f ns/call  ", f == g ? "gen" : "hand", std::chrono::duration<double, std::nano>(t1 - t0).count() / N);
        }
    printf("\n");
}
