#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include "/work/main/bench/hand_cpu.hpp"
using kiln::Tensor;
int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
    kiln::set_num_threads(threads);
    const std::int64_t rows = 8192, cols = 1024;
    kiln::manual_seed(2);
    const Tensor x = kiln::randn({rows, cols}), bias = kiln::randn({cols});
    auto compiled = kiln::compile([&](const Tensor& v) { return Tensor(kiln::gelu_tanh(v + bias)); });
    Tensor y = compiled(x);
    kiln::cpu_codegen_wait();
    for (int i = 0; i < 5; ++i) y = compiled(x);
    std::vector<double> tc, te;
    Tensor h;
    for (int r = 0; r < 60; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        y = compiled(x);
        auto t1 = std::chrono::steady_clock::now();
        const Tensor o = kiln::empty({rows, cols});
        kiln::detail::parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
            kiln_bench_hand::bias_gelu_rows_eigen(x.data<float>(), bias.data<float>(), o.data<float>(), cols, r0, r1);
        });
        h = o;
        auto t2 = std::chrono::steady_clock::now();
        tc.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        te.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(tc.begin(), tc.end()); std::sort(te.begin(), te.end());
    std::printf("threads %d: compiled min %.2f med %.2f | eigen rows min %.2f med %.2f ms\n", threads, tc[0], tc[30], te[0], te[30]);
}
