// The verifier: structural invariants every pass must keep.
#pragma once

#include <string>

#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"

namespace kiln::ir {

/// Throws InternalError naming the first broken invariant: operands precede users, arities,
/// inputs and outputs in range, elementwise shapes are the broadcast of their operands.
inline void verify(const Graph& g, const std::string& after = "trace") {
    auto bad = [&](int id, const std::string& what) {
        throw InternalError("kiln: invalid graph after " + after + ": %" + std::to_string(id) + " " + what + "\n" +
                            to_string(g));
    };
    for (int i = 0; i < g.size(); ++i) {
        const Node& n = g[i];
        for (int j : n.in)
            if (j < 0 || j >= i) bad(i, "uses %" + std::to_string(j) + ", which does not precede it");
        switch (n.kind) {
            case Kind::input: case Kind::constant: case Kind::scalar:
                if (!n.in.empty()) bad(i, "is a leaf with operands");
                break;
            case Kind::elementwise: {
                if (static_cast<int>(n.in.size()) != ops::op_arity(n.op)) bad(i, "has the wrong number of operands");
                Shape s;
                for (int j : n.in) {
                    if (g[j].kind == Kind::scalar) continue;
                    if (!kiln::detail::try_broadcast(s, g[j].shape, s)) bad(i, "has operands that do not broadcast");
                }
                if (!(s == n.shape)) bad(i, "has shape " + n.shape.str() + " but its operands broadcast to " + s.str());
                break;
            }
            case Kind::reduce: case Kind::arg_reduce: case Kind::view:
                if (n.in.size() != 1) bad(i, "needs one operand");
                else if (g[n.in[0]].kind == Kind::scalar) bad(i, "reads a number as a tensor");
                break;
            case Kind::matmul:
                if (n.in.size() != 2) bad(i, "needs two operands");
                break;
            case Kind::view_write:
                if (n.in.size() != 2) bad(i, "needs two operands");
                else if (g[n.in[0]].kind == Kind::scalar || g[n.in[1]].kind == Kind::scalar) bad(i, "reads a number as a tensor");
                else if (!(g[n.in[0]].shape == n.shape) || g[n.in[0]].dtype != n.dtype || g[n.in[1]].dtype != n.dtype)
                    bad(i, "must keep its base's shape and dtype and write a value of that dtype");
                break;
            case Kind::call:
                if (!n.call || !n.call->run || !n.call->shape) bad(i, "is a call without an op");
                break;
        }
    }
    for (int o : g.outputs)
        if (o < 0 || o >= g.size()) bad(o, "is an output out of range");
    for (std::size_t k = 0; k < g.inputs.size(); ++k)
        if (g[g.inputs[k]].kind != Kind::input) bad(g.inputs[k], "is listed as an input but is not one");
}

}  // namespace kiln::ir
