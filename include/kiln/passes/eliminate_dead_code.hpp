// Dead code elimination: drops nodes no output depends on (inputs always stay).
#pragma once

#include "kiln/passes/rebuild.hpp"

namespace kiln::passes {

/// Removes every node that no output depends on; inputs keep their positions.
inline ir::Graph eliminate_dead_code(const ir::Graph& g) {
    std::vector<char> live(static_cast<std::size_t>(g.size()), 0);
    for (int o : g.outputs) live[static_cast<std::size_t>(o)] = 1;
    for (int i = g.size() - 1; i >= 0; --i) {
        if (g[i].kind == ir::Kind::input) live[static_cast<std::size_t>(i)] = 1;
        if (!live[static_cast<std::size_t>(i)]) continue;
        for (int j : g[i].in) live[static_cast<std::size_t>(j)] = 1;
    }
    return rebuild(g, live, identity_map(g));
}

}  // namespace kiln::passes
