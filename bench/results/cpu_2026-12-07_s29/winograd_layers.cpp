#include <cstdio>
#include <cmath>
#include <chrono>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
using namespace kiln;
int main() {
    struct Case { int N, H, W, C, OC, ph; };
    for (Case cs : {Case{2, 8, 8, 16, 16, 1}, Case{1, 7, 9, 20, 33, 1}, Case{3, 14, 14, 64, 64, 1}, Case{1, 5, 6, 17, 40, 0}, Case{2, 7, 7, 512, 512, 1}, Case{1, 3, 3, 16, 16, 2}}) {
        Tensor x = randn({cs.N, cs.H, cs.W, cs.C});
        Tensor w = randn({cs.OC, 3, 3, cs.C});
        Tensor b = randn({cs.OC});
        nn::Window win; win.kh = win.kw = 3; win.ph = win.pw = cs.ph;
        Shape ys{cs.N, win.out_h(cs.H), win.out_w(cs.W), cs.OC};
        Tensor z = randn(ys);
        Tensor yd = nn::detail::conv2d_cpu_implicit(x, w, b, z, win, Act::relu, ys);
        Tensor u = nn::detail::winograd_weights(w);
        Tensor yw = nn::detail::conv2d_cpu_winograd(x, u, cs.OC, b, z, win, true);
        const float* a = (const float*)yd.data_ptr(); const float* c = (const float*)yw.data_ptr();
        double md = 0, mx = 0;
        for (int64_t i = 0; i < yd.numel(); ++i) { md = std::max(md, (double)std::fabs(a[i] - c[i])); mx = std::max(mx, (double)std::fabs(a[i])); }
        std::printf("N%d H%d W%d C%d OC%d: max diff %.3g (max |y| %.3g) shapes %s %s\n", cs.N, cs.H, cs.W, cs.C, cs.OC, md, mx, yd.shape().str().c_str(), yw.shape().str().c_str());
    }
    // timing layer-like
    for (auto [H, C] : {std::pair{56, 64}, {28, 128}, {14, 256}, {7, 512}}) {
        Tensor x = randn({16, H, H, C}); Tensor w = randn({C, 3, 3, C}); Tensor b = randn({C});
        nn::Window win; win.kh = win.kw = 3; win.ph = win.pw = 1;
        Shape ys{16, H, H, C};
        Tensor u = nn::detail::winograd_weights(w);
        for (int r = 0; r < 3; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            Tensor yd = nn::detail::conv2d_cpu_implicit(x, w, b, Tensor{}, win, Act::relu, ys);
            auto t1 = std::chrono::steady_clock::now();
            Tensor yw = nn::detail::conv2d_cpu_winograd(x, u, C, b, Tensor{}, win, true);
            auto t2 = std::chrono::steady_clock::now();
            Tensor u2 = nn::detail::winograd_weights(w);
            auto t3 = std::chrono::steady_clock::now();
            std::printf("H%d C%d: direct %.2f ms  winograd %.2f ms  weights %.2f ms\n", H, C, std::chrono::duration<double, std::milli>(t1 - t0).count(), std::chrono::duration<double, std::milli>(t2 - t1).count(), std::chrono::duration<double, std::milli>(t3 - t2).count());
        }
    }
}
