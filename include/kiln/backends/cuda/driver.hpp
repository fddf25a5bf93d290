// The CUDA driver API, loaded at run time with dlopen: devices, primary contexts, streams, events,
// modules and launches. One binary runs on machines with and without a GPU; where there is no
// driver or no device, the first use throws DeviceError saying so.
#pragma once

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_set>
#include <type_traits>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cuda {

// The driver's handle types, declared here so no CUDA header is needed (same layout as cuda.h's).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;

namespace detail {

inline constexpr CUresult cuda_success = 0;
inline constexpr CUresult cuda_error_out_of_memory = 2;
inline constexpr CUresult cuda_error_not_ready = 600;

// Device attributes kiln reads (values of cuda.h's CUdevice_attribute).
enum DeviceAttribute : int {
    attr_max_threads_per_block = 1,
    attr_max_shared_per_block = 8,
    attr_sm_count = 16,
    attr_l2_cache_size = 38,
    attr_max_threads_per_sm = 39,
    attr_cc_major = 75,
    attr_cc_minor = 76,
    attr_max_shared_per_block_optin = 97,
};

// Every entry point kiln uses: X(name in this struct, exported symbol, signature).
#define KILN_CUDA_DRIVER_FUNCTIONS(X)                                                                       \
    X(init, "cuInit", CUresult(unsigned))                                                             \
    X(driver_get_version, "cuDriverGetVersion", CUresult(int*))                                       \
    X(get_error_string, "cuGetErrorString", CUresult(CUresult, const char**))                         \
    X(get_error_name, "cuGetErrorName", CUresult(CUresult, const char**))                             \
    X(device_get_count, "cuDeviceGetCount", CUresult(int*))                                           \
    X(device_get, "cuDeviceGet", CUresult(CUdevice*, int))                                            \
    X(device_get_name, "cuDeviceGetName", CUresult(char*, int, CUdevice))                             \
    X(device_get_attribute, "cuDeviceGetAttribute", CUresult(int*, int, CUdevice))                    \
    X(device_total_mem, "cuDeviceTotalMem_v2", CUresult(std::size_t*, CUdevice))                      \
    X(primary_ctx_retain, "cuDevicePrimaryCtxRetain", CUresult(CUcontext*, CUdevice))                 \
    X(ctx_set_current, "cuCtxSetCurrent", CUresult(CUcontext))                                        \
    X(ctx_get_current, "cuCtxGetCurrent", CUresult(CUcontext*))                                       \
    X(ctx_synchronize, "cuCtxSynchronize", CUresult())                                                \
    X(mem_alloc, "cuMemAlloc_v2", CUresult(CUdeviceptr*, std::size_t))                                \
    X(mem_free, "cuMemFree_v2", CUresult(CUdeviceptr))                                                \
    X(mem_get_info, "cuMemGetInfo_v2", CUresult(std::size_t*, std::size_t*))                          \
    X(mem_alloc_host, "cuMemAllocHost_v2", CUresult(void**, std::size_t))                             \
    X(mem_free_host, "cuMemFreeHost", CUresult(void*))                                                \
    X(memcpy_htod, "cuMemcpyHtoD_v2", CUresult(CUdeviceptr, const void*, std::size_t))               \
    X(memcpy_dtoh, "cuMemcpyDtoH_v2", CUresult(void*, CUdeviceptr, std::size_t))                     \
    X(memcpy_htod_async, "cuMemcpyHtoDAsync_v2", CUresult(CUdeviceptr, const void*, std::size_t, CUstream)) \
    X(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2", CUresult(void*, CUdeviceptr, std::size_t, CUstream)) \
    X(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2", CUresult(CUdeviceptr, CUdeviceptr, std::size_t, CUstream)) \
    X(memset_d8_async, "cuMemsetD8Async", CUresult(CUdeviceptr, unsigned char, std::size_t, CUstream)) \
    X(memset_d16_async, "cuMemsetD16Async", CUresult(CUdeviceptr, unsigned short, std::size_t, CUstream)) \
    X(memset_d32_async, "cuMemsetD32Async", CUresult(CUdeviceptr, unsigned, std::size_t, CUstream))  \
    X(stream_create, "cuStreamCreate", CUresult(CUstream*, unsigned))                                 \
    X(stream_create_with_priority, "cuStreamCreateWithPriority", CUresult(CUstream*, unsigned, int))  \
    X(ctx_get_stream_priority_range, "cuCtxGetStreamPriorityRange", CUresult(int*, int*))             \
    X(stream_destroy, "cuStreamDestroy_v2", CUresult(CUstream))                                       \
    X(stream_synchronize, "cuStreamSynchronize", CUresult(CUstream))                                  \
    X(stream_wait_event, "cuStreamWaitEvent", CUresult(CUstream, CUevent, unsigned))                  \
    X(stream_query, "cuStreamQuery", CUresult(CUstream))                                              \
    X(event_create, "cuEventCreate", CUresult(CUevent*, unsigned))                                    \
    X(event_destroy, "cuEventDestroy_v2", CUresult(CUevent))                                          \
    X(event_record, "cuEventRecord", CUresult(CUevent, CUstream))                                     \
    X(event_synchronize, "cuEventSynchronize", CUresult(CUevent))                                     \
    X(event_query, "cuEventQuery", CUresult(CUevent))                                                 \
    X(module_load_data, "cuModuleLoadData", CUresult(CUmodule*, const void*))                         \
    X(module_unload, "cuModuleUnload", CUresult(CUmodule))                                            \
    X(module_get_function, "cuModuleGetFunction", CUresult(CUfunction*, CUmodule, const char*))       \
    X(func_set_attribute, "cuFuncSetAttribute", CUresult(CUfunction, int, int))                       \
    X(launch_kernel, "cuLaunchKernel",                                                                    \
      CUresult(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, \
                   void**, void**))                                                                       \
    X(occupancy_max_blocks, "cuOccupancyMaxActiveBlocksPerMultiprocessor",                                \
      CUresult(int*, CUfunction, int, std::size_t))                                                   \
    X(stream_begin_capture, "cuStreamBeginCapture_v2", CUresult(CUstream, int))                       \
    X(stream_end_capture, "cuStreamEndCapture", CUresult(CUstream, CUgraph*))                         \
    X(stream_is_capturing, "cuStreamIsCapturing", CUresult(CUstream, int*))                           \
    X(graph_instantiate, "cuGraphInstantiateWithFlags", CUresult(CUgraphExec*, CUgraph, unsigned long long)) \
    X(graph_launch, "cuGraphLaunch", CUresult(CUgraphExec, CUstream))                                 \
    X(graph_exec_destroy, "cuGraphExecDestroy", CUresult(CUgraphExec))                                \
    X(graph_destroy, "cuGraphDestroy", CUresult(CUgraph))

/// cuLaunchKernelEx's configuration and one launch attribute (cuda.h's CUlaunchConfig and
/// CUlaunchAttribute, the same layout).
struct LaunchAttribute {
    int id = 0;
    char pad[4] = {};
    union {
        char raw[64];
        int value;
    } v{};
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute's layout");
struct LaunchConfig {
    unsigned grid_x = 1, grid_y = 1, grid_z = 1, block_x = 1, block_y = 1, block_z = 1, shared = 0;
    CUstream stream = nullptr;
    LaunchAttribute* attrs = nullptr;
    unsigned num_attrs = 0;
};
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
inline constexpr int launch_attribute_programmatic_serialization = 6;

/// The loaded driver: one function pointer per entry point, or the reason it could not load.
struct Driver {
#define KILN_CUDA_DECLARE(field, symbol, type) std::add_pointer_t<type> field = nullptr;
    KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_DECLARE)
#undef KILN_CUDA_DECLARE
    // cuEventElapsedTime changed its exported name in CUDA 12.8 (the _v2 form); either works.
    CUresult (*event_elapsed_time)(float*, CUevent, CUevent) = nullptr;
    // cuLaunchKernelEx (CUDA 11.8+): launches with attributes; null on older drivers (no PDL then).
    CUresult (*launch_kernel_ex)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;
    void* handle = nullptr;
    std::string error;  ///< empty when loaded and initialised
    int version = 0;    ///< cuDriverGetVersion
    int devices = 0;

    bool ok() const { return error.empty(); }
};

KILN_DECL Driver load_driver();

/// Loads the first of `names` that dlopen finds (RTLD_NOW | RTLD_LOCAL), its name in `path`; null
/// when none loads, every failure then in `why` (the optional libraries: cuDNN, NCCL).
inline void* dlopen_first(const std::vector<std::string>& names, std::string& path, std::string& why) {
    for (const std::string& n : names) {
        if (void* h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
            path = n;
            return h;
        }
        const char* d = ::dlerror();
        why += (why.empty() ? "" : "; ") + std::string(d ? d : n);
    }
    return nullptr;
}

/// The process's driver, loaded on first use (never unloaded). Does not throw.
inline const Driver& driver_state() {
    static const Driver d = load_driver();
    return d;
}

/// The driver, or DeviceError naming why there is none (and the op that needed it).
inline const Driver& driver(const char* op = "cuda") {
    const Driver& d = driver_state();
    if (!d.ok()) throw DeviceError(std::string("kiln::") + op + ": " + d.error);
    return d;
}

/// Text of a driver error code: "CUDA_ERROR_X: description".
KILN_DECL std::string error_text(CUresult r);

/// Throws DeviceError (OutOfMemory for CUDA_ERROR_OUT_OF_MEMORY) naming the call, unless r is success.
inline void check(CUresult r, const char* what) {
    if (r == cuda_success) return;
    const std::string msg = std::string("kiln::cuda: ") + what + " failed: " + error_text(r);
    if (r == cuda_error_out_of_memory) throw OutOfMemory(msg);
    throw DeviceError(msg);
}

}  // namespace detail

/// What kiln knows about a device.
struct DeviceProperties {
    std::string name;
    int index = 0;
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;
    int max_threads_per_block = 0;
    int max_threads_per_sm = 0;
    int max_shared_per_block = 0;        ///< bytes, without opting in
    int max_shared_per_block_optin = 0;  ///< bytes, with cuFuncSetAttribute
    int l2_cache_bytes = 0;
    std::size_t total_memory = 0;
    /// The architecture NVRTC compiles for: 90 for sm_90.
    int arch() const { return cc_major * 10 + cc_minor; }
};

/// Whether a CUDA driver is loaded and at least one device is present. Never throws.
inline bool is_available() { return detail::driver_state().ok() && detail::driver_state().devices > 0; }

/// Number of CUDA devices (0 without a driver). Never throws.
inline int device_count() { return detail::driver_state().ok() ? detail::driver_state().devices : 0; }

namespace detail {

/// Per-device state made once: the primary context (shared with cuBLAS and the runtime API),
/// the properties, and kiln's stream.
struct DeviceState {
    CUcontext ctx = nullptr;
    DeviceProperties props;
    CUstream stream = nullptr;
};

KILN_DECL DeviceState make_device_state(int index);

inline constexpr int max_devices = 64;

/// The state of device `index`, created on first use (thread-safe). Throws DeviceError for a
/// missing driver or an index out of range.
inline DeviceState& device_state(int index, const char* op = "cuda") {
    const Driver& d = driver(op);
    if (index < 0 || index >= d.devices || index >= max_devices)
        throw DeviceError(std::string("kiln::") + op + ": no CUDA device " + std::to_string(index) + " (this machine has " +
                          std::to_string(d.devices) + ")");
    static std::array<std::unique_ptr<DeviceState>, max_devices> states;
    static std::array<std::once_flag, max_devices> once;
    std::call_once(once[static_cast<std::size_t>(index)],
                   [&] { states[static_cast<std::size_t>(index)] = std::make_unique<DeviceState>(make_device_state(index)); });
    return *states[static_cast<std::size_t>(index)];
}

/// Makes device `index`'s primary context current on this thread (cheap when it already is).
inline void use_device(int index, const char* op = "cuda") {
    thread_local CUcontext current = nullptr;
    DeviceState& s = device_state(index, op);
    if (current == s.ctx) return;
    check(driver().ctx_set_current(s.ctx), "cuCtxSetCurrent");
    current = s.ctx;
}

/// This thread's stream override per device (nullptr: kiln's stream for the device).
inline CUstream& stream_override(int index) {
    thread_local std::array<CUstream, max_devices> s{};
    return s[static_cast<std::size_t>(index)];
}

}  // namespace detail

/// Properties of device `index`; throws DeviceError when it does not exist.
inline const DeviceProperties& properties(int index = 0) { return detail::device_state(index, "cuda::properties").props; }

/// The stream kiln's work on device `index` goes to from this thread: kiln's own non-blocking
/// stream, unless a StreamGuard chose another.
inline CUstream current_stream(int index = 0) {
    detail::use_device(index);
    const CUstream o = detail::stream_override(index);
    return o ? o : detail::device_state(index).stream;
}

/// Whether work queued on `s` now is being captured into a CUDA graph (then nothing may wait for
/// the device: a host read of a value must be skipped or deferred).
inline bool capturing(CUstream s) {
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    return detail::driver().stream_is_capturing(s, &status) == detail::cuda_success && status != 0;
}

/// Waits until all work kiln queued on device `index` from this thread has finished.
inline void synchronize(int index = 0) {
    detail::check(detail::driver().stream_synchronize(current_stream(index)), "cuStreamSynchronize");
}

/// A stream of its own (RAII): work queued on it runs in order, concurrently with other streams.
class Stream {
public:
    explicit Stream(int device = 0) : device_(device) {
        detail::use_device(device);
        detail::check(detail::driver().stream_create(&s_, 0x1), "cuStreamCreate");
    }
    /// A stream whose work the device schedules ahead of work of lower priority (the greatest
    /// priority the device has: communication that the compute stream must not starve of SMs).
    struct Highest {};
    Stream(int device, Highest) : device_(device) {
        detail::use_device(device);
        int least = 0, greatest = 0;
        detail::check(detail::driver().ctx_get_stream_priority_range(&least, &greatest), "cuCtxGetStreamPriorityRange");
        detail::check(detail::driver().stream_create_with_priority(&s_, 0x1, greatest), "cuStreamCreateWithPriority");
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    ~Stream() {
        if (s_) detail::driver_state().stream_destroy(s_);
    }
    CUstream handle() const { return s_; }
    int device() const { return device_; }
    void synchronize() const { detail::check(detail::driver().stream_synchronize(s_), "cuStreamSynchronize"); }

private:
    int device_;
    CUstream s_ = nullptr;
};

/// Routes kiln's work on a device to `stream` for this thread, for a scope.
class StreamGuard {
public:
    StreamGuard(const Stream& s) : StreamGuard(s.handle(), s.device()) {}  // NOLINT: implicit by design
    StreamGuard(CUstream s, int device) : device_(device), prev_(detail::stream_override(device)) {
        detail::use_device(device);
        detail::stream_override(device) = s;
    }
    StreamGuard(const StreamGuard&) = delete;
    StreamGuard& operator=(const StreamGuard&) = delete;
    ~StreamGuard() { detail::stream_override(device_) = prev_; }

private:
    int device_;
    CUstream prev_;
};

/// A timing event (RAII). Record it on a stream; elapsed_ms between two recorded events.
class Event {
public:
    explicit Event(int device = 0) {
        detail::use_device(device);
        detail::check(detail::driver().event_create(&e_, 0), "cuEventCreate");
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    ~Event() {
        if (e_) detail::driver_state().event_destroy(e_);
    }
    void record(CUstream s) { detail::check(detail::driver().event_record(e_, s), "cuEventRecord"); }
    void synchronize() const { detail::check(detail::driver().event_synchronize(e_), "cuEventSynchronize"); }
    /// Milliseconds from `start` to this event (both recorded; waits for this one).
    float elapsed_ms(const Event& start) const {
        synchronize();
        float ms = 0;
        detail::check(detail::driver().event_elapsed_time(&ms, start.e_, e_), "cuEventElapsedTime");
        return ms;
    }
    CUevent handle() const { return e_; }

private:
    CUevent e_ = nullptr;
};

namespace detail {

/// A loaded module (cubin) and its kernel, on the device current when it was loaded.
struct Kernel {
    CUmodule module = nullptr;
    CUfunction fn = nullptr;
};

/// Loads a cubin and looks up `name` (modules live as long as the process).
inline Kernel load_kernel(const std::string& cubin, const std::string& name) {
    const Driver& d = driver();
    Kernel k;
    check(d.module_load_data(&k.module, cubin.data()), "cuModuleLoadData");
    check(d.module_get_function(&k.fn, k.module, name.c_str()), ("cuModuleGetFunction(" + name + ")").c_str());
    return k;
}

/// Programmatic dependent launch (sm_90+): kiln's kernels begin with griddepcontrol.wait (nothing
/// before it reads or writes what earlier work touches; kernel_function puts it there), so each is
/// launched with programmatic stream serialization: its blocks may start while the kernel before
/// it finishes (that kernel lets them, griddepcontrol.launch_dependents, once all its blocks run)
/// and wait there, so the launch's latency overlaps the previous kernel instead of following it.
/// Only launches of at most `max_threads` threads (half of what the device holds at once) get the
/// attribute: a small kernel's time is mostly its launch, a large one's blocks would only take
/// room the kernel before it still uses (measured: bert-base at 8 x 128 tokens 12 us slower with
/// every launch so), and not right after a library's kernel (library_tail). Off with KILN_CUDA_PDL=0,
/// and on drivers without cuLaunchKernelEx.
struct PdlKernels {
    std::shared_mutex mu;
    std::unordered_set<CUfunction> fns;
    std::atomic<long long> max_threads{0};
};
inline PdlKernels& pdl_kernels() {
    static PdlKernels k;
    return k;
}
/// Whether kernels for a device of compute capability `arch` are made and launched for PDL.
inline bool pdl_enabled(int arch) {
    static const bool on = [] {
        const char* e = std::getenv("KILN_CUDA_PDL");
        return !(e && std::string(e) == "0");
    }();
    return on && arch >= 90 && driver().launch_kernel_ex != nullptr;
}
/// Marks f as a kernel that begins with griddepcontrol.wait (launched with the PDL attribute when
/// its grid has at most max_threads threads: the smallest such limit of the devices seen).
inline void mark_pdl(CUfunction f, long long max_threads) {
    PdlKernels& k = pdl_kernels();
    std::unique_lock lock(k.mu);
    k.fns.insert(f);
    const long long cur = k.max_threads.load();
    if (cur == 0 || max_threads < cur) k.max_threads.store(max_threads);
}
/// The stream whose last kernel this thread queued came from a library (cuBLASLt, cuDNN), if any.
/// Their kernels let dependents start early too, and a kiln kernel launched then would put its
/// blocks on the few multiprocessors the library kernel leaves free (measured: bert-base at 8 x
/// 128 tokens 12 us slower), so the launch after one goes out without the attribute. Only a
/// matter of speed: a kiln kernel waits for the one before it either way.
inline CUstream& library_tail() {
    thread_local CUstream s = nullptr;
    return s;
}
/// Called after queueing a library's kernels on s.
inline void after_library(CUstream s) { library_tail() = s; }

/// Whether a launch of f with `threads` threads in all goes out with the PDL attribute.
inline bool is_pdl(CUfunction f, long long threads) {
    PdlKernels& k = pdl_kernels();
    if (threads > k.max_threads.load(std::memory_order_relaxed)) return false;
    std::shared_lock lock(k.mu);
    return k.fns.count(f) != 0;
}

/// Launches f with a 1-D grid and block on stream s; args point at each parameter.
inline void launch(CUfunction f, unsigned grid, unsigned block, unsigned shared, CUstream s, void** args) {
    if (grid == 0) return;
    CUstream& tail = library_tail();
    const bool after_lib = tail == s;
    if (after_lib) tail = nullptr;
    if (!after_lib && is_pdl(f, static_cast<long long>(grid) * block)) {
        LaunchAttribute attr;
        attr.id = launch_attribute_programmatic_serialization;
        attr.v.value = 1;
        LaunchConfig c;
        c.grid_x = grid;
        c.block_x = block;
        c.shared = shared;
        c.stream = s;
        c.attrs = &attr;
        c.num_attrs = 1;
        check(driver().launch_kernel_ex(&c, f, args, nullptr), "cuLaunchKernelEx");
        return;
    }
    check(driver().launch_kernel(f, grid, 1, 1, block, 1, 1, shared, s, args, nullptr), "cuLaunchKernel");
}

}  // namespace detail
}  // namespace kiln::cuda

#if KILN_HEADER_ONLY
#include "kiln/backends/cuda/driver_impl.hpp"
#endif
