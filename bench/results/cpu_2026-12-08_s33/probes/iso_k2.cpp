#include <kiln/kiln.hpp>
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <immintrin.h>
#include <vector>
using Fn = void (*)(void* const*, const int64_t*, const int64_t*, const double*, int64_t, int64_t);
__attribute__((noinline)) void inl(const float* x, float* dst, int64_t n) {
    for (int64_t j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), _mm512_loadu_ps(x + j)));
}
int main(int argc, char** argv) {
    void* h = dlopen(argv[1], RTLD_NOW); Fn fn = (Fn)dlsym(h, "kiln_kernel");
    const int64_t rows = 8192, cols = 2048, N = rows * cols;
    kiln::manual_seed(13);
    const kiln::Tensor xt = kiln::randn({rows, cols});
    float* x = const_cast<float*>(xt.data<float>());
    float* blk = (float*)aligned_alloc(4096, 32768 * 4) + (argc > 3 ? atoi(argv[3]) : 0);
    float* buf = blk; float* acc = blk + 1024;  // 4 KB later
    int64_t shape[1] = {N}, strides[2] = {1, 1};
    const char* order = argc > 2 ? argv[2] : "ggggiiiiggggiiii";
    for (const char* p = order; *p; ++p) {
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 5; ++k) {
            memset(acc, 0, cols * 4);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t t = 0; t < cols; t += 256) {
                    const int64_t b = r * cols + t;
                    if (*p == 'g') { void* ptrs[2] = {x, buf - b}; fn(ptrs, shape, strides, nullptr, b, b + 256); }
                    else inl(x + b, buf, 256);
                    float* a = acc + t;
                    for (int j = 0; j < 256; j += 16) _mm512_storeu_ps(a + j, _mm512_add_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(buf + j)));
                }
        }
        auto t1 = std::chrono::steady_clock::now();
        printf("%c %.2f ", *p, std::chrono::duration<double, std::milli>(t1 - t0).count() / 5);
    }
    printf(" x%%4096=%ld buf%%4096=%ld\n", (long)((uintptr_t)x % 4096), (long)((uintptr_t)buf % 4096));
}
