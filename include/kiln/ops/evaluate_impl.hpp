// The expression evaluator's type-independent part (EvalState), compiled once in separate mode.
#pragma once
// Included at the end of kiln/ops/evaluate.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <memory>
#include <vector>

namespace kiln::expr {

KILN_DECL void EvalState::prepare(const std::vector<const Tensor*>& leaves, const Shape& shape, const std::vector<int>& perm,
                                  std::vector<kiln::detail::Access*> extra, int tree_ct) {
    for (const Tensor* t : leaves) leaves_.push_back(kiln::detail::access_of(*t, shape));
    space_.shape = shape;
    std::vector<kiln::detail::Access*> all;
    for (auto& a : leaves_) all.push_back(&a);
    for (auto* a : extra) all.push_back(a);
    if (!perm.empty()) {
        Shape s = shape;
        for (std::size_t i = 0; i < perm.size(); ++i) s[static_cast<int>(i)] = shape[perm[i]];
        for (auto* a : all) {
            Strides st = a->strides;
            for (std::size_t i = 0; i < perm.size(); ++i) st[static_cast<int>(i)] = a->strides[perm[i]];
            a->strides = st;
        }
        space_.shape = s;
    }
    kiln::detail::collapse(space_, all);
    for (const auto& a : leaves_) direct_.push_back(kiln::detail::is_linear(space_, a));
    // one fused loop per statement in the floating compute types; a tree of integer compute type
    // (or of mixed ones) runs on the tile interpreter, compiled once, so that each expression type
    // instantiates two SIMD loops, not four
    const DType tree = tree_ct == Info::tree_none ? DType::f32 : static_cast<DType>(tree_ct);
    fused_ = tree_ct != Info::tree_mixed && (tree == DType::f32 || tree == DType::f64);
    if (fused_) {
        ct_ = tree;
        return;
    }
    prog_ = std::make_unique<kiln::detail::TileProgram>();
    prog_->space = space_;
    prog_->leaves = leaves_;
    prog_->scalars = scalars_;
}

KILN_DECL void EvalState::start_interpreter() {
    runner_ = std::make_unique<kiln::detail::ProgramRunner>(*prog_);
    ct_ = runner_->result_ct();
}

}  // namespace kiln::expr
