// Gather and scatter along a dim on CUDA: one generated kernel per (mode, element type, index type, rank, dim).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// What an index kernel does for each element of the index tensor (coordinate c, index k = idx[c]):
/// gather: out[c] = in[c with dim replaced by k]; scatter: out[c with dim replaced by k] = in[c];
/// scatter_value: the same with one value; scatter_add: out[...] += in[c] (atomically).
enum class IndexMode : std::uint8_t { gather, scatter, scatter_value, scatter_add };

/// Everything an index kernel's text depends on.
struct IndexSignature {
    IndexMode mode = IndexMode::gather;
    DType dtype = DType::f32;        ///< element dtype: copies move raw words of its size, scatter_add adds in it
    DType index_dtype = DType::i64;  ///< i32 or i64
    int rank = 1;                    ///< rank of the index tensor (>= 1)
    int dim = 0;                     ///< the dim the index selects along
};

/// Whether scatter_add has a CUDA atomicAdd for dtype d (f16, bf16 and bool do not, here).
inline bool has_atomic_add(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64; }

/// CUDA C of an index kernel. Parameters: out, in (the tensor read: x for gather, src for scatter),
/// idx, n (index elements), value (scatter_value: the element's bits), then per dim d: the index
/// tensor's size n<d> and strides is<d>, the read tensor's strides rs<d> and the written one's ws<d>.
/// A grid-stride loop over the index elements; the caller checked every index.
inline KernelText index_kernel(const IndexSignature& s) {
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
inline void run_index_kernel(const IndexSignature& s, Tensor& out, const Tensor& in, const Tensor& idx, std::uint64_t value_bits) {
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
