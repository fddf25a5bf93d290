// The IR: nodes and graphs that tracing records and passes, the fuser and backends consume.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/tables/op_table.hpp"
#include "kiln/tables/reduce_table.hpp"

namespace kiln::ir {

/// What a node computes.
enum class Kind : std::uint8_t {
    input,        ///< argument `index` of the traced call
    constant,     ///< a tensor captured by the traced function (bound by handle, read at run time)
    scalar,       ///< a number (a C++ literal in an expression, or a folded constant)
    elementwise,  ///< a table op over broadcast operands
    reduce,       ///< sum / prod / max / min / mean over `mask`
    arg_reduce,   ///< argmax / argmin
    matmul,       ///< matrix product (batch dims broadcast), a library call
    view,         ///< a movement op: a view of its operand in logical (row-major) order
    call,         ///< a library op kiln does not generate code for (conv2d, pooling): runs `Node::call`
    view_write,   ///< operand 0 with the strided view (`args`, offset `value`, operand 1's shape) of its
                  ///< row-major layout replaced by operand 1 (same dtype): a write into a view, functionalized
};

/// A reduction of the table (tables/reduce_table.hpp), by its id there.
enum class ReduceKind : ops::ReduceId {
    sum = ops::reduce_id<ops::SumR>,
    prod = ops::reduce_id<ops::ProdR>,
    max = ops::reduce_id<ops::MaxR>,
    min = ops::reduce_id<ops::MinR>,
    mean = ops::reduce_id<ops::MeanR>,
};
static_assert(ops::Reductions::size == 5, "a reduction was added to the table: name it in ir::ReduceKind");
/// Every movement op of a tracing tensor (reshape, permute, slice, expand, squeeze...) records the
/// strided view it makes of its operand's logical row-major layout: shape, strides, offset.
enum class ViewKind : std::uint8_t { as_strided };

inline const char* kind_name(Kind k) {
    switch (k) {
        case Kind::input: return "input";
        case Kind::constant: return "constant";
        case Kind::scalar: return "scalar";
        case Kind::elementwise: return "elementwise";
        case Kind::reduce: return "reduce";
        case Kind::arg_reduce: return "arg_reduce";
        case Kind::matmul: return "matmul";
        case Kind::view: return "view";
        case Kind::call: return "call";
        case Kind::view_write: return "view_write";
    }
    return "?";
}
inline const char* reduce_name(ReduceKind r) { return ops::reduction_name(static_cast<ops::ReduceId>(r)).data(); }
/// Calls f(std::type_identity<R>{}) for the table entry of a reduction kind.
template <class F>
decltype(auto) visit_reduction(ReduceKind k, F&& f) {
    return ops::visit_reduction(static_cast<ops::ReduceId>(k), std::forward<F>(f));
}
inline const char* view_name(ViewKind) { return "as_strided"; }

/// A library op in a graph (Kind::call): computes its output from concrete operand tensors on any
/// device, outside kiln's code generation, like a matmul. `key` names it with every attribute, for
/// hashing, printing and common subexpressions ("conv2d(stride=2, padding=3, act=relu)"): two ops
/// with one key must compute the same function of their operands.
///
/// The optional hooks let passes rewrite an op without knowing what it is (passes/fold_conv_affine.hpp):
/// - `fold_affine(operands, scale, shift)`: an op and operands computing `op(operands) * scale +
///   shift`, scale and shift 1-D float64 tensors over the output's last dim. `operands[i]` holds the
///   tensor of operand i where the graph has it as a captured constant, and is undefined otherwise.
///   In the result, an undefined operand i stands for the original operand i (the same graph
///   value); a defined one is a new constant. nullopt where the op cannot take the map.
/// - `with_relu()`: the op computing `relu(op(operands))` over the same operands, or null.
/// - `with_residual()`: the op computing `op(operands) + z` over the operands and then z (of the
///   output's shape and dtype), or null (passes/fold_call_epilogue.hpp).
/// - `constant_layout(i, t)`: operand i's captured tensor t in the layout the op reads fastest
///   (the same values; conv2d's weight channels-last), or t itself. Passes bind it in t's place
///   where the program owns its constants (passes/constant_layouts.hpp).
struct CallOp {
    /// An op and its operands after a rewrite (see fold_affine).
    struct Rewrite {
        std::shared_ptr<const CallOp> op;
        std::vector<Tensor> operands;
    };
    std::string key;
    std::function<Tensor(const std::vector<Tensor>&)> run;  ///< operands -> the output (async on the device's stream)
    std::function<Shape(const std::vector<Shape>&)> shape;  ///< output shape from operand shapes (dynamic dims)
    std::function<std::optional<Rewrite>(const std::vector<Tensor>&, const Tensor&, const Tensor&)> fold_affine{};
    std::function<std::shared_ptr<const CallOp>()> with_relu{};
    std::function<std::shared_ptr<const CallOp>()> with_residual{};
    std::function<Tensor(std::size_t, const Tensor&)> constant_layout{};
    /// The op waits for asynchronous work an earlier op started (a collective's join): work that
    /// does not need its result is scheduled before it (passes/delay_waits.hpp), to overlap.
    bool waits = false;
    /// How an exported program saves the op (kiln/export): the name it is registered under
    /// (ir/library_ops.hpp) and the numbers that op's factory makes it again from. An op without a
    /// name cannot be exported.
    std::string name{};
    std::vector<std::pair<std::string, double>> attrs{};
};

/// The numbers of a view (sizes, strides, offset) as functions of a program's dynamic input dims,
/// for views that re-deriving from their operand's shape cannot follow (a reshape that merges or
/// splits a dynamic dim: (batch, seq, E) -> (batch * seq, E)). kiln::export_program fits them from
/// traces at several sizes. A number is a sum of terms w * prod over the term's variables v of
/// (size of v - v's size at the trace); variables are dims of the program's inputs.
struct SymView {
    struct Vars {
        std::vector<std::pair<int, int>> at;  ///< (input index, dim) of each variable
        std::vector<std::int64_t> base;       ///< its size at the trace
    };
    using Number = std::vector<std::pair<unsigned, std::int64_t>>;  ///< (variable mask, weight) terms
    std::shared_ptr<const Vars> vars;
    std::vector<Number> shape, strides;
    Number offset;

    /// The number for inputs of these shapes into `out`; false where it overflows int64 (a file's
    /// formulas may say anything).
    bool eval(const Number& n, const std::vector<Shape>& inputs, std::int64_t& out) const {
        std::int64_t v = 0;
        for (const auto& [mask, w] : n) {
            std::int64_t t = w;
            for (std::size_t k = 0; k < vars->at.size(); ++k)
                if ((mask >> k) & 1u) {
                    const auto [in, d] = vars->at[k];
                    std::int64_t f = 0;
                    if (__builtin_sub_overflow(inputs[static_cast<std::size_t>(in)][d], vars->base[k], &f) || __builtin_mul_overflow(t, f, &t))
                        return false;
                }
            if (__builtin_add_overflow(v, t, &v)) return false;
        }
        out = v;
        return true;
    }
    /// The number for inputs of these shapes (an overflow gives the lowest int64, which no size is).
    std::int64_t eval(const Number& n, const std::vector<Shape>& inputs) const {
        std::int64_t v = 0;
        return eval(n, inputs, v) ? v : std::numeric_limits<std::int64_t>::min();
    }
};

/// One value of the graph. Operands always precede their users (the node list is topological).
struct Node {
    Kind kind = Kind::input;
    DType dtype = DType::f32;
    Shape shape;                 ///< shape for the specialization being built
    std::vector<int> in;         ///< operand node ids
    // elementwise
    ops::OpId op{};
    DType ct = DType::f32;       ///< compute type
    DType attr = DType::f32;     ///< cast target
    // scalar
    double value = 0;
    // reduce / arg_reduce
    ReduceKind rkind = ReduceKind::sum;
    unsigned mask = 0;           ///< reduce: reduced axes of the operand; view, view_write: the view's dims whose extent a
                                 ///< slice fixed (they never follow a dynamic dim)
    bool keepdim = false;
    bool arg_max = true;
    double correction = 0;       ///< mean: sum / max(0, count - correction)
    // view
    ViewKind vkind = ViewKind::as_strided;
    Dims args;                   ///< view, view_write: strides over the (base) operand's row-major layout (offset in `value`)
    std::shared_ptr<const SymView> sym;  ///< view, view_write: its numbers for other input sizes (exported programs)
    // input
    int index = -1;
    // constant
    Tensor tensor;
    /// constant: memory the traced function made (a tensor it creates, as `zeros` filled by
    /// slices): each call must see its first value, so no write may go into it in place
    bool fresh = false;
    // call
    std::shared_ptr<const CallOp> call;
    std::source_location loc{};

    bool is_elementwise() const { return kind == Kind::elementwise; }
};

/// Runs a Kind::call node on the values of its operands (`vals` indexed by node id), as every
/// backend's executor does.
inline Tensor run_call(const Node& n, const std::vector<Tensor>& vals) {
    std::vector<Tensor> in;
    in.reserve(n.in.size());
    for (int j : n.in) in.push_back(vals[static_cast<std::size_t>(j)]);
    return n.call->run(in);
}

/// A traced program: nodes in topological order, which of them are inputs and outputs.
struct Graph {
    std::vector<Node> nodes;
    std::vector<int> inputs;   ///< node ids of Kind::input, in argument order
    std::vector<int> outputs;  ///< node ids returned, in order

    int add(Node n) {
        nodes.push_back(std::move(n));
        return static_cast<int>(nodes.size()) - 1;
    }
    const Node& operator[](int id) const { return nodes[static_cast<std::size_t>(id)]; }
    Node& operator[](int id) { return nodes[static_cast<std::size_t>(id)]; }
    int size() const { return static_cast<int>(nodes.size()); }

    /// Number of users of each node (outputs count as a use).
    std::vector<int> use_counts() const {
        std::vector<int> uses(nodes.size(), 0);
        for (const Node& n : nodes)
            for (int i : n.in) ++uses[static_cast<std::size_t>(i)];
        for (int o : outputs) ++uses[static_cast<std::size_t>(o)];
        return uses;
    }
};

}  // namespace kiln::ir
