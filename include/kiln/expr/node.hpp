// Expression-template nodes: leaves (tensors, scalars) and op nodes that hold their operands by value.
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"
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

/// Whether E's value is a bool whatever its inputs' dtypes: a compare or logical op, or an add or
/// multiply of such values (bool + bool is a logical or, bool * bool a logical and). Fused loops
/// compute an add of these as a logical or; an add that is bool only at run time (of bool
/// tensors) leaves its tree to the tile interpreter (Flat::bool_add).
template <class E> struct StaticBool : std::false_type {};
template <class Op, class... A>
struct StaticBool<Node<Op, A...>>
    : std::bool_constant<Op::rule == ops::DTypeRule::compare || Op::rule == ops::DTypeRule::logical ||
                         ((std::is_same_v<Op, ops::Add> || std::is_same_v<Op, ops::Mul>) && (StaticBool<A>::value && ...))> {};

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

/// One operand of an op node as shape inference sees it: a tensor or node (its Info), or a
/// C++ number.
struct OperandInfo {
    const Info* info = nullptr;
    const Scalar* scalar = nullptr;
};

/// Shape, dtype and compute type of table op `op` over its operands (torch's broadcasting and
/// promotion), the first fault in the operands or of this node recorded in the result. Compiled
/// once (not once per node type).
KILN_DECL Info infer_node(ops::OpId op, const OperandInfo* operands, int n, DType attr);

inline OperandInfo operand_info(const TensorLeaf& a, Info& own) {
    own = a.info();
    return {&own, nullptr};
}
inline OperandInfo operand_info(const ScalarLeaf& a, Info&) { return {nullptr, &a.s}; }
template <class Op, class... A>
OperandInfo operand_info(const Node<Op, A...>& a, Info&) { return {&a.info, nullptr}; }

/// Shape, dtype and compute type of Op over args.
template <class Op, class... A>
Info infer(const std::tuple<A...>& args, DType attr) {
    OperandInfo in[sizeof...(A)];
    Info own[sizeof...(A)];
    [&]<std::size_t... K>(std::index_sequence<K...>) {
        ((in[K] = operand_info(std::get<K>(args), own[K])), ...);
    }(std::index_sequence_for<A...>{});
    return infer_node(ops::op_id<Op>, in, static_cast<int>(sizeof...(A)), attr);
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

/// An expression as a flat list of its leaves and nodes, in the order a depth-first walk
/// finishes them (operands left to right, then their node; the root last). Evaluation, tracing,
/// the CUDA statement path and eager all read this, compiled once, instead of each walking the
/// expression's type: an expression type costs its construction and one walk.
struct Flat {
    enum class Kind : unsigned char { tensor, scalar, op };
    struct Item {
        Kind kind = Kind::op;
        int arity = 0;                   ///< op: number of operands
        int in[3] = {-1, -1, -1};        ///< op: its operands' item indices
        int index = 0;                   ///< tensor: leaf number; scalar: scalar number (walk order)
        ops::OpId op{};                  ///< op: the table op it runs (ops::op_for_dtype applied)
        DType attr = DType::f32;         ///< op: cast target
        DType parent_ct = DType::f32;    ///< scalar: compute type of the op that reads it
        const Info* info = nullptr;      ///< op: its Info (owned by the expression)
        const Tensor* tensor = nullptr;  ///< tensor
        double value = 0;                ///< scalar
    };
    std::vector<Item> items;
    int leaves = 0, scalars = 0;
    /// Whether an add of the tree has a bool result (computed as a logical or) that its type does
    /// not show (an add of bool tensors; StaticBool): expression types' fused loops leave such
    /// trees to the tile interpreter. Set by flatten (flatten_into); a flat form built by hand
    /// (autograd's) runs without a fused loop anyway (Fused{}).
    bool bool_add = false;

    const Item& root() const { return items.back(); }
    const Info& info() const { return *items.back().info; }
};

inline int flatten_into(const TensorLeaf& e, Flat& f, DType) {
    Flat::Item it;
    it.kind = Flat::Kind::tensor;
    it.index = f.leaves++;
    it.tensor = &e.t;
    f.items.push_back(it);
    return static_cast<int>(f.items.size() - 1);
}
inline int flatten_into(const ScalarLeaf& e, Flat& f, DType parent_ct) {
    Flat::Item it;
    it.kind = Flat::Kind::scalar;
    it.index = f.scalars++;
    it.parent_ct = parent_ct;
    it.value = e.s.value;
    f.items.push_back(it);
    return static_cast<int>(f.items.size() - 1);
}
template <class Op, class... A>
int flatten_into(const Node<Op, A...>& e, Flat& f, DType) {
    Flat::Item it;
    it.arity = static_cast<int>(sizeof...(A));
    [&]<std::size_t... K>(std::index_sequence<K...>) {
        ((it.in[K] = flatten_into(std::get<K>(e.args), f, e.info.ct)), ...);
    }(std::index_sequence_for<A...>{});
    it.op = ops::op_for_dtype(ops::op_id<Op>, e.info.dtype);
    if constexpr (std::is_same_v<Op, ops::Add>) {
        if constexpr (StaticBool<Node<Op, A...>>::value) {
            if (it.op == ops::op_id<Op>) throw InternalError("kiln: an add of bool-valued operands has a non-bool result");
        } else {
            f.bool_add = f.bool_add || it.op != ops::op_id<Op>;
        }
    }
    it.attr = e.attr;
    it.info = &e.info;
    f.items.push_back(it);
    return static_cast<int>(f.items.size() - 1);
}

/// The flat form of expression e (which must outlive it).
template <class E>
Flat flatten(const E& e) {
    static_assert(IsNode<E>::value, "kiln: flatten takes an expression node");
    Flat f;
    f.items.reserve(8);
    flatten_into(e, f, e.info.ct);
    return f;
}

}  // namespace expr
}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/expr/node_impl.hpp"
#endif
