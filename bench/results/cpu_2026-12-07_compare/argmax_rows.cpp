#include <kiln/kiln.hpp>
#include <chrono>
#include <algorithm>
#include <cstdio>
using kiln::Tensor;
int main() {
    const Tensor m = kiln::randn({4096, 4096});
    auto amax = kiln::compile([](const Tensor& v) { return kiln::argmax(v * 2.0, 1); });
    Tensor y = amax(m);
    kiln::cpu_codegen_wait();
    for (int t : {1, 2}) {
        kiln::set_num_threads(t);
        std::vector<double> v;
        for (int i = 0; i < 20; ++i) { auto t0 = std::chrono::steady_clock::now(); y = amax(m); v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()); }
        std::sort(v.begin(), v.end());
        std::printf("argmax(x*2, 1) 4096^2, %d thr: %.2f ms\n", t, v[10]);
    }
}
