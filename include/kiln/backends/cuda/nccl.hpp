// NCCL, loaded at run time with dlopen (libnccl.so.2), so kiln builds without NCCL's headers and one
// binary runs where NCCL is missing (only kiln::dist's GPU process groups need it). Declared here
// from NCCL's documented C ABI (nccl.h, unchanged since NCCL 2.10 for what kiln uses).
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backends/cuda/driver.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cuda::nccl {

namespace detail {

using Result = int;          // ncclResult_t
using Comm = void*;          // ncclComm_t
struct UniqueId {            // ncclUniqueId
    char internal[128];
};
inline constexpr Result success = 0, in_progress = 7;
inline constexpr int win_coll_symmetric = 1;  // NCCL_WIN_COLL_SYMMETRIC
inline constexpr int sum = 0, prod = 1, max = 2, min = 3, avg = 4;  // ncclRedOp_t
// ncclDataType_t
inline constexpr int int8 = 0, uint8 = 1, int32 = 2, uint32 = 3, int64 = 4, uint64 = 5, float16 = 6, float32 = 7,
                     float64 = 8, bfloat16 = 9;

#define KILN_NCCL_FUNCTIONS(X)                                                                                    \
    X(get_version, "ncclGetVersion", Result(int*))                                                                \
    X(get_unique_id, "ncclGetUniqueId", Result(UniqueId*))                                                        \
    X(comm_init_rank, "ncclCommInitRank", Result(Comm*, int, UniqueId, int))                                     \
    X(comm_destroy, "ncclCommDestroy", Result(Comm))                                                              \
    X(comm_abort, "ncclCommAbort", Result(Comm))                                                                  \
    X(comm_get_async_error, "ncclCommGetAsyncError", Result(Comm, Result*))                                       \
    X(get_error_string, "ncclGetErrorString", const char*(Result))                                                \
    X(all_reduce, "ncclAllReduce", Result(const void*, void*, std::size_t, int, int, Comm, CUstream))             \
    X(broadcast, "ncclBroadcast", Result(const void*, void*, std::size_t, int, int, Comm, CUstream))              \
    X(all_gather, "ncclAllGather", Result(const void*, void*, std::size_t, int, Comm, CUstream))                  \
    X(reduce_scatter, "ncclReduceScatter", Result(const void*, void*, std::size_t, int, int, Comm, CUstream))     \
    X(group_start, "ncclGroupStart", Result())                                                                    \
    X(group_end, "ncclGroupEnd", Result())

/// The loaded library: one pointer per entry point, or why there is none.
struct Lib {
#define KILN_NCCL_DECLARE(field, symbol, type) std::add_pointer_t<type> field = nullptr;
    KILN_NCCL_FUNCTIONS(KILN_NCCL_DECLARE)
#undef KILN_NCCL_DECLARE
    // optional (NCCL >= 2.13): the last error's text, with the reason NCCL knows
    const char* (*get_last_error)(Comm) = nullptr;
    // optional (NCCL >= 2.27): memory NCCL maps for its peers, registered once as a symmetric
    // window (a collective call), which NCCL's symmetric kernels all-reduce in place
    Result (*mem_alloc)(void**, std::size_t) = nullptr;                      // ncclMemAlloc
    Result (*mem_free)(void*) = nullptr;                                     // ncclMemFree
    Result (*window_register)(Comm, void*, std::size_t, void**, int) = nullptr;  // ncclCommWindowRegister
    bool has_windows() const { return mem_alloc && mem_free && window_register; }
    void* handle = nullptr;
    std::string path;   ///< what was loaded
    std::string error;  ///< empty when loaded
    int version = 0;    ///< e.g. 22809 for 2.28.9
    bool ok() const { return error.empty(); }
};

/// Where NCCL is looked for: $KILN_NCCL (a file), then the loader's search path, then the CUDA
/// toolkit's library folders ($CUDA_HOME, /usr/local/cuda).
inline std::vector<std::string> candidates() {
    std::vector<std::string> names;
    if (const char* e = std::getenv("KILN_NCCL"); e && *e) {
        names.emplace_back(e);
        return names;
    }
    names.emplace_back("libnccl.so.2");
    for (const char* home : {static_cast<const char*>(std::getenv("CUDA_HOME")), static_cast<const char*>(std::getenv("CUDA_PATH")),
                             "/usr/local/cuda"})
        if (home && *home)
            for (const char* sub : {"/lib/libnccl.so.2", "/lib64/libnccl.so.2", "/targets/x86_64-linux/lib/libnccl.so.2"})
                names.push_back(std::string(home) + sub);
    return names;
}

inline Lib load() {
    Lib l;
    std::string why;
    l.handle = cuda::detail::dlopen_first(candidates(), l.path, why);
    if (!l.handle) {
        l.error = "NCCL not found (" + why + "); set KILN_NCCL to libnccl.so.2's path";
        return l;
    }
#define KILN_NCCL_LOAD(field, symbol, type)                                              \
    l.field = reinterpret_cast<std::add_pointer_t<type>>(::dlsym(l.handle, symbol)); \
    if (!l.field && l.error.empty()) l.error = std::string("NCCL (") + l.path + ") lacks " + symbol;
    KILN_NCCL_FUNCTIONS(KILN_NCCL_LOAD)
#undef KILN_NCCL_LOAD
    l.get_last_error = reinterpret_cast<const char* (*)(Comm)>(::dlsym(l.handle, "ncclGetLastError"));
    l.mem_alloc = reinterpret_cast<Result (*)(void**, std::size_t)>(::dlsym(l.handle, "ncclMemAlloc"));
    l.mem_free = reinterpret_cast<Result (*)(void*)>(::dlsym(l.handle, "ncclMemFree"));
    l.window_register = reinterpret_cast<Result (*)(Comm, void*, std::size_t, void**, int)>(::dlsym(l.handle, "ncclCommWindowRegister"));
    if (!l.ok()) return l;
    l.get_version(&l.version);
    if (l.version < 21000) l.error = "NCCL " + std::to_string(l.version) + " is older than 2.10 (kiln needs ncclAvg)";
    return l;
}

/// The process's NCCL, loaded on first use (never unloaded, and never destroyed: a process group
/// may still be torn down by a static destructor). Does not throw.
inline const Lib& lib() {
    static const Lib* l = new Lib(load());
    return *l;
}

/// NCCL's data type for a kiln dtype (bool travels as bytes).
inline int data_type(DType d) {
    switch (d) {
        case DType::boolean: return uint8;
        case DType::i32: return int32;
        case DType::i64: return int64;
        case DType::f16: return float16;
        case DType::bf16: return bfloat16;
        case DType::f32: return float32;
        case DType::f64: return float64;
    }
    return uint8;
}

/// "ncclSystemError: <NCCL's text>[: <its last error>]".
inline std::string error_text(Result r, Comm comm = nullptr) {
    const Lib& l = lib();
    std::string s = l.get_error_string ? l.get_error_string(r) : "NCCL error " + std::to_string(r);
    if (l.get_last_error)
        if (const char* last = l.get_last_error(comm); last && *last) s += ": " + std::string(last);
    return s;
}

}  // namespace detail

/// Whether NCCL loaded; never throws.
inline bool available() { return detail::lib().ok(); }
/// NCCL's version code (22809 for 2.28.9), 0 when it is not available.
inline int version() { return available() ? detail::lib().version : 0; }
/// Why NCCL is not available ("" when it is).
inline const std::string& unavailable_reason() { return detail::lib().error; }

}  // namespace kiln::cuda::nccl
