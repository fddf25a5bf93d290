// conv2d on the CPU by Winograd's minimal filtering, F(2x2, 3x3) (Lavin and Gray, 2015), for 3x3
// stride-1 f32 convolutions of inference: each 2x2 block of outputs is 16 products per channel
// pair instead of 36, so the convolution's multiply-adds drop 2.25x. Included by nn/conv_impl.hpp
// (and by tests).
//
// Per 4x4 input tile d and 3x3 filter g: U = G g G^T, V = B^T d B, the output Y = A^T (U * V) A.
// The sum over input channels of U * V is, for each of the 16 positions e of the 4x4 grid, one
// product (tiles x C) @ (C x OC), run on kiln's CPU GEMM: V_e is packed from the channels-last input
// in place (its A source below, four loads and three adds an element), U_e is the weight transformed
// and packed once (cached while the weight's storage and version stay the same, so a compiled
// program transforms its constant weights on the first call only). Blocks of tiles keep the 16
// products' results in cache for the output transform, where the bias, the residual and relu are
// applied.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backends/cpu/gemm.hpp"
#include "kiln/core/thread_pool.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/nn/window.hpp"

namespace kiln::nn::detail {

/// Whether CPU inference convolutions may take Winograd's F(2x2, 3x3): yes, unless
/// KILN_CPU_WINOGRAD=0 (its results differ from the direct product's by a few units in the last
/// place; set it for the direct product's results).
inline bool winograd_on() {
    static const bool on = [] {
        const char* v = std::getenv("KILN_CPU_WINOGRAD");
        return !(v && std::string(v) == "0");
    }();
    return on;
}

/// Whether conv2d of channels-last x with this window can run as F(2x2, 3x3) on this CPU: f32, 3x3,
/// stride 1, no dilation, channels contiguous, and at least 16 input and output channels (fewer
/// leave the transforms a large share of the work; the threshold is a guess, not measured).
inline bool winograd_applies(const Tensor& x, std::int64_t OC, const Window& win) {
    return kiln::detail::gemm::enabled && x.dtype() == DType::f32 && win.kh == 3 && win.kw == 3 && win.sh == 1 && win.sw == 1 &&
           win.dh == 1 && win.dw == 1 && x.rank() == 4 && x.stride(3) == 1 && x.size(3) >= 16 && OC >= 16;
}

// Rows i of B^T are d[p] + s * d[q]: (p, q, s) = (0, 2, -1), (1, 2, +1), (2, 1, -1), (1, 3, -1).
inline constexpr int wino_p[4] = {0, 1, 2, 1}, wino_q[4] = {2, 2, 1, 3};
inline constexpr float wino_s[4] = {-1.f, 1.f, -1.f, -1.f};

/// Position e = 4 * i + j of V = B^T d B over the channels-last input, as the GEMM's A: row r a tile
/// (n, ty, tx) of the output's 2x2 blocks (from row0 on), column c a channel.
struct WinogradSource {
    const float* x = nullptr;
    std::int64_t sN = 0, sH = 0, sW = 0;  // x's strides (channels contiguous)
    std::int64_t H = 0, W = 0, C = 0, TH = 0, TW = 0, ph = 0, pw = 0;
    int i = 0, j = 0;
    std::int64_t row0 = 0;
};
inline WinogradSource a_offset(const WinogradSource& a, std::int64_t /*elems: one matrix*/, std::int64_t rows) {
    WinogradSource b = a;
    b.row0 += rows;
    return b;
}
/// Rows [i0, i0 + mc) x channels [p0, p0 + kc) of V_e in the GEMM's MR-row strips: per tile, the
/// four input rows' channel runs combined (a zero run outside the image), 8 x 8 transposed.
inline void pack_a_block(const WinogradSource& a, std::int64_t i0, std::int64_t p0, std::int64_t mc, std::int64_t kc, float* out) {
    using V = kiln::detail::simd::Batch<float>;
    constexpr std::int64_t MR = kiln::detail::gemm::Blocking<float>::MR, L = static_cast<std::int64_t>(V::size);
    thread_local std::vector<float> zero, comb;
    if (static_cast<std::int64_t>(zero.size()) < a.C) zero.assign(static_cast<std::size_t>(a.C), 0.f);
    const std::int64_t kpad = (kc + 7) / 8 * 8;
    if (static_cast<std::int64_t>(comb.size()) < MR * kpad) comb.assign(static_cast<std::size_t>(MR * kpad), 0.f);
    const std::int64_t per_image = a.TH * a.TW;
    const float si = wino_s[a.i], sj = wino_s[a.j];
    for (std::int64_t s = 0; s < mc; s += MR, out += kc * MR) {
        for (std::int64_t q = 0; q < MR; ++q) {
            float* const o = comb.data() + q * kpad;
            if (s + q >= mc) {  // past the last tile: a zero row
                std::fill(o, o + kc, 0.f);
                continue;
            }
            const std::int64_t r = a.row0 + i0 + s + q, n = r / per_image, ty = (r % per_image) / a.TW, tx = r % a.TW;
            const std::int64_t h[2] = {2 * ty - a.ph + wino_p[a.i], 2 * ty - a.ph + wino_q[a.i]};
            const std::int64_t w[2] = {2 * tx - a.pw + wino_p[a.j], 2 * tx - a.pw + wino_q[a.j]};
            const float* src[2][2];
            for (int u = 0; u < 2; ++u)
                for (int v = 0; v < 2; ++v)
                    src[u][v] = h[u] >= 0 && h[u] < a.H && w[v] >= 0 && w[v] < a.W ? a.x + n * a.sN + h[u] * a.sH + w[v] * a.sW + p0
                                                                                  : zero.data();
            std::int64_t t = 0;
            const V vsi(si), vsj(sj);
            for (; t + L <= kc; t += L) {
                const V r0 = V::load_unaligned(src[0][0] + t) + vsj * V::load_unaligned(src[0][1] + t);
                const V r1 = V::load_unaligned(src[1][0] + t) + vsj * V::load_unaligned(src[1][1] + t);
                (r0 + vsi * r1).store_unaligned(o + t);
            }
            for (; t < kc; ++t) o[t] = (src[0][0][t] + sj * src[0][1][t]) + si * (src[1][0][t] + sj * src[1][1][t]);
        }
        std::int64_t t = 0;
        if constexpr (MR == 8)  // (Winograd runs where gemm::enabled: AVX-512, MR 8)
            for (; t + 8 <= kc; t += 8) {
                const float* rows[8];
                for (std::int64_t q = 0; q < 8; ++q) rows[q] = comb.data() + q * kpad + t;
                kiln::detail::simd::transpose8_rows(rows, out + t * MR);
            }
        for (; t < kc; ++t)
            for (std::int64_t q = 0; q < MR; ++q) out[t * MR + q] = comb[static_cast<std::size_t>(q * kpad + t)];
    }
}

/// The weight (OC, 3, 3, C) (contiguous rows) transformed, U_e = (G g G^T)_e, and packed as the 16
/// products' B (C x OC each, in gemm::pack_b_whole's layout), one after another: the weight is
/// transposed to (3, 3, C, OC) rows in 16 x 16 blocks, then each channel's 16 transforms are computed
/// 16 output channels at a time and stored where the packed strips hold them.
inline Tensor winograd_weights(const Tensor& wl) {
    namespace gm = kiln::detail::gemm;
    using V = kiln::detail::simd::Batch<float>;
    constexpr std::int64_t L = static_cast<std::int64_t>(V::size), NR = gm::Blocking<float>::NR, KC = gm::Blocking<float>::KC;
    static_assert(NR % L == 0);
    const std::int64_t OC = wl.size(0), C = wl.numel() / (9 * OC), K = 9 * C;
    const std::int64_t each = gm::packed_b_size<float>(C, OC), npad = gm::packed_b_size<float>(1, OC);
    Tensor packed = OC % NR ? zeros({16 * each}, DType::f32) : Tensor({16 * each}, DType::f32);  // padded strips hold zeros
    Tensor gt({K, OC}, DType::f32);
    const float* const g = static_cast<const float*>(wl.data_ptr());
    float* const gtp = static_cast<float*>(gt.data_ptr());
    kiln::detail::parallel_for((K + 15) / 16, 4, [&](std::int64_t k0, std::int64_t k1) {
        for (std::int64_t kb = k0 * 16; kb < std::min(K, k1 * 16); kb += 16) {
            std::int64_t o = 0;
            if (kb + 16 <= K)
                for (; o + 16 <= OC; o += 16) kiln::detail::simd::transpose16(g + o * K + kb, K, gtp + kb * OC + o, OC);
            for (std::int64_t k = kb; k < std::min(K, kb + 16); ++k)
                for (std::int64_t q = o; q < OC; ++q) gtp[k * OC + q] = g[q * K + k];
        }
    });
    float* const pp = static_cast<float*>(packed.data_ptr());
    kiln::detail::parallel_for(C, 4, [&](std::int64_t c0, std::int64_t c1) {
        for (std::int64_t c = c0; c < c1; ++c) {
            const std::int64_t pc = c / KC * KC, kc = std::min(KC, C - pc);
            const float* k[3][3];
            for (int a = 0; a < 3; ++a)
                for (int b = 0; b < 3; ++b) k[a][b] = gtp + ((a * 3 + b) * C + c) * OC;
            // where U_e's element (c, o) goes: strip o / NR of slice pc, row c - pc, lane o % NR
            auto at = [&](int e, std::int64_t o) { return pp + e * each + pc * npad + o / NR * NR * kc + (c - pc) * NR + o % NR; };
            auto transform = [&](auto vtag, std::int64_t o) {
                using T = decltype(vtag);
                auto ld = [&](int a, int b) {
                    if constexpr (std::is_same_v<T, V>) return V::load_unaligned(k[a][b] + o);
                    else return k[a][b][o];
                };
                const T half(0.5f);
                T t[4][3];  // G g
                for (int b = 0; b < 3; ++b) {
                    const T k0 = ld(0, b), k1 = ld(1, b), k2 = ld(2, b);
                    t[0][b] = k0;
                    t[1][b] = half * (k0 + k1 + k2);
                    t[2][b] = half * (k0 - k1 + k2);
                    t[3][b] = k2;
                }
                for (int i = 0; i < 4; ++i) {  // (G g) G^T
                    const T e[4] = {t[i][0], half * (t[i][0] + t[i][1] + t[i][2]), half * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
                    for (int j = 0; j < 4; ++j) {
                        if constexpr (std::is_same_v<T, V>) e[j].store_unaligned(at(4 * i + j, o));
                        else *at(4 * i + j, o) = e[j];
                    }
                }
            };
            std::int64_t o = 0;
            for (; o + L <= OC; o += L) transform(V(0.f), o);
            for (; o < OC; ++o) transform(0.f, o);
        }
    });
    return packed;
}

/// One conv2d op's transformed weight, kept while the weight tensor it came from is the same memory
/// (storage serial, offset, shape, strides) and unwritten (storage version).
class WinogradCache {
public:
    Tensor get(const Tensor& w, const Tensor& wl) {
        const auto& st = w.storage();
        Key key{st ? st->serial() : ~std::uint64_t{0}, st ? st->version() : 0u, w.offset(), w.shape(), w.strides()};
        std::lock_guard<std::mutex> lock(mu_);
        if (!packed_.defined() || !st || !(key == key_)) {
            packed_ = winograd_weights(wl);
            key_ = std::move(key);
        }
        return packed_;
    }

private:
    struct Key {
        std::uint64_t serial = 0;
        std::uint32_t version = 0;
        std::int64_t offset = 0;
        Shape shape;
        Strides strides;
        bool operator==(const Key& o) const {
            return serial == o.serial && version == o.version && offset == o.offset && shape == o.shape && strides == o.strides;
        }
    };
    std::mutex mu_;
    Key key_;
    Tensor packed_;
};

/// conv2d as F(2x2, 3x3) of channels-last f32 x (N, H, W, C; channels contiguous) with the packed,
/// transformed weight `u` (winograd_weights) of OC outputs, into a new (N, OH, OW, OC) tensor, with
/// the bias b, the residual z (N, OH, OW, OC, contiguous) and relu (`relu`) applied. The caller
/// checks winograd_applies.
inline Tensor conv2d_cpu_winograd(const Tensor& x, const Tensor& u, std::int64_t OC, const Tensor& b, const Tensor& z, const Window& win,
                                  bool relu) {
    namespace gm = kiln::detail::gemm;
    using V = kiln::detail::simd::Batch<float>;
    constexpr std::int64_t L = static_cast<std::int64_t>(V::size), MR = gm::Blocking<float>::MR;
    const std::int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    const std::int64_t OH = win.out_h(H), OW = win.out_w(W);
    Tensor y({N, OH, OW, OC}, DType::f32);
    if (N == 0 || OH <= 0 || OW <= 0 || OC == 0) return y;
    WinogradSource src;
    src.x = static_cast<const float*>(x.data_ptr());
    src.sN = x.stride(0);
    src.sH = x.stride(1);
    src.sW = x.stride(2);
    src.H = H;
    src.W = W;
    src.C = C;
    src.TH = (OH + 1) / 2;
    src.TW = (OW + 1) / 2;
    src.ph = win.ph;
    src.pw = win.pw;
    const std::int64_t tiles = N * src.TH * src.TW, each = gm::packed_b_size<float>(C, OC),
                       npad = gm::packed_b_size<float>(1, OC);
    // blocks of about 128 tiles (the 16 products' results, 16 x 128 x OC floats, stay in L2/L3 for
    // the output transform), as many as a multiple of the threads so none waits at the end
    const std::int64_t threads = kiln::num_threads();
    std::int64_t blocks = std::max<std::int64_t>(1, (tiles + 127) / 128);
    blocks = (blocks + threads - 1) / threads * threads;
    const std::int64_t per = ((tiles + blocks - 1) / blocks + MR - 1) / MR * MR;
    blocks = (tiles + per - 1) / per;
    const float* const up = static_cast<const float*>(u.data_ptr());
    const float* const bp = b.defined() ? static_cast<const float*>(b.data_ptr()) : nullptr;
    const float* const zp = z.defined() ? static_cast<const float*>(z.data_ptr()) : nullptr;
    float* const yp = static_cast<float*>(y.data_ptr());
    const std::int64_t per_image = src.TH * src.TW;
    kiln::detail::parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
        thread_local gm::Scratch<float> m_buf;
        for (std::int64_t blk = b0; blk < b1; ++blk) {
            const std::int64_t t0 = blk * per, nt = std::min(per, tiles - t0);
            float* const m = m_buf.get(static_cast<std::size_t>(16 * per * OC));
            for (int e = 0; e < 16; ++e) {
                WinogradSource a = src;
                a.i = e / 4;
                a.j = e % 4;
                a.row0 = t0;
                gm::gemm_serial<float>(nt, OC, C, a, gm::PackedB<float>{up + e * each, npad}, m + e * per * OC, OC);
            }
            // Y = A^T M A per tile, A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]; then bias, residual, relu
            for (std::int64_t t = 0; t < nt; ++t) {
                const std::int64_t r = t0 + t, n = r / per_image, oy = 2 * ((r % per_image) / src.TW), ox = 2 * (r % src.TW);
                const float* const mt = m + t * OC;
                auto tile = [&](auto vtag, std::int64_t o) {  // outputs o.. (a vector of them, or one)
                    using T = decltype(vtag);
                    auto ld = [](const float* p) {
                        if constexpr (std::is_same_v<T, V>) return V::load_unaligned(p);
                        else return *p;
                    };
                    T col[4][2];  // M A, row by row
                    for (int i = 0; i < 4; ++i) {
                        const T m0 = ld(mt + (4 * i) * per * OC + o), m1 = ld(mt + (4 * i + 1) * per * OC + o),
                                m2 = ld(mt + (4 * i + 2) * per * OC + o), m3 = ld(mt + (4 * i + 3) * per * OC + o);
                        col[i][0] = m0 + m1 + m2;
                        col[i][1] = m1 - m2 - m3;
                    }
                    const T bias = bp ? ld(bp + o) : T(0.f);
                    for (int du = 0; du < 2; ++du)
                        for (int dv = 0; dv < 2; ++dv) {
                            if (oy + du >= OH || ox + dv >= OW) continue;
                            T v = (du == 0 ? col[0][dv] + col[1][dv] + col[2][dv] : col[1][dv] - col[2][dv] - col[3][dv]) + bias;
                            const std::int64_t at = ((n * OH + oy + du) * OW + ox + dv) * OC + o;
                            if (zp) v = v + ld(zp + at);
                            if (relu) v = kiln::detail::simd::impl::max_keep_nan(T(0.f), v);  // NaN passes, as relu's
                            if constexpr (std::is_same_v<T, V>) v.store_unaligned(yp + at);
                            else yp[at] = v;
                        }
                };
                std::int64_t o = 0;
                for (; o + L <= OC; o += L) tile(V(0.f), o);
                for (; o < OC; ++o) tile(0.f, o);
            }
        }
    });
    return y;
}

}  // namespace kiln::nn::detail
