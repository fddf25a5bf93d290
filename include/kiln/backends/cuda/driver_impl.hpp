// The CUDA driver's cold paths (loading it, a device's first use, error texts), compiled once in
// separate compilation. Included at the end of kiln/backends/cuda/driver.hpp (in header-only mode,
// or by kiln/src.hpp), never on its own.
#pragma once

#include <cstdlib>
#include <string>

namespace kiln::cuda::detail {

KILN_DECL Driver load_driver() {
    Driver d;
    const char* env = std::getenv("KILN_CUDA_DRIVER");  // tests point this at a missing file
    const char* lib = env && *env ? env : "libcuda.so.1";
    d.handle = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!d.handle) {
        const char* why = ::dlerror();
        d.error = std::string("no CUDA driver: cannot load ") + lib + " (" + (why ? why : "unknown reason") +
                  "); is an NVIDIA driver installed?";
        return d;
    }
#define KILN_CUDA_LOAD(field, symbol, type)                                                     \
    d.field = reinterpret_cast<std::add_pointer_t<type>>(::dlsym(d.handle, symbol));                               \
    if (!d.field && d.error.empty()) d.error = std::string("the CUDA driver lacks ") + symbol + \
                                               " (driver too old for this kiln?)";
    KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_LOAD)
#undef KILN_CUDA_LOAD
    using ElapsedFn = CUresult(float*, CUevent, CUevent);
    d.event_elapsed_time = reinterpret_cast<ElapsedFn*>(::dlsym(d.handle, "cuEventElapsedTime_v2"));
    if (!d.event_elapsed_time) d.event_elapsed_time = reinterpret_cast<ElapsedFn*>(::dlsym(d.handle, "cuEventElapsedTime"));
    if (!d.event_elapsed_time && d.error.empty()) d.error = "the CUDA driver lacks cuEventElapsedTime";
    using LaunchExFn = CUresult(const LaunchConfig*, CUfunction, void**, void**);
    d.launch_kernel_ex = reinterpret_cast<LaunchExFn*>(::dlsym(d.handle, "cuLaunchKernelEx"));
    if (!d.ok()) return d;
    if (CUresult r = d.init(0); r != cuda_success) {
        const char* name = nullptr;
        d.get_error_name(r, &name);
        d.error = std::string("cuInit failed (") + (name ? name : std::to_string(r)) + "): no usable CUDA device";
        return d;
    }
    d.driver_get_version(&d.version);
    d.device_get_count(&d.devices);
    return d;
}

KILN_DECL std::string error_text(CUresult r) {
    const Driver& d = driver_state();
    const char *name = nullptr, *desc = nullptr;
    if (d.get_error_name) d.get_error_name(r, &name);
    if (d.get_error_string) d.get_error_string(r, &desc);
    return std::string(name ? name : "CUDA error " + std::to_string(r)) + (desc ? std::string(": ") + desc : "");
}

KILN_DECL DeviceState make_device_state(int index) {
    const Driver& d = driver();
    DeviceState s;
    CUdevice dev = 0;
    check(d.device_get(&dev, index), "cuDeviceGet");
    check(d.primary_ctx_retain(&s.ctx, dev), "cuDevicePrimaryCtxRetain");
    check(d.ctx_set_current(s.ctx), "cuCtxSetCurrent");
    char name[256] = {};
    check(d.device_get_name(name, sizeof name, dev), "cuDeviceGetName");
    auto attr = [&](int a) {
        int v = 0;
        check(d.device_get_attribute(&v, a, dev), "cuDeviceGetAttribute");
        return v;
    };
    DeviceProperties& p = s.props;
    p.name = name;
    p.index = index;
    p.sm_count = attr(attr_sm_count);
    p.cc_major = attr(attr_cc_major);
    p.cc_minor = attr(attr_cc_minor);
    p.max_threads_per_block = attr(attr_max_threads_per_block);
    p.max_threads_per_sm = attr(attr_max_threads_per_sm);
    p.max_shared_per_block = attr(attr_max_shared_per_block);
    p.max_shared_per_block_optin = attr(attr_max_shared_per_block_optin);
    p.l2_cache_bytes = attr(attr_l2_cache_size);
    check(d.device_total_mem(&p.total_memory, dev), "cuDeviceTotalMem");
    check(d.stream_create(&s.stream, /*CU_STREAM_NON_BLOCKING*/ 0x1), "cuStreamCreate");
    return s;
}

}  // namespace kiln::cuda::detail
