// The registry of kiln's hand-written CUDA kernels: the library kernels that are not generated from
// the op table by codegen.hpp (elementwise, row, reduce) or index_ops.hpp (gather, scatter,
// scatter_add, index_select). Each is a function from its parameters to the kernel's text; the
// callers (nn/conv.hpp, gather.hpp) only launch. library_kernel_sources() lists every variant, so
// the NVRTC compile test (tests/test_cuda_codegen.cpp) builds each without a GPU.
//   im2col_kernel       conv2d's patch matrix (channels-last input), any element size
//   max_pool_kernel     max_pool2d, one thread per output, NaN wins, padding never does
//   max_pool_backward_kernel
//                       max_pool2d's gradient: per input element the sum of the gradients of the
//                       windows that took it (max_pool_kernel with positions gives what each took)
//   gather_rows_kernel  embedding lookups: rows of a table by int64 id
//   col2im_kernel       the gradient of im2col: each input element sums the columns that read it
//   dropout_mask_kernel dropout's keep mask from Philox4x32-10, counters read from a device offset
//   rng_advance_kernel  moves that device offset on (a second launch, so every block read it first)
//   attention_kernel    scaled_dot_product_attention in one pass (scores, mask, online softmax, PV),
//                       tensor cores (mma.sync) for f16/bf16 on sm_80+, one thread per query row
//                       otherwise
//   scale_kernel        x *= s in place over a flat buffer (DataParallel's bucket after its sum
//                       all-reduce: the average)
//   small_gemm          products of few rows, and act_pass, the exact gelu after a cuBLASLt product
//                       (small_gemm.hpp: their texts, when they run, the launches)
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/codegen.hpp"
#include "kiln/backends/cuda/small_gemm.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cuda::detail {

/// im2col of a (N, C, H, W) input with any strides into (N*OH*OW, KH*KW*C) columns of raw
/// elements of `element_size` bytes; padding writes the `pad` bits. i64: 64-bit index math.
inline KernelText im2col_kernel(std::size_t element_size, bool i64) {
    const char* word = raw_word(element_size);
    const char* I = i64 ? "long long" : "int";
    KernelText k;
    k.name = "kiln_im2col_lanes_" + std::to_string(element_size) + (i64 ? "_i64" : "_i32");
    // columns in (kh, kw, c) order. L threads per segment (a row and one window position; L the
    // power of two nearest C, at most 32): the index math runs once per segment, and the lanes copy
    // its C channels, which are contiguous in channels-last input and always in the output.
    k.source = std::string("typedef ") + I + " I;\nextern \"C\" __global__ void " + k.name + "(const " + word +
               "* __restrict__ x, " + word +
               "* __restrict__ cols, long long segs_, long long C_, long long H_, long long W_, long long sN_, long long sC_, "
               "long long sH_, long long sW_, long long OH_, long long OW_, long long KH_, long long KW_, long long SH_, long long SW_, "
               "long long PH_, long long PW_, long long DH_, long long DW_, unsigned long long pad, long long L_) {\n"
               "  const I segs = (I)segs_, C = (I)C_, H = (I)H_, W = (I)W_, sN = (I)sN_, sC = (I)sC_, sH = (I)sH_, sW = (I)sW_;\n"
               "  const I OH = (I)OH_, OW = (I)OW_, KW = (I)KW_, SH = (I)SH_, SW = (I)SW_, PH = (I)PH_, PW = (I)PW_, DH = (I)DH_, DW = (I)DW_;\n"
               "  const I KK = (I)KH_ * KW;\n"
               "  const I L = (I)L_, lane = threadIdx.x & (L - 1), groups = (I)gridDim.x * (blockDim.x / L);\n"
               "  for (I seg = (I)blockIdx.x * (blockDim.x / L) + threadIdx.x / L; seg < segs; seg += groups) {\n"
               "    const I r = seg / KK, kk = seg - r * KK, ki = kk / KW, kj = kk - ki * KW;\n"
               "    const I n = r / (OH * OW), rem = r - n * (OH * OW), oh = rem / OW, ow = rem - oh * OW;\n"
               "    const I h = oh * SH - PH + ki * DH, w = ow * SW - PW + kj * DW;\n"
               "    " + word + "* out = cols + seg * C;\n"
               "    if (h < 0 || h >= H || w < 0 || w >= W) {\n"
               "      for (I c = lane; c < C; c += L) out[c] = (" + word + ")pad;\n"
               "    } else {\n"
               "      const " + word + "* src = x + n * sN + h * sH + w * sW;\n"
               "      for (I c = lane; c < C; c += L) out[c] = src[c * sC];\n"
               "    }\n"
               "  }\n}\n";
    return k;
}

/// The C type of a dtype the direct max-pool kernel takes, or null (f16/bf16/bool take im2col).
inline const char* pool_ctype(DType d) {
    switch (d) {
        case DType::f32: return "float";
        case DType::f64: return "double";
        case DType::i32: return "int";
        case DType::i64: return "long long";
        default: return nullptr;
    }
}

/// A max-pool launch's sizes and window. Given to the kernel generators, they are constants of the
/// kernel's text (its divisions by them become multiplies: the index math, not the memory, bounds
/// these kernels) and the kernel's name carries them; without, the kernel reads the launch's
/// parameters.
struct PoolGeometry {
    std::int64_t C, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW;
};

/// The declarations of C, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH and DW (type I): constants from
/// `g`, else the parameters of the same names with a trailing underscore.
inline std::string pool_sizes(const std::optional<PoolGeometry>& g) {
    const std::pair<const char*, std::int64_t> v[] = {{"C", g ? g->C : 0},   {"H", g ? g->H : 0},   {"W", g ? g->W : 0},   {"OH", g ? g->OH : 0},
                                                      {"OW", g ? g->OW : 0}, {"KH", g ? g->KH : 0}, {"KW", g ? g->KW : 0}, {"SH", g ? g->SH : 0},
                                                      {"SW", g ? g->SW : 0}, {"PH", g ? g->PH : 0}, {"PW", g ? g->PW : 0}, {"DH", g ? g->DH : 0},
                                                      {"DW", g ? g->DW : 0}};
    std::string s = "  const I";
    for (std::size_t i = 0; i < std::size(v); ++i)
        s += std::string(i ? ", " : " ") + v[i].first + " = (I)" + (g ? std::to_string(v[i].second) : std::string(v[i].first) + "_");
    return s + ";\n";
}

/// The part of a max-pool kernel's name that names its baked geometry ("" without one).
inline std::string pool_suffix(const std::optional<PoolGeometry>& g) {
    if (!g) return "";
    const auto n = [](std::int64_t v) { return std::to_string(v); };
    return "_c" + n(g->C) + "h" + n(g->H) + "w" + n(g->W) + "o" + n(g->OH) + "x" + n(g->OW) + "k" + n(g->KH) + "x" + n(g->KW) + "s" +
           n(g->SH) + "x" + n(g->SW) + "p" + n(g->PH) + "x" + n(g->PW) + "d" + n(g->DH) + "x" + n(g->DW);
}

/// max_pool2d of x (N, H, W, C; any strides) into y (N, OH, OW, C; contiguous), one thread per
/// output element, channels fastest: a larger value or a NaN replaces the kept one, so ties keep
/// the first maximum. dtype: one pool_ctype takes. i64: 64-bit index math. `positions` (f32, f64;
/// max_pool2d's backward, first pass): instead of the maximum, the position a * KW + b in its
/// window of the element taken, as int32 into `at` (a window of lowest values keeps its first
/// position inside the input).
inline KernelText max_pool_kernel(DType dtype, bool i64, bool positions = false, const std::optional<PoolGeometry>& geom = std::nullopt) {
    const char* T = pool_ctype(dtype);
    const char* I = i64 ? "long long" : "int";
    const std::string lowest = dtype == DType::f32   ? "__int_as_float(0xff800000)"
                               : dtype == DType::f64 ? "__longlong_as_double(0xfff0000000000000LL)"
                               : dtype == DType::i32 ? "(-2147483647 - 1)"
                                                         : "(-9223372036854775807LL - 1)";
    KernelText k;
    k.name = std::string(positions ? "kiln_max_pool_argmax_" : "kiln_max_pool_") + std::string(dtype_name(dtype)) + (i64 ? "_i64" : "_i32") +
             pool_suffix(geom);
    k.source = std::string("typedef ") + I + " I;\ntypedef " + T + " T;\nextern \"C\" __global__ void " + k.name +
               "(const T* __restrict__ x, " + (positions ? "int* __restrict__ at" : "T* __restrict__ y") +
               ", long long total_, long long C_, long long H_, long long W_, "
               "long long sN_, long long sH_, long long sW_, long long sC_, long long OH_, long long OW_, long long KH_, long long KW_, "
               "long long SH_, long long SW_, long long PH_, long long PW_, long long DH_, long long DW_) {\n"
               "  const I total = (I)total_, sN = (I)sN_, sH = (I)sH_, sW = (I)sW_, sC = (I)sC_;\n" + pool_sizes(geom) +
               "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {\n"
               "    const I c = i % C, r = i / C, ow = r % OW, r2 = r / OW, oh = r2 % OH, n = r2 / OH;\n"
               "    const T* base = x + n * sN + c * sC;\n"
               "    T m = " + lowest + ";\n" + (positions ? "    int pos = -1;\n" : "") +
               "    for (I a = 0; a < KH; ++a) {\n"
               "      const I h = oh * SH - PH + a * DH;\n"
               "      if (h < 0 || h >= H) continue;\n"
               "      for (I b = 0; b < KW; ++b) {\n"
               "        const I w = ow * SW - PW + b * DW;\n"
               "        if (w < 0 || w >= W) continue;\n"
               "        const T v = base[h * sH + w * sW];\n" +
               (positions ? "        if (pos < 0 || v > m || v != v) { pos = (int)(a * KW + b); m = v; }\n" : "        if (v > m || v != v) m = v;\n") +
               "      }\n"
               "    }\n" + (positions ? "    at[i] = pos;\n" : "    y[i] = m;\n") +
               "  }\n}\n";
    return k;
}

/// max_pool2d's backward, second pass: dx (N, H, W, C; contiguous) where each element sums the
/// gradients g (N, OH, OW, C; contiguous) of the windows whose taken position (`at`, from
/// max_pool_kernel with positions) it is. One thread per element, no atomics. dtype f32 or f64.
inline KernelText max_pool_backward_kernel(DType dtype, bool i64, const std::optional<PoolGeometry>& geom = std::nullopt) {
    const char* T = dtype == DType::f64 ? "double" : "float";
    const char* I = i64 ? "long long" : "int";
    KernelText k;
    k.name = "kiln_max_pool_backward_" + std::string(dtype_name(dtype)) + (i64 ? "_i64" : "_i32") + pool_suffix(geom);
    k.source = std::string("typedef ") + I + " I;\ntypedef " + T + " T;\nextern \"C\" __global__ void " + k.name +
               "(const T* __restrict__ g, const int* __restrict__ at, T* __restrict__ dx, long long total_, long long C_, long long H_, "
               "long long W_, long long OH_, long long OW_, long long KH_, long long KW_, long long SH_, long long SW_, long long PH_, "
               "long long PW_, long long DH_, long long DW_) {\n"
               "  const I total = (I)total_;\n" + pool_sizes(geom) +
               "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {\n"
               "    const I c = i % C, r = i / C, w = r % W, r2 = r / W, h = r2 % H, n = r2 / H;\n"
               "    T acc = 0;\n"
               // only the windows that hold (h, w): oh with 0 <= h + PH - oh * SH <= (KH - 1) * DH,
               // walked downwards so the window positions a (and b) come in increasing order
               "    const I th = h + PH, tw = w + PW, lh = th - (KH - 1) * DH, lw = tw - (KW - 1) * DW;\n"
               "    const I oh0 = lh <= 0 ? 0 : (lh + SH - 1) / SH, ow0 = lw <= 0 ? 0 : (lw + SW - 1) / SW;\n"
               "    const I oh1 = th / SH < OH - 1 ? th / SH : OH - 1, ow1 = tw / SW < OW - 1 ? tw / SW : OW - 1;\n"
               "    for (I oh = oh1; oh >= oh0; --oh) {\n"
               "      const I da = th - oh * SH;\n"
               "      if (DH != 1 && da % DH != 0) continue;\n"
               "      const I a = DH == 1 ? da : da / DH;\n"
               "      for (I ow = ow1; ow >= ow0; --ow) {\n"
               "        const I db = tw - ow * SW;\n"
               "        if (DW != 1 && db % DW != 0) continue;\n"
               "        const I b = DW == 1 ? db : db / DW;\n"
               "        const I o = ((n * OH + oh) * OW + ow) * C + c;\n"
               "        if (at[o] == (int)(a * KW + b)) acc += g[o];\n"
               "      }\n"
               "    }\n"
               "    dx[i] = acc;\n"
               "  }\n}\n";
    return k;
}

/// out[i, :] = table[ids[i], :] for a contiguous (rows, width) table of raw elements of
/// `element_size` bytes and contiguous int64 ids (checked by the caller).
inline KernelText gather_rows_kernel(std::size_t element_size) {
    const char* word = raw_word(element_size);
    KernelText k;
    k.name = "kiln_gather_rows_" + std::to_string(element_size);
    k.source = std::string("extern \"C\" __global__ void ") + k.name + "(const " + word + "* __restrict__ table, " +
               "const long long* __restrict__ ids, " + word + "* __restrict__ out, long long n, long long width) {\n"
               "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n * width;\n"
               "       i += (long long)gridDim.x * blockDim.x) {\n"
               "    const long long r = i / width, c = i - r * width;\n"
               "    out[i] = table[ids[r] * width + c];\n"
               "  }\n}\n";
    return k;
}

/// col2im: x (N, H, W, C; contiguous) gets, per element, the sum of the (N*OH*OW, KH*KW*C) column
/// entries that im2col copied from it (padding reads are dropped). One thread per element, no
/// atomics: results do not depend on the launch. dtype f32 or f64 (others go through f32).
inline KernelText col2im_kernel(DType dtype, bool i64) {
    const char* T = dtype == DType::f64 ? "double" : "float";
    const char* I = i64 ? "long long" : "int";
    KernelText k;
    k.name = "kiln_col2im_" + std::string(dtype_name(dtype == DType::f64 ? DType::f64 : DType::f32)) + (i64 ? "_i64" : "_i32");
    k.source = std::string("typedef ") + I + " I;\ntypedef " + T + " T;\nextern \"C\" __global__ void " + k.name +
               "(const T* __restrict__ cols, T* __restrict__ x, long long total_, long long C_, long long H_, long long W_, "
               "long long OH_, long long OW_, long long KH_, long long KW_, long long SH_, long long SW_, long long PH_, long long PW_, "
               "long long DH_, long long DW_) {\n"
               "  const I total = (I)total_, C = (I)C_, H = (I)H_, W = (I)W_, OH = (I)OH_, OW = (I)OW_, KH = (I)KH_, KW = (I)KW_;\n"
               "  const I SH = (I)SH_, SW = (I)SW_, PH = (I)PH_, PW = (I)PW_, DH = (I)DH_, DW = (I)DW_, K = KH * KW * C;\n"
               "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {\n"
               "    const I c = i % C, r = i / C, w = r % W, r2 = r / W, h = r2 % H, n = r2 / H;\n"
               "    T acc = 0;\n"
               "    for (I a = 0; a < KH; ++a) {\n"
               "      const I t = h + PH - a * DH;\n"
               "      if (t < 0 || t % SH != 0 || t / SH >= OH) continue;\n"
               "      for (I b = 0; b < KW; ++b) {\n"
               "        const I u = w + PW - b * DW;\n"
               "        if (u < 0 || u % SW != 0 || u / SW >= OW) continue;\n"
               "        acc += cols[((n * OH + t / SH) * OW + u / SW) * K + (a * KW + b) * C + c];\n"
               "      }\n"
               "    }\n"
               "    x[i] = acc;\n"
               "  }\n}\n";
    return k;
}

/// The Philox4x32-10 rounds as CUDA text (the same rounds as kiln::philox4x32_10): word 0 of the
/// block for a 64-bit counter and key.
inline std::string philox_source() {
    return "__device__ __forceinline__ unsigned kiln_philox_word(unsigned long long key, unsigned long long ctr) {\n"
           "  unsigned c0 = (unsigned)ctr, c1 = (unsigned)(ctr >> 32), c2 = 0, c3 = 0;\n"
           "  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);\n"
           "  #pragma unroll\n"
           "  for (int r = 0; r < 10; ++r) {\n"
           "    if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }\n"
           "    const unsigned lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);\n"
           "    const unsigned lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);\n"
           "    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;\n"
           "  }\n"
           "  return c0;\n"
           "}\n";
}

/// dropout's keep mask: keep[i] = (philox(state[0], state[1] + i) >> 8) >= threshold, as bytes
/// (bool). Seed and offset live on the device so a replayed CUDA graph draws new numbers each time.
inline KernelText dropout_mask_kernel() {
    KernelText k;
    k.name = "kiln_dropout_mask";
    k.source = philox_source() + "extern \"C\" __global__ void " + k.name +
               "(unsigned char* __restrict__ keep, long long n, const unsigned long long* __restrict__ state, long long threshold) {\n"
               "  const unsigned long long seed = state[0], base = state[1];\n"
               "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
               "    keep[i] = (long long)(kiln_philox_word(seed, base + (unsigned long long)i) >> 8) >= threshold;\n"
               "}\n";
    return k;
}

/// offset[0] += n (after the draws that read it).
inline KernelText rng_advance_kernel() {
    KernelText k;
    k.name = "kiln_rng_advance";
    k.source = "extern \"C\" __global__ void kiln_rng_advance(unsigned long long* offset, long long n) { offset[0] += (unsigned long long)n; }\n";
    return k;
}

/// x[i] *= s over n elements of a floating dtype, in place (f16/bf16 through f32, rounded once):
/// the first nv * (16 / element size) elements as 16-byte vectors (nv = 0 where x is not 16-byte
/// aligned), the rest one by one.
inline KernelText scale_kernel(DType d) {
    KernelText k;
    k.name = "kiln_scale_" + std::string(dtype_name(d));
    const char* T = d == DType::f64 ? "double" : d == DType::f32 ? "float" : "unsigned short";
    std::string v;  // one element e scaled, as an expression of e and s
    switch (d) {
        case DType::f64: v = "e * s"; break;
        case DType::f16: v = "kiln_f2h(kiln_h2f(e) * (float)s)"; break;
        case DType::bf16: v = "kiln_f2bf(kiln_bf2f(e) * (float)s)"; break;
        default: v = "e * (float)s"; break;  // f32
    }
    const std::string V = std::to_string(16 / dtype_size(d));
    k.source = std::string(base_prelude()) + "typedef " + T + " T;\n__device__ __forceinline__ T kiln_scale_one(T e, double s) { return " + v +
               "; }\nextern \"C\" __global__ void " + k.name +
               "(T* __restrict__ x, long long n, long long nv, double s) {\n"
               "  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;\n"
               "  uint4* xv = (uint4*)x;\n"
               "  for (long long i = first; i < nv; i += step) {\n"
               "    uint4 w = xv[i];\n    T* e = (T*)&w;\n"
               "#pragma unroll\n    for (int j = 0; j < " + V + "; ++j) e[j] = kiln_scale_one(e[j], s);\n"
               "    xv[i] = w;\n  }\n"
               "  for (long long i = nv * " + V + " + first; i < n; i += step) x[i] = kiln_scale_one(x[i], s);\n}\n";
    return k;
}

/// What an attention kernel's text depends on. mask: 0 none, 1 bool (false masks out), 2 additive
/// (mask_dtype: f32, f16 or bf16). mma: the tensor-core variant (f16/bf16, sm_80+), head_dim padded to 16 there.
struct AttentionSignature {
    DType dtype = DType::f32;  ///< q, k, v and the output
    int head_dim = 64;         ///< D of q, k and v (1..128 with mma, 1..64 without)
    int mask = 0;
    DType mask_dtype = DType::f32;
    bool mma = false;
    /// q, k and v are read in 16-byte vectors: unit stride along D, the other strides and the
    /// addresses multiples of 16 bytes, D a multiple of the vector
    bool vec = false;
    /// mma: warps of 16 query rows per block (1..4; fewer for short queries: a sentence of 8
    /// tokens fills one warp), and keys per tile (0: 64, 32 for D > 64; 16 or 32 for short key
    /// sequences, which a 64-key tile would mostly pad). attention_shape picks them.
    int q_warps = 4;
    int key_tile = 0;
    /// mma: the mask broadcasts over query rows (BERT's padding mask, (B, 1, 1, Sk)): its terms
    /// are read once per key tile into shared memory with the tile, not per (row, key)
    bool mask_keys = false;
    std::string key() const {
        return std::string(dtype_name(dtype)) + "_d" + std::to_string(head_dim) + "_m" + std::to_string(mask) +
               (mask == 2 ? std::string(dtype_name(mask_dtype)) : std::string()) + (mma ? "_mma" : "_rows") + (vec ? "_v" : "") +
               (q_warps != 4 ? "_w" + std::to_string(q_warps) : std::string()) + (key_tile ? "_kt" + std::to_string(key_tile) : std::string()) +
               (mma && mask != 0 && mask_keys ? "_mk" : "");
    }
};

/// The attention kernel's name for a signature (its text is made only when a device has not loaded it).
inline std::string attention_kernel_name(const AttentionSignature& s) { return "kiln_attention_" + s.key(); }

/// Attention for q (B, H, Sq, D), k and v (B, H, Sk, D), any strides (in elements, parameters), an
/// optional mask read at (b, h, i, j) through four strides (0 where it broadcasts), into out (B, Sq,
/// H, D) contiguous: out = softmax(q k^T * scale [+ mask | where mask]) v, scores and the softmax in
/// f32 (f64 never comes here), one pass over the keys with a running max (no scores in memory). A
/// row whose keys are all masked gives NaN, as softmax over -inf does. Blocks cover (b, h, a tile
/// of 64 query rows), b slowest.
inline KernelText attention_kernel(const AttentionSignature& s) {
    const bool half = s.dtype == DType::f16 || s.dtype == DType::bf16;
    const char* T = half ? "unsigned short" : "float";
    const int D = s.head_dim;
    KernelText k;
    k.name = attention_kernel_name(s);
    std::string src = "typedef " + std::string(T) + " T;\n";
    // the mask's element: bool bytes, or an additive mask's f32 / f16 / bf16 bits
    src += std::string("typedef ") + (s.mask != 2 ? "unsigned char" : s.mask_dtype == DType::f32 ? "float" : "unsigned short") + " M;\n";
    // element loads and stores in f32
    auto ld_fn = [](DType d, const char* name, const char* type) {
        std::string f = "__device__ __forceinline__ float " + std::string(name) + "(" + type + " x) { ";
        if (d == DType::bf16) f += "return __uint_as_float(((unsigned)x) << 16); }\n";
        else if (d == DType::f16) f += "float r; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(r) : \"h\"(x)); return r; }\n";
        else f += "return (float)x; }\n";
        return f;
    };
    if (s.mask == 2) src += ld_fn(s.mask_dtype, "ldm", "M");
    if (s.dtype == DType::bf16 || s.dtype == DType::f16)  // ld and st as the small GEMM's, and two values packed
        src += half_conversions(s.dtype) + "__device__ __forceinline__ unsigned pack2(float lo, float hi) { unsigned r; asm(\"cvt.rn." +
               (s.dtype == DType::bf16 ? "bf16x2" : "f16x2") + ".f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r; }\n";
    else
        src += ld_fn(s.dtype, "ld", T) + "__device__ __forceinline__ T st(float x) { return x; }\n";
    // the mask's term of one (row, key) (0 or -inf for a bool mask), read at clamped indices without
    // a branch: the loads of a tile are issued together, before the products that need them
    const std::string mask_term =
        s.mask == 0 ? std::string("0.f")
                    : std::string(s.mask == 1 ? "(mask[" : "ldm(mask[") +
                          "b * mb + h * mh + (row < Sq ? row : Sq - 1) * mq + (key < Sk ? key : Sk - 1) * mk]" +
                          (s.mask == 1 ? " ? 0.f : NEG)" : ")");
    // the score of one (row, key) with its mask term mv: scaled, masked, -inf past the keys
    const std::string score = std::string("    x = x * scale") + (s.mask ? " + mv" : "") + ";\n    if (key >= Sk) x = NEG;\n";
    const std::string params =
        "(const T* __restrict__ q, const T* __restrict__ kk, const T* __restrict__ v, const M* __restrict__ mask, T* __restrict__ out, "
        "long long B, long long H, long long Sq, long long Sk, long long qb, long long qh, long long qs, long long qd, "
        "long long kb, long long kh, long long ks, long long kd, long long vb, long long vh, long long vs, long long vd, "
        "long long mb, long long mh, long long mq, long long mk, double scale_)";
    const int R = s.mma ? 16 * s.q_warps : 64, NT = s.mma ? 32 * s.q_warps : 64;  // query rows and threads per block
    const std::string Rs = std::to_string(R), NTs = std::to_string(NT);
    const std::string head =
        "  const long long tiles = (Sq + " + std::to_string(R - 1) + ") / " + Rs + ", bid = blockIdx.x, tile = bid % tiles, h = (bid / tiles) % H, b = bid / (tiles * H);\n"
        "  const float scale = (float)scale_;\n"
        "  const float NEG = -__int_as_float(0x7f800000);\n"
        "  const T* qp = q + b * qb + h * qh; const T* kp = kk + b * kb + h * kh; const T* vp = v + b * vb + h * vh;\n";
    if (!s.mma) {
        // one thread per query row: its q and its output row in registers; 32 keys at a time in
        // shared memory (read by every thread alike: broadcasts), in chunks of 8 per running max
        const std::string Ds = std::to_string(D);
        // the valid keys of the tile into shared memory (f32): 16-byte vectors where the signature says so
        std::string simt_load;
        if (s.vec && !half)
            simt_load = "    for (int i = threadIdx.x; i < nk * (D / 4); i += blockDim.x) {\n"
                        "      const int j = i / (D / 4), c = (i - j * (D / 4)) * 4;\n"
                        "      const float4 x = *(const float4*)(kp + (k0 + j) * ks + c), y = *(const float4*)(vp + (k0 + j) * vs + c);\n"
                        "      Ks[j][c] = x.x; Ks[j][c + 1] = x.y; Ks[j][c + 2] = x.z; Ks[j][c + 3] = x.w;\n"
                        "      Vs[j][c] = y.x; Vs[j][c + 1] = y.y; Vs[j][c + 2] = y.z; Vs[j][c + 3] = y.w;\n"
                        "    }\n";
        else if (s.vec)
            simt_load = "    for (int i = threadIdx.x; i < nk * (D / 8); i += blockDim.x) {\n"
                        "      const int j = i / (D / 8), c = (i - j * (D / 8)) * 8;\n"
                        "      const uint4 x = *(const uint4*)(kp + (k0 + j) * ks + c), y = *(const uint4*)(vp + (k0 + j) * vs + c);\n"
                        "      const T* xe = (const T*)&x; const T* ye = (const T*)&y;\n"
                        "      #pragma unroll\n"
                        "      for (int u = 0; u < 8; ++u) { Ks[j][c + u] = ld(xe[u]); Vs[j][c + u] = ld(ye[u]); }\n"
                        "    }\n";
        else
            simt_load = "    for (int i = threadIdx.x; i < nk * D; i += blockDim.x) {\n"
                        "      const int j = i / D, d = i - j * D; const long long key = k0 + j;\n"
                        "      Ks[j][d] = ld(kp[key * ks + d * kd]);\n"
                        "      Vs[j][d] = ld(vp[key * vs + d * vd]);\n"
                        "    }\n";
        src += "extern \"C\" __global__ void __launch_bounds__(64) " + k.name + params + " {\n" + head +
               "  constexpr int D = " + Ds + ", KT = 32;\n"
               "  __shared__ float Ks[KT][D], Vs[KT][D];\n"
               "  const long long row = tile * 64 + threadIdx.x;\n"
               "  const bool active = row < Sq;\n"
               "  float qr[D], o[D];\n"
               "  #pragma unroll\n"
               "  for (int d = 0; d < D; ++d) { qr[d] = active ? ld(qp[row * qs + d * qd]) : 0.f; o[d] = 0.f; }\n"
               "  float m = NEG, l = 0.f;\n"
               "  for (long long k0 = 0; k0 < Sk; k0 += KT) {\n"
               "    __syncthreads();\n"
               "    const int nk = (int)(Sk - k0 < KT ? Sk - k0 : KT);\n" + simt_load +
               "    for (int i = threadIdx.x; i < (KT - nk) * D; i += blockDim.x) Vs[nk + i / D][i % D] = 0.f;  // p is 0 there, V must not be NaN\n"
               "    __syncthreads();\n"
               "    if (!active) continue;\n"
               "    for (int c = 0; c < nk; c += 8) {\n"
               "      float sc[8], mvs[8], cm = NEG;\n"
               "      #pragma unroll\n"
               "      for (int j = 0; j < 8; ++j) { const long long key = k0 + c + j; mvs[j] = " + mask_term + "; }\n"
               "      #pragma unroll\n"
               "      for (int j = 0; j < 8; ++j) {\n"
               "        float x = 0.f;\n"
               "        #pragma unroll\n"
               "        for (int d = 0; d < D; ++d) x = fmaf(qr[d], Ks[c + j][d], x);\n"
               "        const long long key = k0 + c + j;\n"
               "        const float mv = mvs[j];\n" + score +
               "        sc[j] = x; cm = fmaxf(cm, x);\n"
               "      }\n"
               "      const float mn = fmaxf(m, cm), mu = mn == NEG ? 0.f : mn, corr = expf(m - mu);\n"
               "      m = mn; l *= corr;\n"
               "      #pragma unroll\n"
               "      for (int d = 0; d < D; ++d) o[d] *= corr;\n"
               "      #pragma unroll\n"
               "      for (int j = 0; j < 8; ++j) {\n"
               "        const float p = expf(sc[j] - mu);\n"
               "        l += p;\n"
               "        #pragma unroll\n"
               "        for (int d = 0; d < D; ++d) o[d] = fmaf(p, Vs[c + j][d], o[d]);\n"
               "      }\n"
               "    }\n"
               "  }\n"
               "  if (!active) return;\n"
               "  const float inv = 1.f / l;\n"
               "  T* op = out + ((b * Sq + row) * H + h) * D;\n"
               "  #pragma unroll\n"
               "  for (int d = 0; d < D; ++d) op[d] = st(o[d] * inv);\n"
               "}\n";
        k.source = src;
        return k;
    }
    // tensor cores, as FlashAttention-2 does: q_warps warps x 16 query rows; per tile of KT keys, S = Q K^T
    // by m16n8k16 MMAs (f32 accumulators), the running max and sum per row (a row's columns sit in
    // the 4 threads of a quad), then P (its accumulator registers are the A operand's layout,
    // rounded to T) times V (row-major in shared memory, its B fragments read by ldmatrix.trans)
    // into the output accumulators. Q, K and V reach shared memory by cp.async where 16-byte
    // vectors fit (s.vec), the next tile's copies in flight while this tile is multiplied (two
    // buffers); Q is staged in the second buffer (and past it, where a short key tile leaves it
    // smaller than the block's query rows) before the first tile needs it.
    const int DP = (D + 15) / 16 * 16, KT = s.key_tile ? s.key_tile : DP <= 64 ? 64 : 32;
    const std::string Ds = std::to_string(D), DPs = std::to_string(DP), KTs = std::to_string(KT);
    const std::string mma = std::string("mma.sync.aligned.m16n8k16.row.col.f32.") + (s.dtype == DType::bf16 ? "bf16.bf16" : "f16.f16") + ".f32";
    // one buffer's tile of keys k0.. (K and V, rows past Sk and columns past D zero): cp.async
    // (zero-filled where src-size is 0) or element loads
    const std::string load_tile =
        s.vec ? "  for (int i = threadIdx.x; i < KT * (DP / 8); i += " + NTs + ") {\n"
                "    const int j = i / (DP / 8), c = (i - j * (DP / 8)) * 8;\n"
                "    const long long key = k0 + j; const bool ok = key < Sk && c < D;\n"
                "    const long long kr = ok ? key : 0; const int cc = ok ? c : 0;\n"
                "    cp16(&Kb[j * KS + c], kp + kr * ks + cc, ok ? 16 : 0);\n"
                "    cp16(&Vb[j * KS + c], vp + kr * vs + cc, ok ? 16 : 0);\n"
                "  }\n"
              : "  for (int i = threadIdx.x; i < KT * DP; i += " + NTs + ") {\n"
                "    const int j = i / DP, d = i - j * DP; const long long key = k0 + j; const bool ok = key < Sk && d < D;\n"
                "    Kb[j * KS + d] = ok ? kp[key * ks + d * kd] : (unsigned short)0;\n"
                "    Vb[j * KS + d] = ok ? vp[key * vs + d * vd] : (unsigned short)0;\n"
                "  }\n";
    // and the tile's key terms (log2 units, as the scores): -inf past Sk, else the mask's term where
    // it broadcasts over query rows (mask_keys), else 0
    const bool key_mask = s.mask != 0 && s.mask_keys;
    const std::string key_term = !key_mask ? std::string("0.f") : s.mask == 1 ? "(mkp[key * mk] ? 0.f : NEG)" : "ldm(mkp[key * mk]) * LOG2E";
    const std::string load_terms = "  const float NEG = -__int_as_float(0x7f800000), LOG2E = 1.4426950408889634f;\n"
                                   "  for (int j = threadIdx.x; j < KT; j += " + NTs + ") { const long long key = k0 + j; Mb[j] = key < Sk ? " + key_term + " : NEG; }\n";
    // the mask's two rows of this thread (g and g + 8 of its warp's 16, clamped to Sq) found once:
    // per (row, key) only the key's offset remains
    const std::string mask_rows =
        s.mask == 0 || key_mask ? std::string()
                    : "  const long long mq0 = q0 + warp * 16 + g, mq1 = mq0 + 8;\n"
                      "  const M* mr0 = mask + b * mb + h * mh + (mq0 < Sq ? mq0 : Sq - 1) * mq;\n"
                      "  const M* mr1 = mask + b * mb + h * mh + (mq1 < Sq ? mq1 : Sq - 1) * mq;\n";
    const std::string mma_mask_term =  // a mask that varies over query rows: its term per (row, key), in log2 units
        s.mask == 0 || key_mask ? std::string("0.f")
                                : std::string(s.mask == 1 ? "((e >= 2 ? mr1 : mr0)" : "LOG2E * ldm((e >= 2 ? mr1 : mr0)") +
                                      "[(key < Sk ? key : Sk - 1) * mk]" + (s.mask == 1 ? " ? 0.f : NEG)" : ")");
    const bool row_mask = s.mask != 0 && !key_mask;
    src += "__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {\n"
           "  asm volatile(\"" + mma + " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n"
           "               : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n"
           "}\n"
           "__device__ __forceinline__ void cp16(void* dst, const void* src, int bytes) {\n"
           "  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" :: \"r\"((unsigned)__cvta_generic_to_shared(dst)), \"l\"(src), \"r\"(bytes));\n"
           "}\n"
           "__device__ __forceinline__ float ex2(float x) { float r; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x)); return r; }\n"
           "__device__ __forceinline__ void cp_wait() { asm volatile(\"cp.async.commit_group;\\ncp.async.wait_group 0;\\n\" ::: \"memory\"); }\n"
           "__device__ __forceinline__ void ldsm4(const unsigned short* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {\n"
           "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
           "               : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"((unsigned)__cvta_generic_to_shared(p)));\n"
           "}\n"
           "__device__ __forceinline__ void ldsm_t4(const unsigned short* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {\n"
           "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
           "               : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"((unsigned)__cvta_generic_to_shared(p)));\n"
           "}\n"
           "template <int KT, int DP, int D, int KS>\n"
           "__device__ __forceinline__ void load_tile(unsigned short* Kb, unsigned short* Vb, float* Mb, const T* kp, const T* vp, const M* mkp,\n"
           "                                          long long k0, long long Sk, long long ks, long long kd, long long vs, long long vd, long long mk) {\n" +
           load_tile + load_terms + "}\n"
           "extern \"C\" __global__ void __launch_bounds__(" + NTs + ") " + k.name + params + " {\n" + head +
           "  constexpr int D = " + Ds + ", DP = " + DPs + ", KT = " + KTs + ", KS = DP + 8, R = " + Rs + ";\n"
           "  // K0, V0, K1, V1: two buffers of a key tile each; Q (R rows) staged from K1 on first\n"
           "  __shared__ __align__(16) unsigned short sm[(2 * KT + (2 * KT > R ? 2 * KT : R)) * KS];\n"
           "  __shared__ __align__(16) float ms[2][KT];  // the two tiles' key terms\n"
           "  const float scale2 = (float)(scale_ * 1.4426950408889634), LOG2E = 1.4426950408889634f;  // scores in log2 units: ex2\n"
           "  const M* mkp = " + std::string(key_mask ? "mask + b * mb + h * mh" : "nullptr") + ";\n"
           "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
           "  const long long q0 = tile * R;\n" + mask_rows +
           "  {\n"
           "    unsigned short* Qs = sm + 2 * KT * KS;\n" +
           (s.vec ? "    for (int i = threadIdx.x; i < R * (DP / 8); i += " + NTs + ") {\n"
                    "      const int r = i / (DP / 8), c = (i - r * (DP / 8)) * 8;\n"
                    "      const long long row = q0 + r; const bool ok = row < Sq && c < D;\n"
                    "      cp16(&Qs[r * KS + c], qp + (ok ? row : 0) * qs + (ok ? c : 0), ok ? 16 : 0);\n"
                    "    }\n"
                  : "    for (int i = threadIdx.x; i < R * DP; i += " + NTs + ") {\n"
                    "      const int r = i / DP, d = i - r * DP; const long long row = q0 + r;\n"
                    "      Qs[r * KS + d] = row < Sq && d < D ? qp[row * qs + d * qd] : (unsigned short)0;\n"
                    "    }\n") +
           "  }\n"
           "  load_tile<KT, DP, D, KS>(sm, sm + KT * KS, ms[0], kp, vp, mkp, 0, Sk, ks, kd, vs, vd, mk);\n"
           "  cp_wait();\n"
           "  __syncthreads();\n"
           "  unsigned qa[DP / 16][4];\n"
           "  #pragma unroll\n"
           "  for (int c = 0; c < DP / 16; ++c) {\n"
           "    const unsigned short* Qs = sm + 2 * KT * KS;\n"
           "    const int r0 = warp * 16 + g, col = c * 16 + 2 * t;\n"
           "    qa[c][0] = *(const unsigned*)&Qs[r0 * KS + col];\n"
           "    qa[c][1] = *(const unsigned*)&Qs[(r0 + 8) * KS + col];\n"
           "    qa[c][2] = *(const unsigned*)&Qs[r0 * KS + col + 8];\n"
           "    qa[c][3] = *(const unsigned*)&Qs[(r0 + 8) * KS + col + 8];\n"
           "  }\n"
           "  __syncthreads();  // Q's space takes the second tile\n"
           "  float o[DP / 8][4];\n"
           "  #pragma unroll\n"
           "  for (int n = 0; n < DP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;\n"
           "  float m[2] = {NEG, NEG}, l[2] = {0.f, 0.f};\n"
           "  for (long long k0 = 0, it = 0; k0 < Sk; k0 += KT, ++it) {\n"
           "    const unsigned short* Kb = sm + (it & 1) * 2 * KT * KS;\n"
           "    const unsigned short* Vb = Kb + KT * KS;\n"
           "    const bool more = k0 + KT < Sk;\n"
           "    if (more) {\n"
           "      unsigned short* Kn = sm + ((it + 1) & 1) * 2 * KT * KS;\n"
           "      load_tile<KT, DP, D, KS>(Kn, Kn + KT * KS, ms[(it + 1) & 1], kp, vp, mkp, k0 + KT, Sk, ks, kd, vs, vd, mk);\n"
           "    }\n"
           "    float sc[KT / 8][4];\n" +
           (row_mask ? "    float mvs[KT / 8][4];\n"
                       "    #pragma unroll\n"
                       "    for (int n = 0; n < KT / 8; ++n)\n"
                       "      #pragma unroll\n"
                       "      for (int e = 0; e < 4; ++e) {\n"
                       "        const long long key = k0 + n * 8 + 2 * t + (e & 1);\n"
                       "        mvs[n][e] = " + mma_mask_term + ";\n"
                       "      }\n"
                     : "") +
           "    #pragma unroll\n"
           "    for (int n = 0; n < KT / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;\n"
           "    #pragma unroll\n"
           "    for (int c = 0; c < DP / 16; ++c)\n"
           "      #pragma unroll\n"
           "      for (int n = 0; n < KT / 8; n += 2) {\n"
           "        // lane l gives the address of key (n + l/16)*8 + l%8, columns c*16 + (l/8 % 2)*8..: the\n"
           "        // B fragments of key blocks n and n + 1 in one ldmatrix\n"
           "        unsigned b0, b1, b2, b3;\n"
           "        ldsm4(&Kb[((n + (lane >> 4)) * 8 + (lane & 7)) * KS + c * 16 + ((lane >> 3) & 1) * 8], b0, b1, b2, b3);\n"
           "        mma(sc[n], qa[c], b0, b1);\n"
           "        mma(sc[n + 1], qa[c], b2, b3);\n"
           "      }\n"
           "    const float* Mt = ms[it & 1];\n"
           "    #pragma unroll\n"
           "    for (int n = 0; n < KT / 8; ++n) {\n"
           "      const float2 kt = *(const float2*)&Mt[n * 8 + 2 * t];  // keys 2t and 2t + 1 of the 8\n"
           "      sc[n][0] = fmaf(sc[n][0], scale2, kt.x); sc[n][1] = fmaf(sc[n][1], scale2, kt.y);\n"
           "      sc[n][2] = fmaf(sc[n][2], scale2, kt.x); sc[n][3] = fmaf(sc[n][3], scale2, kt.y);\n" +
           (row_mask ? "      sc[n][0] += mvs[n][0]; sc[n][1] += mvs[n][1]; sc[n][2] += mvs[n][2]; sc[n][3] += mvs[n][3];\n" : "") +
           "    }\n"
           "    #pragma unroll\n"
           "    for (int r = 0; r < 2; ++r) {\n"
           "      float mx = NEG;\n"
           "      #pragma unroll\n"
           "      for (int n = 0; n < KT / 8; ++n) mx = fmaxf(mx, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));\n"
           "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));\n"
           "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));\n"
           "      const float mn = fmaxf(m[r], mx), mu = mn == NEG ? 0.f : mn, corr = ex2(m[r] - mu);\n"
           "      m[r] = mn; l[r] *= corr;\n"
           "      #pragma unroll\n"
           "      for (int n = 0; n < DP / 8; ++n) { o[n][2 * r] *= corr; o[n][2 * r + 1] *= corr; }\n"
           "      #pragma unroll\n"
           "      for (int n = 0; n < KT / 8; ++n) {\n"
           "        sc[n][2 * r] = ex2(sc[n][2 * r] - mu); sc[n][2 * r + 1] = ex2(sc[n][2 * r + 1] - mu);\n"
           "        l[r] += sc[n][2 * r] + sc[n][2 * r + 1];\n"
           "      }\n"
           "    }\n"
           "    #pragma unroll\n"
           "    for (int j = 0; j < KT / 16; ++j) {\n"
           "      const unsigned a[4] = {pack2(sc[2 * j][0], sc[2 * j][1]), pack2(sc[2 * j][2], sc[2 * j][3]),\n"
           "                             pack2(sc[2 * j + 1][0], sc[2 * j + 1][1]), pack2(sc[2 * j + 1][2], sc[2 * j + 1][3])};\n"
           "      // lane l gives the address of key j*16 + (l/8 % 2)*8 + l%8, columns (n + l/16)*8..: V's B\n"
           "      // fragments of column blocks n and n + 1\n"
           "      const unsigned short* vr = &Vb[(j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (lane >> 4) * 8];\n"
           "      #pragma unroll\n"
           "      for (int n = 0; n < DP / 8; n += 2) {\n"
           "        unsigned b0, b1, b2, b3;\n"
           "        ldsm_t4(vr + n * 8, b0, b1, b2, b3);\n"
           "        mma(o[n], a, b0, b1);\n"
           "        mma(o[n + 1], a, b2, b3);\n"
           "      }\n"
           "    }\n"
           "    if (!more) break;\n"
           "    cp_wait();\n"
           "    __syncthreads();\n"
           "  }\n"
           "  #pragma unroll\n"
           "  for (int r = 0; r < 2; ++r) {\n"
           "    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);\n"
           "    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);\n"
           "  }\n"
           "  #pragma unroll\n"
           "  for (int r = 0; r < 2; ++r) {\n"
           "    const long long row = q0 + warp * 16 + g + 8 * r;\n"
           "    if (row >= Sq) continue;\n"
           "    T* orow = out + ((b * Sq + row) * H + h) * D;\n"
           "    const float inv = 1.f / l[r];\n"
           "    #pragma unroll\n"
           "    for (int n = 0; n < DP / 8; ++n) {\n"
           "      const int d = n * 8 + 2 * t;\n" +
           (D % 2 == 0 ? "      if (d < D) *(unsigned*)&orow[d] = pack2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);  // two columns, 4 bytes\n"
                       : "      if (d < D) orow[d] = st(o[n][2 * r] * inv);\n"
                         "      if (d + 1 < D) orow[d + 1] = st(o[n][2 * r + 1] * inv);\n") +
           "    }\n"
           "  }\n"
           "}\n";
    k.source = src;
    return k;
}

/// Every variant of every registered kernel (for the NVRTC compile test).
inline std::vector<KernelText> library_kernel_sources() {
    std::vector<KernelText> out;
    for (std::size_t es : {1, 2, 4, 8}) {
        for (bool i64 : {false, true}) out.push_back(im2col_kernel(es, i64));
        out.push_back(gather_rows_kernel(es));
    }
    for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64})
        for (bool i64 : {false, true}) out.push_back(max_pool_kernel(d, i64));
    for (DType d : {DType::f32, DType::f64})
        for (bool i64 : {false, true}) {
            out.push_back(col2im_kernel(d, i64));
            out.push_back(max_pool_kernel(d, i64, true));
            out.push_back(max_pool_backward_kernel(d, i64));
            // as launched: ResNet's stem pool, its sizes baked in
            const PoolGeometry stem{64, 112, 112, 56, 56, 3, 3, 2, 2, 1, 1, 1, 1};
            out.push_back(max_pool_kernel(d, i64, true, stem));
            out.push_back(max_pool_backward_kernel(d, i64, stem));
        }
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) out.push_back(scale_kernel(d));
    out.push_back(dropout_mask_kernel());
    out.push_back(rng_advance_kernel());
    // attention: each mask kind in f32 (rows) and bf16 (mma), then the other dtypes and edge head dims
    for (int mask : {0, 1, 2}) {
        out.push_back(attention_kernel({DType::f32, 64, mask, DType::f32, false}));
        out.push_back(attention_kernel({DType::bf16, 64, mask, DType::f32, true}));
    }
    out.push_back(attention_kernel({DType::f16, 32, 2, DType::f16, false}));
    out.push_back(attention_kernel({DType::bf16, 8, 1, DType::f32, false}));
    out.push_back(attention_kernel({DType::f16, 40, 2, DType::f16, true}));
    out.push_back(attention_kernel({DType::bf16, 128, 2, DType::bf16, true}));
    out.push_back(attention_kernel({DType::f16, 16, 1, DType::f32, true}));
    out.push_back(attention_kernel({DType::f32, 64, 2, DType::f32, false, true}));
    out.push_back(attention_kernel({DType::bf16, 32, 1, DType::f32, false, true}));
    out.push_back(attention_kernel({DType::bf16, 64, 2, DType::f32, true, true}));
    out.push_back(attention_kernel({DType::f16, 40, 0, DType::f32, true, true}));
    // short sequences: one query warp and 16 keys (a sentence at batch 1), two and 32; a 16-key tile with D = 128
    out.push_back(attention_kernel({DType::bf16, 64, 1, DType::f32, true, true, 1, 16}));
    out.push_back(attention_kernel({DType::f16, 64, 2, DType::f16, true, true, 2, 32}));
    out.push_back(attention_kernel({DType::bf16, 128, 0, DType::f32, true, false, 3, 16}));
    // masks that broadcast over query rows (their terms per key tile in shared memory), bool and additive, odd D
    out.push_back(attention_kernel({DType::bf16, 64, 1, DType::f32, true, true, 4, 0, true}));
    out.push_back(attention_kernel({DType::f16, 40, 2, DType::f32, true, true, 1, 16, true}));
    out.push_back(attention_kernel({DType::bf16, 7, 2, DType::bf16, true, false, 2, 32, true}));
    // small products: each activation with a bias, and each row-tile count, in both dtypes
    for (DType d : {DType::bf16, DType::f16}) {
        for (const ActInfo& a : act_table) {
            const SmallGemmSignature s{d, 1, Epilogue{a.act, true}};
            out.push_back({small_gemm_name(s), small_gemm_source(s, small_gemm_name(s))});
        }
        for (int mt = 2; mt <= 4; ++mt) {
            const SmallGemmSignature s{d, mt, Epilogue{}};
            out.push_back({small_gemm_name(s), small_gemm_source(s, small_gemm_name(s))});
        }
        // more warps for a long k: the most shared memory (32 warps of 2 tiles, 16 of 4)
        for (const SmallGemmSignature& s : {SmallGemmSignature{d, 2, Epilogue{Act::gelu, true}, 32}, SmallGemmSignature{d, 4, Epilogue{}, 16},
                                            SmallGemmSignature{d, 1, Epilogue{}, 16}})
            out.push_back({small_gemm_name(s), small_gemm_source(s, small_gemm_name(s))});
    }
    // the exact gelu after a cuBLASLt product, in each dtype cuBLASLt computes
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16})
        out.push_back({act_pass_name(d, Act::gelu), act_pass_source(d, Act::gelu, act_pass_name(d, Act::gelu))});
    return out;
}

}  // namespace kiln::cuda::detail
