// Shared by the passes: rebuilding a graph with nodes dropped or replaced.
#pragma once

#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::passes {

/// Copies the nodes with keep[i] into a new graph, in order, mapping operands through
/// `replace` first (replace[i] = j: uses of i become uses of j, j < i). Inputs keep their order.
inline ir::Graph rebuild(const ir::Graph& g, const std::vector<char>& keep, const std::vector<int>& replace) {
    ir::Graph out;
    std::vector<int> remap(static_cast<std::size_t>(g.size()), -1);
    auto resolve = [&](int id) {
        while (replace[static_cast<std::size_t>(id)] != id) id = replace[static_cast<std::size_t>(id)];
        return remap[static_cast<std::size_t>(id)];
    };
    for (int i = 0; i < g.size(); ++i) {
        if (!keep[static_cast<std::size_t>(i)] || replace[static_cast<std::size_t>(i)] != i) continue;
        ir::Node n = g[i];
        for (int& j : n.in) j = resolve(j);
        remap[static_cast<std::size_t>(i)] = out.add(std::move(n));
        if (g[i].kind == ir::Kind::input) out.inputs.push_back(remap[static_cast<std::size_t>(i)]);
    }
    for (int o : g.outputs) out.outputs.push_back(resolve(o));
    return out;
}

inline std::vector<int> identity_map(const ir::Graph& g) {
    std::vector<int> r(static_cast<std::size_t>(g.size()));
    for (int i = 0; i < g.size(); ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
}

}  // namespace kiln::passes
