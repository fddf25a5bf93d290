#include <chrono>
#include <cstdio>
#include <vector>
#include <immintrin.h>
#include <kiln/backends/cpu/gemm.hpp>
using namespace kiln::detail::gemm;
static inline void t8(const float* src, long ls, float* dst) {  // dst[j*8+i] = src[i*ls+j], 8x8
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ls), r2 = _mm256_loadu_ps(src + 2 * ls), r3 = _mm256_loadu_ps(src + 3 * ls);
    __m256 r4 = _mm256_loadu_ps(src + 4 * ls), r5 = _mm256_loadu_ps(src + 5 * ls), r6 = _mm256_loadu_ps(src + 6 * ls), r7 = _mm256_loadu_ps(src + 7 * ls);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5), t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE), s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE), s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst + 0, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 16, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 24, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 32, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 40, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 48, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 56, _mm256_permute2f128_ps(s3, s7, 0x31));
}
void pack8(View<float> v, long count, long kc, float* out) {
    for (long s = 0; s < count; s += 8, out += kc * 8) {
        const float* src = &v.at(s, 0);
        long p = 0;
        for (; p + 8 <= kc; p += 8) t8(src + p, v.rs, out + p * 8);
        for (; p < kc; ++p) for (int r = 0; r < 8; ++r) out[p * 8 + r] = src[r * v.rs + p];
    }
}
int main() {
    const long M = 50176, K = 576, MC = 384, KC = 576;
    std::vector<float> a(M * K), o(MC * KC), o2(MC * KC);
    for (long i = 0; i < M * K; ++i) a[i] = float(i % 1000);
    for (int rep = 0; rep < 3; ++rep) {
        for (int mode = 0; mode < 2; ++mode) {
            auto t0 = std::chrono::steady_clock::now();
            for (long ic = 0; ic < M; ic += MC) {
                View<float> v{a.data() + ic * K, K, 1};
                if (mode == 0) pack_strips<float, 8>(v, MC, KC, o.data()); else pack8(v, MC, KC, o2.data());
            }
            double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            std::printf("mode %d: %.2f ms (%.1f GB/s read)\n", mode, ms, M * K * 4 / ms / 1e6);
        }
    }
    for (long i = 0; i < MC * KC; ++i) if (o[i] != o2[i]) { std::printf("mismatch at %ld\n", i); return 1; }
    std::printf("same\n");
}
