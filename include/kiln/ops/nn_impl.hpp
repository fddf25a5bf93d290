// Definitions of ops/nn.hpp's non-template functions (one_hot, the eager row composites' entry),
// compiled once in separate mode.
#pragma once
// Included at the end of kiln/ops/nn.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

namespace kiln {

namespace detail {
KILN_DECL std::optional<Tensor> eager_row_composite(const RowCompositeCall& c, const std::source_location& loc) {
    const RowCompositeRunner run = row_composite_runner();
    if (!run || trace::Tracer::active() != nullptr || c.x.is_traced() || c.x.numel() == 0 || !is_floating(c.x.dtype())) return std::nullopt;
    for (const Tensor* t : {&c.weight, &c.bias})
        if (t->defined() && (t->is_traced() || t->device() != c.x.device())) return std::nullopt;
    if (autograd::detail::needs_grad({&c.x, &c.weight, &c.bias})) return std::nullopt;
    return run(c, loc);
}
}  // namespace detail

KILN_DECL Tensor one_hot(const Tensor& indices, std::int64_t num_classes, Loc loc) {
    const detail::UserOpScope scope("one_hot", loc);
    if (!is_integral(indices.dtype()))
        detail::fail<DTypeError>("one_hot", "needs integer class indices, got " + std::string(dtype_name(indices.dtype())), loc);
    if (num_classes < -1 || num_classes == 0)
        detail::fail<ValueError>("one_hot", "num_classes must be positive or -1, got " + std::to_string(num_classes), loc);
    if (!indices.is_traced() || num_classes < 0) {
        if (indices.numel() == 0) {
            if (num_classes < 0) detail::fail<ValueError>("one_hot", "cannot infer num_classes from an empty tensor", loc);
        } else {
            const auto lo = min(indices, {}, false, loc).item<std::int64_t>(loc);
            const auto hi = max(indices, {}, false, loc).item<std::int64_t>(loc);
            if (lo < 0) detail::fail<ValueError>("one_hot", "class index " + std::to_string(lo) + " is negative", loc);
            if (num_classes < 0) num_classes = hi + 1;
            else if (hi >= num_classes)
                detail::fail<ValueError>("one_hot", "class index " + std::to_string(hi) + " is out of range for num_classes " +
                                                        std::to_string(num_classes), loc);
        }
    }
    const Tensor classes = arange(0, static_cast<double>(num_classes), 1, DType::i64, detail::leaf_device(indices), loc);
    return Tensor(cast(indices.unsqueeze(-1, loc) == classes, DType::i64), loc);
}

}  // namespace kiln
