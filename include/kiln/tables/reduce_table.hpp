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
    /// Autograd (as the op table's vjp): g and y keep the reduced dims as size 1; the engine
    /// broadcasts the result to x's shape. f.sum / f.prod reduce over the same dims (keepdim).
    template <class F, class T> static auto vjp(const F&, const T& g, const T&, const T&) { return g; }
};
struct ProdR {
    using Accumulate = ProdR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "prod", cuda_combine = "(({0}) * ({1}))";
    static constexpr ReduceRule rule = ReduceRule::widen_int;
    static constexpr bool needs_elements = false;
    using Combine = Mul;
    template <class T> static constexpr T identity() { return T(1); }
    /// y / x without dividing by zero (torch's prod_backward): with one zero in a group its
    /// element gets the product of the others, with two or more every element gets 0.
    template <class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T& x) {
        const auto zero = f(tag<Eq>, x, 0);
        const T zeros = f.sum(f.cast(zero, x.dtype()));
        const T others = f.prod(f(tag<Where>, zero, 1, x));
        return g * f(tag<Where>, f(tag<Eq>, zeros, 0), y / x, f(tag<Where>, f(tag<LogicalAnd>, f(tag<Eq>, zeros, 1), zero), others, 0));
    }
};
struct MaxR {
    using Accumulate = MaxR;  ///< what kernels accumulate (itself)
    static constexpr std::string_view name = "max", cuda_combine = "kiln_max({0}, {1})";
    static constexpr ReduceRule rule = ReduceRule::same;
    static constexpr bool needs_elements = true;  ///< no identity a user would accept for an empty input
    using Combine = Maximum;
    /// torch's amax: the gradient split evenly between the elements equal to the result.
    template <class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T& x) {
        const T hit = f.cast(f(tag<Eq>, x, y), x.dtype());
        return g * hit / f.sum(hit);
    }
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
    template <class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T& x) { return MaxR::vjp(f, g, y, x); }
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
