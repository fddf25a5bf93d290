// kiln::compile: trace a function into a graph, optimize and fuse it, cache the program under guards.
// This header holds what depends on the function's type (flattening its arguments and results,
// calling it under the tracer); the rest is detail::CompiledCore.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backends/cpu/cpp_build.hpp"  // CpuCodegen: generated C++ for compiled CPU programs
#include "kiln/compile/compiled_core.hpp"
#include "kiln/compile/options.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {
namespace detail {

template <class T> struct is_tuple_like : std::false_type {};
template <class... A> struct is_tuple_like<std::tuple<A...>> : std::true_type {};
template <class A, class B> struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, std::size_t N> struct is_array<std::array<T, N>> : std::true_type {};

// Aggregates (plain structs of Tensors, numbers and containers of them, no base classes) are
// taken apart with structured bindings; their field count comes from brace-initialization with a
// value convertible to anything (the technique of Boost.PFR), up to max_fields fields.
inline constexpr std::size_t max_fields = 12;
struct AnyField {
    template <class T> operator T() const;  // never defined: only in unevaluated contexts
};
template <class T, std::size_t... I>
constexpr bool brace_constructible(std::index_sequence<I...>) {
    return requires { T{(void(I), AnyField{})...}; };
}
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
    if constexpr (N < max_fields + 1 && brace_constructible<T>(std::make_index_sequence<N + 1>{})) return field_count<T, N + 1>();
    else return N;
}
template <class T>
inline constexpr bool is_struct_of_fields = std::is_aggregate_v<T> && std::is_class_v<T> && !std::is_same_v<T, Tensor> &&
                                            field_count<T>() >= 1 && field_count<T>() <= max_fields;

/// The fields of aggregate a as a tuple of references.
template <class T> auto fields(T& a) {
    constexpr std::size_t n = field_count<std::remove_const_t<T>>();
#define KILN_FIELDS_(N, ...)                       \
    if constexpr (n == N) {                        \
        auto& [__VA_ARGS__] = a;                   \
        return std::tie(__VA_ARGS__);              \
    } else
    KILN_FIELDS_(1, f0)
    KILN_FIELDS_(2, f0, f1)
    KILN_FIELDS_(3, f0, f1, f2)
    KILN_FIELDS_(4, f0, f1, f2, f3)
    KILN_FIELDS_(5, f0, f1, f2, f3, f4)
    KILN_FIELDS_(6, f0, f1, f2, f3, f4, f5)
    KILN_FIELDS_(7, f0, f1, f2, f3, f4, f5, f6)
    KILN_FIELDS_(8, f0, f1, f2, f3, f4, f5, f6, f7)
    KILN_FIELDS_(9, f0, f1, f2, f3, f4, f5, f6, f7, f8)
    KILN_FIELDS_(10, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)
    KILN_FIELDS_(11, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10)
    KILN_FIELDS_(12, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11)
    static_assert(n >= 1 && n <= max_fields, "kiln::compile: aggregates of 1 to 12 fields");
#undef KILN_FIELDS_
}
/// The type of field I of aggregate T.
template <class T, std::size_t I>
using field_t = std::remove_cvref_t<std::tuple_element_t<I, decltype(fields(std::declval<T&>()))>>;

/// The type a compiled function returns for a result of type T: tensor expressions become
/// Tensors (materialized), also inside tuples, pairs, vectors and arrays.
template <class T> struct materialized { using type = T; };
template <class T> requires IsExprNode<T>::value struct materialized<T> { using type = Tensor; };
template <class... A> struct materialized<std::tuple<A...>> { using type = std::tuple<typename materialized<A>::type...>; };
template <class A, class B> struct materialized<std::pair<A, B>> {
    using type = std::pair<typename materialized<A>::type, typename materialized<B>::type>;
};
template <class T, class A> struct materialized<std::vector<T, A>> { using type = std::vector<typename materialized<T>::type>; };
template <class T, std::size_t N> struct materialized<std::array<T, N>> { using type = std::array<typename materialized<T>::type, N>; };
template <class T> using materialized_t = typename materialized<std::remove_cvref_t<T>>::type;

/// v with every tensor expression in it evaluated (a Tensor), as materialized_t describes.
template <class T> materialized_t<T> materialize_result(T&& v) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<materialized_t<T>, D>) {
        return std::forward<T>(v);
    } else if constexpr (IsExprNode<D>::value) {
        return Tensor(v);
    } else if constexpr (is_vector<D>::value) {
        materialized_t<T> out;
        out.reserve(v.size());
        for (const auto& x : v) out.push_back(materialize_result(x));
        return out;
    } else if constexpr (is_array<D>::value) {
        materialized_t<T> out;
        for (std::size_t i = 0; i < v.size(); ++i) out[i] = materialize_result(v[i]);
        return out;
    } else {
        return std::apply([](const auto&... x) { return materialized_t<T>{materialize_result(x)...}; }, v);
    }
}

template <class T> void flatten(const T& a, Flat& f) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<D, Tensor>) {
        f.tensors.push_back(a);
    } else if constexpr (std::is_arithmetic_v<D>) {
        f.numbers.push_back(static_cast<double>(a));
    } else if constexpr (is_vector<D>::value || is_array<D>::value) {
        f.sizes.push_back(a.size());
        for (const auto& x : a) flatten(x, f);
    } else if constexpr (is_tuple_like<D>::value) {
        std::apply([&](const auto&... x) { (flatten(x, f), ...); }, a);
    } else if constexpr (is_struct_of_fields<D>) {
        std::apply([&](const auto&... x) { (flatten(x, f), ...); }, fields(a));
    } else {
        static_assert(std::is_same_v<D, Tensor>,
                      "kiln::compile: arguments and results must be Tensors, numbers, or std::tuple / std::pair / "
                      "std::vector / std::array / aggregate structs of them");
    }
}

/// A copy of a with each Tensor replaced by next() (the traced or concrete tensor for it).
template <class T, class Next> T rebuild(const T& a, Next& next) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<D, Tensor>) {
        return next();
    } else if constexpr (std::is_arithmetic_v<D>) {
        return a;
    } else if constexpr (is_vector<D>::value) {
        D out;
        out.reserve(a.size());
        for (const auto& x : a) out.push_back(rebuild(x, next));
        return out;
    } else if constexpr (is_array<D>::value) {
        D out;
        for (std::size_t i = 0; i < a.size(); ++i) out[i] = rebuild(a[i], next);
        return out;
    } else if constexpr (is_tuple_like<D>::value) {
        return std::apply([&](const auto&... x) { return D{rebuild(x, next)...}; }, a);
    } else {
        return std::apply([&](const auto&... x) { return D{rebuild(x, next)...}; }, fields(a));
    }
}

}  // namespace detail

/// A compiled function: call it like the original. Thread-safe; concurrent first calls compile
/// once. Copies share one cache.
template <class F>
class Compiled {
public:
    Compiled(F fn, Options opt) : fn_(std::move(fn)), core_(std::make_shared<detail::CompiledCore>(std::move(opt))) {}

    template <class... Args>
    auto operator()(const Args&... args) {
        // results that are tensor expressions come back as Tensors
        using R = detail::materialized_t<std::invoke_result_t<F&, const Args&...>>;
        if (core_->options().backend == Backend::none) return R(detail::materialize_result(fn_(args...)));
        detail::Flat flat;
        (detail::flatten(args, flat), ...);
        std::vector<std::size_t> sizes;
        std::optional<std::vector<Tensor>> outs = core_->call(flat, sizes, [&](trace::Tracer& tr) {
            std::size_t k = 0;
            auto next = [&]() {
                const int arg = static_cast<int>(k++);
                return tr.input(flat.tensors[static_cast<std::size_t>(arg)], arg);
            };
            trace::ActiveScope scope(&tr);
            R traced = detail::materialize_result(
                std::apply([&](const auto&... a) { return fn_(a...); }, std::tuple<Args...>{detail::rebuild(args, next)...}));
            detail::Flat f;
            detail::flatten(traced, f);
            return f;
        });
        if (!outs) return R(detail::materialize_result(fn_(args...)));  // the recompile limit: eager from now on
        std::size_t k = 0, s = 0;
        return unflatten_one<R>(*outs, k, sizes, s);
    }

    /// Programs compiled so far (recompiles + 1), and cached entries.
    int compiles() const { return core_->compiles(); }
    /// Kernels of the most recent whole-graph program (0 for graph-breaking functions).
    int kernels() const { return core_->kernels(); }
    /// The optimized graph of the most recent program, as text.
    std::string graph() const { return core_->graph(); }
    /// Graph breaks seen by the last trace.
    std::vector<trace::Break> graph_breaks() const { return core_->graph_breaks(); }
    /// The most recent program as Graphviz DOT, kernels as clusters.
    std::string dot() const { return core_->dot(); }
    /// What the most recent compile produced, in words: graphs, breaks, kernels, the graph.
    std::string report() const { return core_->report(); }
    /// Whether the recompile limit switched this function to eager.
    bool fell_back_to_eager() const { return core_->fell_back_to_eager(); }

private:
    template <class R>
    R unflatten_one(const std::vector<Tensor>& outs, std::size_t& k, const std::vector<std::size_t>& sizes, std::size_t& s) {
        using D = std::remove_cvref_t<R>;
        if constexpr (std::is_same_v<D, Tensor>) {
            return outs[k++];
        } else if constexpr (detail::is_vector<D>::value) {
            D out;
            const std::size_t n = sizes[s++];
            for (std::size_t i = 0; i < n; ++i) out.push_back(unflatten_one<typename D::value_type>(outs, k, sizes, s));
            return out;
        } else if constexpr (detail::is_array<D>::value) {
            D out;
            ++s;
            for (auto& x : out) x = unflatten_one<typename D::value_type>(outs, k, sizes, s);
            return out;
        } else if constexpr (detail::is_tuple_like<D>::value) {
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return D{unflatten_one<std::tuple_element_t<I, D>>(outs, k, sizes, s)...};
            }(std::make_index_sequence<std::tuple_size_v<D>>{});
        } else {
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return D{unflatten_one<detail::field_t<D, I>>(outs, k, sizes, s)...};
            }(std::make_index_sequence<detail::field_count<D>()>{});
        }
    }

    F fn_;
    std::shared_ptr<detail::CompiledCore> core_;
};

/// Compiles fn: its first call traces it into a graph, which is optimized, fused and cached;
/// later calls whose inputs pass the guards run the cached program without calling fn.
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, Options opt = {}) {
    return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(opt));
}

/// Compiles fn and calls it once with args, then reports what kiln made of it: graphs, graph
/// breaks (with source locations), fusion groups and kernels, and the optimized graph.
template <class F, class... Args>
std::string explain(F&& fn, const Args&... args) {
    auto c = compile(std::forward<F>(fn));
    (void)c(args...);
    return c.report();
}

}  // namespace kiln

