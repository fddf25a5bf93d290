// Tile kernels derived from the op table: one vectorized loop per (op, compute type).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/tables/simd.hpp"
#include "kiln/core/config.hpp"
#include "kiln/tables/op_table.hpp"

namespace kiln::detail {

/// Whether Op is ever evaluated in compute type T (float-only ops never see integers).
template <class Op, class T>
inline constexpr bool op_runs_in = Op::rule != ops::DTypeRule::float_math || std::is_floating_point_v<T>;

/// Op applied to one value per operand (scalars or batches alike).
template <class Op, class... V>
inline auto apply_op(DType attr, V... v) {
    if constexpr (Op::rule == ops::DTypeRule::cast) return Op::eval(v..., attr);
    else return Op::eval(v...);
}

/// One operand's values for the batch at i: loaded, or the operand's single value broadcast
/// when it is a scalar (bit k of Scalars).
template <unsigned Scalars, std::size_t K, class T>
inline simd::Batch<T> operand(const T* const* in, std::int64_t i) {
    if constexpr (Scalars >> K & 1u) return simd::Batch<T>(in[K][0]);
    else return simd::load(in[K] + i);
}

/// out[i] = Op(in[0][i], ...) for i < n, in compute type T; an operand whose bit is set in Scalars
/// is one value (in[k][0]) for every i.
template <class Op, class T, unsigned Scalars = 0>
void op_tile(const T* const* in, T* out, std::int64_t n, DType attr) {
    using B = simd::Batch<T>;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
        std::int64_t i = 0;
        for (; i + w <= n; i += w) simd::store(out + i, apply_op<Op>(attr, operand<Scalars, K>(in, i)...));
        if (i < n) {  // the tail runs through the same batch code on padded copies
            alignas(64) T pad[Op::arity][w] = {};
            const T* padded[Op::arity];
            for (std::size_t k = 0; k < sizeof...(K); ++k) {
                if (Scalars >> k & 1u) padded[k] = in[k];
                else std::copy(in[k] + i, in[k] + n, pad[k]), padded[k] = pad[k];
            }
            alignas(64) T res[w];
            simd::store_aligned(res, B(apply_op<Op>(attr, operand<Scalars, K>(padded, 0)...)));
            std::copy(res, res + (n - i), out + i);
        }
    }(std::make_index_sequence<Op::arity>{});
}

/// A tile kernel of any compute type behind one signature, for the interpreter's step list.
using AnyTileKernel = void (*)(const void* const* in, void* out, std::int64_t n, DType attr);

template <class Op, class T, unsigned Scalars>
void any_op_tile(const void* const* in, void* out, std::int64_t n, DType attr) {
    const T* typed[3] = {};
    for (int k = 0; k < Op::arity; ++k) typed[k] = static_cast<const T*>(in[k]);
    op_tile<Op, T, Scalars>(typed, static_cast<T*>(out), n, attr);
}

/// The kernel for op id in compute type ct with the operands of `scalars` (a bit per operand)
/// broadcast from one value: binary ops have variants with either operand scalar; otherwise
/// scalars must be 0. nullptr where the op never runs in ct. (Every op in every compute type:
/// compiled once, in tables/op_kernels_impl.hpp.)
KILN_DECL AnyTileKernel any_tile_kernel(ops::OpId id, DType ct, unsigned scalars);

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/tables/op_kernels_impl.hpp"
#endif
