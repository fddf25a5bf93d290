// Expression-template nodes: leaves (tensors, scalars) and op nodes that hold their operands by value.
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/tables/op_table.hpp"

namespace kiln {
namespace expr {

/// What an expression computes, worked out when it is built: shape, dtype, the compute type
/// its op runs in, and the first error in the tree (thrown, with the user's source location,
/// when the expression is evaluated).
struct Info {
    enum class Fault : unsigned char { none, shape, dtype };
    Shape shape;
    DType dtype = DType::f32;
    DType ct = DType::f32;   ///< compute type of this node's op
    bool agnostic = true;    ///< op gives the same answer in any compute type (bool-valued logic)
    /// Compute type shared by every non-agnostic node of the tree: a DType, or none/mixed.
    int tree_ct = tree_none;
    Fault fault = Fault::none;
    std::shared_ptr<const std::string> error;

    static constexpr int tree_none = -1, tree_mixed = -2;
    bool ok() const { return fault == Fault::none; }
    [[noreturn]] void raise(const std::source_location& loc) const {
        const std::string msg = *error + " at " + kiln::detail::format_location(loc);
        if (fault == Fault::shape) throw ShapeError(msg);
        throw DTypeError(msg);
    }
};

/// A tensor operand (shared handle: the expression keeps the data alive).
struct TensorLeaf {
    Tensor t;
    Info info() const { return {t.shape(), t.dtype(), compute_dtype(t.dtype()), true, Info::tree_none, {}, {}}; }
};

/// A C++ number operand.
struct ScalarLeaf {
    Scalar s;
};

/// An op applied to operands, each a TensorLeaf, ScalarLeaf or Node.
template <class Op, class... Args>
struct Node {
    using op = Op;
    std::tuple<Args...> args;
    DType attr = DType::f32;  ///< cast target
    Info info;

    const Shape& shape() const { return info.shape; }
    DType dtype() const { return info.dtype; }
    int rank() const { return info.shape.rank(); }
    std::int64_t numel() const { return info.shape.numel(); }
};

template <class T> struct IsNode : std::false_type {};
template <class Op, class... A> struct IsNode<Node<Op, A...>> : std::true_type {};

}  // namespace expr

template <class Op, class... A> struct IsExprNode<expr::Node<Op, A...>> : std::true_type {};

/// An unevaluated elementwise expression (the result of an op on tensors).
template <class E>
concept TensorExpr = expr::IsNode<std::remove_cvref_t<E>>::value;

/// Anything an op accepts: a Tensor, an expression, or a C++ number.
template <class E>
concept Operand = std::is_same_v<std::remove_cvref_t<E>, Tensor> || TensorExpr<E> ||
                  (std::is_arithmetic_v<std::remove_cvref_t<E>>);

namespace expr {

template <class X>
auto as_leaf(const X& x) {
    using D = std::remove_cvref_t<X>;
    if constexpr (std::is_same_v<D, Tensor>) return TensorLeaf{x};
    else if constexpr (std::is_arithmetic_v<D>) return ScalarLeaf{Scalar(x)};
    else return x;
}
template <class X> using leaf_t = decltype(as_leaf(std::declval<const X&>()));

template <class A> Info info_of(const A& a) {
    if constexpr (std::is_same_v<A, TensorLeaf>) return a.info();
    else return a.info;
}

/// Shape, dtype and compute type of Op over args (torch's broadcasting and promotion).
template <class Op, class... A>
Info infer(const std::tuple<A...>& args, DType attr) {
    using ops::DTypeRule;
    Info out;
    out.agnostic = false;
    // the first fault in the operands wins
    bool fault = false;
    std::apply([&](const auto&... a) {
        ([&] {
            if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(a)>, ScalarLeaf>) {
                const Info& i = info_of(a);
                if (!fault && !i.ok()) { out.fault = i.fault; out.error = i.error; fault = true; }
            }
        }(), ...);
    }, args);
    if (fault) return out;
    auto fail = [&](Info::Fault f, std::string msg) {
        out.fault = f;
        out.error = std::make_shared<const std::string>("kiln::" + std::string(Op::name) + ": " + msg);
        return out;
    };
    // broadcast shapes
    std::string shapes;
    bool first = true, bad = false;
    std::apply([&](const auto&... a) {
        ([&] {
            if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(a)>, ScalarLeaf>) {
                const Shape& s = info_of(a).shape;
                shapes += (shapes.empty() ? "" : " with ") + s.str();
                if (first) { out.shape = s; first = false; }
                else if (!bad && !kiln::detail::try_broadcast(out.shape, s, out.shape)) bad = true;
            }
        }(), ...);
    }, args);
    if (bad) return fail(Info::Fault::shape, "cannot broadcast " + shapes);
    // promote dtypes (where: the condition does not take part)
    kiln::detail::ResultType rt;
    std::string dtypes;
    int k = 0;
    DType cond = DType::boolean;
    std::apply([&](const auto&... a) {
        ([&] {
            using X = std::remove_cvref_t<decltype(a)>;
            const bool skip = Op::rule == DTypeRule::where && k == 0;
            if constexpr (std::is_same_v<X, ScalarLeaf>) {
                dtypes += (dtypes.empty() ? "" : ", ") + std::string("scalar");
                if (!skip) rt.scalar(a.s);
            } else {
                const Info& i = info_of(a);
                dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(i.dtype));
                if (skip) cond = i.dtype;
                else rt.tensor(i.dtype, i.shape.rank() == 0);
            }
            ++k;
        }(), ...);
    }, args);
    if (Op::rule == DTypeRule::where && cond != DType::boolean)
        return fail(Info::Fault::dtype, "the condition must be bool, got " + std::string(dtype_name(cond)));
    const DType p = rt.result();
    if (!(Op::allowed_categories & (1u << dtype_category(p))))
        return fail(Info::Fault::dtype, "not supported for dtype " + std::string(dtype_name(p)) + " (operands: " + dtypes + ")");
    switch (Op::rule) {
        case DTypeRule::same: case DTypeRule::where:
            out.dtype = p;
            out.ct = compute_dtype(p);
            out.agnostic = p == DType::boolean;
            break;
        case DTypeRule::float_math:
            out.dtype = is_floating(p) ? p : default_float_dtype;
            out.ct = compute_dtype(out.dtype);
            break;
        case DTypeRule::compare: case DTypeRule::logical:
            out.dtype = DType::boolean;
            out.ct = compute_dtype(p);
            out.agnostic = p == DType::boolean;
            break;
        case DTypeRule::cast:
            out.dtype = attr;
            out.ct = attr == DType::boolean ? compute_dtype(p) : compute_dtype(attr);
            out.agnostic = attr == DType::boolean && p == DType::boolean;
            break;
    }
    // the compute type the whole tree shares, if any
    out.tree_ct = out.agnostic ? Info::tree_none : static_cast<int>(out.ct);
    std::apply([&](const auto&... a) {
        ([&] {
            if constexpr (IsNode<std::remove_cvref_t<decltype(a)>>::value) {
                const int c = a.info.tree_ct;
                if (c == Info::tree_none) return;
                if (out.tree_ct == Info::tree_none) out.tree_ct = c;
                else if (c != out.tree_ct) out.tree_ct = Info::tree_mixed;
            }
        }(), ...);
    }, args);
    return out;
}

/// Builds the node for Op over operands (Tensors, expressions, numbers).
template <class Op, class... X>
auto make(DType attr, const X&... x) {
    static_assert(sizeof...(X) == Op::arity, "wrong number of operands for this op");
    static_assert((... || !std::is_arithmetic_v<std::remove_cvref_t<X>>),
                  "kiln: an op needs at least one Tensor or expression operand");
    using N = Node<Op, leaf_t<X>...>;
    N n{{as_leaf(x)...}, attr, {}};
    n.info = infer<Op>(n.args, attr);
    return n;
}

}  // namespace expr
}  // namespace kiln
