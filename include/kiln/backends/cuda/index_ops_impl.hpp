// The index kernels' text and launch (backends/cuda/index_ops.hpp), compiled once in separate mode.
#pragma once
// Included at the end of kiln/backends/cuda/index_ops.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cstdint>
#include <string>

#include "kiln/backends/cuda/graph_exec.hpp"

namespace kiln::cuda::detail {

/// CUDA C of an index kernel. Parameters: out, in (the tensor read: x for gather, src for scatter),
/// idx, n (index elements), value (scatter_value: the element's bits), then per dim d: the index
/// tensor's size n<d> and strides is<d>, the read tensor's strides rs<d> and the written one's ws<d>.
/// A grid-stride loop over the index elements; the caller checked every index.
KILN_DECL KernelText index_kernel(const IndexSignature& s) {
    const bool add = s.mode == IndexMode::scatter_add;
    const std::size_t es = dtype_size(s.dtype);
    const std::string W = add ? storage_type(s.dtype) : raw_word(es);
    const std::string I = storage_type(s.index_dtype);
    const bool gather = s.mode == IndexMode::gather;
    std::string p = "extern \"C\" __global__ void @NAME@(" + W + "* __restrict__ out, const " + W + "* __restrict__ in, const " + I +
                    "* __restrict__ idx, long long n, unsigned long long value";
    std::string walk;
    for (int d = s.rank - 1; d >= 0; --d) {
        const std::string k = std::to_string(d);
        p += ", long long n" + k + ", long long is" + k + ", long long rs" + k + ", long long ws" + k;
        walk += d > 0 ? "    c = r % n" + k + "; r /= n" + k + ";\n" : "    c = r;\n";
        walk += "    io += c * is" + k + ";";
        // the selected dim's coordinate is replaced by the index: on the read side for a gather,
        // on the written side for a scatter
        if (!(gather && d == s.dim)) walk += " ro += c * rs" + k + ";";
        if (!gather && d != s.dim) walk += " wo += c * ws" + k + ";";
        walk += "\n";
    }
    const std::string D = std::to_string(s.dim);
    std::string act;
    switch (s.mode) {
        case IndexMode::gather: act = "    out[i] = in[ro + k * rs" + D + "];\n"; break;
        case IndexMode::scatter: act = "    out[wo + k * ws" + D + "] = in[ro];\n"; break;
        case IndexMode::scatter_value: act = "    out[wo + k * ws" + D + "] = (" + W + ")value;\n"; break;
        case IndexMode::scatter_add:
            act = s.dtype == DType::i64
                      ? "    atomicAdd((unsigned long long*)(out + wo + k * ws" + D + "), (unsigned long long)in[ro]);\n"
                      : "    atomicAdd(out + wo + k * ws" + D + ", in[ro]);\n";
            break;
    }
    const std::string body = p + ") {\n"
                                 "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
                                 "       i += (long long)gridDim.x * blockDim.x) {\n"
                                 "    long long r = i, c, io = 0, ro = 0, wo = 0;\n" +
                             walk + "    const long long k = (long long)idx[io];\n" + act + "  }\n}\n";
    static const char* const family[] = {"gather", "scatter", "scatter_value", "scatter_add"};
    return finish_kernel(family[static_cast<int>(s.mode)], body);
}

/// Runs an index kernel: over the elements of idx (rank >= 1), reading `in` (undefined for
/// scatter_value) and writing `out`, all on one CUDA device; `value_bits` is scatter_value's element.
KILN_DECL void run_index_kernel(const IndexSignature& s, Tensor& out, const Tensor& in, const Tensor& idx, std::uint64_t value_bits) {
    const std::int64_t n = idx.numel();
    if (n == 0) return;
    const int device = out.device().index;
    const CUfunction f = kernel_function(index_kernel(s), device);
    Args a;
    a.add_ptr(out.data_ptr());
    a.add_ptr(in.defined() ? in.data_ptr() : nullptr);
    a.add_ptr(idx.data_ptr());
    a.add(n);
    a.add(static_cast<std::int64_t>(value_bits));
    for (int d = s.rank - 1; d >= 0; --d) {
        a.add(idx.size(d));
        a.add(idx.stride(d));
        a.add(in.defined() ? in.stride(d) : 0);
        a.add(out.stride(d));
    }
    launch(f, grid_for(n, 256, device), 256, 0, current_stream(device), a.finish());
}

}  // namespace kiln::cuda::detail
