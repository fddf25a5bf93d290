#include <kiln/kiln.hpp>
#include <chrono>
#include <cstdio>
using kiln::Tensor;
template <class F> double t(F&& f) { f(); double best = 1e9; for (int r = 0; r < 7; ++r) { auto t0 = std::chrono::steady_clock::now(); f(); best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()); } return best; }
int main() {
  kiln::set_num_threads(1);
  Tensor x = kiln::randn({8192, 1024}), b = kiln::randn({1024}), y = kiln::empty({8192, 1024});
  Tensor bb = b.expand({8192, 1024}).contiguous();
  std::printf("copy-like x*1   %.2f ms\n", t([&] { y.assign(x * 1.0f); }));
  std::printf("x + b (bcast)   %.2f ms\n", t([&] { y.assign(x + b); }));
  std::printf("x + bb (contig) %.2f ms\n", t([&] { y.assign(x + bb); }));
  std::printf("gelu_tanh(x)    %.2f ms\n", t([&] { y.assign(kiln::gelu_tanh(x)); }));
  std::printf("gelu_tanh(x+b)  %.2f ms\n", t([&] { y.assign(kiln::gelu_tanh(x + b)); }));
  std::printf("gelu_tanh(x+bb) %.2f ms\n", t([&] { y.assign(kiln::gelu_tanh(x + bb)); }));
  std::printf("sigmoid(x)      %.2f ms\n", t([&] { y.assign(kiln::sigmoid(x)); }));
  std::printf("tanh(x)         %.2f ms\n", t([&] { y.assign(kiln::tanh(x)); }));
  std::printf("exp(x)          %.2f ms\n", t([&] { y.assign(kiln::exp(x)); }));
}
