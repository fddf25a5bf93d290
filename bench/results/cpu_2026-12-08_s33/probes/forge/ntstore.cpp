#include <immintrin.h>
#include <cstdint>
// x * x into the caller's tile, then a full fence before returning (do pending stores matter?)
extern "C" void kiln_kernel(void* const* ptr, const int64_t*, const int64_t*, const double*, int64_t begin, int64_t end) {
    const float* a0 = static_cast<const float*>(ptr[0]) + begin;
    float* a1 = static_cast<float*>(ptr[1]) + begin;
    const int64_t n = end - begin;
    for (int64_t j = 0; j + 16 <= n; j += 16) { __m512 v = _mm512_loadu_ps(a0 + j); _mm512_storeu_ps(a1 + j, _mm512_mul_ps(v, v)); }
    _mm_sfence();
}
