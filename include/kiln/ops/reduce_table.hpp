// The reduction table: identity and combine for each reduction, the second list of DESIGN.md.
#pragma once

#include <limits>
#include <string_view>

#include "kiln/ops/op_table.hpp"

namespace kiln::ops {

/// How a reduction's output dtype follows from its input dtype.
enum class ReduceRule : std::uint8_t {
    widen_int,  ///< bool and integers accumulate and return int64 (sum, prod)
    same,       ///< the input dtype (max, min)
};

struct SumR {
    static constexpr std::string_view name = "sum", cuda_combine = "(({0}) + ({1}))";
    static constexpr ReduceRule rule = ReduceRule::widen_int;
    static constexpr bool needs_elements = false;
    using Combine = Add;
    template <class T> static constexpr T identity() { return T(0); }
};
struct ProdR {
    static constexpr std::string_view name = "prod", cuda_combine = "(({0}) * ({1}))";
    static constexpr ReduceRule rule = ReduceRule::widen_int;
    static constexpr bool needs_elements = false;
    using Combine = Mul;
    template <class T> static constexpr T identity() { return T(1); }
};
struct MaxR {
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
    static constexpr std::string_view name = "min", cuda_combine = "kiln_min({0}, {1})";
    static constexpr ReduceRule rule = ReduceRule::same;
    static constexpr bool needs_elements = true;
    using Combine = Minimum;
    template <class T> static constexpr T identity() {
        if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
        else return std::numeric_limits<T>::max();
    }
};

/// Every reduction with an identity and a combine op.
using Reductions = OpList<SumR, ProdR, MaxR, MinR>;

/// Output dtype of reduction R over input dtype d.
template <class R>
constexpr DType reduce_dtype(DType d) {
    if (R::rule == ReduceRule::widen_int && !is_floating(d)) return DType::i64;
    return d;
}

}  // namespace kiln::ops
