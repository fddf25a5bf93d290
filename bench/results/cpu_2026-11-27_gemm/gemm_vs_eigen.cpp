#include "kiln/backends/cpu/gemm.hpp"
#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>
using namespace kiln::detail;
template <class F> double med(F f, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) { auto a = std::chrono::steady_clock::now(); f(); auto b = std::chrono::steady_clock::now(); t.push_back(std::chrono::duration<double>(b - a).count()); }
  std::sort(t.begin(), t.end()); return t[t.size() / 2];
}
int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  kiln::set_num_threads(threads);
  struct S { long m, n, k; bool bt; };
  for (S s : {S{64, 4096, 1024, true}, S{64, 4096, 1024, false}, S{64, 1024, 4096, true}, S{64,1024,4096,false}, S{1024, 768, 768, true}, S{1024, 3072, 768, true}, S{1024, 768, 3072, true}, S{512, 512, 512, false}, S{37, 23, 19, false}}) {
    long m = s.m, n = s.n, k = s.k;
    std::vector<float> A(m * k), Bw(n * k), C(m * n), C2(m * n);
    std::mt19937 g(1); std::normal_distribution<float> d;
    for (auto& x : A) x = d(g); for (auto& x : Bw) x = d(g);
    // B = W^T (W is n x k row-major) when bt, else B row-major k x n
    gemm::View<float> a{A.data(), k, 1}, b = s.bt ? gemm::View<float>{Bw.data(), 1, k} : gemm::View<float>{Bw.data(), n, 1};
    auto mine = [&] { gemm::batched<float>(1, m, n, k, a, 0, b, 0, C.data()); };
    using RM = Eigen::Matrix<float, -1, -1, Eigen::RowMajor>;
    Eigen::Map<RM> am(A.data(), m, k), cm(C2.data(), m, n);
    auto eig = [&] {
      if (s.bt) { Eigen::Map<RM> w(Bw.data(), n, k); cm.noalias() = am * w.transpose(); }
      else { Eigen::Map<RM> w(Bw.data(), k, n); cm.noalias() = am * w; }
    };
    double fl = 2.0 * m * n * k;
    int reps = std::max(5, int(2e10 / fl / 10));
    mine(); eig();
    double err = 0, mx = 0; for (long i = 0; i < m * n; ++i) { err = std::max(err, double(std::abs(C[i] - C2[i]))); mx = std::max(mx, double(std::abs(C2[i]))); }
    double tm = med(mine, reps), te = med(eig, reps);
    double tn = 0;

    std::printf("%5ld x %5ld x %5ld bt=%d  mine %8.1f us %6.1f GF/s   eigen %8.1f us %6.1f GF/s  ratio %.2f  err %.2e/%.1f\n", m, n, k, s.bt, tm * 1e6, fl / tm / 1e9, te * 1e6, fl / te / 1e9, te / tm, err, mx);
  }
}
