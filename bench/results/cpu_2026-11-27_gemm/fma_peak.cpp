#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main() {
  __m512 acc[24]; for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(i * 1e-9f);
  __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.999999f);
  long N = 200000000;
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < N; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);

  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float r = 0; for (int i = 0; i < 24; ++i) r += _mm512_reduce_add_ps(acc[i]);
  std::printf("peak %.1f GFLOP/s (%g)\n", N * 24.0 * 32 / s / 1e9, r);
}
