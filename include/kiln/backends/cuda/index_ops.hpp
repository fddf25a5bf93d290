// Gather and scatter along a dim on CUDA: one generated kernel per (mode, element type, index type, rank, dim).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

struct KernelText;  // backends/cuda/codegen.hpp

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
KILN_DECL KernelText index_kernel(const IndexSignature& s);

/// Runs an index kernel: over the elements of idx (rank >= 1), reading `in` (undefined for
/// scatter_value) and writing `out`, all on one CUDA device; `value_bits` is scatter_value's element.
KILN_DECL void run_index_kernel(const IndexSignature& s, Tensor& out, const Tensor& in, const Tensor& idx, std::uint64_t value_bits);

}  // namespace kiln::cuda::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cuda/index_ops_impl.hpp"
#endif
