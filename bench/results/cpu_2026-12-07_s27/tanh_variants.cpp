#include <kiln/tables/simd.hpp>
#include <xsimd/xsimd.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <random>
using B = xsimd::batch<float>;
namespace ks = kiln::detail::simd;
constexpr int W = B::size;
#define VAR(name, SIG, TANH, EXP) \
__attribute__((noinline)) void name(const float* x, float* y, long n) { \
  for (long i = 0; i < n; i += W) { B v = B::load_unaligned(x + i); \
    const B relu = xsimd::max(v * B(1.5f) + B(0.5f), B(0.0f)); \
    y[0]=0; (relu * (SIG) - (TANH) + (EXP)).store_unaligned(y + i); } }
#undef VAR
#define VAR(name, SIG, TANH, EXP) \
__attribute__((noinline)) void name(const float* x, float* y, long n) { \
  for (long i = 0; i < n; i += W) { B v = B::load_unaligned(x + i); \
    const B relu = xsimd::max(v * B(1.5f) + B(0.5f), B(0.0f)); \
    (relu * (SIG) - (TANH) + (EXP)).store_unaligned(y + i); } }
VAR(hand, B(1.0f) / (B(1.0f) + xsimd::exp(-v)), xsimd::tanh(v * B(0.1f)), xsimd::exp(-v * v))
VAR(ksig, ks::sigmoid(v), xsimd::tanh(v * B(0.1f)), xsimd::exp(-v * v))
VAR(ktanh, B(1.0f) / (B(1.0f) + xsimd::exp(-v)), ks::tanh(v * B(0.1f)), xsimd::exp(-v * v))
VAR(kexp, B(1.0f) / (B(1.0f) + xsimd::exp(-v)), xsimd::tanh(v * B(0.1f)), ks::exp(-v * v))
VAR(kall, ks::sigmoid(v), ks::tanh(v * B(0.1f)), ks::exp(-v * v))
int main() {
  long n = 4096; int reps = 4096*4;
  std::vector<float> x(n), y(n); std::mt19937 g(1); std::normal_distribution<float> d(0, 2); for (auto& e : x) e = d(g);
  struct V { const char* name; void (*f)(const float*, float*, long); } vs[] = {{"hand", hand}, {"ksig", ksig}, {"ktanh", ktanh}, {"kexp", kexp}, {"kall", kall}};
  for (int round = 0; round < 3; ++round) for (auto& v : vs) {
    std::vector<double> ts; for (int k = 0; k < 7; ++k) { auto t0 = std::chrono::steady_clock::now(); for (int r = 0; r < reps/8; ++r) v.f(x.data(), y.data(), n); ts.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (reps/8) / (n / W)); }
    std::sort(ts.begin(), ts.end()); std::printf("%s %.2f ns/batch  ", v.name, ts[3]); if (&v == &vs[4]) std::printf("\n"); }
}
