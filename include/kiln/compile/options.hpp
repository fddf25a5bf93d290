// kiln::compile's options, and the flattened form of a compiled function's arguments and results.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/fuse/limits.hpp"

namespace kiln {

namespace ir {
struct Graph;  // ir/graph.hpp: what Options::custom_backend receives
}

/// How a compiled function runs.
/// The names follow torch.compile's backends: `eager` runs the captured graph one op per kernel,
/// as kiln::eager(expr) runs an expression.
enum class Backend : std::uint8_t {
    none,    ///< no capture: the function runs as written (each fused statement as it comes)
    eager,   ///< captured and optimized, then run one op per kernel, every intermediate materialized
    fused,   ///< captured, optimized and fused (the default)
    custom,  ///< Options::custom_backend turns the graph into an executable
    graph = eager,  ///< the former name of `eager`
};
/// Whether dims may change without recompiling.
enum class Dynamic : std::uint8_t {
    automatic,  ///< static first; a dim that changes size becomes symbolic, so a third size reuses the program
    on,         ///< every dim symbolic from the first call (sizes 0 and 1 stay specialized)
    off,        ///< every new size recompiles
};
/// How a compiled program runs on a CUDA device.
/// The names follow torch.compile's modes.
enum class Mode : std::uint8_t {
    normal,           ///< launch each kernel of each call
    reduce_overhead,  ///< replay each call as one CUDA graph (backends/cuda/graphs.hpp has the rules); the CPU ignores it
    /// reduce_overhead, and the first call of each shape times the candidate algorithms of every
    /// new GEMM problem (cuBLASLt's heuristic's top ones, split-K included; remembered in the disk
    /// cache, backends/cuda/blas.hpp) and the launch shapes of every row kernel (kept for the
    /// program, graph_exec.hpp), keeping the fastest; KILN_LOGS=autotune prints the times
    max_autotune,
    /// max_autotune without CUDA graphs: each call launches its kernels, so a candidate costs at
    /// least the host's time to queue it (a split-K algorithm's second kernel is not free here)
    max_autotune_no_cudagraphs,
};
/// Whether a mode replays CUDA graphs, and whether it autotunes.
constexpr bool replays_graphs(Mode m) { return m == Mode::reduce_overhead || m == Mode::max_autotune; }
constexpr bool autotunes(Mode m) { return m == Mode::max_autotune || m == Mode::max_autotune_no_cudagraphs; }
/// What happens when a function would compile more than Options::recompile_limit times.
enum class Stance : std::uint8_t { fallback_eager, error };

/// Thrown when the recompile limit is hit with Stance::error.
class RecompileLimitError : public Error { using Error::Error; };

/// A program a backend made from a graph: input tensors in, output tensors out.
using Executable = fuse::Executable;

struct Options {
    Backend backend = Backend::fused;
    Mode mode = Mode::normal;
    Dynamic dynamic = Dynamic::automatic;
    int recompile_limit = 8;
    Stance stance = Stance::fallback_eager;
    bool fullgraph = false;  ///< a graph break throws GraphBreakError instead of splitting the graph
    /// Like torch inductor's freezing: captured tensors are snapshotted at compile time (each
    /// compile, recompiles included, takes its own snapshot); passes may fold them (BatchNorm into
    /// its convolution: passes/fold_conv_affine.hpp); later writes to them are not seen. Off:
    /// captured tensors are read on every call.
    bool freeze = false;
    /// Backend::custom: turns the optimized graph into an executable (include <kiln/ir/graph.hpp>
    /// to read the graph, <kiln/fuse/fuser.hpp> to plan it as kiln does)
    std::function<Executable(const ir::Graph&)> custom_backend{};
    fuse::Limits limits{};
};

namespace detail {

// ------------------------------------------------------------------ flattening arguments and results
/// Arguments flattened: tensors in order, numbers (guarded by value), and the sizes of vectors.
struct Flat {
    std::vector<Tensor> tensors;
    std::vector<double> numbers;
    std::vector<std::size_t> sizes;
};

}  // namespace detail
}  // namespace kiln
