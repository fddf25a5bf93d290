// Convolutions through cuDNN where it is present: loaded at run time with dlopen (libcudnn.so.9,
// then .8), so kiln builds and runs without it; conv2d falls back to im2col + cuBLASLt when it is
// missing, turned off (KILN_CUDNN=0), or refuses a configuration.
//
// Only cuDNN's stable C ABI is used (the "legacy" convolution API of cuDNN 8 and 9), declared here
// from its documented signatures and enum values, so no cuDNN headers are needed to build.
// One call computes y = act(conv(x, w) + bias + z) (cudnnConvolutionBiasActivationForward), so a
// ResNet block's folded BatchNorm, residual add and relu ride in its second convolution.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <dlfcn.h>

#include "kiln/backends/cuda/blas.hpp"
#include "kiln/backends/cuda/driver.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/debug/logs.hpp"

namespace kiln::cuda::cudnn {

namespace detail {

// cuDNN's handle and descriptor types are opaque pointers; its enums are ints (values from
// cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h, unchanged since cuDNN 7).
using Status = int;
using Handle = void*;
using TensorDesc = void*;
using FilterDesc = void*;
using ConvDesc = void*;
using ActDesc = void*;
constexpr Status status_success = 0;
constexpr int data_float = 0, data_double = 1, data_half = 2, data_bfloat16 = 9;
constexpr int format_nchw = 0, format_nhwc = 1;
constexpr int cross_correlation = 1;
constexpr int math_tensor_op = 1, math_fma = 3;
constexpr int act_relu = 1, act_identity = 5;
constexpr int nan_propagate = 1;
constexpr int algo_implicit_precomp_gemm = 1;

/// cudnnConvolutionFwdAlgoPerf_t.
struct AlgoPerf {
    int algo;
    Status status;
    float time;
    std::size_t memory;
    int determinism;
    int math_type;
    int reserved[3];
};

#define KILN_CUDNN_FUNCTIONS(X)                                                                                      \
    X(get_version, "cudnnGetVersion", std::size_t())                                                                  \
    X(get_error_string, "cudnnGetErrorString", const char*(Status))                                                   \
    X(create, "cudnnCreate", Status(Handle*))                                                                         \
    X(set_stream, "cudnnSetStream", Status(Handle, CUstream))                                                         \
    X(create_tensor, "cudnnCreateTensorDescriptor", Status(TensorDesc*))                                              \
    X(set_tensor_4d_ex, "cudnnSetTensor4dDescriptorEx", Status(TensorDesc, int, int, int, int, int, int, int, int, int)) \
    X(destroy_tensor, "cudnnDestroyTensorDescriptor", Status(TensorDesc))                                             \
    X(create_filter, "cudnnCreateFilterDescriptor", Status(FilterDesc*))                                              \
    X(set_filter_4d, "cudnnSetFilter4dDescriptor", Status(FilterDesc, int, int, int, int, int, int))                  \
    X(destroy_filter, "cudnnDestroyFilterDescriptor", Status(FilterDesc))                                             \
    X(create_conv, "cudnnCreateConvolutionDescriptor", Status(ConvDesc*))                                             \
    X(set_conv_2d, "cudnnSetConvolution2dDescriptor", Status(ConvDesc, int, int, int, int, int, int, int, int))       \
    X(set_conv_math, "cudnnSetConvolutionMathType", Status(ConvDesc, int))                                            \
    X(destroy_conv, "cudnnDestroyConvolutionDescriptor", Status(ConvDesc))                                            \
    X(create_act, "cudnnCreateActivationDescriptor", Status(ActDesc*))                                                \
    X(set_act, "cudnnSetActivationDescriptor", Status(ActDesc, int, int, double))                                     \
    X(destroy_act, "cudnnDestroyActivationDescriptor", Status(ActDesc))                                               \
    X(get_algos, "cudnnGetConvolutionForwardAlgorithm_v7",                                                            \
      Status(Handle, TensorDesc, FilterDesc, ConvDesc, TensorDesc, int, int*, AlgoPerf*))                             \
    X(workspace_size, "cudnnGetConvolutionForwardWorkspaceSize",                                                      \
      Status(Handle, TensorDesc, FilterDesc, ConvDesc, TensorDesc, int, std::size_t*))                                \
    X(conv_forward, "cudnnConvolutionForward",                                                                        \
      Status(Handle, const void*, TensorDesc, const void*, FilterDesc, const void*, ConvDesc, int, void*, std::size_t, \
             const void*, TensorDesc, void*))                                                                         \
    X(conv_bias_act_forward, "cudnnConvolutionBiasActivationForward",                                                 \
      Status(Handle, const void*, TensorDesc, const void*, FilterDesc, const void*, ConvDesc, int, void*, std::size_t, \
             const void*, TensorDesc, const void*, TensorDesc, const void*, ActDesc, TensorDesc, void*))

/// The loaded library: one pointer per entry point, or why there is none.
struct Lib {
#define KILN_CUDNN_DECLARE(field, symbol, type) std::add_pointer_t<type> field = nullptr;
    KILN_CUDNN_FUNCTIONS(KILN_CUDNN_DECLARE)
#undef KILN_CUDNN_DECLARE
    void* handle = nullptr;
    std::string error;  ///< empty when loaded
    std::size_t version = 0;
    bool ok() const { return error.empty(); }
};

inline Lib load() {
    Lib l;
    const char* env = std::getenv("KILN_CUDNN");  // "0"/"off": never use cuDNN; a path: load that file
    const std::string e = env ? env : "";
    if (e == "0" || e == "off" || e == "OFF") {
        l.error = "turned off by KILN_CUDNN=" + e;
        return l;
    }
    std::vector<std::string> names;
    if (!e.empty() && e != "1" && e != "on") names.push_back(e);
    else names = {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"};
    std::string why;
    for (const std::string& n : names) {
        l.handle = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (l.handle) break;
        const char* d = ::dlerror();
        why += (why.empty() ? "" : "; ") + std::string(d ? d : n);
    }
    if (!l.handle) {
        l.error = "cuDNN not found (" + why + ")";
        return l;
    }
#define KILN_CUDNN_LOAD(field, symbol, type)                                             \
    l.field = reinterpret_cast<std::add_pointer_t<type>>(::dlsym(l.handle, symbol)); \
    if (!l.field && l.error.empty()) l.error = std::string("cuDNN lacks ") + symbol;
    KILN_CUDNN_FUNCTIONS(KILN_CUDNN_LOAD)
#undef KILN_CUDNN_LOAD
    if (!l.ok()) return l;
    l.version = l.get_version();
    if (l.version < 8000) l.error = "cuDNN " + std::to_string(l.version) + " is older than 8.0";
    return l;
}

inline const Lib& lib() {
    static const Lib l = [] {
        Lib x = load();
        debug::log("cudnn", x.ok() ? "loaded cuDNN " + std::to_string(x.version) : "not used: " + x.error);
        return x;
    }();
    return l;
}

inline int data_type(DType d) {
    switch (d) {
        case DType::f32: return data_float;
        case DType::f64: return data_double;
        case DType::f16: return data_half;
        case DType::bf16: return data_bfloat16;
        default: return -1;
    }
}

}  // namespace detail

/// Whether cuDNN loaded (see KILN_CUDNN); never throws.
inline bool available() { return detail::lib().ok(); }

/// cuDNN's version number (e.g. 91900), 0 when it is not available.
inline std::size_t version() { return available() ? detail::lib().version : 0; }

/// Why cuDNN is not used ("" when it is).
inline const std::string& unavailable_reason() { return detail::lib().error; }

namespace detail {
inline std::atomic<std::size_t>& conv_call_count() {
    static std::atomic<std::size_t> n{0};
    return n;
}
}  // namespace detail

/// How many convolutions cuDNN has run in this process (for tests and tuning).
inline std::size_t conv_calls() { return detail::conv_call_count().load(std::memory_order_relaxed); }

/// When conv2d hands bias, relu and a residual to cuDNN's fused call
/// (cudnnConvolutionBiasActivationForward) rather than running cudnnConvolutionForward and then
/// one kiln kernel for them. The fused call saves that kernel's memory traffic but costs more host
/// time per call (about 90 us against 60 us with cuDNN 9.14 on an H100 host), so by default
/// (`capture`) it is used only while a CUDA graph is being captured (reduce_overhead), where host
/// time is paid once. KILN_CUDNN_FUSED=1: always; 0: never.
enum class FusedEpilogues : std::uint8_t { never, capture, always };

inline FusedEpilogues fused_epilogues() {
    static const FusedEpilogues mode = [] {
        const char* e = std::getenv("KILN_CUDNN_FUSED");
        const std::string v = e ? e : "";
        if (v == "0" || v == "off") return FusedEpilogues::never;
        if (v == "1" || v == "on") return FusedEpilogues::always;
        return FusedEpilogues::capture;
    }();
    return mode;
}

/// Whether work queued on `s` now is being captured into a CUDA graph.
inline bool capturing(CUstream s) {
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    return kiln::cuda::detail::driver().stream_is_capturing(s, &status) == kiln::cuda::detail::cuda_success && status != 0;
}

/// The geometry of a 2-D convolution (the kernel size comes from the weight).
struct ConvParams {
    std::int64_t ph = 0, pw = 0, sh = 1, sw = 1, dh = 1, dw = 1;
};

namespace detail {

/// Everything an algorithm choice depends on.
struct ConvKey {
    int device, dtype, math;
    std::int64_t n, c, h, w, oc, kh, kw;
    ConvParams p;
    bool bias_act;  ///< the fused call (bias, activation, residual) rather than cudnnConvolutionForward
    int act;
    bool z;
    auto tie() const {
        return std::tie(device, dtype, math, n, c, h, w, oc, kh, kw, p.ph, p.pw, p.sh, p.sw, p.dh, p.dw, bias_act, act, z);
    }
    bool operator<(const ConvKey& o) const { return tie() < o.tie(); }
};

/// The descriptors of one configuration and the algorithm that ran it (read-only once made).
struct Plan {
    TensorDesc x = nullptr, y = nullptr, bias = nullptr;
    FilterDesc w = nullptr;
    ConvDesc conv = nullptr;
    ActDesc act = nullptr;
    std::vector<AlgoPerf> candidates;  ///< cuDNN's heuristic order
    int algo = -1;                     ///< the chosen one, -1 until a call succeeded
    std::size_t workspace = 0;
    bool unsupported = false;  ///< no candidate ran: the caller falls back
    ~Plan() {
        const Lib& l = lib();
        if (x) l.destroy_tensor(x);
        if (y) l.destroy_tensor(y);
        if (bias) l.destroy_tensor(bias);
        if (w) l.destroy_filter(w);
        if (conv) l.destroy_conv(conv);
        if (act) l.destroy_act(act);
    }
};

struct DeviceState {
    std::mutex mutex;  ///< guards the handle, the plans and every call (calls only queue work)
    Handle handle = nullptr;
    std::map<ConvKey, std::unique_ptr<Plan>> plans;
};

inline DeviceState& device_state(int device) {
    static std::mutex m;
    static std::map<int, std::unique_ptr<DeviceState>> states;  // lives as long as the process
    std::lock_guard<std::mutex> lock(m);
    auto& s = states[device];
    if (!s) s = std::make_unique<DeviceState>();
    return *s;
}

inline std::string text(Status s) {
    const char* t = lib().get_error_string ? lib().get_error_string(s) : nullptr;
    return t ? t : "cuDNN status " + std::to_string(s);
}

/// Makes the descriptors of key's configuration; false (with why) when cuDNN refuses one.
inline bool make_descriptors(const ConvKey& k, std::int64_t oh, std::int64_t ow, Plan& p, std::string& why) {
    const Lib& l = lib();
    auto ok = [&](Status s, const char* what) {
        if (s != status_success && why.empty()) why = std::string(what) + ": " + text(s);
        return s == status_success;
    };
    const int C = static_cast<int>(k.c), H = static_cast<int>(k.h), W = static_cast<int>(k.w), OC = static_cast<int>(k.oc);
    const int N = static_cast<int>(k.n), OH = static_cast<int>(oh), OW = static_cast<int>(ow);
    // channels-last packed tensors: strides (n, c, h, w) = (H*W*C, 1, W*C, C)
    bool good = ok(l.create_tensor(&p.x), "x descriptor") &&
                ok(l.set_tensor_4d_ex(p.x, k.dtype, N, C, H, W, H * W * C, 1, W * C, C), "x descriptor") &&
                ok(l.create_tensor(&p.y), "y descriptor") &&
                ok(l.set_tensor_4d_ex(p.y, k.dtype, N, OC, OH, OW, OH * OW * OC, 1, OW * OC, OC), "y descriptor") &&
                ok(l.create_filter(&p.w), "filter descriptor") &&
                ok(l.set_filter_4d(p.w, k.dtype, format_nhwc, OC, C, static_cast<int>(k.kh), static_cast<int>(k.kw)), "filter descriptor") &&
                ok(l.create_conv(&p.conv), "convolution descriptor") &&
                ok(l.set_conv_2d(p.conv, static_cast<int>(k.p.ph), static_cast<int>(k.p.pw), static_cast<int>(k.p.sh),
                                 static_cast<int>(k.p.sw), static_cast<int>(k.p.dh), static_cast<int>(k.p.dw), cross_correlation,
                                 k.dtype == data_double ? data_double : data_float),
                   "convolution descriptor") &&
                ok(l.set_conv_math(p.conv, k.math), "math type");
    if (good && k.bias_act)
        good = ok(l.create_tensor(&p.bias), "bias descriptor") &&
               ok(l.set_tensor_4d_ex(p.bias, k.dtype, 1, OC, 1, 1, OC, 1, 1, 1), "bias descriptor") &&
               ok(l.create_act(&p.act), "activation descriptor") &&
               ok(l.set_act(p.act, k.act, nan_propagate, 0.0), "activation descriptor");
    return good;
}

}  // namespace detail

namespace detail {

inline ConvKey make_key(const Tensor& x, const Tensor& w, bool bias, bool z, bool relu, const ConvParams& cp) {
    ConvKey k{};
    k.device = x.device().index;
    k.dtype = data_type(x.dtype());
    k.math = (x.dtype() == DType::f32 && !allow_tf32()) ? math_fma : math_tensor_op;
    k.n = x.size(0), k.h = x.size(1), k.w = x.size(2), k.c = x.size(3);
    k.oc = w.size(0), k.kh = w.size(1), k.kw = w.size(2);
    k.p = cp;
    k.bias_act = bias || z || relu;
    k.act = relu ? act_relu : act_identity;
    k.z = z;
    return k;
}

}  // namespace detail

/// Whether conv2d_forward with these arguments has already chosen its algorithm (or found none),
/// so that a call will not try candidates (which must not happen during a graph capture).
inline bool conv2d_planned(const Tensor& x, const Tensor& w, bool bias, bool z, bool relu, const ConvParams& cp) {
    if (!available()) return true;
    const detail::ConvKey k = detail::make_key(x, w, bias, z, relu, cp);
    detail::DeviceState& s = detail::device_state(k.device);
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.plans.find(k);
    return it != s.plans.end() && (it->second->algo >= 0 || it->second->unsupported);
}

/// y = act(conv(x, w) + bias + z) on cuDNN, with x (N, H, W, C) and w (OC, KH, KW, C) channels-last
/// and contiguous, bias (OC) contiguous or null, z (N, OH, OW, OC) contiguous or null, act relu or
/// not, into y (N, OH, OW, OC) contiguous; all one floating dtype on one device. f32 uses TF32 tensor
/// cores only when set_allow_tf32(true) (torch's cudnn.allow_tf32 is a separate switch; kiln has
/// one). Returns false, having written nothing, when cuDNN is missing or takes no algorithm for
/// this configuration (the caller falls back); throws DeviceError when a chosen algorithm fails later.
inline bool conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor* z, bool relu, const ConvParams& cp,
                           Tensor& y) {
    using namespace detail;
    if (!available()) return false;
    const int dt = data_type(x.dtype());
    if (dt < 0 || dt == data_double) return false;
    const std::int64_t limit = std::int64_t{1} << 31;
    if (x.numel() >= limit || y.numel() >= limit || w.numel() >= limit) return false;
    const Lib& l = lib();
    const ConvKey k = make_key(x, w, bias != nullptr, z != nullptr, relu, cp);
    DeviceState& s = device_state(k.device);
    std::lock_guard<std::mutex> lock(s.mutex);
    Status st = status_success;
    if (!s.handle) {
        st = l.create(&s.handle);
        if (st != status_success) throw DeviceError("kiln::cuda::cudnn: cudnnCreate failed: " + text(st));
    }
    auto& plan = s.plans[k];
    if (!plan) {
        plan = std::make_unique<Plan>();
        std::string why;
        if (!make_descriptors(k, y.size(1), y.size(2), *plan, why)) {
            plan->unsupported = true;
            debug::log("cudnn", "conv falls back to im2col: " + why);
        } else {
            int count = 0;
            plan->candidates.resize(8);
            st = l.get_algos(s.handle, plan->x, plan->w, plan->conv, plan->y, 8, &count, plan->candidates.data());
            plan->candidates.resize(st == status_success ? static_cast<std::size_t>(count) : 0);
            std::erase_if(plan->candidates, [&](const AlgoPerf& a) {
                // the fused call with the identity activation runs only the implicit precomputed GEMM
                return a.status != status_success || (k.bias_act && !relu && a.algo != algo_implicit_precomp_gemm);
            });
            if (k.bias_act && !relu && plan->candidates.empty()) plan->candidates.push_back(AlgoPerf{algo_implicit_precomp_gemm, 0, 0, 0, 0, 0, {}});
        }
    }
    if (plan->unsupported) return false;
    st = l.set_stream(s.handle, current_stream(k.device));
    if (st != status_success) throw DeviceError("kiln::cuda::cudnn: cudnnSetStream failed: " + text(st));
    // a zero bias when the fused call has none (it always reads one)
    Tensor zero_bias;
    if (k.bias_act && !bias) zero_bias = zeros({k.oc}, x.dtype(), x.device());
    const void* bias_ptr = bias ? bias->data_ptr() : zero_bias.defined() ? zero_bias.data_ptr() : nullptr;
    const float one_f = 1.0f, zero_f = 0.0f;
    auto run = [&](int algo, std::size_t ws_bytes) {
        Tensor ws;
        if (ws_bytes) ws = Tensor(Shape{static_cast<std::int64_t>((ws_bytes + 3) / 4)}, DType::f32, x.device());
        void* wp = ws.defined() ? ws.data_ptr() : nullptr;
        if (!k.bias_act)
            return l.conv_forward(s.handle, &one_f, plan->x, x.data_ptr(), plan->w, w.data_ptr(), plan->conv, algo, wp, ws_bytes,
                                  &zero_f, plan->y, y.data_ptr());
        return l.conv_bias_act_forward(s.handle, &one_f, plan->x, x.data_ptr(), plan->w, w.data_ptr(), plan->conv, algo, wp,
                                       ws_bytes, z ? &one_f : &zero_f, plan->y, z ? z->data_ptr() : y.data_ptr(), plan->bias,
                                       bias_ptr, plan->act, plan->y, y.data_ptr());
    };
    if (plan->algo >= 0) {
        st = run(plan->algo, plan->workspace);
        if (st != status_success) throw DeviceError("kiln::cuda::cudnn: convolution failed: " + text(st));
        ++conv_call_count();
        return true;
    }
    // the first call of a configuration: cuDNN's candidates in its order until one runs
    std::string why = "no algorithm";
    for (const AlgoPerf& a : plan->candidates) {
        std::size_t ws_bytes = 0;
        st = l.workspace_size(s.handle, plan->x, plan->w, plan->conv, plan->y, a.algo, &ws_bytes);
        if (st != status_success) {
            why = text(st);
            continue;
        }
        st = run(a.algo, ws_bytes);
        if (st == status_success) {
            plan->algo = a.algo;
            plan->workspace = ws_bytes;
            ++conv_call_count();
            debug::log("cudnn", "conv N=" + std::to_string(k.n) + " C=" + std::to_string(k.c) + " H=" + std::to_string(k.h) +
                                    " W=" + std::to_string(k.w) + " OC=" + std::to_string(k.oc) + " k=" + std::to_string(k.kh) + "x" +
                                    std::to_string(k.kw) + ": algo " + std::to_string(a.algo) + ", workspace " +
                                    std::to_string(ws_bytes) + " B" + (k.bias_act ? ", fused bias/act" : "") + (k.z ? "/residual" : ""));
            return true;
        }
        why = text(st);
    }
    plan->unsupported = true;
    debug::log("cudnn", "conv falls back to im2col: " + why);
    return false;
}

}  // namespace kiln::cuda::cudnn
