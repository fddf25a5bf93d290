// Row gathers on CUDA (embedding lookups): one generated kernel per element size.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// out[i, :] = table[ids[i], :] for a contiguous (rows, width) table and contiguous int64 ids; the
/// caller checked every id. Rows are copied as raw elements of the table's size (any dtype).
inline void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
    const int device = table.device().index;
    const std::size_t es = table.element_size();
    const char* word = es == 1 ? "unsigned char" : es == 2 ? "unsigned short" : es == 4 ? "unsigned int" : "unsigned long long";
    KernelText k;
    k.name = "kiln_gather_rows_" + std::to_string(es);
    k.source = std::string("extern \"C\" __global__ void ") + k.name + "(const " + word + "* __restrict__ table, " +
               "const long long* __restrict__ ids, " + word + "* __restrict__ out, long long n, long long width) {\n"
               "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n * width;\n"
               "       i += (long long)gridDim.x * blockDim.x) {\n"
               "    const long long r = i / width, c = i - r * width;\n"
               "    out[i] = table[ids[r] * width + c];\n"
               "  }\n}\n";
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
