// Movement and combination ops: cat, stack, split, chunk, pad, roll, and gather / scatter along a dim.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/factories.hpp"

namespace kiln {


/// The tensors joined along dim (torch.cat): every tensor has the same rank and the same sizes in
/// the other dims (a 1-D empty tensor is skipped, as torch does); the result's dtype is the
/// promotion of all of theirs, its device theirs.
KILN_DECL Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0, Loc loc = Loc::current());

/// The tensors, all of one shape, stacked along a new dim (torch.stack).
KILN_DECL Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim = 0, Loc loc = Loc::current());

/// Views of x split along dim into pieces of split_size (the last one smaller when it does not
/// divide), as torch.split.
KILN_DECL std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0, Loc loc = Loc::current());

/// Views of x split along dim into pieces of the given sizes, which must add up to its size (torch.split).
KILN_DECL std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0,
                                 Loc loc = Loc::current());

/// Views of x in `chunks` pieces along dim of ceil(size / chunks) each (fewer pieces when the size
/// runs out first), as torch.chunk.
KILN_DECL std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim = 0, Loc loc = Loc::current());

/// x padded with `value` (torch.nn.functional.pad, constant mode): pads lists (before, after)
/// pairs from the last dim backwards, {left, right, top, bottom, ...}; negative pads crop.
KILN_DECL Tensor pad(const Tensor& x, const std::vector<std::int64_t>& pads, Scalar value = 0, Loc loc = Loc::current());

/// x with its elements shifted along dims, wrapping around (torch.roll); with no dims, over the
/// flattened tensor. shifts and dims pair up.
KILN_DECL Tensor roll(const Tensor& x, const std::vector<std::int64_t>& shifts, const std::vector<std::int64_t>& dims = {},
                   Loc loc = Loc::current());

/// torch.roll with one shift: along dim, or over the flattened tensor when dim is absent.
KILN_DECL Tensor roll(const Tensor& x, std::int64_t shift, std::optional<std::int64_t> dim = {}, Loc loc = Loc::current());

// ---------------------------------------------------------------- gather / scatter

namespace detail {

enum class IndexOp : std::uint8_t { gather, scatter, scatter_value, scatter_add };
/// Registers gather/scatter/scatter_add's library-op factories (for loading a program file;
/// called by export/program_file.hpp, not at static initialization: a registration made there
/// would compile every index kernel into every translation unit that includes kiln.hpp).
KILN_DECL void register_index_ops();
/// The front door of gather / scatter: validates, then runs now or records a library call.
KILN_DECL Tensor index_op(IndexOp m, const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Scalar value,
                          const std::source_location& loc);

}  // namespace detail

/// out[i][j] = x[index[i][j]][j] for dim 0 (and likewise for any dim): torch.gather. index has x's
/// rank, is int64 (or int32), no larger than x in the other dims; out has index's shape.
KILN_DECL Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index, Loc loc = Loc::current());

/// torch.take_along_dim: gather along dim after broadcasting x and indices in the other dims; with
/// no dim, over the flattened tensors.
KILN_DECL Tensor take_along_dim(const Tensor& x, const Tensor& indices, std::optional<std::int64_t> dim = {}, Loc loc = Loc::current());

/// A copy of x with src[i][j] written at x[index[i][j]][j] for dim 0 (and likewise for any dim):
/// torch.scatter. index is no larger than src, nor than x outside dim; src has x's dtype. Where an
/// index repeats, one of the writes wins (the last on the CPU; unspecified on CUDA, as in torch).
KILN_DECL Tensor scatter(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Loc loc = Loc::current());

/// torch.scatter with a number: a copy of x with `value` at every indexed position.
KILN_DECL Tensor scatter(const Tensor& x, std::int64_t dim, const Tensor& index, Scalar value, Loc loc = Loc::current());

/// A copy of x with src[i][j] added at x[index[i][j]][j] for dim 0 (and likewise for any dim):
/// torch.scatter_add. Repeated indices accumulate (atomically on CUDA, so float sums may differ in
/// the last bits from run to run there; f16, bf16 and bool run on the host).
KILN_DECL Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Loc loc = Loc::current());

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/ops/shape_ops_impl.hpp"
#endif
