#include <initializer_list>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
float poly(float x) {
  float s = x * x;
  float p = std::fma(-5.70498872745E-3f, s, 2.06390887954E-2f);
  p = std::fma(p, s, -5.37397155531E-2f);
  p = std::fma(p, s, 1.33314422036E-1f);
  p = std::fma(p, s, -3.33332819422E-1f);
  return std::fma(p * s, x, x);
}
long double ulp(long double r) { int e; std::frexp(std::fabs(r), &e); return std::ldexp(1.0L, e - 24); }
int main() {
  for (float lim : {0.5f, 0.55f, 0.625f}) {
  double worst = 0; float wx = 0;
  for (uint32_t u = 0x30000000u; ; ++u) { float x; std::memcpy(&x, &u, 4); if (x >= lim) break;
    long double r = std::tanh((long double)x); double e = (double)(std::fabs((long double)poly(x) - r) / ulp(r)); if (e > worst) { worst = e; wx = x; } }
  std::printf("lim %.3f max ulp %.3f at %g\n", lim, worst, wx); }
}
