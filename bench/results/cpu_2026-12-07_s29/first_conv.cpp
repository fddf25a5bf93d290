#include <cstdio>
#include <chrono>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/nn/conv_cpu.hpp>
using namespace kiln;
int main() {
    Tensor x = randn({16, 3, 224, 224});
    Tensor w = randn({64, 7, 7, 3});
    Tensor b = randn({64});
    nn::Window win; win.kh = win.kw = 7; win.sh = win.sw = 2; win.ph = win.pw = 3;
    Shape ys{16, 112, 112, 64};
    Tensor xnchw_as_nhwc = x.permute({0, 2, 3, 1});
    Tensor xnhwc = xnchw_as_nhwc.contiguous();
    for (int r = 0; r < 4; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        Tensor y1 = nn::detail::conv2d_cpu_implicit(xnchw_as_nhwc, w, b, Tensor{}, win, Act::relu, ys);
        auto t1 = std::chrono::steady_clock::now();
        Tensor y2 = nn::detail::conv2d_cpu_implicit(xnhwc, w, b, Tensor{}, win, Act::relu, ys);
        auto t2 = std::chrono::steady_clock::now();
        Tensor xc = xnchw_as_nhwc.contiguous();
        auto t3 = std::chrono::steady_clock::now();
        std::printf("nchw-view %.2f ms  nhwc %.2f ms  copy %.2f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), std::chrono::duration<double, std::milli>(t2 - t1).count(), std::chrono::duration<double, std::milli>(t3 - t2).count());
    }
}
