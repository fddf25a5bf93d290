// The op table: every primitive elementwise op defined once; ids, dispatch, loops and codegen derive from it.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kiln/tables/simd.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::ops {

/// How an op's output dtype follows from its (promoted) input dtype.
enum class DTypeRule : std::uint8_t {
    same,        ///< output = promoted inputs (add, neg, maximum...)
    float_math,  ///< integers and bool become the default float (exp, div...)
    compare,     ///< output bool, compared in the promoted dtype
    logical,     ///< output bool, inputs read as nonzero/zero
    where,       ///< where(cond, a, b): output = promote(a, b), cond must be bool
    cast,        ///< output = the dtype attribute
};

/// How gradients flow through an op (autograd; OpTraits::grad).
enum class Grad : std::uint8_t { rule, zero, none };

struct Neg; struct Abs; struct Exp; struct Log; struct Sin; struct Cos; struct Sigmoid; struct Floor; struct Sign;
struct Pow; struct Eq; struct Lt; struct Le; struct Gt; struct Ge; struct LogicalAnd; struct Where;
/// Names a table op inside a gradient rule: f(tag<Cos>, x) is the node cos(x).
template <class Op> struct Tag {};
template <class Op> inline constexpr Tag<Op> tag{};

// Gradient rules (autograd/): each differentiable op has
//   template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T&... x)
// giving the gradient with respect to operand K as a kiln expression over the incoming gradient
// g, the result y and the operands x (tensors), so that it traces and fuses like forward code.
// f(tag<Op>, operands...) builds a node of another table op, f.cast(e, dtype) a cast. The engine sums
// the gradients of broadcast operands back to their shapes; a rule does not.

namespace detail {

/// Element type of a scalar or a SIMD batch (the SIMD header owns what a batch is).
template <class V> using scalar_of = kiln::detail::simd::scalar_of<V>;
template <class V> inline constexpr bool is_int_v = std::is_integral_v<scalar_of<V>>;

// Integer arithmetic wraps like the hardware does (and like torch), instead of being UB on scalars.
template <class V> V wrap(V a, V b, auto f) {
    if constexpr (std::is_integral_v<V>) {
        using U = std::make_unsigned_t<V>;
        return static_cast<V>(f(static_cast<U>(a), static_cast<U>(b)));
    } else {
        return f(a, b);
    }
}

}  // namespace detail

/// CRTP base giving each op its arity and defaults. `Allow` tells which input categories an op
/// accepts: bit 0 bool, bit 1 integers, bit 2 floats.
template <int Arity, DTypeRule Rule, unsigned Allow = 0b111>
struct OpTraits {
    static constexpr int arity = Arity;
    static constexpr DTypeRule rule = Rule;
    static constexpr unsigned allowed_categories = Allow;
    /// CUDA device functions the op's `cuda` text calls (emitted once in every generated kernel's
    /// prelude, in table order), written next to the CPU formula they mirror. Most ops need none.
    static constexpr std::string_view cuda_helper = "";
    /// Autograd: how gradients flow through the op. `rule`: its `vjp`; `zero`: the gradient is
    /// zero everywhere (floor, round, sign...: nothing flows back); `none`: not differentiable
    /// (bool results: compare, logical), its result never requires grad.
    static constexpr Grad grad = Grad::rule;
    /// Operands no gradient flows to (bit k: operand k), e.g. where's condition.
    static constexpr unsigned no_grad_operands = 0;
};

// ---------------------------------------------------------------- unary
struct Neg : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "neg", cuda = "(-{0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T&) { return -g; }
    template <class V> static V eval(V x) {
        if constexpr (std::is_integral_v<V>) return detail::wrap(V{0}, x, [](auto a, auto b) { return a - b; });
        else return kiln::detail::simd::neg(x);
    }
};
struct Abs : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "abs", cuda = "abs({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) { return g * f(tag<Sign>, x); }
    template <class V> static V eval(V x) {
        if constexpr (std::is_integral_v<V>) return x < 0 ? Neg::eval(x) : x;
        else return kiln::detail::simd::abs(x);
    }
};
struct Exp : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "exp", cuda = "exp({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * y; }
    template <class V> static V eval(V x) { return kiln::detail::simd::exp(x); }
};
struct Expm1 : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "expm1", cuda = "expm1({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * (y + 1); }
    template <class V> static V eval(V x) { return kiln::detail::simd::expm1(x); }
};
struct Log : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "log", cuda = "log({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T& x) { return g / x; }
    template <class V> static V eval(V x) { return kiln::detail::simd::log(x); }
};
struct Log1p : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "log1p", cuda = "log1p({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T& x) { return g / (x + 1); }
    template <class V> static V eval(V x) { return kiln::detail::simd::log1p(x); }
};
struct Sqrt : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "sqrt", cuda = "sqrt({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g / (y * 2); }
    template <class V> static V eval(V x) { return kiln::detail::simd::sqrt(x); }
};
struct Rsqrt : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "rsqrt", cuda = "rsqrt({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * y * y * y * -0.5; }
    template <class V> static V eval(V x) { return kiln::detail::simd::rsqrt(x); }
};
struct Sin : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "sin", cuda = "sin({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) { return g * f(tag<Cos>, x); }
    template <class V> static V eval(V x) { return kiln::detail::simd::sin(x); }
};
struct Cos : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "cos", cuda = "cos({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) { return -(g * f(tag<Sin>, x)); }
    template <class V> static V eval(V x) { return kiln::detail::simd::cos(x); }
};
struct Tan : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "tan", cuda = "tan({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * (y * y + 1); }
    template <class V> static V eval(V x) { return kiln::detail::simd::tan(x); }
};
struct Tanh : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "tanh", cuda = "tanh({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * (1 - y * y); }
    template <class V> static V eval(V x) { return kiln::detail::simd::tanh(x); }
};
struct Erf : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "erf", cuda = "erf({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) { return g * f(tag<Exp>, -(x * x)) * 1.1283791670955126; }  // 2 / sqrt(pi)
    template <class V> static V eval(V x) { return kiln::detail::simd::erf(x); }
};
struct Sigmoid : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "sigmoid", cuda = "kiln_sigmoid({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return g * y * (1 - y); }
    // the CPU's formula (simd.hpp): e / (1 + e) with e = e^-|x| for x < 0, so tiny results keep their precision
    static constexpr std::string_view cuda_helper =
        "template <class T> __device__ __forceinline__ T kiln_sigmoid(T x) {\n"
        "  const T e = exp(-fabs(x));\n"
        "  return (x < T(0) ? e : T(1)) / (T(1) + e);\n"
        "}\n";
    template <class V> static V eval(V x) { return kiln::detail::simd::sigmoid(x); }
};
/// GELU, tanh approximation (torch's approximate='tanh'): x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
/// computed as x * sigmoid(2u) (the same value; no cancellation in 1 + tanh(u) for negative x).
/// A primitive rather than a composite so that a matmul's backend can take it as its epilogue.
struct GeluTanh : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "gelu_tanh", cuda = "kiln_gelu_tanh({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) {  // d/dx x s(z) = s + x s (1 - s) dz/dx
        const auto s = f(tag<Sigmoid>, (x + x * x * x * 0.044715) * 1.5957691216057308);
        return g * (s + x * s * (1 - s) * ((x * x * 0.134145 + 1) * 1.5957691216057308));
    }
    static constexpr std::string_view cuda_helper =
        "template <class T> __device__ __forceinline__ T kiln_gelu_tanh(T x) {  // as eval below, with kiln_sigmoid\n"
        "  const T z = T(1.5957691216057308) * (x + T(0.044715) * x * x * x);\n"
        "  return x * kiln_sigmoid(z);\n"
        "}\n";
    template <class V> static V eval(V x) {
        using S = detail::scalar_of<V>;
        const V z = V(S(1.5957691216057308)) * (x + V(S(0.044715)) * x * x * x);  // 2 sqrt(2/pi) (x + 0.044715 x^3)
        return x * kiln::detail::simd::sigmoid(z);
    }
};
/// torch.nn.Hardswish: x * relu6(x + 3) / 6 (NaN stays NaN).
struct Hardswish : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "hardswish", cuda = "kiln_hardswish({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) {  // torch: 0 below -3, x/3 + 1/2 up to 3, 1 above
        return f(tag<Where>, f(tag<Lt>, x, -3.0), 0.0, f(tag<Where>, f(tag<Le>, x, 3.0), g * (x / 3 + 0.5), g));
    }
    static constexpr std::string_view cuda_helper =
        "template <class T> __device__ __forceinline__ T kiln_hardswish(T x) { return x * kiln_min(kiln_max(x + T(3), T(0)), T(6)) / T(6); }\n";
    template <class V> static V eval(V x) {
        using T = detail::scalar_of<V>;
        return x * kiln::detail::simd::min(kiln::detail::simd::max(x + V(T(3)), V(T(0))), V(T(6))) / V(T(6));
    }
};
struct Relu : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "relu", cuda = "relu({0})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T&) { return f(tag<Where>, f(tag<Gt>, y, 0), g, 0); }  // torch: where the result is positive
    template <class V> static V eval(V x) { return kiln::detail::simd::relu(x); }
};
struct Floor : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "floor", cuda = "floor({0})";
    static constexpr Grad grad = Grad::zero;
    template <class V> static V eval(V x) {
        if constexpr (detail::is_int_v<V>) return x;
        else return kiln::detail::simd::floor(x);
    }
};
struct Ceil : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "ceil", cuda = "ceil({0})";
    static constexpr Grad grad = Grad::zero;
    template <class V> static V eval(V x) {
        if constexpr (detail::is_int_v<V>) return x;
        else return kiln::detail::simd::ceil(x);
    }
};
struct Round : OpTraits<1, DTypeRule::same, 0b110> {  // half to even, like torch.round
    static constexpr std::string_view name = "round", cuda = "rint({0})";
    static constexpr Grad grad = Grad::zero;
    template <class V> static V eval(V x) {
        if constexpr (detail::is_int_v<V>) return x;
        else return kiln::detail::simd::round(x);
    }
};
struct Sign : OpTraits<1, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "sign", cuda = "sign({0})";
    static constexpr Grad grad = Grad::zero;
    template <class V> static V eval(V x) { return kiln::detail::simd::sign(x); }
};
struct Reciprocal : OpTraits<1, DTypeRule::float_math> {
    static constexpr std::string_view name = "reciprocal", cuda = "(1 / ({0}))";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T& y, const T&) { return -(g * y * y); }
    template <class V> static V eval(V x) { return V(detail::scalar_of<V>(1)) / x; }
};
struct LogicalNot : OpTraits<1, DTypeRule::logical> {
    static constexpr std::string_view name = "logical_not", cuda = "(({0}) == 0)";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V x) { return kiln::detail::simd::logical_not(x); }
};
/// Conversion to the dtype attribute. Inside one compute type it only has to round (to f16/bf16)
/// or squash to 0/1 (to bool); conversions between compute types happen at loads and stores.
struct Cast : OpTraits<1, DTypeRule::cast> {
    static constexpr std::string_view name = "cast", cuda = "(({1})({0}))";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& x) { return f.cast(g, x.dtype()); }
    template <class V> static V eval(V x, DType to) {
        using T = detail::scalar_of<V>;
        if (to == DType::boolean) return kiln::detail::simd::ne(x, V(T(0)));
        if constexpr (std::is_same_v<T, float>) {
            if (to == DType::f16 || to == DType::bf16) return round_lanes(x, to);
        }
        return x;
    }

private:
    template <class V> static V round_lanes(V x, DType to) {
        auto round1 = [to](float f) {
            return to == DType::f16 ? static_cast<float>(half(f)) : static_cast<float>(bfloat16(f));
        };
        if constexpr (std::is_same_v<V, float>) {
            return round1(x);
        } else {
            alignas(64) float lanes[V::size];
            x.store_aligned(lanes);
            for (auto& l : lanes) l = round1(l);
            return V::load_aligned(lanes);
        }
    }
};

/// A copy into memory of its own: clone() inside kiln::compile. The identity the passes keep (a
/// cast to the same dtype is removed), so a clone the program returns never aliases its source.
struct Copy : OpTraits<1, DTypeRule::same> {
    static constexpr std::string_view name = "copy", cuda = "({0})";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T&) { return g; }
    template <class V> static V eval(V x) { return x; }
};

// ---------------------------------------------------------------- binary
struct Add : OpTraits<2, DTypeRule::same> {
    static constexpr std::string_view name = "add", cuda = "(({0}) + ({1}))";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T&, const T&) {
        if constexpr (K == 0) return g; else return g;
    }
    template <class V> static V eval(V a, V b) { return detail::wrap(a, b, [](auto x, auto y) { return x + y; }); }
};
struct Sub : OpTraits<2, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "sub", cuda = "(({0}) - ({1}))";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T&, const T&) {
        if constexpr (K == 0) return g; else return -g;
    }
    template <class V> static V eval(V a, V b) { return detail::wrap(a, b, [](auto x, auto y) { return x - y; }); }
};
struct Mul : OpTraits<2, DTypeRule::same> {
    static constexpr std::string_view name = "mul", cuda = "(({0}) * ({1}))";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T& a, const T& b) {
        if constexpr (K == 0) return g * b; else return g * a;
    }
    template <class V> static V eval(V a, V b) { return detail::wrap(a, b, [](auto x, auto y) { return x * y; }); }
};
struct Div : OpTraits<2, DTypeRule::float_math> {  // true division
    static constexpr std::string_view name = "div", cuda = "(({0}) / ({1}))";
    template <int K, class F, class T> static auto vjp(const F&, const T& g, const T&, const T& a, const T& b) {
        if constexpr (K == 0) return g / b; else return -(g * a / (b * b));
    }
    template <class V> static V eval(V a, V b) { return a / b; }
};
struct Pow : OpTraits<2, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "pow", cuda = "pow({0}, {1})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T& y, const T& a, const T& b) {  // torch: 0 where the exponent is 0 / where the base is 0 and the exponent >= 0
        if constexpr (K == 0) return f(tag<Where>, f(tag<Eq>, b, 0), 0, g * b * f(tag<Pow>, a, b - 1));
        else return f(tag<Where>, f(tag<LogicalAnd>, f(tag<Eq>, a, 0), f(tag<Ge>, b, 0)), 0, g * y * f(tag<Log>, a));
    }
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::pow(a, b); }
};
/// torch.remainder / Python's %: a - floor(a / b) * b, with the sign of the divisor. Integer x % 0
/// is 0 (torch raises ZeroDivisionError; a kernel cannot, so it follows numpy).
struct Remainder : OpTraits<2, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "remainder", cuda = "kiln_remainder({0}, {1})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& a, const T& b) {
        if constexpr (K == 0) return g; else return -(g * f(tag<Floor>, a / b));
    }
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::remainder(a, b); }
};
/// torch.fmod / C's fmod: a - trunc(a / b) * b, with the sign of the dividend. Integer fmod(x, 0) is 0.
struct Fmod : OpTraits<2, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "fmod", cuda = "kiln_fmod({0}, {1})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& a, const T& b) {  // trunc(a / b) = sign * floor(|a / b|)
        if constexpr (K == 0) return g; else return -(g * f(tag<Sign>, a / b) * f(tag<Floor>, f(tag<Abs>, a / b)));
    }
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::fmod(a, b); }
};
/// torch.floor_divide / Python's //: the floor of the true quotient (integers round toward -inf).
/// Integer x // 0 is 0 (torch raises ZeroDivisionError); INT_MIN // -1 wraps to INT_MIN.
struct FloorDivide : OpTraits<2, DTypeRule::same, 0b110> {
    static constexpr std::string_view name = "floor_divide", cuda = "kiln_floor_divide({0}, {1})";
    static constexpr Grad grad = Grad::zero;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::floor_divide(a, b); }
};
struct Maximum : OpTraits<2, DTypeRule::same> {  // NaN-propagating, like torch.maximum
    static constexpr std::string_view name = "maximum", cuda = "kiln_max({0}, {1})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& a, const T& b) {  // torch: ties split the gradient evenly
        if constexpr (K == 0) return f(tag<Where>, f(tag<Gt>, a, b), g, f(tag<Where>, f(tag<Eq>, a, b), g * 0.5, 0));
        else return f(tag<Where>, f(tag<Gt>, b, a), g, f(tag<Where>, f(tag<Eq>, a, b), g * 0.5, 0));
    }
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::max(a, b); }
};
struct Minimum : OpTraits<2, DTypeRule::same> {
    static constexpr std::string_view name = "minimum", cuda = "kiln_min({0}, {1})";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& a, const T& b) {
        if constexpr (K == 0) return f(tag<Where>, f(tag<Lt>, a, b), g, f(tag<Where>, f(tag<Eq>, a, b), g * 0.5, 0));
        else return f(tag<Where>, f(tag<Lt>, b, a), g, f(tag<Where>, f(tag<Eq>, a, b), g * 0.5, 0));
    }
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::min(a, b); }
};
struct Eq : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "eq", cuda = "(({0}) == ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::eq(a, b); }
};
struct Ne : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "ne", cuda = "(({0}) != ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::ne(a, b); }
};
struct Lt : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "lt", cuda = "(({0}) < ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::lt(a, b); }
};
struct Le : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "le", cuda = "(({0}) <= ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::le(a, b); }
};
struct Gt : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "gt", cuda = "(({0}) > ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::gt(a, b); }
};
struct Ge : OpTraits<2, DTypeRule::compare> {
    static constexpr std::string_view name = "ge", cuda = "(({0}) >= ({1}))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::ge(a, b); }
};
struct LogicalAnd : OpTraits<2, DTypeRule::logical> {
    static constexpr std::string_view name = "logical_and", cuda = "((({0}) != 0) && (({1}) != 0))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::logical_and(a, b); }
};
struct LogicalOr : OpTraits<2, DTypeRule::logical> {
    static constexpr std::string_view name = "logical_or", cuda = "((({0}) != 0) || (({1}) != 0))";
    static constexpr Grad grad = Grad::none;
    template <class V> static V eval(V a, V b) { return kiln::detail::simd::logical_or(a, b); }
};

// ---------------------------------------------------------------- ternary
struct Where : OpTraits<3, DTypeRule::where> {
    static constexpr std::string_view name = "where", cuda = "((({0}) != 0) ? ({1}) : ({2}))";
    template <int K, class F, class T> static auto vjp(const F& f, const T& g, const T&, const T& c, const T&, const T&) {
        if constexpr (K == 2) return f(tag<Where>, c, 0, g); else return f(tag<Where>, c, g, 0);
    }
    static constexpr unsigned no_grad_operands = 0b001;  // the condition
    template <class V> static V eval(V c, V a, V b) { return kiln::detail::simd::select(c, a, b); }
};

// ---------------------------------------------------------------- the table
template <class... Ops> struct OpList {
    static constexpr std::size_t size = sizeof...(Ops);
};

/// Every primitive elementwise op. Adding one: a struct above and an entry here.
using ElementwiseOps = OpList<Neg, Abs, Exp, Expm1, Log, Log1p, Sqrt, Rsqrt, Sin, Cos, Tan, Tanh, Erf, Sigmoid, GeluTanh, Hardswish, Relu,
                              Floor, Ceil, Round, Sign, Reciprocal, LogicalNot, Cast, Copy, Add, Sub, Mul, Div, Pow, Remainder,
                              Fmod, FloorDivide, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, Where>;

/// Runtime id of an op: its position in ElementwiseOps.
using OpId = std::uint8_t;

namespace detail {
template <class Op, class List> struct IndexOf;
template <class Op, class... Ops> struct IndexOf<Op, OpList<Ops...>> {
    static constexpr std::size_t value = [] {
        constexpr bool hits[] = {std::is_same_v<Op, Ops>...};
        for (std::size_t i = 0; i < sizeof...(Ops); ++i)
            if (hits[i]) return i;
        return sizeof...(Ops);
    }();
    static_assert(value < sizeof...(Ops), "op is not in ElementwiseOps");
};
template <class F, class... Ops>
decltype(auto) visit_in(OpList<Ops...>, OpId id, F&& f) {
    using R = decltype(f(std::type_identity<typename std::tuple_element<0, std::tuple<Ops...>>::type>{}));
    if constexpr (std::is_void_v<R>) {
        std::size_t i = 0;
        ((i++ == id ? (f(std::type_identity<Ops>{}), true) : false) || ...);
    } else {
        R r{};
        std::size_t i = 0;
        ((i++ == id ? (r = f(std::type_identity<Ops>{}), true) : false) || ...);
        return r;
    }
}
}  // namespace detail

template <class Op> inline constexpr OpId op_id = static_cast<OpId>(detail::IndexOf<Op, ElementwiseOps>::value);

/// Calls f(std::type_identity<Op>{}) for the op with this runtime id.
template <class F>
decltype(auto) visit_op(OpId id, F&& f) {
    return detail::visit_in(ElementwiseOps{}, id, std::forward<F>(f));
}

/// Calls f(std::type_identity<Op>{}) for every op in the table.
template <class F>
void for_each_op(F&& f) {
    [&]<class... Ops>(OpList<Ops...>) { (f(std::type_identity<Ops>{}), ...); }(ElementwiseOps{});
}

namespace detail {
/// Each op's constant facts, indexed by OpId: a table lookup, not a visit (a chain of one
/// comparison and one lambda per op, compiled in every file).
template <class List> struct OpFacts;
template <class... Ops> struct OpFacts<OpList<Ops...>> {
    static constexpr std::size_t size = sizeof...(Ops);
    static constexpr std::string_view name[] = {Ops::name...};
    static constexpr int arity[] = {Ops::arity...};
    static constexpr DTypeRule rule[] = {Ops::rule...};
    static constexpr Grad grad[] = {Ops::grad...};
    static constexpr unsigned allowed_categories[] = {Ops::allowed_categories...};
};
using Facts = OpFacts<ElementwiseOps>;
}  // namespace detail

/// An op's name, arity, dtype rule, gradient kind and allowed dtype categories; an id outside the
/// table gives the type's default value, as visit_op does.
inline std::string_view op_name(OpId id) { return id < detail::Facts::size ? detail::Facts::name[id] : std::string_view{}; }
inline int op_arity(OpId id) { return id < detail::Facts::size ? detail::Facts::arity[id] : 0; }
inline DTypeRule op_rule(OpId id) { return id < detail::Facts::size ? detail::Facts::rule[id] : DTypeRule{}; }
/// Whether a loop computing an op of this rule may write its large outputs with streaming stores
/// (simd::store_stream, simd::stream_min_bytes): not where it computes float math (a
/// transcendental, a division, a root). Such loops are bound by arithmetic, and there streaming
/// made them slower (one thread, Zen 4, 2026-12-07, bench/results/cpu_2026-12-07_s27): chain16M's
/// generated kernel (exp, tanh, sigmoid) 12.0 -> 12.5-13.9 ms, bias_gelu's 3.5 -> 3.8-3.9 ms. Loops
/// of plain arithmetic are bound by memory, and there it saves the read for ownership: x * 2 + 1
/// over 64 MB 6.1 -> 4.5 ms, the last pass of layer_norm over 8192 x 1024 4.2 -> 2.7 ms.
constexpr bool streams_ok(DTypeRule r) { return r != DTypeRule::float_math; }
inline Grad op_grad(OpId id) { return id < detail::Facts::size ? detail::Facts::grad[id] : Grad{}; }
inline unsigned op_allowed_categories(OpId id) { return id < detail::Facts::size ? detail::Facts::allowed_categories[id] : 0u; }

/// The op that computes `op` for a result of this dtype: bool + bool is a logical or in torch
/// (True + True is True), while bools compute as 0/1 integers, where 1 + 1 is 2. Every evaluator
/// (tile programs, eager, lowering to IR, CUDA) runs add of a bool result as logical_or; an
/// expression type's fused loop does where its type shows the bools (expr::StaticBool) and
/// otherwise leaves the tree to the tile interpreter (expr::Flat::bool_add).
inline OpId op_for_dtype(OpId op, DType dtype) {
    return op == op_id<Add> && dtype == DType::boolean ? op_id<LogicalOr> : op;
}

}  // namespace kiln::ops
