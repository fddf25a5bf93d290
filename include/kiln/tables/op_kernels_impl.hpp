// The tile interpreter's kernel table: every op of the table in every compute type it runs in.
#pragma once
// Included at the end of kiln/tables/op_kernels.hpp (in header-only mode, or by kiln/src.hpp), never on its own.


namespace kiln::detail {

/// The kernel for op id in compute type ct with the operands of `scalars` (a bit per operand)
/// broadcast from one value: binary ops have variants with either operand scalar; otherwise
/// scalars must be 0. nullptr where the op never runs in ct.
KILN_DECL AnyTileKernel any_tile_kernel(ops::OpId id, DType ct, unsigned scalars) {
    return visit_compute_dtype(ct, [&](auto ttag) -> AnyTileKernel {
        using T = typename decltype(ttag)::type;
        return ops::visit_op(id, [&](auto tag) -> AnyTileKernel {
            using Op = typename decltype(tag)::type;
            if constexpr (!op_runs_in<Op, T>) {
                return nullptr;
            } else if constexpr (Op::arity == 2) {
                return scalars == 1u ? &any_op_tile<Op, T, 1u> : scalars == 2u ? &any_op_tile<Op, T, 2u> : &any_op_tile<Op, T, 0u>;
            } else {
                return &any_op_tile<Op, T, 0u>;
            }
        });
    });
}

}  // namespace kiln::detail
