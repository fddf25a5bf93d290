// Public elementwise functions and operators: each builds an expression node from the op table.
#pragma once

#include "kiln/expr/node.hpp"

namespace kiln {

namespace detail {
/// Callable for a table op: checks the operands at compile time and builds the node.
template <class Op>
struct OpFn {
    template <class... X>
    auto operator()(const X&... x) const {
        static_assert(sizeof...(X) == Op::arity, "kiln: wrong number of operands for this op");
        static_assert((Operand<X> && ...),
                      "kiln: operands must be kiln::Tensor, a kiln expression, or a C++ number");
        return expr::make<Op>(DType::f32, x...);
    }
};
}  // namespace detail

// One public name per table op.
inline constexpr detail::OpFn<ops::Neg> neg{};
inline constexpr detail::OpFn<ops::Abs> abs{};
inline constexpr detail::OpFn<ops::Exp> exp{};
inline constexpr detail::OpFn<ops::Expm1> expm1{};
inline constexpr detail::OpFn<ops::Log> log{};
inline constexpr detail::OpFn<ops::Log1p> log1p{};
inline constexpr detail::OpFn<ops::Sqrt> sqrt{};
inline constexpr detail::OpFn<ops::Rsqrt> rsqrt{};
inline constexpr detail::OpFn<ops::Sin> sin{};
inline constexpr detail::OpFn<ops::Cos> cos{};
inline constexpr detail::OpFn<ops::Tan> tan{};
inline constexpr detail::OpFn<ops::Tanh> tanh{};
inline constexpr detail::OpFn<ops::Erf> erf{};
inline constexpr detail::OpFn<ops::Sigmoid> sigmoid{};
inline constexpr detail::OpFn<ops::Hardswish> hardswish{};
inline constexpr detail::OpFn<ops::Relu> relu{};
inline constexpr detail::OpFn<ops::GeluTanh> gelu_tanh{};  ///< GELU, tanh approximation (torch's approximate='tanh')
inline constexpr detail::OpFn<ops::Floor> floor{};
inline constexpr detail::OpFn<ops::Ceil> ceil{};
inline constexpr detail::OpFn<ops::Round> round{};
inline constexpr detail::OpFn<ops::Sign> sign{};
inline constexpr detail::OpFn<ops::Reciprocal> reciprocal{};
inline constexpr detail::OpFn<ops::LogicalNot> logical_not{};
inline constexpr detail::OpFn<ops::Add> add{};
inline constexpr detail::OpFn<ops::Sub> sub{};
inline constexpr detail::OpFn<ops::Mul> mul{};
inline constexpr detail::OpFn<ops::Div> div{};
inline constexpr detail::OpFn<ops::Pow> pow{};
inline constexpr detail::OpFn<ops::Remainder> remainder{};     ///< a % b with the sign of b (torch.remainder, Python's %)
inline constexpr detail::OpFn<ops::Fmod> fmod{};               ///< C's fmod: the sign of a (torch.fmod)
inline constexpr detail::OpFn<ops::FloorDivide> floor_divide{}; ///< floor(a / b) (torch.floor_divide, Python's //)
inline constexpr detail::OpFn<ops::Maximum> maximum{};
inline constexpr detail::OpFn<ops::Minimum> minimum{};
inline constexpr detail::OpFn<ops::Eq> eq{};
inline constexpr detail::OpFn<ops::Ne> ne{};
inline constexpr detail::OpFn<ops::Lt> lt{};
inline constexpr detail::OpFn<ops::Le> le{};
inline constexpr detail::OpFn<ops::Gt> gt{};
inline constexpr detail::OpFn<ops::Ge> ge{};
inline constexpr detail::OpFn<ops::LogicalAnd> logical_and{};
inline constexpr detail::OpFn<ops::LogicalOr> logical_or{};
inline constexpr detail::OpFn<ops::Where> where{};

/// Converts to dtype (torch's .to(dtype) inside an expression).
template <Operand X>
auto cast(const X& x, DType dtype) {
    return expr::make<ops::Cast>(dtype, x);
}

// Operators: at least one side is a Tensor or an expression; the other may be a number.
template <class A, class B>
concept BinaryOperands = Operand<A> && Operand<B> && (!std::is_arithmetic_v<A> || !std::is_arithmetic_v<B>);

template <class A, class B> requires BinaryOperands<A, B> auto operator+(const A& a, const B& b) { return add(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator-(const A& a, const B& b) { return sub(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator*(const A& a, const B& b) { return mul(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator/(const A& a, const B& b) { return div(a, b); }
/// torch's %: remainder, with the sign of the divisor (not C++'s truncating %).
template <class A, class B> requires BinaryOperands<A, B> auto operator%(const A& a, const B& b) { return remainder(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator==(const A& a, const B& b) { return eq(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator!=(const A& a, const B& b) { return ne(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator<(const A& a, const B& b) { return lt(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator<=(const A& a, const B& b) { return le(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator>(const A& a, const B& b) { return gt(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator>=(const A& a, const B& b) { return ge(a, b); }
/// Logical and/or/not (on any dtype: nonzero is true), like torch's & | ~ on bool tensors.
template <class A, class B> requires BinaryOperands<A, B> auto operator&(const A& a, const B& b) { return logical_and(a, b); }
template <class A, class B> requires BinaryOperands<A, B> auto operator|(const A& a, const B& b) { return logical_or(a, b); }
template <class A> requires (Operand<A> && !std::is_arithmetic_v<A>) auto operator-(const A& a) { return neg(a); }
template <class A> requires (Operand<A> && !std::is_arithmetic_v<A>) auto operator!(const A& a) { return logical_not(a); }

namespace expr {
// expression nodes live here, so argument-dependent lookup must find the operators here too
using kiln::operator+, kiln::operator-, kiln::operator*, kiln::operator/, kiln::operator%, kiln::operator==, kiln::operator!=,
    kiln::operator<, kiln::operator<=, kiln::operator>, kiln::operator>=, kiln::operator&, kiln::operator|,
    kiln::operator!;
}  // namespace expr

}  // namespace kiln
