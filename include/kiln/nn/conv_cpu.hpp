// conv2d and max_pool2d on the CPU over channels-last values, for inference: the convolution as
// an implicit GEMM (kiln's CPU GEMM packing its A from the input in place) and a direct max pool.
// Inline templates, included by nn/conv_impl.hpp (and by tests, which call them directly).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/backends/cpu/gemm.hpp"
#include "kiln/core/thread_pool.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/nn/window.hpp"
#include "kiln/tables/activations.hpp"

namespace kiln::nn::detail {

/// A convolution's im2col matrix read in place from its channels-last input (an implicit GEMM):
/// row r = (n, oh, ow) of the output pixels (from row0 on), column k = (i, j, c) of the window's
/// taps and channels, element x[n, oh * sh - ph + i * dh, ow * sw - pw + j * dw, c], 0 outside the
/// image. kiln's CPU GEMM packs its blocks of A from it (pack_a_block below), so the columns (KH *
/// KW * C values a row: 930 MB a ResNet-18 forward at batch 16) are never written and read back.
template <class T>
struct Im2colSource {
    const T* x = nullptr;
    std::int64_t sN = 0, sH = 0, sW = 0, sC = 1;  // x's strides
    std::int64_t H = 0, W = 0, C = 0, OH = 0, OW = 0;
    Window win;
    std::int64_t row0 = 0;
};
template <class T>
Im2colSource<T> a_offset(const Im2colSource<T>& a, std::int64_t /*elems: one matrix*/, std::int64_t rows) {
    Im2colSource<T> b = a;
    b.row0 += rows;
    return b;
}
/// Rows [i0, i0 + mc) x columns [p0, p0 + kc) of the im2col matrix in the GEMM's MR-row strips
/// (out[p * MR + r]): per strip and tap, each row's run of channels (a zero run outside the image
/// and past the last row), 8 x 8 blocks transposed in registers for float's 8-row strips.
template <class T>
void pack_a_block(const Im2colSource<T>& a, std::int64_t i0, std::int64_t p0, std::int64_t mc, std::int64_t kc, T* out) {
    constexpr std::int64_t MR = kiln::detail::gemm::Blocking<T>::MR;
    // channels and pixels along W contiguous (C = 3: a model's first convolution, made channels-last):
    // a row's taps along one kernel row are one run of memory while they stay inside the image (or
    // outside it, a zero run)
    const bool rows_run = a.sC == 1 && a.sW == a.C && a.win.dw == 1;
    thread_local std::vector<T> zero;
    if (static_cast<std::int64_t>(zero.size()) < a.C * a.win.kw) zero.assign(static_cast<std::size_t>(a.C * a.win.kw), T(0));
    const std::int64_t kend = p0 + kc, pixels = a.OH * a.OW;
    for (std::int64_t s = 0; s < mc; s += MR, out += kc * MR) {
        const T* img[MR];
        std::int64_t h0[MR], w0[MR];
        for (std::int64_t q = 0; q < MR; ++q) {
            img[q] = nullptr;
            if (s + q >= mc) continue;
            const std::int64_t r = a.row0 + i0 + s + q, n = r / pixels, oh = (r % pixels) / a.OW, ow = r % a.OW;
            img[q] = a.x + n * a.sN;
            h0[q] = oh * a.win.sh - a.win.ph;
            w0[q] = ow * a.win.sw - a.win.pw;
        }
        for (std::int64_t k = p0; k < kend;) {
            const std::int64_t tap = k / a.C, c = k - tap * a.C, i = tap / a.win.kw, j = tap - i * a.win.kw;
            std::int64_t len = std::min(rows_run ? (a.win.kw - j) * a.C - c : a.C - c, kend - k);
            const T* src[MR];
            for (std::int64_t q = 0; q < MR; ++q) {
                const std::int64_t h = img[q] ? h0[q] + i * a.win.dh : -1, w = img[q] ? w0[q] + j * a.win.dw : -1;
                const bool inside = h >= 0 && h < a.H && w >= 0 && w < a.W;
                src[q] = inside ? img[q] + h * a.sH + w * a.sW + c * a.sC : zero.data();
                // the taps ahead that stay inside (or, left of the image, outside)
                if (rows_run && inside) len = std::min(len, (a.W - w) * a.C - c);
                else if (rows_run && h >= 0 && h < a.H && w < 0) len = std::min(len, -w * a.C - c);
            }
            T* o = out + (k - p0) * MR;
            std::int64_t t = 0;
            if constexpr (std::is_same_v<T, float> && MR == 8)
                for (; a.sC == 1 && t + 8 <= len; t += 8) {
                    const float* rows[8];
                    for (int q = 0; q < 8; ++q) rows[q] = src[q] + t;
                    kiln::detail::simd::transpose8_rows(rows, o + t * 8);
                }
            std::int64_t step[MR];  // a zero run is read with stride 0
            for (std::int64_t q = 0; q < MR; ++q) step[q] = src[q] == zero.data() ? 0 : a.sC;
            for (; t < len; ++t)
                for (std::int64_t q = 0; q < MR; ++q) o[t * MR + q] = src[q][t * step[q]];
            k += len;
        }
    }
}

/// max_pool2d on the CPU of channels-last x (N, H, W, C; channels contiguous) into y (N, OH, OW,
/// C), contiguous: each output pixel's channels the running maximum of its window's positions inside
/// the image (a NaN wins and stays, as torch's; a padding position is never read), threads over
/// the output rows. Reads x once, where im2col wrote each window's copy first (ResNet-18's pool at
/// batch 16: 115 MB).
template <class T>
void max_pool_cpu(const Tensor& x, const Window& win, Tensor& y) {
    const std::int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3), OH = y.size(1), OW = y.size(2);
    const std::int64_t sN = x.stride(0), sH = x.stride(1), sW = x.stride(2);
    const T* const xp = static_cast<const T*>(x.data_ptr());
    T* const yp = static_cast<T*>(y.data_ptr());
    kiln::detail::parallel_for(N * OH, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(OW * C * win.kh * win.kw, 1)),
                               [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
            const std::int64_t n = r / OH, oh = r % OH;
            for (std::int64_t ow = 0; ow < OW; ++ow) {
                T* const o = yp + (r * OW + ow) * C;
                std::fill(o, o + C, -std::numeric_limits<T>::infinity());
                for (std::int64_t i = 0; i < win.kh; ++i) {
                    const std::int64_t h = oh * win.sh - win.ph + i * win.dh;
                    if (h < 0 || h >= H) continue;
                    for (std::int64_t j = 0; j < win.kw; ++j) {
                        const std::int64_t w = ow * win.sw - win.pw + j * win.dw;
                        if (w < 0 || w >= W) continue;
                        const T* const p = xp + n * sN + h * sH + w * sW;
                        for (std::int64_t c = 0; c < C; ++c) o[c] = p[c] > o[c] || p[c] != p[c] ? p[c] : o[c];
                    }
                }
            }
        }
    });
}

/// Whether the CPU's inference convolutions (this implicit GEMM, nn/conv_winograd.hpp) take these
/// operands: kiln's GEMM runs (AVX-512), f32 or f64 throughout, x a 4-D CPU tensor of non-negative
/// strides, the weight rows, bias and residual (of the output's shape ys) contiguous, no activation
/// or relu.
inline bool cpu_conv_operands_ok(const Tensor& x, const Tensor& wl, const Tensor& b, const Tensor& z, Act act, const Shape& ys) {
    const DType dt = x.dtype();
    return kiln::detail::gemm::enabled && (dt == DType::f32 || dt == DType::f64) && x.rank() == 4 && x.stride(3) >= 0 &&
           x.stride(0) >= 0 && x.stride(1) >= 0 && x.stride(2) >= 0 && wl.dtype() == dt && wl.is_contiguous() &&
           (!b.defined() || (b.dtype() == dt && b.is_contiguous())) &&
           (!z.defined() || (z.dtype() == dt && z.is_contiguous() && z.shape() == ys)) && (act == Act::none || act == Act::relu) &&
           !x.device().is_cuda();
}

/// conv2d of channels-last x (N, H, W, C; any strides, channels best contiguous) with the weight
/// as (OC, KH * KW * C) rows (contiguous) into a new (N, OH, OW, OC) tensor, as one product of
/// kiln's CPU GEMM whose A is packed from x in place (Im2colSource), with the bias, the residual z
/// and relu applied to each block of the result while it is in cache. Where that GEMM does not run (not AVX-512), or for
/// other dtypes, layouts or activations, returns an undefined tensor (the caller takes im2col and
/// a product).
inline Tensor conv2d_cpu_implicit(const Tensor& x_in, const Tensor& wl, const Tensor& b, const Tensor& z, const Window& win, Act act,
                                  const Shape& ys) {
    if (!cpu_conv_operands_ok(x_in, wl, b, z, act, ys)) return Tensor{};
    const DType dt = x_in.dtype();
    // channels not contiguous (an NCHW input viewed channels-last, a model's first convolution): a
    // channels-last copy, read in runs, costs less than packing it an element at a time
    const Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
    Tensor y(ys, dt);
    const std::int64_t M = ys[0] * ys[1] * ys[2], OC = ys[3];
    if (M == 0 || OC == 0) return y;
    const std::int64_t K = wl.numel() / OC;
    visit_dtype(dt, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            Im2colSource<T> src;
            src.x = static_cast<const T*>(x.data_ptr());
            src.sN = x.stride(0);
            src.sH = x.stride(1);
            src.sW = x.stride(2);
            src.sC = x.stride(3);
            src.H = x.size(1);
            src.W = x.size(2);
            src.C = x.size(3);
            src.OH = ys[1];
            src.OW = ys[2];
            src.win = win;
            // B (K x OC): element (k, o) is the weight's row o, column k
            const kiln::detail::gemm::View<T> bv{static_cast<const T*>(wl.data_ptr()), 1, K};
            T* const yp = static_cast<T*>(y.data_ptr());
            const T* const bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
            const T* const zp = z.defined() ? static_cast<const T*>(z.data_ptr()) : nullptr;
            const bool relu = act == Act::relu;
            kiln::detail::gemm::batched<T>(1, M, OC, K, src, 0, bv, 0, yp,
                                           [=](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                                               for (std::int64_t r = r0; r < r1; ++r) {
                                                   T* row = yp + r * OC;
                                                   const T* zr = zp ? zp + r * OC : nullptr;
                                                   for (std::int64_t o = c0; o < c1; ++o) {
                                                       T v = row[o];
                                                       if (bp) v += bp[o];
                                                       if (zr) v += zr[o];
                                                       if (relu) v = v > T(0) || v != v ? v : T(0);  // NaN passes, as relu's
                                                       row[o] = v;
                                                   }
                                               }
                                           });
        }
    });
    return y;
}

}  // namespace kiln::nn::detail
