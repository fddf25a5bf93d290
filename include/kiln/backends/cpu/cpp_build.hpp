// Building generated C++ kernels at run time (issue 18): the host compiler, a precompiled prelude,
// dlopen, and the caches (process-wide memory, then <cache_dir()>/cpu on disk), with builds on
// background threads while the tile interpreter runs.
#pragma once

#include <cstddef>
#include <string>

#include "kiln/core/config.hpp"

namespace kiln {

/// How compiled CPU programs use generated C++ (KILN_CPU_CODEGEN=off|async|sync; async by default).
enum class CpuCodegen : unsigned char {
    off,    ///< the tile interpreter only
    async,  ///< a group's first call queues its build and runs on the interpreter until it is loaded
    sync,   ///< a group's first call waits for its build (tests; benchmarks that want no warm-up)
};

/// Counters since the process started.
struct CpuCodegenStats {
    std::size_t memory_hits = 0;    ///< kernels found in this process's cache
    std::size_t disk_hits = 0;      ///< kernels loaded from a valid disk entry
    std::size_t builds = 0;         ///< compiler runs (failed ones included)
    std::size_t build_failures = 0; ///< compiler runs that failed (the group stays on the interpreter)
    std::size_t disk_rejected = 0;  ///< disk entries ignored as corrupt or foreign (then rebuilt)
    double build_ms = 0;            ///< wall time of those compiler runs
    std::size_t matmul_epilogues = 0;  ///< matmul calls whose following elementwise group ran inside the GEMM
};

/// The mode: set_cpu_codegen's, else KILN_CPU_CODEGEN's, else async.
KILN_DECL CpuCodegen cpu_codegen();
KILN_DECL void set_cpu_codegen(CpuCodegen mode);
/// Blocks until every queued build has finished (loaded or failed).
KILN_DECL void cpu_codegen_wait();
KILN_DECL CpuCodegenStats cpu_codegen_stats();
/// Why generated C++ cannot be built here ("" when it can): no compiler, no kiln headers, or (known
/// after a first failed build) a kernel prelude that does not compile, such as without xsimd's headers.
KILN_DECL std::string cpu_codegen_unavailable();

namespace detail::cppgen {

/// The kernel (`kiln_kernel`) built from `source` (group_source's or row_source's text, whose
/// signature the caller knows): loaded now from memory or disk, or built (in sync mode, waited
/// for); nullptr while a background build runs, or where it cannot be built (then the caller runs
/// the interpreter).
KILN_DECL void* kernel_for(const std::string& source);

/// Counts a matmul whose epilogue group ran inside the GEMM (backends/cpu/graph_exec.hpp).
KILN_DECL void note_matmul_epilogue();

/// Forgets the kernels this process found (after any queued build): the next ask of a source reads
/// its disk entry again (tests of the disk cache).
KILN_DECL void forget_loaded();

/// The disk entry's path stem for a source under the current toolchain and cache dir (tests).
KILN_DECL std::string entry_stem(const std::string& source);

}  // namespace detail::cppgen
}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/backends/cpu/cpp_build_impl.hpp"
#endif
