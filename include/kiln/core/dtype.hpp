// Element types, their C++ counterparts, PyTorch's promotion rules and dtype dispatch.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/core/half.hpp"

namespace kiln {

/// Element type of a tensor. Ordered by promotion category: bool < integers < floats.
enum class DType : std::uint8_t { boolean, i32, i64, f16, bf16, f32, f64 };

inline constexpr std::array<DType, 7> all_dtypes = {DType::boolean, DType::i32, DType::i64, DType::f16,
                                                    DType::bf16, DType::f32, DType::f64};

/// The dtype a float literal or a float-producing op on integers gets (torch's default dtype).
inline constexpr DType default_float_dtype = DType::f32;
/// The dtype an integer literal gets when nothing else decides.
inline constexpr DType default_int_dtype = DType::i64;

constexpr std::string_view dtype_name(DType d) {
    switch (d) {
        case DType::boolean: return "bool";
        case DType::i32: return "int32";
        case DType::i64: return "int64";
        case DType::f16: return "float16";
        case DType::bf16: return "bfloat16";
        case DType::f32: return "float32";
        case DType::f64: return "float64";
    }
    return "?";
}

constexpr std::size_t dtype_size(DType d) {
    switch (d) {
        case DType::boolean: return 1;
        case DType::i32: return 4;
        case DType::i64: return 8;
        case DType::f16: case DType::bf16: return 2;
        case DType::f32: return 4;
        case DType::f64: return 8;
    }
    return 0;
}

constexpr bool is_floating(DType d) { return d >= DType::f16; }
constexpr bool is_integral(DType d) { return d == DType::i32 || d == DType::i64; }
/// Promotion category: 0 bool, 1 integer, 2 floating.
constexpr int dtype_category(DType d) { return d == DType::boolean ? 0 : is_integral(d) ? 1 : 2; }

/// The smallest dtype both a and b convert to without losing category (torch.promote_types).
constexpr DType promote_types(DType a, DType b) {
    if (a == b) return a;
    if (a == DType::boolean) return b;
    if (b == DType::boolean) return a;
    if (is_integral(a) && is_integral(b)) return DType::i64;
    if (is_integral(a)) return b;
    if (is_integral(b)) return a;
    // both floating, different
    if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
    return a > b ? a : b;
}

/// The type arithmetic runs in: f16/bf16 compute in f32, bool has none of its own.
constexpr DType compute_dtype(DType d) {
    return (d == DType::f16 || d == DType::bf16) ? DType::f32 : d;
}
/// The compute type a conversion from `from` to `to` runs in, as expressions resolve it: the
/// target's, or for a conversion to bool the source's; bool to bool runs in f32 (kernels never
/// compute in bool).
constexpr DType cast_compute_dtype(DType from, DType to) {
    const DType c = to == DType::boolean ? compute_dtype(from) : compute_dtype(to);
    return c == DType::boolean ? DType::f32 : c;
}

template <class T> struct TypeTag { using type = T; };

template <class T> struct DTypeOf;
template <> struct DTypeOf<bool> { static constexpr DType value = DType::boolean; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
/// The dtype of C++ element type T.
template <class T> inline constexpr DType dtype_of = DTypeOf<std::remove_cv_t<T>>::value;

template <class T>
concept Element = requires { DTypeOf<std::remove_cv_t<T>>::value; };

/// Calls f(TypeTag<T>{}) with T the C++ storage type of d.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
    switch (d) {
        case DType::boolean: return f(TypeTag<bool>{});
        case DType::i32: return f(TypeTag<std::int32_t>{});
        case DType::i64: return f(TypeTag<std::int64_t>{});
        case DType::f16: return f(TypeTag<half>{});
        case DType::bf16: return f(TypeTag<bfloat16>{});
        case DType::f32: return f(TypeTag<float>{});
        case DType::f64: break;
    }
    return f(TypeTag<double>{});
}

/// Calls f(TypeTag<C>{}) with C the compute type of d (f32, f64, i32, i64; bool computes as f32).
template <class F>
decltype(auto) visit_compute_dtype(DType d, F&& f) {
    switch (compute_dtype(d)) {
        case DType::i32: return f(TypeTag<std::int32_t>{});
        case DType::i64: return f(TypeTag<std::int64_t>{});
        case DType::f64: return f(TypeTag<double>{});
        default: break;
    }
    return f(TypeTag<float>{});
}

/// A C++ number (a literal in user code) as an operand: it takes part in promotion by category
/// only, like a Python scalar in PyTorch, so `x_f32 * 2.0` stays f32.
struct Scalar {
    double value = 0;
    DType kind = DType::f64;  // boolean, i64 or f64: the category of the literal
    Scalar() = default;
    template <class T>
        requires std::is_arithmetic_v<T>
    Scalar(T v)  // NOLINT: implicit on purpose
        : value(static_cast<double>(v)),
          kind(std::is_same_v<T, bool> ? DType::boolean : std::is_integral_v<T> ? DType::i64 : DType::f64) {}
    /// The dtype the literal has on its own (torch: bool, int64, default float).
    DType dtype() const { return kind == DType::f64 ? default_float_dtype : kind; }
};

namespace detail {

/// torch's ResultTypeState: tensors with dims decide first, then 0-dim tensors, then scalars,
/// and a lower group only matters when it is of a higher category.
struct ResultType {
    int dim = -1, zero = -1, wrapped = -1;  // -1: nothing seen
    static void add(int& slot, DType d) {
        slot = slot < 0 ? static_cast<int>(d) : static_cast<int>(promote_types(static_cast<DType>(slot), d));
    }
    void tensor(DType d, bool zero_dim) { add(zero_dim ? zero : dim, d); }
    void scalar(const Scalar& s) { add(wrapped, s.dtype()); }
    static int combine(int higher, int lower) {
        if (higher < 0) return lower;
        if (lower < 0) return higher;
        const auto h = static_cast<DType>(higher), l = static_cast<DType>(lower);
        if (is_floating(h)) return higher;
        if (h == DType::boolean || is_floating(l) || (is_integral(h) && dtype_category(l) > dtype_category(h)))
            return static_cast<int>(promote_types(h, l));
        return higher;
    }
    DType result() const {
        const int r = combine(dim, combine(zero, wrapped));
        return r < 0 ? DType::f32 : static_cast<DType>(r);
    }
};

}  // namespace detail
namespace detail {

/// Storage element -> compute value (bool reads as 0/1; f16/bf16 widen through float).
template <class T, class S>
inline T load_as(const S& s) {
    if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) return static_cast<T>(static_cast<float>(s));
    else return static_cast<T>(s);
}
/// Compute value -> storage element (nonzero stores as true; f16/bf16 round from float).
template <class S, class T>
inline S store_as(const T& v) {
    if constexpr (std::is_same_v<S, bool>) return v != T(0);
    else if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) return S(static_cast<float>(v));
    else return static_cast<S>(v);
}

}  // namespace detail

}  // namespace kiln
