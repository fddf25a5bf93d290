// Alternating probe: one compiled program per workload, run with the interpreter (off) and the
// generated kernel (sync) in turns, 1 thread; min and median of each.
#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using kiln::Tensor;
int main() {
    kiln::set_num_threads(1);
    kiln::manual_seed(0);
    Tensor x = kiln::randn({4096, 1024});
    Tensor w = kiln::randn({1024}), b = kiln::randn({1024});
    auto sm = kiln::compile([](const Tensor& x) { return kiln::softmax(x, -1); });
    auto ln = kiln::compile([&](const Tensor& x) { return kiln::layer_norm(x, 1, w, b); });
    auto bg = kiln::compile([&](const Tensor& x) { return Tensor(kiln::gelu_tanh(x + b)); });
    struct W { const char* name; std::function<Tensor()> f; };
    std::vector<W> ws = {{"softmax", [&] { return sm(x); }}, {"layernorm", [&] { return ln(x); }}, {"bias_gelu 4096x1024", [&] { return bg(x); }}};
    for (auto& wk : ws) {
        std::vector<double> t[2];
        for (int m = 0; m < 2; ++m) { kiln::set_cpu_codegen(m ? kiln::CpuCodegen::sync : kiln::CpuCodegen::off); wk.f(); }
        for (int r = 0; r < 40; ++r)
            for (int m = 0; m < 2; ++m) {
                kiln::set_cpu_codegen(m ? kiln::CpuCodegen::sync : kiln::CpuCodegen::off);
                auto t0 = std::chrono::steady_clock::now();
                Tensor y = wk.f();
                t[m].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
        for (auto& v : t) std::sort(v.begin(), v.end());
        std::printf("%-22s interpreter min %.3f med %.3f ms | generated min %.3f med %.3f ms | gen/interp (med) %.2f\n", wk.name, t[0][0], t[0][20], t[1][0], t[1][20], t[1][20] / t[0][20]);
    }
}
