// Matrix products with few rows on CUDA tensor cores: C = act(A @ B + bias) for up to
// small_gemm_max_m() rows (16 by default, 64 at most) of f16/bf16 with B column-major (x @ W^T,
// nn::Linear's layout): batch-1 inference and decoding, where a product reads each weight once.
// cuBLASLt's tiles cover such an m with few blocks (bert-base's 768 x 2304 weight at 8 tokens: 36
// blocks of 64 columns on 132 multiprocessors); this kernel gives every 8 columns a block, applies
// any activation of the table in its epilogue (the exact gelu too, which cuBLASLt lacks), and on
// sm_90 prefetches its weights to L2 before waiting for the kernel before it (PDL). Measured on
// the H100 (bench/results/h100_2026-11-28_small_gemm_pdl): bert-base's four weights at 8 rows
// stream at 862 GB/s against cuBLASLt's 767, both far from the copy rate: one DRAM round trip and
// a launch per product bound them at these sizes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/backends/cuda/blas.hpp"
#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/kernel_cache.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/tables/activations.hpp"

namespace kiln::cuda::detail {

/// What a small-GEMM kernel's text depends on: the dtype (f16, bf16), tiles of 16 rows (1..4), the
/// epilogue, and the warps of a block (8, 16 or 32: small_gemm_warps).
struct SmallGemmSignature {
    DType dtype = DType::bf16;
    int mtiles = 1;
    Epilogue epilogue{};
    int warps = 8;
    std::string key() const {
        return std::string(dtype_name(dtype)) + "_mt" + std::to_string(mtiles) + "_" + epilogue_name(epilogue) +
               (warps != 8 ? "_w" + std::to_string(warps) : std::string());
    }
};

/// The warps of a block for a product over k with `mtiles` tiles of 16 rows: one per 3 pieces of
/// 32 k's (KILN_CUDA_SMALL_GEMM_PIECES at start-up, 1-8), from 8 up to 32 (16 with 3 or 4 tiles:
/// the partial sums' shared memory). A block has only 8 columns, so a long k (bert-base's 3072 ->
/// 768 at 8 tokens: 96 blocks of 96 pieces) is otherwise a long chain of loads in few warps per
/// multiprocessor. Measured on the H200 (bert-base bf16 at batch 1, us a forward, 2026-11-29): 3
/// pieces a warp 253.5-254.9, 2 (16 warps at k = 768) 305-307, 1 403-405, 6 or 8 (16 warps for
/// the 3072-long k) 263.
inline int small_gemm_warps(std::int64_t k, int mtiles) {
    static const int per_warp = [] {
        const char* e = std::getenv("KILN_CUDA_SMALL_GEMM_PIECES");
        return e ? std::clamp(std::atoi(e), 1, 8) : 3;
    }();
    const std::int64_t pieces = (k + 31) / 32;
    const int w = pieces <= 8 * per_warp ? 8 : pieces <= 16 * per_warp ? 16 : 32;
    return std::min(w, mtiles <= 2 ? 32 : 16);
}

/// The largest m the small kernel takes: KILN_CUDA_SMALL_GEMM_M at start-up (0 turns it off; at
/// most 64), else 16. Settable (the bench compares both paths in one process).
inline std::atomic<std::int64_t>& small_gemm_limit() {
    static std::atomic<std::int64_t> m{[] {
        const char* e = std::getenv("KILN_CUDA_SMALL_GEMM_M");
        return e ? std::clamp<std::int64_t>(std::atoll(e), 0, 64) : std::int64_t{16};
    }()};
    return m;
}
inline std::int64_t small_gemm_max_m() { return small_gemm_limit().load(std::memory_order_relaxed); }

/// How many products the small kernel has run in this process (tests check which path ran).
inline std::atomic<std::int64_t>& small_gemm_launches() {
    static std::atomic<std::int64_t> n{0};
    return n;
}

/// ld (to f32) and st (from f32, rounded to nearest even) for T = unsigned short holding f16 or bf16 bits.
inline std::string half_conversions(DType dtype) {
    return dtype == DType::bf16
               ? "__device__ __forceinline__ float ld(T x) { return __uint_as_float(((unsigned)x) << 16); }\n"
                 "__device__ __forceinline__ T st(float x) { unsigned short r; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(x)); return r; }\n"
               : "__device__ __forceinline__ float ld(T x) { float r; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(r) : \"h\"(x)); return r; }\n"
                 "__device__ __forceinline__ T st(float x) { unsigned short r; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(x)); return r; }\n";
}

/// `x = act(x);` for a variable x of type F (float or double), NaN passing through; empty for none.
inline std::string act_statement(Act a, const std::string& F) {
    const std::string f = F == "float" ? "f" : "";
    switch (a) {
        case Act::none: return "";
        case Act::relu: return "    x = (x > (" + F + ")0 || x != x) ? x : (" + F + ")0;\n";
        case Act::gelu_tanh:
            return "    x = (" + F + ")0.5 * x * ((" + F + ")1 + tanh" + f + "((" + F + ")0.7978845608028654 * (x + (" + F +
                   ")0.044715 * x * x * x)));\n";
        case Act::gelu: return "    x = (" + F + ")0.5 * x * ((" + F + ")1 + erf" + f + "(x * (" + F + ")0.7071067811865476));\n";
    }
    return "";
}

/// The activation applied in place to n contiguous elements of `dtype` (f32, f64, f16, bf16), in
/// f32 (f64 for f64): the first nv 16-byte vectors a vector per thread and step (nv = 0 where the
/// address is not 16-byte aligned), the rest one by one: the exact gelu after a cuBLASLt product,
/// which has no such epilogue.
inline std::string act_pass_source(DType dtype, Act a, const std::string& name) {
    std::string src;
    if (dtype == DType::f64) src = "typedef double T;\n__device__ __forceinline__ double ld(T x) { return x; }\n__device__ __forceinline__ T st(double x) { return x; }\n";
    else if (dtype == DType::f32) src = "typedef float T;\n__device__ __forceinline__ float ld(T x) { return x; }\n__device__ __forceinline__ T st(float x) { return x; }\n";
    else src = std::string("typedef unsigned short T;\n") + half_conversions(dtype);
    const std::string F = dtype == DType::f64 ? "double" : "float";
    const std::string V = std::to_string(16 / dtype_size(dtype));  // elements per 16 bytes
    return src + "extern \"C\" __global__ void " + name + "(T* __restrict__ p, long long n, long long nv) {\n"
                 "  constexpr int V = " + V + ";\n"
                 "  const long long step = (long long)gridDim.x * blockDim.x;\n"
                 "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += step) {\n"
                 "    uint4 w = ((const uint4*)p)[i];\n"
                 "    T* e = (T*)&w;\n"
                 "    #pragma unroll\n"
                 "    for (int u = 0; u < V; ++u) {\n"
                 "      " + F + " x = ld(e[u]);\n" + act_statement(a, F) + "      e[u] = st(x);\n"
                 "    }\n"
                 "    ((uint4*)p)[i] = w;\n"
                 "  }\n"
                 "  for (long long i = nv * V + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
                 "    " + F + " x = ld(p[i]);\n" + act_statement(a, F) + "    p[i] = st(x);\n  }\n}\n";
}

/// The in-place activation pass's kernel name.
inline std::string act_pass_name(DType dtype, Act a) { return "kiln_act_pass_" + std::string(dtype_name(dtype)) + "_" + std::string(act_name(a)); }

/// C (m, n) row-major = act(A (m, k) row-major @ B + bias), B column-major: element (k, n) at
/// W[n * ldw + k], i.e. the rows of W (n, k) are B's columns. Block = s.warps warps and 8 columns
/// of C; each warp takes every s.warps-th 32-long piece of k and multiplies it by m16n8k16 MMAs (f32
/// accumulators), a lane's 16-byte loads of A and of W holding the same 8 k's (the MMA sums over
/// k, so the lanes' k's may be any permutation shared by both operands); the warps' partial sums
/// meet in shared memory, where the epilogue adds the bias, applies the activation and rounds.
/// Needs k % 8 == 0 and A, W 16-byte aligned with lda, ldw multiples of 8 (small_gemm_takes).
inline std::string small_gemm_source(const SmallGemmSignature& s, const std::string& name) {
    const bool bf = s.dtype == DType::bf16;
    std::string src = "typedef unsigned short T;\n" + half_conversions(s.dtype);
    const std::string mma = std::string("mma.sync.aligned.m16n8k16.row.col.f32.") + (bf ? "bf16.bf16" : "f16.f16") + ".f32";
    src += "__device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {\n"
           "  asm volatile(\"" + mma + " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n"
           "               : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1));\n"
           "}\n";
    const std::string act = act_statement(s.epilogue.act, "float");
    src += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(32 * s.warps) + ") " + name +
           "(const T* __restrict__ A, const T* __restrict__ W, T* __restrict__ C, const T* __restrict__ bias,\n"
           "    long long M, long long N, long long K, long long lda, long long ldw, long long ldc) {\n"
           "  constexpr int WARPS = " + std::to_string(s.warps) + ", MT = " + std::to_string(s.mtiles) + ", U = MT == 1 ? 8 : MT == 2 ? 4 : 2;\n"
           "  __shared__ float red[WARPS][MT * 16][9];\n"
           "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
           "  const long long n0 = (long long)blockIdx.x * 8, n = n0 + g;\n"
           "  const T* wr = W + (n < N ? n : N - 1) * ldw + 8 * t;  // columns past N read the last one, never stored\n"
           "  const T* ar = A + 8 * t;\n"
           "#if __CUDA_ARCH__ >= 900\n"
           "  // launched for PDL (driver.hpp): the block's weight rows start on their way to L2\n"
           "  // while the kernel before this one finishes (a prefetch reads nothing into registers: if that\n"
           "  // kernel writes them, the loads after the wait see its values), then the wait\n"
           "  {\n"
           "    const long long lines = (K * 2 + 127) / 128;\n"
           "    for (long long i = threadIdx.x; i < 8 * lines; i += WARPS * 32) {\n"
           "      const long long r = n0 + i / lines;\n"
           "      if (r < N) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"((const char*)(W + r * ldw) + (i % lines) * 128));\n"
           "    }\n"
           "  }\n"
           "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
           "  if (gridDim.x <= 512) asm volatile(\"griddepcontrol.launch_dependents;\");\n"
           "#endif\n"
           "  const uint4 z = make_uint4(0u, 0u, 0u, 0u);\n"
           "  float acc[MT][4];\n"
           "  #pragma unroll\n"
           "  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;\n"
           "  const long long chunks = (K + 31) >> 5;\n"
           "  for (long long c0 = warp; c0 < chunks; c0 += WARPS * U) {\n"
           "    // every load of the round (W's and A's) issued before the first product needs one: one\n"
           "    // round trip to L2 per round, not one per piece of A\n"
           "    uint4 w[U], a[U][MT][2];\n"
           "    #pragma unroll\n"
           "    for (int u = 0; u < U; ++u) {\n"
           "      const long long c = c0 + u * WARPS;\n"
           "      const bool in = c < chunks && c * 32 + 8 * t < K;\n"
           "      w[u] = in ? __ldg((const uint4*)(wr + c * 32)) : z;\n"
           "      #pragma unroll\n"
           "      for (int mt = 0; mt < MT; ++mt) {\n"
           "        const int r0 = mt * 16 + g, r1 = r0 + 8;\n"
           "        a[u][mt][0] = in && r0 < M ? *(const uint4*)(ar + r0 * lda + c * 32) : z;\n"
           "        a[u][mt][1] = in && r1 < M ? *(const uint4*)(ar + r1 * lda + c * 32) : z;\n"
           "      }\n"
           "    }\n"
           "    #pragma unroll\n"
           "    for (int u = 0; u < U; ++u)\n"
           "      #pragma unroll\n"
           "      for (int mt = 0; mt < MT; ++mt) {\n"
           "        const uint4 a0 = a[u][mt][0], a1 = a[u][mt][1];\n"
           "        mma(acc[mt], a0.x, a1.x, a0.y, a1.y, w[u].x, w[u].y);\n"
           "        mma(acc[mt], a0.z, a1.z, a0.w, a1.w, w[u].z, w[u].w);\n"
           "      }\n"
           "  }\n"
           "  #pragma unroll\n"
           "  for (int mt = 0; mt < MT; ++mt) {\n"
           "    red[warp][mt * 16 + g][2 * t] = acc[mt][0]; red[warp][mt * 16 + g][2 * t + 1] = acc[mt][1];\n"
           "    red[warp][mt * 16 + g + 8][2 * t] = acc[mt][2]; red[warp][mt * 16 + g + 8][2 * t + 1] = acc[mt][3];\n"
           "  }\n"
           "  __syncthreads();\n"
           "  for (int i = threadIdx.x; i < MT * 16 * 8; i += WARPS * 32) {\n"
           "    const int r = i >> 3, j = i & 7;\n"
           "    const long long col = n0 + j;\n"
           "    if (r >= M || col >= N) continue;\n"
           "    float x = 0.f;\n"
           "    #pragma unroll\n"
           "    for (int v = 0; v < WARPS; ++v) x += red[v][r][j];\n" +
           (s.epilogue.bias ? "    x += ld(bias[col]);\n" : "") + act +
           "    C[r * ldc + col] = st(x);\n"
           "  }\n"
           "}\n";
    return src;
}

/// The kernel's name for a signature.
inline std::string small_gemm_name(const SmallGemmSignature& s) { return "kiln_small_gemm_" + s.key(); }

/// Whether the small kernel takes problem p with these pointers on a device of compute capability
/// `arch`: f16/bf16, one matrix, 1 <= m <= small_gemm_max_m(), A row-major and B column-major with
/// 16-byte aligned rows (k % 8 == 0), sm_80 or newer. Otherwise cuBLASLt runs it.
inline bool small_gemm_takes(const GemmProblem& p, const void* a, const void* b, int arch) {
    auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    return (p.dtype == DType::bf16 || p.dtype == DType::f16) && arch >= 80 && p.batch == 1 && p.m >= 1 &&
           p.m <= small_gemm_max_m() && p.k % 8 == 0 && !p.a.transposed && p.b.transposed && !p.c.transposed &&
           p.a.ld % 8 == 0 && p.b.ld % 8 == 0 && aligned(a) && aligned(b) && (p.n + 7) / 8 <= 0x7fffffff;
}

/// The loaded kernel `name` on a device, its source made by make(name) only the first time.
template <class MakeSource>
CUfunction named_function(const std::string& name, int device, MakeSource&& make) {
    static std::mutex mu;
    static std::unordered_map<std::string, CUfunction> made;
    std::lock_guard lock(mu);
    CUfunction& slot = made[std::to_string(device) + "/" + name];
    if (!slot) slot = kernel_function(name, make(name), device);
    return slot;
}

/// Queues the small kernel for p (small_gemm_takes) on `stream`: C = epilogue(A @ B (+ bias)).
inline void run_small_gemm(const GemmProblem& p, const void* a, const void* b, void* c, const void* bias, int device,
                           CUstream stream) {
    const int mtiles = static_cast<int>((p.m + 15) / 16);
    const SmallGemmSignature s{p.dtype, mtiles, p.epilogue, small_gemm_warps(p.k, mtiles)};
    const CUfunction f = named_function(small_gemm_name(s), device, [&](const std::string& name) { return small_gemm_source(s, name); });
    std::int64_t m = p.m, n = p.n, k = p.k, lda = p.a.ld, ldw = p.b.ld, ldc = p.c.ld;
    const void* bias_ptr = bias;
    void* args[] = {&a, &b, &c, &bias_ptr, &m, &n, &k, &lda, &ldw, &ldc};
    launch(f, static_cast<unsigned>((p.n + 7) / 8), static_cast<unsigned>(32 * s.warps), 0, stream, args);
    small_gemm_launches().fetch_add(1, std::memory_order_relaxed);
}

/// Queues the activation in place over n contiguous elements of `dtype` at p on `stream`.
inline void run_act_pass(DType dtype, Act a, void* p, std::int64_t n, int device, CUstream stream) {
    if (a == Act::none || n == 0) return;
    const CUfunction f = named_function(act_pass_name(dtype, a), device,
                                        [&](const std::string& name) { return act_pass_source(dtype, a, name); });
    void* ptr = p;
    const std::int64_t per_vector = 16 / static_cast<std::int64_t>(dtype_size(dtype));
    std::int64_t nv = reinterpret_cast<std::uintptr_t>(p) % 16 == 0 ? n / per_vector : 0;
    void* args[] = {&ptr, &n, &nv};
    const std::int64_t work = nv + (n - nv * per_vector);
    launch(f, static_cast<unsigned>(std::clamp<std::int64_t>((work + 255) / 256, 1, std::int64_t{properties(device).sm_count} * 16)),
           256, 0, stream, args);
}

}  // namespace kiln::cuda::detail
