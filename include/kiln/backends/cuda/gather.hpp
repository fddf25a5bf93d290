// Row gathers on CUDA (embedding lookups): the registry's gather_rows_kernel, one per element size.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/backends/cuda/library_kernels.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// out[i, :] = table[ids[i], :] for a contiguous (rows, width) table and contiguous int64 ids; the
/// caller checked every id. Rows are copied as raw elements of the table's size (any dtype).
inline void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
    const int device = table.device().index;
    const std::size_t es = table.element_size();
    const KernelText k = gather_rows_kernel(es);
    const CUfunction f = kernel_function(k, device);
    const std::int64_t n = ids.numel(), width = table.size(1);
    Args a;
    a.add_ptr(table.data_ptr());
    a.add_ptr(ids.data_ptr());
    a.add_ptr(out.data_ptr());
    a.add(n);
    a.add(width);
    const std::int64_t total = n * width;
    const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>((total + 255) / 256, 65535));
    launch(f, grid, 256, 0, current_stream(device), a.finish());
}

}  // namespace kiln::cuda::detail
