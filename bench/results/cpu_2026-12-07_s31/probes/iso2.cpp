// The colsum prologue kernel alone: 256-float tiles of x (8192 x 2048) squared into a scratch tile,
// through the generated kernel vs an inline loop, then accumulated as reduce_cols does.
#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <cstdlib>
using GroupFn = void (*)(void* const*, const std::int64_t*, const std::int64_t*, const double*, std::int64_t, std::int64_t);
int main() {
    std::ifstream f("gen_src.txt"); std::stringstream ss; ss << f.rdbuf();
    kiln::set_cpu_codegen(kiln::CpuCodegen::sync);
    auto gen = reinterpret_cast<GroupFn>(kiln::detail::cppgen::kernel_for(ss.str()));
    if (!gen) { std::printf("no kernel\n"); return 1; }
    const std::int64_t rows = 8192, cols = 2048, n = rows * cols;
    kiln::manual_seed(13);
    const kiln::Tensor x = kiln::randn({n});
    const float* px = x.data<float>();
    alignas(4096) static double block[2 + 8192 / 256][256];
    const int gap = std::getenv("GAP") ? std::atoi(std::getenv("GAP")) : 2;
    float* const buf = reinterpret_cast<float*>(block[0]);
    float* const acc = reinterpret_cast<float*>(block[gap]);  // reduce_cols: the accumulators 2 tiles (4 KB) after the values
    std::int64_t shape[1] = {n}, strides[2] = {1, 1};
    double sc[1] = {0};
    for (int rep = 0; rep < 4; ++rep) {
        // ORDER: the loops of one round, 0 generated and 1 inline ("01" by default; the README's
        // runs also used "10" and "0011010")
        const std::string order = std::getenv("ORDER") ? std::getenv("ORDER") : "01";
        for (const char m : order) {
            const int mode = m == '0' ? 0 : 1;
            std::fill(acc, acc + cols, 0.f);
            auto t0 = std::chrono::steady_clock::now();
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t t = 0; t < cols; t += 256) {
                    const std::int64_t b = r * cols + t;
                    if (mode == 0) {
                        void* ptrs[2] = {const_cast<float*>(px), buf - b};
                        gen(ptrs, shape, strides, sc, b, b + 256);
                    } else {
                        for (int j = 0; j < 256; ++j) buf[j] = px[b + j] * px[b + j];
                    }
                    for (int j = 0; j < 256; ++j) acc[t + j] += buf[j];
                }
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            std::printf("%s %.2f ms (acc[7] %.1f)\n", mode == 0 ? "generated" : "inline   ", ms, acc[7]);
        }
    }
}
