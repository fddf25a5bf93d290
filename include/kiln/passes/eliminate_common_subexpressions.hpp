// Common subexpression elimination: identical nodes over identical operands become one node.
#pragma once

#include <bit>
#include <map>
#include <sstream>
#include <string>

#include "kiln/passes/rebuild.hpp"

namespace kiln::passes {

namespace detail {
/// Everything that makes two nodes compute the same value, as a string key.
inline std::string cse_key(const ir::Node& n, const std::vector<int>& operands) {
    std::ostringstream s;
    s << static_cast<int>(n.kind) << '|' << static_cast<int>(n.dtype) << '|' << n.shape.str() << '|';
    for (int j : operands) s << j << ',';
    s << '|' << static_cast<int>(n.op) << '|' << static_cast<int>(n.ct) << '|' << static_cast<int>(n.attr) << '|'
      << std::bit_cast<std::uint64_t>(n.value) << '|' << static_cast<int>(n.rkind) << '|' << n.mask << '|' << n.keepdim
      << n.arg_max << '|' << std::bit_cast<std::uint64_t>(n.correction) << '|' << n.args.str() << '|' << n.index;
    if (n.kind == ir::Kind::call) s << '|' << n.call->key;
    if (n.kind == ir::Kind::constant)
        s << '|' << n.tensor.storage().get() << '|' << n.tensor.offset() << '|' << n.tensor.strides().str();
    return s.str();
}
}  // namespace detail

/// Merges nodes that compute the same value (same kind, attributes and operands): a shared
/// subexpression is computed once. Inputs are never merged.
inline ir::Graph eliminate_common_subexpressions(const ir::Graph& g) {
    std::vector<int> replace = identity_map(g);
    std::map<std::string, int> seen;
    for (int i = 0; i < g.size(); ++i) {
        if (g[i].kind == ir::Kind::input) continue;
        std::vector<int> ops = g[i].in;
        for (int& j : ops)
            while (replace[static_cast<std::size_t>(j)] != j) j = replace[static_cast<std::size_t>(j)];
        const auto [it, fresh] = seen.emplace(detail::cse_key(g[i], ops), i);
        if (!fresh) replace[static_cast<std::size_t>(i)] = it->second;
    }
    return rebuild(g, std::vector<char>(static_cast<std::size_t>(g.size()), 1), replace);
}

}  // namespace kiln::passes
