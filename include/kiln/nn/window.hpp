// The window of a convolution or pooling: kernel size, stride, padding and dilation over (H, W).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::nn {

/// The window of a convolution or pooling over (H, W).
struct Window {
    std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
    std::int64_t out_h(std::int64_t h) const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
    std::int64_t out_w(std::int64_t w) const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
    std::string str() const {
        return "k=" + std::to_string(kh) + "x" + std::to_string(kw) + ", stride=" + std::to_string(sh) + "x" + std::to_string(sw) +
               ", padding=" + std::to_string(ph) + "x" + std::to_string(pw) + ", dilation=" + std::to_string(dh) + "x" + std::to_string(dw);
    }
};

}  // namespace kiln::nn
