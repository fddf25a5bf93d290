// What kiln::compile's options and callers see of the fuser: the limits that bound a group and
// the executable a backend makes of a graph (no fuser, no IR: a light include for compile/options.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/core/tensor.hpp"

namespace kiln::fuse {

/// Limits that bound a group.
struct Limits {
    int max_inputs = 24;               ///< tensors an elementwise or reduce group reads before it splits
    int max_nodes = 64;                ///< nodes per group before it splits
    std::int64_t max_row = 1 << 16;    ///< longest row (reduced elements) a row group holds
    std::int64_t long_row = 4096;      ///< rows longer than this make a row group only when there are
    std::int64_t min_rows = 64;        ///< at least min_rows of them (else the reduce kernels split them)
    /// Row groups also for reductions that keep the innermost dim (a column sum: BatchNorm's
    /// statistics over (N, H, W), a bias gradient). Off on both backends: CUDA's row kernels walk
    /// a row with neighbouring threads, which for those rows reads memory a row-stride apart, and
    /// the CPU's row groups would transpose such rows first; the reduce kernels of both read whole
    /// rows of the kept dims instead (the CPU's reduce_cols: a column sum of exp over 4096 x 4096
    /// f32, one thread, 2026-12-07: 58.5 ms as a row group, 5.9 ms so).
    bool column_rows = false;
    /// Reduce groups over the same values' shape and axes that do not read each other become one
    /// kernel with an output per reduction (merge_reduce_groups). For backends whose reduce
    /// kernels take several outputs (CUDA; the CPU's row groups do this already).
    bool merge_reductions = false;
    /// An elementwise group's value read by several elementwise or reduce kernels is computed again
    /// in each of them instead of stored, where that reads no more memory (recompute_producers).
    bool recompute = false;
    int recompute_nodes = 24;      ///< the largest group recomputed so
    int recompute_broadcast = 8;   ///< ... when its value is broadcast where it is read (its ops run per element)
    int max_reduce_outputs = 4;  ///< reductions one merged reduce group computes at most
};

/// A compiled program as compile's callers hold it.
using Executable = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

}  // namespace kiln::fuse
