// A float tree with an add of compares ((a > 0) + (b > 0), a logical or), against the same tree
// written with logical_or (fused loop): their times, alternating, one thread.
#include <kiln/kiln.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using kiln::Tensor;
int main() {
    kiln::set_num_threads(1);
    const Tensor a = kiln::randn({4096, 1024}), b = kiln::randn({4096, 1024}), x = kiln::randn({4096, 1024});
    Tensor y = kiln::cast((a > 0) + (b > 0), kiln::DType::f32) * x, z = kiln::cast(kiln::logical_or(a > 0, b > 0), kiln::DType::f32) * x;
    std::printf("same values: %d\n", kiln::max(kiln::abs(y - z)).item<float>() == 0.0f);
    std::vector<double> ty, tz;
    for (int r = 0; r < 30; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        y = kiln::cast((a > 0) + (b > 0), kiln::DType::f32) * x;
        auto t1 = std::chrono::steady_clock::now();
        z = kiln::cast(kiln::logical_or(a > 0, b > 0), kiln::DType::f32) * x;
        auto t2 = std::chrono::steady_clock::now();
        ty.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        tz.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(ty.begin(), ty.end()); std::sort(tz.begin(), tz.end());
    std::printf("add of compares: median %.2f ms | logical_or: median %.2f ms\n", ty[15], tz[15]);
}
