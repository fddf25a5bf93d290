// NVRTC: compiles kiln's generated CUDA C++ straight to a cubin for one architecture.
#pragma once
// Also a classic guard: this header and its partner include each other, and clang ignores
// #pragma once in a main file (clangd, -fsyntax-only on the header), which would loop.
#ifndef KILN_BACKENDS_CUDA_NVRTC_HPP
#define KILN_BACKENDS_CUDA_NVRTC_HPP

// Uses the NVRTC C API only when kiln is built with the CUDA toolkit (KILN_WITH_CUDA, set by
// CMake) and <nvrtc.h> is reachable; otherwise nvrtc_available() is false and compiles throw
// DeviceError. Caching lives in kiln/backends/cuda/kernel_cache.hpp (cubin_for); kiln/cache/files.hpp has what this uses
// for cache_dir() and hash64() (failing sources are saved under <cache dir>/failed/).

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/cache/files.hpp"
#include "kiln/core/error.hpp"
#include "kiln/debug/logs.hpp"

#if defined(KILN_WITH_CUDA) && defined(__has_include)
#if __has_include(<nvrtc.h>)
#include <nvrtc.h>
#define KILN_NVRTC_HAVE_API 1
#endif
#endif

namespace kiln::cuda {

inline int nvrtc_version();

/// A flag for compile_to_cubin / compile_to_ptx / cache::cubin_for (not passed to NVRTC): the
/// program keeps NVRTC's full declarations (no -minimal): for a source that uses the runtime's or
/// driver's types, textures or device-side launches.
inline constexpr const char* full_declarations = "--kiln-full-declarations";

namespace detail {

/// The options NVRTC gets for sm_<arch>: kiln's defaults, then `extra_flags`. No --use_fast_math:
/// kiln's kernels must match the CPU backend's numerics unless a caller asks otherwise. From
/// NVRTC 12.4 on, -minimal, which leaves out of every program the declarations kiln's kernels do
/// not use (textures and surfaces, the runtime's device functions, device-side launches, the
/// runtime's and driver's types): 31.6 -> 25.5 ms for an empty kernel, 57.4 -> 54.0 ms for a small
/// strided elementwise kernel (NVRTC 13.0, sm_90 cubins, the dev VM, 2026-12-07), unless
/// `extra_flags` holds kiln::cuda::full_declarations (a source of one's own that needs them).
inline std::vector<std::string> nvrtc_options(int arch, const std::vector<std::string>& extra_flags) {
    std::vector<std::string> opts = {"-arch=sm_" + std::to_string(arch), "--std=c++17", "-default-device"};
    bool minimal = nvrtc_version() >= 12040;
    for (const std::string& f : extra_flags)
        if (f == full_declarations) minimal = false;
        else opts.push_back(f);
    if (minimal) opts.insert(opts.begin() + 3, "-minimal");
    return opts;
}

/// `name` reduced to characters safe in a file name.
inline std::string file_stem(const std::string& name) {
    std::string s;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        s += ok ? c : '_';
    }
    if (s.empty()) s = "kernel";
    if (s.size() > 64) s.resize(64);
    return s;
}

/// Saves a source that failed to compile to <cache dir>/failed/<name>-<hash>.cu; returns a
/// sentence for the error message naming the file, or saying why it could not be saved.
inline std::string save_failed_source(const std::string& source, const std::string& name) {
    std::filesystem::path path;
    try {
        path = std::filesystem::path(kiln::cache::cache_dir()) / "failed" /
               (file_stem(name) + "-" + kiln::cache::to_hex(kiln::cache::hash64(source)) + ".cu");
    } catch (const std::exception& e) {
        return std::string("the source could not be saved: ") + e.what();
    }
    std::string why;
    if (kiln::cache::detail::write_file_atomically(path, source, why)) return "source saved to " + path.string();
    return "the source could not be saved to " + path.string() + ": " + why;
}

#if defined(KILN_NVRTC_HAVE_API)
/// Throws CompileError naming the failed NVRTC call, unless `r` is NVRTC_SUCCESS.
inline void nvrtc_check(nvrtcResult r, const char* call, const std::string& name) {
    if (r != NVRTC_SUCCESS)
        throw CompileError("kiln::cuda::compile_to_cubin: " + std::string(call) + " failed for kernel '" + name +
                           "': " + nvrtcGetErrorString(r));
}

/// Destroys an nvrtcProgram when it goes out of scope.
struct NvrtcProgram {
    nvrtcProgram prog = nullptr;
    NvrtcProgram() = default;
    NvrtcProgram(const NvrtcProgram&) = delete;
    NvrtcProgram& operator=(const NvrtcProgram&) = delete;
    ~NvrtcProgram() {
        if (prog) nvrtcDestroyProgram(&prog);
    }
};

/// The program's compile log, or a note saying why it could not be read.
inline std::string nvrtc_log(nvrtcProgram prog) {
    std::size_t size = 0;
    if (nvrtcResult r = nvrtcGetProgramLogSize(prog, &size); r != NVRTC_SUCCESS)
        return std::string("(nvrtcGetProgramLogSize failed: ") + nvrtcGetErrorString(r) + ")";
    std::string log(size, '\0');
    if (size == 0) return log;
    if (nvrtcResult r = nvrtcGetProgramLog(prog, log.data()); r != NVRTC_SUCCESS)
        return std::string("(nvrtcGetProgramLog failed: ") + nvrtcGetErrorString(r) + ")";
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    return log;
}
#endif

}  // namespace detail

/// Whether this build of kiln can compile CUDA kernels (built with the toolkit and NVRTC answers).
inline bool nvrtc_available() {
#if defined(KILN_NVRTC_HAVE_API)
    int major = 0, minor = 0;
    return nvrtcVersion(&major, &minor) == NVRTC_SUCCESS;
#else
    return false;
#endif
}

/// NVRTC's version as major*1000 + minor*10 (13.0 -> 13000), or 0 when NVRTC is unavailable.
inline int nvrtc_version() {
#if defined(KILN_NVRTC_HAVE_API)
    static const int v = [] {
        int major = 0, minor = 0;
        if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
        return major * 1000 + minor * 10;
    }();
    return v;
#else
    return 0;
#endif
}

namespace detail {

/// NVRTC on `source` for sm_<arch>: the cubin, or with `ptx` the PTX for compute_<arch> (NVRTC's
/// front end and optimizer without ptxas: 0.36 s against 0.84 s for bf16 attention, 4.35 against
/// 5.45 s for the f32 one, NVRTC 13.0 on the dev VM). Throws as compile_to_cubin.
inline std::string nvrtc_compile(const std::string& source, const std::string& name, int arch, const std::vector<std::string>& extra_flags,
                                 bool ptx) {
#if defined(KILN_NVRTC_HAVE_API)
    const std::string fn = ptx ? "kiln::cuda::compile_to_ptx" : "kiln::cuda::compile_to_cubin";
    std::vector<std::string> opts = detail::nvrtc_options(arch, extra_flags);
    if (ptx) opts[0] = "-arch=compute_" + std::to_string(arch);
    std::string flags;
    for (const std::string& o : opts) flags += " " + o;
    if (kiln::debug::log_on("output_code")) kiln::debug::log("output_code", "kernel " + name + " (nvrtc" + flags + "):\n" + source);
    std::vector<const char*> argv;
    argv.reserve(opts.size());
    for (const std::string& o : opts) argv.push_back(o.c_str());

    detail::NvrtcProgram p;
    const std::string file = detail::file_stem(name) + ".cu";
    detail::nvrtc_check(nvrtcCreateProgram(&p.prog, source.c_str(), file.c_str(), 0, nullptr, nullptr),
                        "nvrtcCreateProgram", name);
    const nvrtcResult r = nvrtcCompileProgram(p.prog, static_cast<int>(argv.size()), argv.data());
    if (r != NVRTC_SUCCESS) {
        const std::string log = detail::nvrtc_log(p.prog);
        const std::string saved = detail::save_failed_source(source, name);
        throw CompileError(fn + ": kernel '" + name + "' failed to compile for " + (ptx ? "compute_" : "sm_") +
                           std::to_string(arch) + " (" + nvrtcGetErrorString(r) + "; flags:" + flags + "); " + saved +
                           "\nNVRTC log:\n" + log);
    }
    if (kiln::debug::log_on("output_code"))
        if (const std::string log = detail::nvrtc_log(p.prog); !log.empty())
            kiln::debug::log("output_code", "kernel " + name + " NVRTC log:\n" + log);
    std::size_t size = 0;
    detail::nvrtc_check(ptx ? nvrtcGetPTXSize(p.prog, &size) : nvrtcGetCUBINSize(p.prog, &size), ptx ? "nvrtcGetPTXSize" : "nvrtcGetCUBINSize",
                        name);
    if (size == 0)
        throw CompileError(fn + ": NVRTC returned an empty " + std::string(ptx ? "PTX" : "cubin") + " for kernel '" +
                           name + "' (sm_" + std::to_string(arch) + ")");
    std::string out(size, '\0');
    detail::nvrtc_check(ptx ? nvrtcGetPTX(p.prog, out.data()) : nvrtcGetCUBIN(p.prog, out.data()), ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN", name);
    if (ptx)
        while (!out.empty() && out.back() == '\0') out.pop_back();
    return out;
#else
    (void)source;
    (void)arch;
    (void)extra_flags;
    (void)ptx;
    throw DeviceError(std::string(ptx ? "kiln::cuda::compile_to_ptx" : "kiln::cuda::compile_to_cubin") + ": cannot compile kernel '" + name +
                      "': kiln was built without the CUDA toolkit (NVRTC)");
#endif
}

}  // namespace detail

/// Compiles self-contained CUDA C++ `source` to a cubin for sm_<arch> (no cache: see kiln::cache::cubin_for),
/// with kiln's options (detail::nvrtc_options: -minimal from NVRTC 12.4 on, unless `extra_flags`
/// holds full_declarations). Throws CompileError with the NVRTC log and the path of the saved
/// source, or DeviceError without NVRTC.
inline std::string compile_to_cubin(const std::string& source, const std::string& name, int arch,
                                    const std::vector<std::string>& extra_flags = {}) {
    return detail::nvrtc_compile(source, name, arch, extra_flags, false);
}

/// The same source to PTX for compute_<arch> (no cache; NVRTC without ptxas): to read what kiln
/// generates, or to check that it compiles where no cubin is needed (CI's NVRTC test).
inline std::string compile_to_ptx(const std::string& source, const std::string& name, int arch,
                                  const std::vector<std::string>& extra_flags = {}) {
    return detail::nvrtc_compile(source, name, arch, extra_flags, true);
}

}  // namespace kiln::cuda

#undef KILN_NVRTC_HAVE_API

#endif  // KILN_BACKENDS_CUDA_NVRTC_HPP
