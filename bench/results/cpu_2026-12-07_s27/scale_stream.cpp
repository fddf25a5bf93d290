#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
int main(int argc, char** argv) {
  long n = 16 << 20; float* x = (float*)aligned_alloc(64, n * 4); float* y[4]; for (int k = 0; k < 4; ++k) { y[k] = (float*)aligned_alloc(64, n * 4); memset(y[k], 0, n * 4); }
  for (long i = 0; i < n; ++i) x[i] = (i % 97) * 0.01f;
  auto tm = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<double> a, b; int k = 0;
  for (int r = 0; r < 30; ++r) {
    float* o = y[k++ % 4];
    a.push_back(tm([&] { __m512 c = _mm512_set1_ps(2.f), d = _mm512_set1_ps(1.f); for (long i = 0; i < n; i += 16) _mm512_storeu_ps(o + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), c, d)); }));
    o = y[k++ % 4];
    b.push_back(tm([&] { __m512 c = _mm512_set1_ps(2.f), d = _mm512_set1_ps(1.f); for (long i = 0; i < n; i += 16) _mm512_stream_ps(o + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), c, d)); _mm_sfence(); }));
  }
  std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
  std::printf("scale 64MB->64MB: store %.3f ms  stream %.3f ms\n", a[15], b[15]);
}
