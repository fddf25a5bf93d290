// Tile kernels derived from the op table: one vectorized loop per (op, compute type).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cpu/simd.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail {

/// out[i] = Op(in[0][i], ...) for i < n, in compute type T.
template <class T>
using TileKernel = void (*)(const T* const* in, T* out, std::int64_t n, DType attr);

/// Whether Op is ever evaluated in compute type T (float-only ops never see integers).
template <class Op, class T>
inline constexpr bool op_runs_in = Op::rule != ops::DTypeRule::float_math || std::is_floating_point_v<T>;

/// Op applied to one value per operand (scalars or batches alike).
template <class Op, class... V>
inline auto apply_op(DType attr, V... v) {
    if constexpr (Op::rule == ops::DTypeRule::cast) return Op::eval(v..., attr);
    else return Op::eval(v...);
}

template <class Op, class T>
void op_tile(const T* const* in, T* out, std::int64_t n, DType attr) {
    using B = simd::Batch<T>;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
        std::int64_t i = 0;
        for (; i + w <= n; i += w) simd::store(out + i, apply_op<Op>(attr, simd::load(in[K] + i)...));
        if (i < n) {  // the tail runs through the same batch code on padded copies
            alignas(64) T pad[Op::arity][w] = {};
            for (std::size_t k = 0; k < sizeof...(K); ++k) std::copy(in[k] + i, in[k] + n, pad[k]);
            alignas(64) T res[w];
            simd::store_aligned(res, B(apply_op<Op>(attr, simd::load_aligned(pad[K])...)));
            std::copy(res, res + (n - i), out + i);
        }
    }(std::make_index_sequence<Op::arity>{});
}

/// The kernel for op id in compute type T (nullptr where the op never runs in T).
template <class T>
inline TileKernel<T> tile_kernel(ops::OpId id) {
    return ops::visit_op(id, [](auto tag) -> TileKernel<T> {
        using Op = typename decltype(tag)::type;
        if constexpr (op_runs_in<Op, T>) return &op_tile<Op, T>;
        else return nullptr;
    });
}

}  // namespace kiln::detail
