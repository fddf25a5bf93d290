// Matrix products on CUDA through cuBLASLt: row-major batched GEMM with bias/activation epilogues.
#pragma once

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/cuda/driver.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/tables/activations.hpp"

#if defined(KILN_WITH_CUDA) && KILN_WITH_CUDA
#include <cublasLt.h>
#define KILN_CUDA_BLAS_ENABLED 1
#else
#define KILN_CUDA_BLAS_ENABLED 0
#endif

namespace kiln::cuda {

/// What cuBLASLt applies to the product before it is stored: C = act(A @ B + bias). The
/// activations it has are the activation table's `gemm_epilogue` rows (tables/activations.hpp):
/// its GELU is the tanh approximation, 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), i.e.
/// kiln::gelu_tanh; the exact (erf) gelu has none (cuda::matmul applies it in small_gemm.hpp's
/// kernel, or in a pass after cuBLASLt). The bias is a vector over the n output columns, broadcast
/// over rows and batches.
struct Epilogue {
    Act act = Act::none;
    bool bias = false;
    auto operator<=>(const Epilogue&) const = default;
};

/// The epilogue's name, for messages and logs ("bias_relu", "gelu_tanh", "none").
inline std::string epilogue_name(Epilogue e) {
    if (!e.bias) return std::string(act_name(e.act));
    return e.act == Act::none ? "bias" : "bias_" + std::string(act_name(e.act));
}

/// Whether the epilogue reads a bias vector.
constexpr bool epilogue_has_bias(Epilogue e) { return e.bias; }

namespace detail {
inline std::atomic<bool>& allow_tf32_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}
}  // namespace detail

/// Lets f32 matrix products use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): faster, with
/// inputs rounded to 10 mantissa bits. Process-wide, default off (torch.backends.cuda.matmul.allow_tf32).
inline void set_allow_tf32(bool allow) { detail::allow_tf32_flag().store(allow, std::memory_order_relaxed); }

/// Whether f32 matrix products may use TF32 (see set_allow_tf32).
inline bool allow_tf32() { return detail::allow_tf32_flag().load(std::memory_order_relaxed); }

namespace detail {

/// How one row-major operand of a GEMM lies in memory: a (rows, cols) matrix stored row-major
/// (transposed = false: element (i, j) at i*ld + j) or column-major (transposed = true: element
/// (i, j) at i + j*ld, e.g. a `.t()` view), matrices of a batch `batch_stride` elements apart
/// (0: one matrix broadcast over the batch).
struct GemmOperand {
    bool transposed = false;
    std::int64_t ld = 0;
    std::int64_t batch_stride = 0;
    auto operator<=>(const GemmOperand&) const = default;
};

/// A row-major batched product C[b] = epilogue(A[b] @ B[b]) with A (m, k), B (k, n), C (m, n), all
/// of one dtype; f32 computes in f32 (or TF32 when `tf32`), f16/bf16 in f32, f64 in f64. C must be
/// row-major (not transposed). The problem is what the plan cache is keyed by: no pointers.
struct GemmProblem {
    DType dtype = DType::f32;
    std::int64_t m = 0, n = 0, k = 0, batch = 1;
    GemmOperand a, b, c;
    Epilogue epilogue{};
    bool tf32 = false;
    auto operator<=>(const GemmProblem&) const = default;
};

/// The layout of a (rows, cols) matrix with element strides (row_stride, col_stride) as a GEMM
/// operand, or nullopt when it is neither row- nor column-major (no unit stride, a broadcast
/// (stride 0) row or column, overlapping rows): the caller copies such a matrix first.
/// Size-1 dims take any stride. `batch_stride` is passed through (0 for a broadcast batch).
inline std::optional<GemmOperand> gemm_operand(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                               std::int64_t col_stride, std::int64_t batch_stride = 0) {
    if (rows < 1 || cols < 1) return std::nullopt;
    if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols))
        return GemmOperand{false, rows == 1 ? cols : row_stride, batch_stride};
    if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows))
        return GemmOperand{true, cols == 1 ? rows : col_stride, batch_stride};
    return std::nullopt;
}

/// "float32 [3] (33x17 col-major ld 33, batch stride 0) @ (17x65 row-major ld 65) -> (33x65), epilogue bias".
inline std::string describe(const GemmProblem& p) {
    auto mat = [](std::int64_t r, std::int64_t c, const GemmOperand& o, bool batched) {
        std::string s = "(";
        s += std::to_string(r);
        s += 'x';
        s += std::to_string(c);
        s += o.transposed ? " col-major ld " : " row-major ld ";
        s += std::to_string(o.ld);
        if (batched) {
            s += ", batch stride ";
            s += std::to_string(o.batch_stride);
        }
        s += ')';
        return s;
    };
    const bool batched = p.batch > 1;
    std::string s = std::string(dtype_name(p.dtype)) + (p.tf32 ? " (tf32)" : "") + " ";
    if (batched) s += "[batch " + std::to_string(p.batch) + "] ";
    s += mat(p.m, p.k, p.a, batched) + " @ " + mat(p.k, p.n, p.b, batched) + " -> " + mat(p.m, p.n, p.c, batched);
    return s + ", epilogue " + epilogue_name(p.epilogue);
}

/// Checks a problem before it reaches cuBLASLt: a supported dtype (DTypeError), positive sizes,
/// leading dims that cover a row (column), a row-major C, a batch count that fits in int32
/// (InternalError: the tensor-level entry guarantees these). Host-only, never touches a GPU.
inline void check_gemm_problem(const GemmProblem& p) {
    if (p.dtype != DType::f32 && p.dtype != DType::f16 && p.dtype != DType::bf16 && p.dtype != DType::f64)
        throw DTypeError("kiln::cuda::gemm: dtype " + std::string(dtype_name(p.dtype)) +
                         " is not supported by cuBLASLt (float32, float16, bfloat16, float64)");
    auto bad = [&](const std::string& why) { throw InternalError("kiln::cuda::gemm: " + why + " in " + describe(p)); };
    if (p.m < 1 || p.n < 1 || p.k < 1 || p.batch < 1) bad("sizes must be positive");
    if (p.batch > std::numeric_limits<std::int32_t>::max()) bad("batch count over 2^31-1");
    auto check_ld = [&](const GemmOperand& o, std::int64_t rows, std::int64_t cols, const char* name) {
        if (o.ld < (o.transposed ? rows : cols))
            bad(std::string("leading dimension of ") + name + " is smaller than a " + (o.transposed ? "column" : "row"));
        if (o.batch_stride < 0) bad(std::string("negative batch stride of ") + name);
    };
    check_ld(p.a, p.m, p.k, "A");
    check_ld(p.b, p.k, p.n, "B");
    check_ld(p.c, p.m, p.n, "C");
    if (p.c.transposed) bad("C must be row-major");
    if (p.batch > 1 && p.c.batch_stride < p.m * p.c.ld) bad("the matrices of C overlap");
}

/// The alignment in bytes (a power of two, at most 256, cuBLASLt's default requirement) that every
/// matrix of a batch starting at `p`, `batch_stride_bytes` apart, has.
inline std::uint32_t pointer_alignment(const void* p, std::int64_t batch_stride_bytes = 0) {
    std::uint64_t bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)) |
                         static_cast<std::uint64_t>(batch_stride_bytes) | 256u;
    return static_cast<std::uint32_t>(bits & (~bits + 1));  // lowest set bit
}

/// cuBLASLt's workspace per (device, stream): 32 MiB, what NVIDIA recommends for Hopper, unless
/// KILN_CUBLASLT_WORKSPACE_KB says otherwise (read once; 0: only algorithms that need none).
inline std::size_t gemm_workspace_bytes() {
    static const std::size_t bytes = [] {
        const char* e = std::getenv("KILN_CUBLASLT_WORKSPACE_KB");
        return e && *e ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) << 10 : std::size_t{32} << 20;
    }();
    return bytes;
}

#if KILN_CUDA_BLAS_ENABLED

/// Throws DeviceError naming the cuBLASLt call, its status and the problem, unless s is success.
inline void check_blas(cublasStatus_t s, const char* what, const GemmProblem& p) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    const char* name = cublasLtGetStatusName(s);
    const char* text = cublasLtGetStatusString(s);
    const std::string msg = std::string("kiln::cuda::gemm: ") + what + " failed (" + (name ? name : "?") + ": " +
                            (text ? text : "?") + ") for " + describe(p);
    if (s == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(msg);
    throw DeviceError(msg);
}

inline cudaDataType_t blas_data_type(DType d) {
    switch (d) {
        case DType::f16: return CUDA_R_16F;
        case DType::bf16: return CUDA_R_16BF;
        case DType::f64: return CUDA_R_64F;
        default: return CUDA_R_32F;
    }
}

inline cublasComputeType_t blas_compute_type(const GemmProblem& p) {
    if (p.dtype == DType::f64) return CUBLAS_COMPUTE_64F;
    if (p.dtype == DType::f32 && p.tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
    return CUBLAS_COMPUTE_32F;
}

/// cuBLASLt's constant for an epilogue whose activation has a `gemm_epilogue` row.
inline cublasLtEpilogue_t blas_epilogue(Epilogue e) {
    switch (e.act) {
        case Act::none: return e.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        case Act::relu: return e.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
        case Act::gelu_tanh: return e.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
        case Act::gelu: break;
    }
    throw InternalError("kiln: cuBLASLt has no epilogue " + epilogue_name(e) + " (the activation table says which it has)");
}

/// What a problem compiles to: the matrix layouts and the heuristic's algorithm. Built once per
/// (problem, alignments), immutable afterwards, so threads share it without a lock.
struct GemmPlan {
    // cuBLASLt is column-major: the row-major C = A @ B is computed as C^T = B^T @ A^T, so
    // cuBLASLt's "A" is our B, its "B" our A, and its D (n x m, column-major) is our C.
    cublasLtMatrixLayoutOpaque_t lt_a{}, lt_b{}, lt_d{};
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    cublasLtMatmulAlgo_t algo{};
    bool workspace = true;  ///< false: the algorithm was chosen without a workspace and runs without one
};

/// The plan cache key: the problem plus the pointer alignments the algorithm was chosen for, and
/// whether it was chosen by the heuristic alone (off) or by timing, for graphs or for launches.
struct GemmKey {
    GemmProblem problem;
    std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0;
    kiln::detail::Autotune tuned = kiln::detail::Autotune::off;
    auto operator<=>(const GemmKey&) const = default;
};

/// One stream's cuBLASLt workspace. A product may queue several kernels that share it (split-K
/// partials, then their reduction), so products on one stream are queued one at a time under
/// `launch`: two threads' kernels interleaved on the stream would overwrite each other's partials.
struct GemmWorkspace {
    CUdeviceptr ptr = 0;
    std::mutex launch;
};

/// cuBLASLt state of one device: the handle, workspaces per stream and the plan cache.
struct BlasState {
    std::mutex mutex;  ///< guards the handle's creation and both maps (not the launches)
    cublasLtHandle_t handle = nullptr;
    std::map<CUstream, GemmWorkspace> workspaces;  // nodes are stable: a workspace never moves
    std::map<GemmKey, std::unique_ptr<GemmPlan>> plans;  // never changed once made
};

/// The cuBLASLt state of device `index` (the handle, workspaces and plans live as long as the process:
/// freeing them during static destruction could outlive the driver).
inline BlasState& blas_state(int index) {
    static std::array<BlasState, max_devices> states;
    return states[static_cast<std::size_t>(index)];
}

/// A matmul descriptor for p: compute and scale types, transposes, epilogue, bias pointer.
inline void init_matmul_desc(cublasLtMatmulDescOpaque_t& desc, const GemmProblem& p, cublasOperation_t op_a,
                             cublasOperation_t op_b, const void* bias) {
    const cudaDataType_t scale = p.dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
    check_blas(cublasLtMatmulDescInit(&desc, blas_compute_type(p), scale), "cublasLtMatmulDescInit", p);
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value, const char* what) {
        check_blas(cublasLtMatmulDescSetAttribute(&desc, attr, &value, sizeof value), what, p);
    };
    const std::int32_t ta = op_a, tb = op_b;
    set(CUBLASLT_MATMUL_DESC_TRANSA, ta, "cublasLtMatmulDescSetAttribute(TRANSA)");
    set(CUBLASLT_MATMUL_DESC_TRANSB, tb, "cublasLtMatmulDescSetAttribute(TRANSB)");
    const std::uint32_t epi = blas_epilogue(p.epilogue);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (epilogue_has_bias(p.epilogue)) {
        set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
        const std::int64_t bias_batch_stride = 0;  // one bias for every matrix of the batch
        set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride, "cublasLtMatmulDescSetAttribute(BIAS_BATCH_STRIDE)");
    }
}

/// Initialises a column-major layout (rows x cols, ld) with p.batch matrices batch_stride apart.
inline void init_layout(cublasLtMatrixLayoutOpaque_t& l, const GemmProblem& p, std::int64_t rows, std::int64_t cols,
                        std::int64_t ld, std::int64_t batch_stride) {
    check_blas(cublasLtMatrixLayoutInit(&l, blas_data_type(p.dtype), static_cast<std::uint64_t>(rows),
                                        static_cast<std::uint64_t>(cols), ld),
               "cublasLtMatrixLayoutInit", p);
    const std::int32_t count = static_cast<std::int32_t>(p.batch);
    check_blas(cublasLtMatrixLayoutSetAttribute(&l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
               "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", p);
    const std::int64_t stride = p.batch > 1 ? batch_stride : 0;
    check_blas(cublasLtMatrixLayoutSetAttribute(&l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
               "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", p);
}

inline std::vector<cublasLtMatmulHeuristicResult_t> gemm_heuristic(cublasLtHandle_t handle, const GemmKey& key, GemmPlan& plan,
                                                                   const void* bias, int count, std::uint64_t workspace_bytes);

/// The plan's layouts and transposes for the key's problem (no algorithm yet).
inline std::unique_ptr<GemmPlan> gemm_layouts(const GemmKey& key) {
    const GemmProblem& p = key.problem;
    auto plan = std::make_unique<GemmPlan>();
    // cuBLASLt A = our B (k x n): row-major B is the column-major n x k matrix B^T (no op);
    // column-major B is the column-major k x n matrix B, transposed by the op.
    plan->op_a = p.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    init_layout(plan->lt_a, p, p.b.transposed ? p.k : p.n, p.b.transposed ? p.n : p.k, p.b.ld, p.b.batch_stride);
    // cuBLASLt B = our A (m x k), likewise.
    plan->op_b = p.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    init_layout(plan->lt_b, p, p.a.transposed ? p.m : p.k, p.a.transposed ? p.k : p.m, p.a.ld, p.a.batch_stride);
    init_layout(plan->lt_d, p, p.n, p.m, p.c.ld, p.c.batch_stride);
    return plan;
}

/// One configuration attribute of an algorithm (T: the attribute's type, which cuBLASLt checks); -1
/// where it cannot be read.
template <class T>
std::int64_t algo_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    T v{};
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return -1;
    return static_cast<std::int64_t>(v);
}

/// Whether a heuristic choice that needs a workspace is swapped for its twin that needs none (the
/// same tile, stages, split-k and cluster shape). cuBLASLt's Hopper kernels with a dynamic tile
/// scheduler need a few bytes of workspace zeroed by a memset before each launch: in a CUDA graph
/// that memset is a node of its own, and on the H200 each cost ~2.5 us of gaps around it on one
/// GPU and ~5 us beside NCCL on two (the BERT layer's training step at 32 x 128: 8 such GEMMs,
/// 927 -> 901 us on one GPU, 1013 -> 965 us on two; see docs/ARCHITECTURE.md). On unless
/// KILN_CUBLASLT_NO_WORKSPACE=0.
inline bool prefer_no_workspace_twin() {
    static const bool on = [] {
        const char* e = std::getenv("KILN_CUBLASLT_NO_WORKSPACE");
        return !(e && std::string_view(e) == "0");
    }();
    return on;
}

/// Builds the layouts and asks the heuristic for the best algorithm under the key's alignments
/// (or its twin without a workspace, prefer_no_workspace_twin).
inline std::unique_ptr<GemmPlan> make_gemm_plan(cublasLtHandle_t handle, const GemmKey& key, const void* bias) {
    std::unique_ptr<GemmPlan> plan = gemm_layouts(key);
    const cublasLtMatmulHeuristicResult_t first = gemm_heuristic(handle, key, *plan, bias, 1, gemm_workspace_bytes()).front();
    plan->algo = first.algo;
    if (first.workspaceSize == 0 || !prefer_no_workspace_twin()) return plan;
    const auto shape = [](const cublasLtMatmulAlgo_t& a) {
        return std::array<std::int64_t, 4>{algo_attribute<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                                           algo_attribute<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                                           algo_attribute<std::int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                                           algo_attribute<std::uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)};
    };
    std::vector<cublasLtMatmulHeuristicResult_t> none;
    try {
        none = gemm_heuristic(handle, key, *plan, bias, 1, 0);
    } catch (const DeviceError&) {  // no algorithm without a workspace: keep the first
    }
    const bool twin = !none.empty() && shape(none[0].algo) == shape(first.algo);
    if (twin) {
        plan->algo = none[0].algo;
        plan->workspace = false;
    }
    if (debug::log_on("gemm"))
        debug::log("gemm", describe(key.problem) + ": the heuristic's first needs " + std::to_string(first.workspaceSize) + " B of workspace; " +
                               (twin ? "its twin without one runs instead" : "no twin without one: kept"));
    return plan;
}

/// Queues C = epilogue(A @ B) with `algo` under a descriptor made for the plan (desc carries the
/// bias pointer): cuBLASLt's A is our B and its B our A; C and D are both our C. The one call of
/// cublasLtMatmul, for gemm and for max_autotune's timed runs.
inline cublasStatus_t run_gemm(cublasLtHandle_t handle, cublasLtMatmulDescOpaque_t& desc, const GemmProblem& p, GemmPlan& plan,
                               const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* c, CUdeviceptr workspace,
                               CUstream stream) {
    static const float one_f = 1.0f, zero_f = 0.0f;
    static const double one_d = 1.0, zero_d = 0.0;
    const void* alpha = p.dtype == DType::f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
    const void* beta = p.dtype == DType::f64 ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
    after_library(stream);
    return cublasLtMatmul(handle, &desc, alpha, b, &plan.lt_a, a, &plan.lt_b, beta, c,
                          &plan.lt_d, c, &plan.lt_d, &algo, plan.workspace ? reinterpret_cast<void*>(workspace) : nullptr,
                          plan.workspace ? gemm_workspace_bytes() : 0,
                          reinterpret_cast<cudaStream_t>(stream));
}

/// What cuBLASLt's heuristic ranks first for the key (best first, at most `count`, each one's state
/// a success); throws DeviceError when it has none.
inline std::vector<cublasLtMatmulHeuristicResult_t> gemm_heuristic(cublasLtHandle_t handle, const GemmKey& key, GemmPlan& plan,
                                                                   const void* bias, int count, std::uint64_t workspace_bytes) {
    const GemmProblem& p = key.problem;
    cublasLtMatmulDescOpaque_t desc;
    init_matmul_desc(desc, p, plan.op_a, plan.op_b, bias);
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", p);
    struct PrefGuard {
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
    } guard{pref};
    auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value, const char* what) {
        check_blas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value), what, p);
    };
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    // cuBLASLt's A is our B and its B our A; C and D are both our C.
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D)");

    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
    int found = 0;
    check_blas(cublasLtMatmulAlgoGetHeuristic(handle, &desc, &plan.lt_a, &plan.lt_b, &plan.lt_d, &plan.lt_d, pref, count,
                                              results.data(), &found),
               "cublasLtMatmulAlgoGetHeuristic", p);
    results.resize(static_cast<std::size_t>(std::max(found, 0)));
    std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
    if (results.empty())
        throw DeviceError("kiln::cuda::gemm: cuBLASLt has no algorithm for " + describe(p) + " (alignments A " +
                          std::to_string(key.align_a) + ", B " + std::to_string(key.align_b) + ", C " +
                          std::to_string(key.align_c) + " bytes)");
    return results;
}

/// max_autotune's plan for a key: the heuristic's top candidates (up to 16, split-K ones among
/// them) timed on this call's operands on `stream` (medians of 15 runs each after L2 is flushed,
/// and of 15 runs back to back; for Autotune::launches a run costs at least the host's time to
/// queue it, which is what a call without CUDA graphs pays where the GPU outruns the host); the
/// heuristic's first is kept unless another is no slower both ways and 3% faster one way, and the
/// choice is remembered in the disk cache under the key, the GPU and
/// cuBLASLt's version, so that another process reads it instead of timing. The stream is
/// synchronized while timing (this runs in a first call, never during a graph capture); c is
/// overwritten. Defined in blas_impl.hpp.
/// What a tuned choice depends on, as text (the problem, the alignments, the GPU, cuBLASLt's
/// version: an algorithm is valid only for the version that made it), and the disk entry that
/// remembers it: <cache dir>/autotune/gemm-<hash of the text>.txt, holding the text, the algorithm
/// (8 words in hex) and its time. An entry is used only where its text matches exactly.
KILN_DECL std::string gemm_tune_key_text(const GemmKey& key, int device);
KILN_DECL std::string tuned_gemm_file(const std::string& key_text);
/// The algorithm the entry at `file` holds for `key_text`; nullopt where there is no entry, it
/// names another key, or it is malformed (it is then timed again and overwritten).
KILN_DECL std::optional<cublasLtMatmulAlgo_t> read_tuned_algo(const std::string& file, const std::string& key_text);
KILN_DECL std::unique_ptr<GemmPlan> tune_gemm_plan(cublasLtHandle_t handle, const GemmKey& key, const void* a, const void* b, void* c,
                                                   const void* bias, int device, CUstream stream, GemmWorkspace& workspace);

#endif  // KILN_CUDA_BLAS_ENABLED

/// Runs C[b] = epilogue(A[b] @ B[b] (+ bias)) for the row-major problem p on device `device`, queued
/// on `stream`. a, b, c (and bias: p.n elements of p.dtype, when the epilogue has one) are device
/// pointers on that device. Thread-safe; the first call per device creates its cuBLASLt handle, the
/// first per stream its workspace, the first per (problem, alignments) its plan.
inline void gemm(const GemmProblem& p, const void* a, const void* b, void* c, const void* bias, int device,
                 CUstream stream) {
    check_gemm_problem(p);
#if KILN_CUDA_BLAS_ENABLED
    if (epilogue_has_bias(p.epilogue) && bias == nullptr)
        throw InternalError("kiln::cuda::gemm: epilogue " + epilogue_name(p.epilogue) +
                            " needs a bias pointer (" + describe(p) + ")");
    use_device(device, "cuda::gemm");
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
    const bool batched = p.batch > 1;
    // max_autotune times a new problem's candidates, never while a graph is captured (nothing may
    // wait for the device then): a capture uses the plan its first call tuned, else the heuristic's
    GemmKey key{p,
                pointer_alignment(a, batched ? p.a.batch_stride * es : 0),
                pointer_alignment(b, batched ? p.b.batch_stride * es : 0),
                pointer_alignment(c, batched ? p.c.batch_stride * es : 0),
                epilogue_has_bias(p.epilogue) ? pointer_alignment(bias) : 0u,
                kiln::detail::autotune_active()};
    BlasState& s = blas_state(device);
    GemmPlan* plan = nullptr;  // cuBLASLt takes non-const layouts but only reads them
    GemmWorkspace* workspace = nullptr;
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.handle) check_blas(cublasLtCreate(&s.handle), "cublasLtCreate", p);
        auto ws = s.workspaces.find(stream);
        if (ws == s.workspaces.end()) {
            CUdeviceptr ptr = 0;
            if (gemm_workspace_bytes() > 0) check(driver().mem_alloc(&ptr, gemm_workspace_bytes()), "cuMemAlloc (cuBLASLt workspace)");
            ws = s.workspaces.try_emplace(stream).first;
            ws->second.ptr = ptr;
        }
        workspace = &ws->second;
        auto it = s.plans.find(key);
        const bool tuned = key.tuned != kiln::detail::Autotune::off;
        if (it == s.plans.end() && tuned && capturing(stream)) {
            key.tuned = kiln::detail::Autotune::off;  // not tuned before the capture: the heuristic's plan
            it = s.plans.find(key);
        }
        if (it == s.plans.end())
            it = s.plans.emplace(key, key.tuned != kiln::detail::Autotune::off ? tune_gemm_plan(s.handle, key, a, b, c, bias, device, stream, *workspace)
                                                : make_gemm_plan(s.handle, key, bias)).first;
        plan = it->second.get();
    }
    // The descriptor carries this call's bias pointer, so it is made per call (on the stack, cheap).
    cublasLtMatmulDescOpaque_t desc;
    init_matmul_desc(desc, p, plan->op_a, plan->op_b, bias);
    std::lock_guard<std::mutex> launch(workspace->launch);  // only queues the kernels: microseconds
    check_blas(run_gemm(s.handle, desc, p, *plan, plan->algo, a, b, c, workspace->ptr, stream), "cublasLtMatmul", p);
#else
    (void)a, (void)b, (void)c, (void)bias, (void)device, (void)stream;
    throw DeviceError("kiln::cuda::gemm: kiln was built without the CUDA toolkit (cuBLASLt); cannot run " + describe(p));
#endif
}

}  // namespace detail
}  // namespace kiln::cuda

#if KILN_HEADER_ONLY && KILN_CUDA_BLAS_ENABLED
#include "kiln/backends/cuda/blas_impl.hpp"
#endif

#undef KILN_CUDA_BLAS_ENABLED
