// Scheduling for overlap: work that needs the result of a wait (an op joining asynchronous work,
// such as DataParallel's gradient all-reduce) moves after the work that does not, so the device
// keeps computing while the communication runs. DataParallel's optimizer step thus updates the
// parameters of the buckets that arrived first while the last bucket is still on the wire.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::passes {

/// Reorders g's nodes (a stable sort, so still topological): each node's level is the number of
/// waits it depends on (the k-th wait and what reads it: at least k), and nodes go in order of
/// level, keeping their order within one. Library calls keep their relative order (each has at
/// least the level of the call before it): collectives must run in one order on every rank and
/// random draws in the order they were made. A graph without waits is returned as it is.
inline ir::Graph delay_waits(const ir::Graph& g) {
    const auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
    std::vector<int> level(static_cast<std::size_t>(g.size()), 0);
    int waits = 0, call_level = 0;
    for (int i = 0; i < g.size(); ++i) {
        const ir::Node& n = g[i];
        int l = 0;
        for (int j : n.in) l = std::max(l, at(level, j));
        if (n.kind == ir::Kind::call) {
            if (n.call->waits) l = std::max(l, ++waits);
            l = std::max(l, call_level);
            call_level = l;
        }
        at(level, i) = l;
    }
    if (waits == 0) return g;
    std::vector<int> order(static_cast<std::size_t>(g.size()));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return at(level, a) < at(level, b); });
    ir::Graph out;
    std::vector<int> remap(static_cast<std::size_t>(g.size()), -1);
    for (int i : order) {
        ir::Node n = g[i];
        for (int& j : n.in) j = at(remap, j);
        at(remap, i) = out.add(std::move(n));
    }
    for (int i : g.inputs) out.inputs.push_back(at(remap, i));
    for (int o : g.outputs) out.outputs.push_back(at(remap, o));
    return out;
}

}  // namespace kiln::passes
