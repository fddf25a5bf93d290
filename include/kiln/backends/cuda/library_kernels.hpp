// The registry of kiln's hand-written CUDA kernels: the library kernels that are not generated from
// the op table by codegen.hpp (elementwise, row, reduce) or index_ops.hpp (gather, scatter,
// scatter_add, index_select). Each is a function from its parameters to the kernel's text; the
// callers (nn/conv.hpp, gather.hpp) only launch. library_kernel_sources() lists every variant, so
// the NVRTC compile test (tests/test_cuda_codegen.cpp) builds each without a GPU.
//   im2col_kernel       conv2d's patch matrix (channels-last input), any element size
//   max_pool_kernel     max_pool2d, one thread per output, NaN wins, padding never does
//   gather_rows_kernel  embedding lookups: rows of a table by int64 id
//   col2im_kernel       the gradient of im2col: each input element sums the columns that read it
//   dropout_mask_kernel dropout's keep mask from Philox4x32-10, counters read from a device offset
//   rng_advance_kernel  moves that device offset on (a second launch, so every block read it first)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kiln/backends/cuda/codegen.hpp"
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

/// max_pool2d of x (N, H, W, C; any strides) into y (N, OH, OW, C; contiguous), one thread per
/// output element, channels fastest. dtype: one pool_ctype takes. i64: 64-bit index math.
inline KernelText max_pool_kernel(DType dtype, bool i64) {
    const char* T = pool_ctype(dtype);
    const char* I = i64 ? "long long" : "int";
    const std::string lowest = dtype == DType::f32   ? "__int_as_float(0xff800000)"
                               : dtype == DType::f64 ? "__longlong_as_double(0xfff0000000000000LL)"
                               : dtype == DType::i32 ? "(-2147483647 - 1)"
                                                         : "(-9223372036854775807LL - 1)";
    KernelText k;
    k.name = "kiln_max_pool_" + std::string(dtype_name(dtype)) + (i64 ? "_i64" : "_i32");
    k.source = std::string("typedef ") + I + " I;\ntypedef " + T + " T;\nextern \"C\" __global__ void " + k.name +
               "(const T* __restrict__ x, T* __restrict__ y, long long total_, long long C_, long long H_, long long W_, "
               "long long sN_, long long sH_, long long sW_, long long sC_, long long OH_, long long OW_, long long KH_, long long KW_, "
               "long long SH_, long long SW_, long long PH_, long long PW_, long long DH_, long long DW_) {\n"
               "  const I total = (I)total_, C = (I)C_, H = (I)H_, W = (I)W_, sN = (I)sN_, sH = (I)sH_, sW = (I)sW_, sC = (I)sC_;\n"
               "  const I OH = (I)OH_, OW = (I)OW_, KH = (I)KH_, KW = (I)KW_, SH = (I)SH_, SW = (I)SW_, PH = (I)PH_, PW = (I)PW_;\n"
               "  const I DH = (I)DH_, DW = (I)DW_;\n"
               "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {\n"
               "    const I c = i % C, r = i / C, ow = r % OW, r2 = r / OW, oh = r2 % OH, n = r2 / OH;\n"
               "    const T* base = x + n * sN + c * sC;\n"
               "    T m = " + lowest + ";\n"
               "    for (I a = 0; a < KH; ++a) {\n"
               "      const I h = oh * SH - PH + a * DH;\n"
               "      if (h < 0 || h >= H) continue;\n"
               "      for (I b = 0; b < KW; ++b) {\n"
               "        const I w = ow * SW - PW + b * DW;\n"
               "        if (w < 0 || w >= W) continue;\n"
               "        const T v = base[h * sH + w * sW];\n"
               "        if (v > m || v != v) m = v;\n"
               "      }\n"
               "    }\n"
               "    y[i] = m;\n"
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
        for (bool i64 : {false, true}) out.push_back(col2im_kernel(d, i64));
    out.push_back(dropout_mask_kernel());
    out.push_back(rng_advance_kernel());
    return out;
}

}  // namespace kiln::cuda::detail
