// Constant folding: elementwise ops whose operands are all numbers become a number.
#pragma once

#include "kiln/tables/op_kernels.hpp"
#include "kiln/passes/rebuild.hpp"

namespace kiln::passes {

/// Replaces each elementwise node whose operands are all scalar nodes by a scalar node holding
/// its value, computed by the op table in the node's compute type (as the kernel would). A node
/// that a view or another non-elementwise node reads stays (it is a 0-d tensor there: a number
/// filling a slice, say).
inline ir::Graph fold_constants(ir::Graph g) {
    std::vector<char> tensor_use(static_cast<std::size_t>(g.size()), 0);
    for (const ir::Node& n : g.nodes)
        if (n.kind != ir::Kind::elementwise)
            for (int j : n.in) tensor_use[static_cast<std::size_t>(j)] = 1;
    for (int o : g.outputs) tensor_use[static_cast<std::size_t>(o)] = 1;
    for (int i = 0; i < g.size(); ++i) {
        ir::Node& n = g[i];
        if (n.kind != ir::Kind::elementwise || n.in.empty() || n.shape.rank() != 0 || tensor_use[static_cast<std::size_t>(i)]) continue;
        bool all = true;
        for (int j : n.in) all = all && g[j].kind == ir::Kind::scalar;
        if (!all) continue;
        double v = 0;
        bool ok = false;
        kiln::visit_compute_dtype(n.ct, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const kiln::detail::AnyTileKernel k = kiln::detail::any_tile_kernel(n.op, n.ct, 0);
            if (!k) return;
            T a[3] = {};
            const void* in[3] = {&a[0], &a[1], &a[2]};
            for (std::size_t q = 0; q < n.in.size(); ++q) a[q] = static_cast<T>(g[n.in[q]].value);
            T r{};
            k(in, &r, 1, n.attr);  // the kernel itself, so folding rounds exactly as running would
            v = kiln::visit_dtype(n.dtype, [&](auto dtag) {
                using S = typename decltype(dtag)::type;
                return static_cast<double>(kiln::detail::load_as<T>(kiln::detail::store_as<S>(r)));
            });
            ok = true;
        });
        if (!ok) continue;
        n.kind = ir::Kind::scalar;
        n.value = v;
        n.in.clear();
    }
    return g;
}

}  // namespace kiln::passes
