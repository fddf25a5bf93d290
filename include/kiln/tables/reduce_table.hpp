// The reduction table: identity and combine for each reduction, the second list of DESIGN.md.
#pragma once

#include <limits>
#include <string_view>

#include "kiln/tables/op_table.hpp"

namespace kiln::ops {

/// How a reduction's output dtype follows from its input dtype.
enum class ReduceRule : std::uint8_t {
    widen_int,  ///< bool and integers accumulate and return int64 (sum, prod)
    same,       ///< the input dtype (max, min)
};

struct SumR {
    using Accumulate = SumR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "sum", cuda_combine = "(({0}) + ({1}))";
    static constexpr ReduceRule rule = ReduceRule::widen_int;
    static constexpr bool needs_elements = false;
    using Combine = Add;
    template <class T> static constexpr T identity() { return T(0); }
};
struct ProdR {
    using Accumulate = ProdR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "prod", cuda_combine = "(({0}) * ({1}))";
    static constexpr ReduceRule rule = ReduceRule::widen_int;
    static constexpr bool needs_elements = false;
    using Combine = Mul;
    template <class T> static constexpr T identity() { return T(1); }
};
struct MaxR {
    using Accumulate = MaxR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "max", cuda_combine = "kiln_max({0}, {1})";
    static constexpr ReduceRule rule = ReduceRule::same;
    static constexpr bool needs_elements = true;  ///< no identity a user would accept for an empty input
    using Combine = Maximum;
    template <class T> static constexpr T identity() {
        if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
        else return std::numeric_limits<T>::lowest();
    }
};
struct MinR {
    using Accumulate = MinR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "min", cuda_combine = "kiln_min({0}, {1})";
    static constexpr ReduceRule rule = ReduceRule::same;
    static constexpr bool needs_elements = true;
    using Combine = Minimum;
    template <class T> static constexpr T identity() {
        if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
        else return std::numeric_limits<T>::max();
    }
};

/// mean: kernels accumulate a sum; the result is divided by the element count (minus a
/// correction: var's) when a row is done.
struct MeanR {
    static constexpr std::string_view name = "mean";
    using Accumulate = SumR;
};

/// Every reduction, in the order of their runtime ids (ir::ReduceKind). Adding one: a struct above
/// and an entry here.
using Reductions = OpList<SumR, ProdR, MaxR, MinR, MeanR>;

/// Runtime id of a reduction: its position in Reductions.
using ReduceId = std::uint8_t;
template <class R> inline constexpr ReduceId reduce_id = static_cast<ReduceId>(detail::IndexOf<R, Reductions>::value);

/// Calls f(std::type_identity<R>{}) for the reduction with this runtime id.
template <class F>
decltype(auto) visit_reduction(ReduceId id, F&& f) {
    return detail::visit_in(Reductions{}, id, std::forward<F>(f));
}
inline std::string_view reduction_name(ReduceId id) {
    return visit_reduction(id, [](auto t) { return decltype(t)::type::name; });
}

/// Output dtype of reduction R over input dtype d.
template <class R>
constexpr DType reduce_dtype(DType d) {
    if (R::rule == ReduceRule::widen_int && !is_floating(d)) return DType::i64;
    return d;
}

}  // namespace kiln::ops
