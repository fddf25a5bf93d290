// cuda::graph_stats(): what reduce_overhead's CUDA graphs did (backends/cuda/graphs.hpp replays them),
// without the replay machinery: kiln.hpp includes this.
#pragma once

#include <cstddef>
#include <mutex>

namespace kiln::cuda {

/// Counters of every reduce_overhead program in the process (for tests and tuning).
struct GraphStats {
    std::size_t captures = 0;   ///< graph instances captured
    std::size_t replays = 0;    ///< calls served by one graph launch
    std::size_t fallbacks = 0;  ///< calls run without a graph (first call of a shape, or every instance busy)
};

namespace detail {
inline GraphStats& graph_stats_ref() {
    static GraphStats s;
    return s;
}
inline std::mutex& graph_stats_mutex() {
    static std::mutex m;
    return m;
}
}  // namespace detail

/// Counters of CUDA graph captures, replays and calls run without a graph (reduce_overhead).
inline GraphStats graph_stats() {
    std::lock_guard l(detail::graph_stats_mutex());
    return detail::graph_stats_ref();
}

}  // namespace kiln::cuda
