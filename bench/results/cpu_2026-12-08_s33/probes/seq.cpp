#include <cstdlib>
#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using kiln::Tensor;
int main(int argc, char** argv) {
    kiln::set_num_threads(1);
    const std::int64_t rows = 8192, cols = 2048;
    kiln::manual_seed(13);
    const Tensor x = kiln::randn({rows, cols});
    auto compiled = kiln::compile([](const Tensor& v) { return kiln::sum(v * v, {0}); });
    Tensor y = compiled(x), z = kiln::sum(x * x, {0});
    const char* order = argc > 1 ? argv[1] : "cccccfffffcccccfffff";
    for (const char* p = order; *p; ++p) {
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 5; ++k) { if (*p == 'c') y = compiled(x); else z = kiln::sum(x * x, {0}); }
        auto t1 = std::chrono::steady_clock::now();
        std::printf("%c %.2f\n", *p, std::chrono::duration<double, std::milli>(t1 - t0).count() / 5);
    }
}
