// Convolutions through cuDNN where it is present: loaded at run time with dlopen (libcudnn.so.9,
// then .8), so kiln builds and runs without it; conv2d falls back to im2col + cuBLASLt when it is
// missing, turned off (KILN_CUDNN=0), or refuses a configuration.
//
// Only cuDNN's stable C ABI is used (the "legacy" convolution API of cuDNN 8 and 9), declared here
// from its documented signatures and enum values, so no cuDNN headers are needed to build.
// One call computes y = act(conv(x, w) + bias + z) (cudnnConvolutionBiasActivationForward), so a
// ResNet block's folded BatchNorm, residual add and relu ride in its second convolution.
#pragma once

#include <algorithm>
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
#include "kiln/core/factories.hpp"
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
using BackendDesc = void*;
constexpr Status status_success = 0;
constexpr int data_float = 0, data_double = 1, data_half = 2, data_bfloat16 = 9;
constexpr int format_nchw = 0, format_nhwc = 1;
constexpr int cross_correlation = 1;
constexpr int math_tensor_op = 1, math_fma = 3;
constexpr int act_relu = 1, act_identity = 5;
constexpr int nan_propagate = 1;
constexpr int algo_implicit_precomp_gemm = 1;

/// cudnnConvolutionFwdAlgoPerf_t (the backward-data and backward-filter perf structs have the
/// same layout).
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
             const void*, TensorDesc, const void*, TensorDesc, const void*, ActDesc, TensorDesc, void*))                \
    X(get_bwd_data_algos, "cudnnGetConvolutionBackwardDataAlgorithm_v7",                                             \
      Status(Handle, FilterDesc, TensorDesc, ConvDesc, TensorDesc, int, int*, AlgoPerf*))                             \
    X(bwd_data_workspace, "cudnnGetConvolutionBackwardDataWorkspaceSize",                                             \
      Status(Handle, FilterDesc, TensorDesc, ConvDesc, TensorDesc, int, std::size_t*))                                \
    X(conv_bwd_data, "cudnnConvolutionBackwardData",                                                                  \
      Status(Handle, const void*, FilterDesc, const void*, TensorDesc, const void*, ConvDesc, int, void*, std::size_t, \
             const void*, TensorDesc, void*))                                                                         \
    X(get_bwd_filter_algos, "cudnnGetConvolutionBackwardFilterAlgorithm_v7",                                         \
      Status(Handle, TensorDesc, TensorDesc, ConvDesc, FilterDesc, int, int*, AlgoPerf*))                             \
    X(bwd_filter_workspace, "cudnnGetConvolutionBackwardFilterWorkspaceSize",                                         \
      Status(Handle, TensorDesc, TensorDesc, ConvDesc, FilterDesc, int, std::size_t*))                                \
    X(conv_bwd_filter, "cudnnConvolutionBackwardFilter",                                                              \
      Status(Handle, const void*, TensorDesc, const void*, TensorDesc, const void*, ConvDesc, int, void*, std::size_t, \
             const void*, FilterDesc, void*))                                                                         \
    X(backend_create, "cudnnBackendCreateDescriptor", Status(int, BackendDesc*))                                      \
    X(backend_destroy, "cudnnBackendDestroyDescriptor", Status(BackendDesc))                                          \
    X(backend_finalize, "cudnnBackendFinalize", Status(BackendDesc))                                                  \
    X(backend_set, "cudnnBackendSetAttribute", Status(BackendDesc, int, int, std::int64_t, const void*))              \
    X(backend_get, "cudnnBackendGetAttribute", Status(BackendDesc, int, int, std::int64_t, std::int64_t*, void*))     \
    X(backend_execute, "cudnnBackendExecute", Status(Handle, BackendDesc, BackendDesc))

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
    std::string why, path;
    l.handle = cuda::detail::dlopen_first(names, path, why);
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
/// (cudnnConvolutionBiasActivationForward) rather than running the plain convolution and then one
/// kiln kernel for them. The fused call saves that kernel's memory traffic but costs far more host
/// time per call (about 100 us with cuDNN 9.14 on the H100 host, against about 20 us for a plain
/// convolution through a cached graph-API plan), so by default (`capture`) it is used only while a
/// CUDA graph is being captured (reduce_overhead), where host time is paid once.
/// KILN_CUDNN_FUSED=1: always; 0: never.
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

/// Whether plain convolutions (no fused epilogue) use cuDNN's graph API with execution plans
/// cached per configuration (default) or the legacy call; KILN_CUDNN_GRAPH=0 picks the legacy call.
inline bool graph_api() {
    static const bool on = [] {
        const char* e = std::getenv("KILN_CUDNN_GRAPH");
        return !(e && (std::string(e) == "0" || std::string(e) == "off"));
    }();
    return on;
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
    int pass = 0;  ///< 0 forward, 1 backward data, 2 backward filter (ConvPass)
    auto tie() const {
        return std::tie(device, dtype, math, n, c, h, w, oc, kh, kw, p.ph, p.pw, p.sh, p.sw, p.dh, p.dw, bias_act, act, z, pass);
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

/// A convolution through cuDNN's graph ("backend") API: an execution plan finalized once per
/// configuration, so a call costs one variant pack and cudnnBackendExecute (the legacy
/// cudnnConvolutionForward spends tens of microseconds of host time per call with cuDNN 9).
struct GraphPlan {
    BackendDesc plan = nullptr;  ///< null: no engine config finalized (the legacy call runs)
    std::int64_t workspace = 0;
    std::vector<BackendDesc> owned;  ///< every descriptor made for it
    ~GraphPlan() {
        for (auto it = owned.rbegin(); it != owned.rend(); ++it) lib().backend_destroy(*it);
    }
};

struct DeviceState {
    std::mutex mutex;  ///< guards the handle, the plans and every call (calls only queue work)
    Handle handle = nullptr;
    std::map<ConvKey, std::unique_ptr<Plan>> plans;
    std::map<std::pair<ConvKey, int>, std::unique_ptr<GraphPlan>> graph_plans;  ///< (key, byte alignment)
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

/// Throws DeviceError naming the call, unless s is success.
inline void check(Status s, const char* what) {
    if (s != status_success) throw DeviceError(std::string("kiln::cuda::cudnn: ") + what + " failed: " + text(s));
}

/// Scratch memory of `bytes` for one call on `device` (undefined when none is needed).
inline Tensor workspace(std::int64_t bytes, Device device) {
    return bytes > 0 ? Tensor(Shape{(bytes + 3) / 4}, DType::f32, device) : Tensor{};
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

// cuDNN graph API enum values (cudnn_graph.h)
constexpr int bk_conv = 1, bk_engine = 2, bk_enginecfg = 3, bk_engineheur = 4, bk_plan = 5, bk_op_conv_fwd = 10,
              bk_opgraph = 15, bk_variant_pack = 16, bk_tensor = 17;
constexpr int at_conv_comp_type = 100, at_conv_mode = 101, at_conv_dilations = 102, at_conv_strides = 103,
              at_conv_post_pad = 104, at_conv_pre_pad = 105, at_conv_spatial_dims = 106, at_heur_mode = 200,
              at_heur_graph = 201, at_heur_results = 202, at_cfg_engine = 300, at_plan_handle = 400, at_plan_cfg = 401,
              at_plan_workspace = 402, at_op_alpha = 700, at_op_beta = 701, at_op_conv = 702, at_op_w = 703, at_op_x = 704,
              at_op_y = 705, at_graph_handle = 800, at_graph_ops = 801, at_tensor_alignment = 900, at_tensor_dtype = 901,
              at_tensor_dims = 902, at_tensor_strides = 903, at_tensor_uid = 906, at_vp_uids = 1000, at_vp_ptrs = 1001,
              at_vp_workspace = 1003, at_engine_notes = 1303;
constexpr int ty_handle = 0, ty_data_type = 1, ty_int64 = 3, ty_float = 4, ty_void_ptr = 6, ty_conv_mode = 7, ty_heur_mode = 8,
              ty_numerical_note = 11, ty_descriptor = 15;
constexpr int heur_mode_a = 3, note_tensor_core = 0, note_down_convert = 1;

/// Builds the execution plan of a plain convolution (x uid 1, w uid 2, y uid 3); g.plan stays
/// null when cuDNN finalizes no engine config (why says the last refusal).
inline void make_graph_plan(Handle h, const ConvKey& k, std::int64_t oh, std::int64_t ow, int align, GraphPlan& g, std::string& why) {
    const Lib& l = lib();
    bool ok = true;
    auto make = [&](int type) {
        BackendDesc d = nullptr;
        const Status st = l.backend_create(type, &d);
        if (st != status_success) {
            why = "cudnnBackendCreateDescriptor: " + text(st);
            ok = false;
            return BackendDesc{nullptr};
        }
        g.owned.push_back(d);
        return d;
    };
    auto set = [&](BackendDesc d, int name, int type, std::int64_t n, const void* v) {
        if (!ok) return;
        const Status st = l.backend_set(d, name, type, n, v);
        if (st != status_success) why = "cudnnBackendSetAttribute(" + std::to_string(name) + "): " + text(st), ok = false;
    };
    auto finalize = [&](BackendDesc d, const char* what) {
        if (!ok) return;
        const Status st = l.backend_finalize(d);
        if (st != status_success) why = std::string(what) + ": " + text(st), ok = false;
    };
    auto tensor = [&](std::int64_t uid, std::int64_t n, std::int64_t c, std::int64_t hh, std::int64_t ww) {
        BackendDesc t = ok ? make(bk_tensor) : nullptr;
        if (!t) return t;
        // logical (n, c, h, w) over channels-last memory
        const std::int64_t dims[4] = {n, c, hh, ww}, strides[4] = {hh * ww * c, 1, ww * c, c};
        const std::int64_t alignment = align;
        set(t, at_tensor_dtype, ty_data_type, 1, &k.dtype);
        set(t, at_tensor_dims, ty_int64, 4, dims);
        set(t, at_tensor_strides, ty_int64, 4, strides);
        set(t, at_tensor_uid, ty_int64, 1, &uid);
        set(t, at_tensor_alignment, ty_int64, 1, &alignment);
        finalize(t, "tensor descriptor");
        return t;
    };
    BackendDesc x = tensor(1, k.n, k.c, k.h, k.w), w = tensor(2, k.oc, k.c, k.kh, k.kw), y = tensor(3, k.n, k.oc, oh, ow);
    BackendDesc conv = ok ? make(bk_conv) : nullptr;
    if (!conv) return;
    const std::int64_t dims = 2;
    const int comp = k.dtype == data_double ? data_double : data_float, mode = cross_correlation;
    const std::int64_t pad[2] = {k.p.ph, k.p.pw}, stride[2] = {k.p.sh, k.p.sw}, dil[2] = {k.p.dh, k.p.dw};
    set(conv, at_conv_spatial_dims, ty_int64, 1, &dims);
    set(conv, at_conv_comp_type, ty_data_type, 1, &comp);
    set(conv, at_conv_mode, ty_conv_mode, 1, &mode);
    set(conv, at_conv_dilations, ty_int64, 2, dil);
    set(conv, at_conv_strides, ty_int64, 2, stride);
    set(conv, at_conv_pre_pad, ty_int64, 2, pad);
    set(conv, at_conv_post_pad, ty_int64, 2, pad);
    finalize(conv, "convolution descriptor");
    BackendDesc op = ok ? make(bk_op_conv_fwd) : nullptr;
    if (!op) return;
    const float alpha = 1.0f, beta = 0.0f;
    set(op, at_op_x, ty_descriptor, 1, &x);
    set(op, at_op_w, ty_descriptor, 1, &w);
    set(op, at_op_y, ty_descriptor, 1, &y);
    set(op, at_op_conv, ty_descriptor, 1, &conv);
    set(op, at_op_alpha, ty_float, 1, &alpha);
    set(op, at_op_beta, ty_float, 1, &beta);
    finalize(op, "convolution operation");
    BackendDesc graph = ok ? make(bk_opgraph) : nullptr;
    if (!graph) return;
    set(graph, at_graph_ops, ty_descriptor, 1, &op);
    set(graph, at_graph_handle, ty_handle, 1, &h);
    finalize(graph, "operation graph");
    BackendDesc heur = ok ? make(bk_engineheur) : nullptr;
    if (!heur) return;
    const int heur_mode = heur_mode_a;
    set(heur, at_heur_graph, ty_descriptor, 1, &graph);
    set(heur, at_heur_mode, ty_heur_mode, 1, &heur_mode);
    finalize(heur, "engine heuristics");
    if (!ok) return;
    constexpr int max_cfgs = 16;
    std::vector<BackendDesc> cfgs;
    for (int i = 0; i < max_cfgs && ok; ++i) cfgs.push_back(make(bk_enginecfg));
    if (!ok) return;
    std::int64_t count = 0;
    if (const Status st = l.backend_get(heur, at_heur_results, ty_descriptor, max_cfgs, &count, cfgs.data()); st != status_success) {
        why = "engine heuristics results: " + text(st);
        return;
    }
    const bool no_tensor_cores = k.math == math_fma;  // f32 without TF32
    for (std::int64_t i = 0; i < std::min<std::int64_t>(count, max_cfgs); ++i) {
        BackendDesc cfg = cfgs[static_cast<std::size_t>(i)];
        if (no_tensor_cores) {
            BackendDesc engine = make(bk_engine);
            if (!engine) return;
            std::int64_t got = 0, nn = 0;
            int notes[16] = {};
            if (l.backend_get(cfg, at_cfg_engine, ty_descriptor, 1, &got, &engine) != status_success ||
                l.backend_get(engine, at_engine_notes, ty_numerical_note, 16, &nn, notes) != status_success)
                continue;
            const int* first = notes;
            const int* end = first + std::min<std::int64_t>(nn, 16);
            if (std::any_of(first, end, [](int n) { return n == note_tensor_core || n == note_down_convert; })) continue;
        }
        BackendDesc plan = make(bk_plan);
        if (!plan) return;
        set(plan, at_plan_handle, ty_handle, 1, &h);
        set(plan, at_plan_cfg, ty_descriptor, 1, &cfg);
        finalize(plan, "execution plan");
        std::int64_t ws = 0, got = 0;
        if (ok && l.backend_get(plan, at_plan_workspace, ty_int64, 1, &got, &ws) == status_success) {
            g.plan = plan;
            g.workspace = ws;
            return;
        }
        ok = true;  // the next config
    }
    if (why.empty()) why = "no engine config for this convolution";
}

/// Runs a plain convolution through a cached graph-API plan; false when there is none.
inline bool graph_conv_forward(DeviceState& s, const ConvKey& k, const Tensor& x, const Tensor& w, Tensor& y) {
    const Lib& l = lib();
    int align = 16;
    for (const void* p : {static_cast<const void*>(x.data_ptr()), static_cast<const void*>(w.data_ptr()),
                          static_cast<const void*>(y.data_ptr())})
        while (align > 1 && reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(align) != 0) align /= 2;
    auto& g = s.graph_plans[{k, align}];
    if (!g) {
        g = std::make_unique<GraphPlan>();
        std::string why;
        make_graph_plan(s.handle, k, y.size(1), y.size(2), align, *g, why);
        if (!g->plan) debug::log("cudnn", "no graph-API plan (" + why + "): the legacy convolution call runs");
    }
    if (!g->plan) return false;
    const Tensor ws = workspace(g->workspace, x.device());
    void* ptrs[3] = {const_cast<void*>(x.data_ptr()), const_cast<void*>(w.data_ptr()), y.data_ptr()};
    const std::int64_t uids[3] = {1, 2, 3};
    void* wp = ws.defined() ? ws.data_ptr() : nullptr;
    BackendDesc vp = nullptr;
    Status st = l.backend_create(bk_variant_pack, &vp);
    check(st, "cudnnBackendCreateDescriptor (variant pack)");
    st = l.backend_set(vp, at_vp_ptrs, ty_void_ptr, 3, ptrs);
    if (st == status_success) st = l.backend_set(vp, at_vp_uids, ty_int64, 3, uids);
    if (st == status_success) st = l.backend_set(vp, at_vp_workspace, ty_void_ptr, 1, &wp);
    if (st == status_success) st = l.backend_finalize(vp);
    if (st == status_success) {
        kiln::cuda::detail::after_library(current_stream(x.device().index));
        st = l.backend_execute(s.handle, g->plan, vp);
    }
    l.backend_destroy(vp);
    check(st, "cudnnBackendExecute");
    return true;
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
    if (!s.handle) check(l.create(&s.handle), "cudnnCreate");
    check(l.set_stream(s.handle, current_stream(k.device)), "cudnnSetStream");
    Status st = status_success;
    if (!k.bias_act && graph_api()) {
        if (graph_conv_forward(s, k, x, w, y)) {
            ++conv_call_count();
            return true;
        }
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
    // a zero bias when the fused call has none (it always reads one)
    Tensor zero_bias;
    if (k.bias_act && !bias) zero_bias = zeros({k.oc}, x.dtype(), x.device());
    const void* bias_ptr = bias ? bias->data_ptr() : zero_bias.defined() ? zero_bias.data_ptr() : nullptr;
    const float one_f = 1.0f, zero_f = 0.0f;
    auto run = [&](int algo, std::size_t ws_bytes) {
        const Tensor ws = workspace(static_cast<std::int64_t>(ws_bytes), x.device());
        void* wp = ws.defined() ? ws.data_ptr() : nullptr;
        kiln::cuda::detail::after_library(current_stream(k.device));  // the next kiln launch follows cuDNN's kernels
        if (!k.bias_act)
            return l.conv_forward(s.handle, &one_f, plan->x, x.data_ptr(), plan->w, w.data_ptr(), plan->conv, algo, wp, ws_bytes,
                                  &zero_f, plan->y, y.data_ptr());
        return l.conv_bias_act_forward(s.handle, &one_f, plan->x, x.data_ptr(), plan->w, w.data_ptr(), plan->conv, algo, wp,
                                       ws_bytes, z ? &one_f : &zero_f, plan->y, z ? z->data_ptr() : y.data_ptr(), plan->bias,
                                       bias_ptr, plan->act, plan->y, y.data_ptr());
    };
    if (plan->algo >= 0) {
        check(run(plan->algo, plan->workspace), "the convolution");
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

/// Which gradient of a convolution conv2d_backward computes.
enum class ConvPass : int { backward_data = 1, backward_filter = 2 };

/// A convolution's gradient on cuDNN, all tensors channels-last, contiguous, one floating dtype
/// (not f64) on one device: backward_data writes dx (N, H, W, C) from dy (N, OH, OW, OC) and w
/// (OC, KH, KW, C), reading `x` only for its shape (it is dx); backward_filter writes dw (OC, KH, KW,
/// C) from x and dy, reading `w` only for its shape (it is dw). The first call of a configuration
/// tries cuDNN's candidates in its order (outside a graph capture). Returns false, having written
/// nothing, when cuDNN is missing or runs none (the caller falls back to GEMMs and col2im).
inline bool conv2d_backward(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& cp, Tensor& out) {
    using namespace detail;
    if (!available()) return false;
    const int dt = data_type(dy.dtype());
    if (dt < 0 || dt == data_double) return false;
    const std::int64_t limit = std::int64_t{1} << 31;
    if (x.numel() >= limit || dy.numel() >= limit || w.numel() >= limit) return false;
    const Lib& l = lib();
    ConvKey k = make_key(x, w, false, false, false, cp);
    k.pass = static_cast<int>(pass);
    DeviceState& s = device_state(k.device);
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.handle) check(l.create(&s.handle), "cudnnCreate");
    check(l.set_stream(s.handle, current_stream(k.device)), "cudnnSetStream");
    const bool data = pass == ConvPass::backward_data;
    auto& plan = s.plans[k];
    if (!plan) {
        plan = std::make_unique<Plan>();
        std::string why;
        if (!make_descriptors(k, dy.size(1), dy.size(2), *plan, why)) {
            plan->unsupported = true;
            debug::log("cudnn", std::string(data ? "backward data" : "backward filter") + " falls back to GEMMs: " + why);
        } else {
            int count = 0;
            plan->candidates.resize(8);
            const Status st = data ? l.get_bwd_data_algos(s.handle, plan->w, plan->y, plan->conv, plan->x, 8, &count, plan->candidates.data())
                                   : l.get_bwd_filter_algos(s.handle, plan->x, plan->y, plan->conv, plan->w, 8, &count, plan->candidates.data());
            plan->candidates.resize(st == status_success ? static_cast<std::size_t>(count) : 0);
            std::erase_if(plan->candidates, [](const AlgoPerf& a) { return a.status != status_success; });
        }
    }
    if (plan->unsupported) return false;
    const float one_f = 1.0f, zero_f = 0.0f;
    auto run = [&](int algo, std::size_t ws_bytes) {
        const Tensor ws = workspace(static_cast<std::int64_t>(ws_bytes), dy.device());
        void* wp = ws.defined() ? ws.data_ptr() : nullptr;
        kiln::cuda::detail::after_library(current_stream(k.device));  // the next kiln launch follows cuDNN's kernels
        if (data)
            return l.conv_bwd_data(s.handle, &one_f, plan->w, w.data_ptr(), plan->y, dy.data_ptr(), plan->conv, algo, wp, ws_bytes, &zero_f,
                                   plan->x, out.data_ptr());
        return l.conv_bwd_filter(s.handle, &one_f, plan->x, x.data_ptr(), plan->y, dy.data_ptr(), plan->conv, algo, wp, ws_bytes, &zero_f,
                                 plan->w, out.data_ptr());
    };
    if (plan->algo >= 0) {
        check(run(plan->algo, plan->workspace), data ? "the convolution's backward data" : "the convolution's backward filter");
        ++conv_call_count();
        return true;
    }
    if (capturing(current_stream(k.device))) return false;  // trying candidates cannot be captured
    std::string why = "no algorithm";
    for (const AlgoPerf& a : plan->candidates) {
        std::size_t ws_bytes = 0;
        Status st = data ? l.bwd_data_workspace(s.handle, plan->w, plan->y, plan->conv, plan->x, a.algo, &ws_bytes)
                         : l.bwd_filter_workspace(s.handle, plan->x, plan->y, plan->conv, plan->w, a.algo, &ws_bytes);
        if (st == status_success) st = run(a.algo, ws_bytes);
        if (st == status_success) {
            plan->algo = a.algo;
            plan->workspace = ws_bytes;
            ++conv_call_count();
            debug::log("cudnn", std::string(data ? "backward data" : "backward filter") + " N=" + std::to_string(k.n) + " C=" +
                                    std::to_string(k.c) + " H=" + std::to_string(k.h) + " W=" + std::to_string(k.w) + " OC=" +
                                    std::to_string(k.oc) + " k=" + std::to_string(k.kh) + "x" + std::to_string(k.kw) + ": algo " +
                                    std::to_string(a.algo) + ", workspace " + std::to_string(ws_bytes) + " B");
            return true;
        }
        why = text(st);
    }
    plan->unsupported = true;
    debug::log("cudnn", std::string(data ? "backward data" : "backward filter") + " falls back to GEMMs: " + why);
    return false;
}

}  // namespace kiln::cuda::cudnn
