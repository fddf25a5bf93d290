// Constant layouts: a captured tensor read only by library ops that name a faster layout for it
// (CallOp::constant_layout: conv2d's weight channels-last) is bound in that layout, once, instead of
// being copied into it on every call.
#pragma once

#include <utility>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::passes {

/// Replaces the tensor of each constant whose every reader is a library op with a constant_layout
/// hook, and whose readers agree on the layout, by the hook's tensor (the same values; the graph
/// is otherwise unchanged). Only where the program owns its constants: a frozen program
/// (kiln::Options::freeze) or an exported program's lifted tensors, not a captured tensor the
/// caller may still write between calls.
inline ir::Graph constant_layouts(const ir::Graph& g) {
    using ir::Kind;
    const std::size_t n = static_cast<std::size_t>(g.size());
    std::vector<std::vector<std::pair<int, std::size_t>>> readers(n);
    std::vector<char> other(n, 0);  // read by something without a hook (or an output)
    for (int i = 0; i < g.size(); ++i)
        for (std::size_t q = 0; q < g[i].in.size(); ++q) {
            const auto j = static_cast<std::size_t>(g[i].in[q]);
            if (g[g[i].in[q]].kind != Kind::constant) continue;
            if (g[i].kind == Kind::call && g[i].call->constant_layout) readers[j].emplace_back(i, q);
            else other[j] = 1;
        }
    for (int o : g.outputs) other[static_cast<std::size_t>(o)] = 1;
    ir::Graph out = g;
    for (std::size_t j = 0; j < n; ++j) {
        if (other[j] || readers[j].empty() || !g[static_cast<int>(j)].tensor.defined()) continue;
        const Tensor& t = g[static_cast<int>(j)].tensor;
        const auto [c0, q0] = readers[j][0];
        const Tensor want = g[c0].call->constant_layout(q0, t);
        if (!want.defined() || want.is_same(t)) continue;
        bool agree = true;
        for (std::size_t r = 1; r < readers[j].size() && agree; ++r) {
            const auto [c, q] = readers[j][r];
            agree = g[c].call->constant_layout(q, t).strides() == want.strides();
        }
        if (agree) out[static_cast<int>(j)].tensor = want;
    }
    return out;
}

}  // namespace kiln::passes
