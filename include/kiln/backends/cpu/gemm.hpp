// kiln's CPU GEMM for f32 and f64: C = A @ B with any element strides on A and B (transposed and
// broadcast views are packing orders, never copies) and a row-major C. The BLIS/GotoBLAS scheme:
// A is packed in MC x KC blocks of MR-tall strips, B in KC x NR strips, and an MR x NR register
// tile of FMAs sums each pair of strips. Every element of C sums its K terms in
// the same order whatever the thread count or the split, so results do not depend on threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "kiln/core/thread_pool.hpp"
#include "kiln/tables/simd.hpp"

namespace kiln::detail::gemm {

/// Whether kiln's CPU products use this GEMM: on AVX-512 targets, where it runs 1.2-1.5x faster
/// than Eigen's (whose AVX-512 kernels ran a Zen 5 core at 36-83 GFLOP/s of its 115). On AVX2 and
/// SSE targets Eigen's GEMM is as fast or faster (measured on the same core built for AVX2: 70-105
/// GFLOP/s, this one 49-95), so Eigen's stays (backends/cpu/matmul_impl.hpp).
inline constexpr bool enabled = XSIMD_WITH_AVX512F;

/// Register and cache blocking for element type T on the target's SIMD width: the MR x NR tile
/// holds MR * NR / W accumulators, plus NR / W loads of B and one broadcast of A, in the 32 vector
/// registers of AVX-512 (MR 8, which divides the usual batch and sequence sizes) or the 16 of AVX2
/// and SSE (MR 6). Each KC x NR strip of packed B (128 KB of f32 on AVX-512) is read from L2 by
/// MC / MR tiles, each of which reads its MR x KC strip of A (32 KB) from L1. (Measured on a Zen 5
/// core: KC = 1024 f32 runs large products at 95-100 GFLOP/s of its 115, KC = 256 at 85.)
template <class T>
struct Blocking {
    static constexpr std::int64_t W = static_cast<std::int64_t>(simd::width<T>);
    static constexpr std::int64_t NR = 2 * W;
#if XSIMD_WITH_AVX512F
    static constexpr std::int64_t MR = 8;
#else
    static constexpr std::int64_t MR = 6;
#endif
    static constexpr std::int64_t KC = 4096 / static_cast<std::int64_t>(sizeof(T));
    static constexpr std::int64_t MC = MR * 48;
};

/// A strided matrix operand: element (i, j) is at p[i * rs + j * cs].
template <class T>
struct View {
    const T* p;
    std::int64_t rs, cs;
    const T& at(std::int64_t i, std::int64_t j) const { return p[i * rs + j * cs]; }
};

/// Packs lines [0, count) of v, kc terms each (line i, term p: v.at(i, p)), into R-line strips,
/// each term-major (out[p * R + r] is term p of line s + r), the last strip padded with zeros. A's
/// strips are its rows; B's are its columns (v = B viewed transposed).
template <class T, std::int64_t R>
void pack_strips(View<T> v, std::int64_t count, std::int64_t kc, T* out) {
    for (std::int64_t s = 0; s < count; s += R, out += kc * R) {
        const std::int64_t lines = std::min(R, count - s);
        if (lines < R) std::fill(out, out + kc * R, T(0));
        if (v.rs == 1) {  // each term's lines are contiguous (a row-major B)
            for (std::int64_t p = 0; p < kc; ++p) std::copy_n(&v.at(s, p), lines, out + p * R);
            continue;
        }
        std::int64_t r = 0;
        if constexpr (std::is_same_v<T, float> && R % 16 == 0) {
            if (v.cs == 1) {  // contiguous lines (x @ W^T's W): 16 x 16 blocks transposed in registers
                const std::int64_t kv = kc / 16 * 16;
                for (; r + 16 <= lines; r += 16) {
                    const T* src = &v.at(s + r, 0);
                    for (std::int64_t p = 0; p < kv; p += 16) simd::transpose16(src + p, v.rs, out + p * R + r, R);
                    for (std::int64_t i = 0; i < 16; ++i)
                        for (std::int64_t p = kv; p < kc; ++p) out[p * R + r + i] = src[i * v.rs + p];
                }
            }
        }
        for (; r < lines; ++r) {  // one line at a time, along its terms
            const T* src = &v.at(s + r, 0);
            for (std::int64_t p = 0; p < kc; ++p) out[p * R + r] = src[p * v.cs];
        }
    }
}

/// Rows [0, mc) x columns [0, kc) of a, in MR-row strips.
template <class T>
void pack_a(View<T> a, std::int64_t mc, std::int64_t kc, T* out) {
    pack_strips<T, Blocking<T>::MR>(a, mc, kc, out);
}

// A's source: a strided matrix (View), or any type with the same two functions found by argument-
// dependent lookup (nn/conv_impl.hpp's implicit im2col reads a convolution's input in place):
// `pack_a_block(a, i0, p0, mc, kc, out)` packs rows [i0, i0 + mc) x columns [p0, p0 + kc) in
// MR-row strips as pack_a does, and `a_offset(a, elems, rows)` is the source moved by `elems`
// elements (a batch) and `rows` rows.
template <class T>
void pack_a_block(const View<T>& a, std::int64_t i0, std::int64_t p0, std::int64_t mc, std::int64_t kc, T* out) {
    pack_a(View<T>{&a.at(i0, p0), a.rs, a.cs}, mc, kc, out);
}
template <class T>
View<T> a_offset(const View<T>& a, std::int64_t elems, std::int64_t rows) {
    return View<T>{a.p + elems + rows * a.rs, a.rs, a.cs};
}

/// Rows [0, kc) x columns [0, nc) of b, in NR-column strips.
template <class T>
void pack_b(View<T> b, std::int64_t kc, std::int64_t nc, T* out) {
    pack_strips<T, Blocking<T>::NR>(View<T>{b.p, b.cs, b.rs}, nc, kc, out);
}

/// B packed whole ahead of time (a weight used by many products): for each KC-deep slice, its
/// NR-column strips as pack_b writes them (the last padded with zeros), one slice after another; the
/// strip at (pc, jr) starts at p + pc * npad + jr * kc, npad being n rounded up to NR.
template <class T>
struct PackedB {
    const T* p;
    std::int64_t npad;
};
/// Elements pack_b_whole writes for a k x n B.
template <class T>
std::int64_t packed_b_size(std::int64_t k, std::int64_t n) {
    return k * ((n + Blocking<T>::NR - 1) / Blocking<T>::NR * Blocking<T>::NR);
}
template <class T>
void pack_b_whole(View<T> b, std::int64_t k, std::int64_t n, T* out) {
    const std::int64_t npad = packed_b_size<T>(1, n);
    for (std::int64_t pc = 0; pc < k; pc += Blocking<T>::KC) {
        const std::int64_t kc = std::min(Blocking<T>::KC, k - pc);
        for (std::int64_t jr = 0; jr < n; jr += Blocking<T>::NR)
            pack_b(View<T>{&b.at(pc, jr), b.rs, b.cs}, kc, std::min(Blocking<T>::NR, n - jr), out + pc * npad + jr * kc);
    }
}

// B's source: a strided matrix (View), packed strip by strip into `buf` as the tiles need it, or a
// PackedB, read in place. `b_strip(b, pc, kc, jr, nr, buf)` is the KC-deep slice pc's strip at
// column jr (nr columns of it real).
template <class T>
const T* b_strip(const View<T>& b, std::int64_t pc, std::int64_t kc, std::int64_t jr, std::int64_t nr, T* buf) {
    pack_b(View<T>{&b.at(pc, jr), b.rs, b.cs}, kc, nr, buf);
    return buf;
}
template <class T>
const T* b_strip(const PackedB<T>& b, std::int64_t pc, std::int64_t kc, std::int64_t jr, std::int64_t /*nr*/, T* /*buf*/) {
    return b.p + pc * b.npad + jr * kc;
}

/// The register tile: c[0:MR, 0:NR] (row stride ldc) = (or +=, with accumulate) a_strip @ b_strip
/// over kc terms.
template <class T>
[[gnu::always_inline]] inline void micro_tile(std::int64_t kc, const T* __restrict a, const T* __restrict b, T* c, std::int64_t ldc,
                                              bool accumulate) {
    using B = simd::Batch<T>;
    constexpr std::int64_t MR = Blocking<T>::MR, NR = Blocking<T>::NR, W = Blocking<T>::W, NV = NR / W;
    B acc[MR][NV];
#pragma GCC unroll 16
    for (std::int64_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (std::int64_t j = 0; j < NV; ++j) acc[i][j] = B(T(0));
    for (std::int64_t p = 0; p < kc; ++p, a += MR, b += NR) {
        B bv[NV];
#pragma GCC unroll 4
        for (std::int64_t j = 0; j < NV; ++j) bv[j] = B::load_aligned(b + j * W);
#pragma GCC unroll 16
        for (std::int64_t i = 0; i < MR; ++i) {
            const B av(a[i]);
#pragma GCC unroll 4
            for (std::int64_t j = 0; j < NV; ++j) acc[i][j] = simd::impl::fmadd(av, bv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 16
    for (std::int64_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (std::int64_t j = 0; j < NV; ++j) {
            T* cp = c + i * ldc + j * W;
            (accumulate ? acc[i][j] + B::load_unaligned(cp) : acc[i][j]).store_unaligned(cp);
        }
}

/// A 64-byte-aligned scratch buffer, kept per thread and grown on demand.
template <class T>
class Scratch {
public:
    T* get(std::size_t n) {
        if (n > size_) {
            release();
            p_ = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
            size_ = n;
        }
        return p_;
    }
    ~Scratch() { release(); }

private:
    void release() {
        if (p_) ::operator delete(p_, std::align_val_t{64});
        p_ = nullptr;
        size_ = 0;
    }
    T* p_ = nullptr;
    std::size_t size_ = 0;
};

/// The tiles of one (MC x KC block of packed A) x (KC x nc slice of B) product: for each NR-wide
/// strip of B (packed by `strip_b(jr)`, which returns it), every MR-tall strip of A.
template <class T, class StripB>
[[gnu::always_inline]] inline void block_product(std::int64_t mc, std::int64_t nc, std::int64_t kc, const T* ap, StripB&& strip_b, T* c,
                                                 std::int64_t ldc, bool accumulate) {
    using Bk = Blocking<T>;
    constexpr std::int64_t MR = Bk::MR, NR = Bk::NR;
    alignas(64) T edge[MR * NR];
    for (std::int64_t jr = 0; jr < nc; jr += NR) {
        const std::int64_t nr = std::min(NR, nc - jr);
        const T* bs = strip_b(jr);
        for (std::int64_t ir = 0; ir < mc; ir += MR) {
            const std::int64_t mr = std::min(MR, mc - ir);
            const T* as = ap + ir * kc;
            T* cp = c + ir * ldc + jr;
            if (mr == MR && nr == NR) {
                micro_tile(kc, as, bs, cp, ldc, accumulate);
            } else {  // a partial tile: computed whole into `edge`, its valid part written
                micro_tile(kc, as, bs, edge, NR, false);
                for (std::int64_t i = 0; i < mr; ++i)
                    for (std::int64_t j = 0; j < nr; ++j)
                        cp[i * ldc + j] = accumulate ? cp[i * ldc + j] + edge[i * NR + j] : edge[i * NR + j];
            }
        }
    }
}

/// C[0:m, 0:n] (row-major, row stride ldc) = A[0:m, 0:k] @ B[0:k, 0:n] on the calling thread.
/// For each KC-deep slice, each MC x KC block of A is packed (to stay in L2), then each KC x NR strip
/// of B is packed just before the block's tiles use it, so it is still in cache. B is packed once
/// per block of A (measured on a Zen 5 core: about 30% of a 64-row product's time, mostly reading
/// the weight from memory, and 8% of a 1024-row one's; the tiles alone run at 97% of the FMA peak).
/// `done(i0, i1)`, if given, is called once rows [i0, i1) of this C are final (after the last KC
/// slice of their block of A), while they are still in cache: matmul epilogues run there.
template <class T, class A, class B = View<T>, class Done = std::nullptr_t>
void gemm_serial(std::int64_t m, std::int64_t n, std::int64_t k, const A& a, const B& b, T* c, std::int64_t ldc, const Done& done = nullptr) {
    using Bk = Blocking<T>;
    constexpr std::int64_t NR = Bk::NR, KC = Bk::KC, MC = Bk::MC;
    thread_local Scratch<T> a_buf, b_buf;
    T* ap = a_buf.get(static_cast<std::size_t>(MC * KC));
    T* bp = b_buf.get(static_cast<std::size_t>(KC * NR));
    for (std::int64_t pc = 0; pc < k; pc += KC) {
        const std::int64_t kc = std::min(KC, k - pc);
        const bool accumulate = pc > 0;
        for (std::int64_t ic = 0; ic < m; ic += MC) {
            const std::int64_t mc = std::min(MC, m - ic);
            pack_a_block(a, ic, pc, mc, kc, ap);
            block_product(mc, n, kc, ap, [&](std::int64_t jr) { return b_strip(b, pc, kc, jr, std::min(NR, n - jr), bp); }, c + ic * ldc,
                          ldc, accumulate);
            if constexpr (!std::is_same_v<Done, std::nullptr_t>)
                if (pc + kc >= k) done(ic, ic + mc);
        }
    }
}

/// How to split one m x n product over `parts` threads: a rows x cols grid of C blocks, chosen to
/// pack the least (each block packs its rows of A, and its columns of B once per MC rows).
struct Split {
    std::int64_t rows = 1, cols = 1;
};
template <class T>
Split choose_split(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t parts) {
    Split best;
    double best_cost = -1;
    for (std::int64_t r = 1; r <= parts; ++r) {
        if (parts % r != 0) continue;
        const std::int64_t cl = parts / r;
        // blocks narrower than a register tile waste the tile
        if (r > 1 && m / r < Blocking<T>::MR) continue;
        if (cl > 1 && n / cl < Blocking<T>::NR) continue;
        // A is packed once per column block; B once per MC-row block of A
        const std::int64_t b_packs = std::max(r, (m + Blocking<T>::MC - 1) / Blocking<T>::MC);
        const double cost = static_cast<double>(cl) * static_cast<double>(m) * static_cast<double>(k) +
                            static_cast<double>(b_packs) * static_cast<double>(k) * static_cast<double>(n);
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best = Split{r, cl};
        }
    }
    return best;
}

/// C[b] = A[b] @ B[b] for b in [0, batch): A[b] at a + b * a_batch_stride (likewise B), C[b]
/// contiguous (m, n) at c + b * m * n, over kiln's threads (batches first, then blocks of C).
/// `done(row0, row1, col0, col1)`, if given, is called on the thread that computed them for each
/// part of C that is final (rows counted across batches: row b * m + r), while it is in cache.
template <class T, class A, class Done = std::nullptr_t>
void batched(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const A& a, std::int64_t a_bs, View<T> b, std::int64_t b_bs,
             T* c, const Done& done = nullptr) {
    if (batch <= 0 || m <= 0 || n <= 0) return;
    if (k <= 0) {  // an empty sum
        std::fill(c, c + batch * m * n, T(0));
        if constexpr (!std::is_same_v<Done, std::nullptr_t>) done(0, batch * m, 0, n);
        return;
    }
    const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const std::int64_t threads = flops < double(1 << 21) ? 1 : num_threads();
    const std::int64_t per_batch = batch >= threads ? 1 : (threads + batch - 1) / batch;
    const Split sp = choose_split<T>(m, n, k, per_batch);
    // block edges on register-tile boundaries
    auto edge = [](std::int64_t len, std::int64_t parts, std::int64_t i, std::int64_t unit) {
        const std::int64_t units = (len + unit - 1) / unit;
        return std::min(len, units * i / parts * unit);
    };
    const std::int64_t tasks = batch * sp.rows * sp.cols;
    auto task = [&](std::int64_t t) {
        const std::int64_t bi = t / (sp.rows * sp.cols), blk = t % (sp.rows * sp.cols);
        const std::int64_t ri = blk / sp.cols, ci = blk % sp.cols;
        const std::int64_t r0 = edge(m, sp.rows, ri, Blocking<T>::MR), r1 = edge(m, sp.rows, ri + 1, Blocking<T>::MR);
        const std::int64_t c0 = edge(n, sp.cols, ci, Blocking<T>::NR), c1 = edge(n, sp.cols, ci + 1, Blocking<T>::NR);
        if (r1 <= r0 || c1 <= c0) return;
        const A ab = a_offset(a, bi * a_bs, r0);
        const View<T> bb{b.p + bi * b_bs + c0 * b.cs, b.rs, b.cs};
        T* const cb = c + bi * m * n + r0 * n + c0;
        if constexpr (std::is_same_v<Done, std::nullptr_t>) {
            gemm_serial<T>(r1 - r0, c1 - c0, k, ab, bb, cb, n);
        } else {
            const std::int64_t row = bi * m + r0;
            gemm_serial<T>(r1 - r0, c1 - c0, k, ab, bb, cb, n, [&](std::int64_t i0, std::int64_t i1) { done(row + i0, row + i1, c0, c1); });
        }
    };
    if (tasks == 1) {
        task(0);
    } else {
        thread_pool().run(tasks, task);
    }
}

}  // namespace kiln::detail::gemm
