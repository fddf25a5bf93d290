// Printing graphs: one line per node, and Graphviz DOT with fusion groups as clusters.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::ir {

/// What node n computes, e.g. "add(%1, %2)" or "sum(%3, mask=0b10, keepdim)".
inline std::string describe(const Graph& g, int id) {
    const Node& n = g[id];
    std::ostringstream s;
    auto args = [&] {
        for (std::size_t i = 0; i < n.in.size(); ++i) s << (i ? ", " : "") << "%" << n.in[i];
    };
    switch (n.kind) {
        case Kind::input: s << "input(" << n.index << ")"; break;
        case Kind::constant: s << "constant"; break;
        case Kind::scalar: s << "scalar(" << n.value << ")"; break;
        case Kind::elementwise:
            s << ops::op_name(n.op) << "(";
            args();
            s << ")";
            if (n.op == ops::op_id<ops::Cast>) s << " -> " << dtype_name(n.attr);
            break;
        case Kind::reduce:
        case Kind::arg_reduce:
            s << (n.kind == Kind::arg_reduce ? (n.arg_max ? "argmax" : "argmin") : reduce_name(n.rkind)) << "(";
            args();
            s << ", axes=0x" << std::hex << n.mask << std::dec << (n.keepdim ? ", keepdim" : "") << ")";
            break;
        case Kind::matmul: s << "matmul("; args(); s << ")"; break;
        case Kind::call: s << n.call->key << "("; args(); s << ")"; break;
        case Kind::view_write:
            s << "view_write(";
            args();
            s << ", strides=" << n.args.str() << ", offset=" << static_cast<std::int64_t>(n.value);
            if (n.mask) s << ", fixed=0x" << std::hex << n.mask << std::dec;
            s << ")";
            break;
        case Kind::view:
            s << "view(";
            args();
            s << ", strides=" << n.args.str() << ", offset=" << static_cast<std::int64_t>(n.value);
            if (n.mask) s << ", fixed=0x" << std::hex << n.mask << std::dec;
            s << ")";
            break;
    }
    return s.str();
}

/// The graph as text: "%3 = add(%1, %2) : f32(32, 64)", then the outputs.
inline std::string to_string(const Graph& g) {
    std::ostringstream s;
    for (int i = 0; i < g.size(); ++i)
        s << "%" << i << " = " << describe(g, i) << " : " << dtype_name(g[i].dtype) << g[i].shape.str() << "\n";
    s << "return";
    for (std::size_t i = 0; i < g.outputs.size(); ++i) s << (i ? ", %" : " %") << g.outputs[i];
    s << "\n";
    return s.str();
}

/// Graphviz DOT; `group[i]` >= 0 puts node i in cluster "kernel <group>".
inline std::string to_dot(const Graph& g, const std::vector<int>& group = {}) {
    std::ostringstream s;
    s << "digraph kiln {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
    int max_group = -1;
    for (int gi : group) max_group = std::max(max_group, gi);
    auto node_line = [&](int i) {
        std::string label = describe(g, i);
        for (auto& c : label)
            if (c == '"') c = '\'';
        s << "    n" << i << " [label=\"%" << i << " = " << label << "\\n" << dtype_name(g[i].dtype) << g[i].shape.str()
          << "\"];\n";
    };
    for (int k = 0; k <= max_group; ++k) {
        s << "  subgraph cluster_" << k << " {\n    label=\"kernel " << k << "\"; style=rounded; color=blue;\n";
        for (int i = 0; i < g.size(); ++i)
            if (static_cast<int>(group.size()) > i && group[static_cast<std::size_t>(i)] == k) node_line(i);
        s << "  }\n";
    }
    for (int i = 0; i < g.size(); ++i)
        if (static_cast<int>(group.size()) <= i || group[static_cast<std::size_t>(i)] < 0) node_line(i);
    for (int i = 0; i < g.size(); ++i)
        for (int j : g[i].in) s << "  n" << j << " -> n" << i << ";\n";
    for (std::size_t o = 0; o < g.outputs.size(); ++o)
        s << "  out" << o << " [shape=oval, label=\"output " << o << "\"];\n  n" << g.outputs[o] << " -> out" << o << ";\n";
    s << "}\n";
    return s.str();
}

}  // namespace kiln::ir
