#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using kiln::Tensor;
int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
    kiln::set_num_threads(threads);
    const std::int64_t rows = 8192, cols = 2048;
    kiln::manual_seed(13);
    const std::int64_t off = argc > 2 ? std::atoll(argv[2]) : 0;
    const Tensor big = kiln::randn({rows * cols + off});
    const Tensor x = big.slice(0, off, off + rows * cols).view({rows, cols});
    auto compiled = kiln::compile([](const Tensor& v) { return kiln::sum(v * v, {0}); });
    Tensor y = compiled(x), z = kiln::sum(x * x, {0});
    for (int i = 0; i < 5; ++i) { y = compiled(x); z = kiln::sum(x * x, {0}); }
    std::vector<double> tc, tf;
    for (int r = 0; r < 40; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        y = compiled(x);
        auto t1 = std::chrono::steady_clock::now();
        z = kiln::sum(x * x, {0});
        auto t2 = std::chrono::steady_clock::now();
        tc.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        tf.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(tc.begin(), tc.end()); std::sort(tf.begin(), tf.end());
    std::printf("off %lld threads %d: compiled min %.2f med %.2f | fused min %.2f med %.2f ms\n", (long long)off, threads, tc[0], tc[20], tf[0], tf[20]);
}
