#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
#include <immintrin.h>
using Fn = void (*)(void* const*, const long*, const long*, const double*, long, long);
int main(int argc, char** argv) {
    const long n = 8192L * 2048, T = atol(argv[3]);
    float* x = (float*)aligned_alloc(64, n * 4); for (long i = 0; i < n; ++i) x[i] = (i % 113) * 0.01f;
    Fn f1 = (Fn)dlsym(dlopen(argv[1], RTLD_NOW), "kiln_kernel");
    Fn f2 = (Fn)dlsym(dlopen(argv[2], RTLD_NOW), "kiln_kernel");
    alignas(64) static float buf[8192]; alignas(64) static float acc[2048] = {};
    auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    auto run = [&](Fn fn) { const long sh[1] = {n}, st[2] = {1, 1};
        for (long s = 0; s < n; s += T) { void* p[2] = {(void*)x, (void*)(buf - s)}; fn(p, sh, st, nullptr, s, s + T);
            float* a = acc + (s % 2048); for (long j = 0; j < T && j + (s % 2048) < 2048; j += 16) _mm512_store_ps(a + j, _mm512_add_ps(_mm512_load_ps(a + j), _mm512_load_ps(buf + j))); } };
    std::vector<double> a, b;
    for (int rep = 0; rep < 20; ++rep) { a.push_back(tm([&] { run(f1); })); b.push_back(tm([&] { run(f2); })); }
    std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
    std::printf("tile %ld: %s %.3f  %s %.3f ms\n", T, argv[1], a[10], argv[2], b[10]);
}
