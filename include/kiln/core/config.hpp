// Build modes. Header-only (the default): every definition is in the headers, compiled by each
// translation unit that uses it. Separate compilation (KILN_SEPARATE_COMPILATION, as Boost.Asio's
// BOOST_ASIO_SEPARATE_COMPILATION): kiln's non-template runtime (the compile engine, the CUDA
// backend, matmul, nn) is declared only, and compiled once, in one .cpp that includes
// <kiln/src.hpp> or by linking the CMake target kiln::kiln_compiled.
#pragma once

#if defined(KILN_SEPARATE_COMPILATION) && !defined(KILN_BUILDING_LIBRARY)
#define KILN_HEADER_ONLY 0  // user code in separate mode: the runtime's definitions are not seen
#else
#define KILN_HEADER_ONLY 1  // header-only, or the one translation unit that compiles the runtime
#endif

// KILN_DECL marks a runtime function that separate compilation compiles once: inline in
// header-only mode, an ordinary external function otherwise.
#if defined(KILN_SEPARATE_COMPILATION)
#define KILN_DECL
#else
#define KILN_DECL inline
#endif

// KILN_FUSED_LOOPS: 1 (the default) gives every expression type whose tree computes in f32 or
// f64 its own fused SIMD loop, instantiated where the expression is evaluated: the fastest CPU
// evaluation, and most of an expression's compile time. 0 runs every expression on the tile
// interpreter (one pass over tiles, no intermediate tensors, compiled once): faster builds.
// Define it the same way in every translation unit of a program.
#ifndef KILN_FUSED_LOOPS
#define KILN_FUSED_LOOPS 1
#endif

namespace kiln::detail {
/// Whether the work this thread queues now belongs to a call of a program compiled with a
/// max_autotune mode, and how that program runs: where it is set, the CUDA backend times candidate
/// configurations of each new GEMM problem and keeps the fastest (backends/cuda/blas.hpp).
enum class Autotune : unsigned char {
    off,
    graphs,    ///< Mode::max_autotune: replayed as CUDA graphs, a candidate costs its GPU time
    launches,  ///< max_autotune_no_cudagraphs: launched per call, a candidate costs at least its launches
};
inline Autotune& autotune_active() {
    thread_local Autotune on = Autotune::off;
    return on;
}
/// Sets autotune_active() for a scope (restores the previous value).
struct AutotuneScope {
    Autotune prev;
    explicit AutotuneScope(Autotune on) : prev(autotune_active()) { autotune_active() = on; }
    ~AutotuneScope() { autotune_active() = prev; }
    AutotuneScope(const AutotuneScope&) = delete;
    AutotuneScope& operator=(const AutotuneScope&) = delete;
};
}  // namespace kiln::detail
