// Algebraic simplification: identities, cast chains, and factoring a sum over a broadcast product.
#pragma once

#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::passes {

namespace detail {

inline bool is_scalar_value(const ir::Graph& g, int id, double v) {
    return g[id].kind == ir::Kind::scalar && g[id].value == v;
}

/// Whether every value of dtype `from` survives a round trip through `via` exactly.
inline bool widens_exactly(DType from, DType via) {
    if (from == via || from == DType::boolean) return true;
    switch (via) {
        case DType::f64: return from != DType::i64;
        case DType::f32: return from == DType::f16 || from == DType::bf16;
        case DType::i64: return from == DType::i32;
        default: return false;
    }
}

/// Axis d of a shape of rank r aligned to the right of a rank-R iteration shape: its size, or 1
/// for dims it lacks (they broadcast).
inline std::int64_t aligned_size(const Shape& s, int d, int R) {
    const int k = d - (R - s.rank());
    return k < 0 ? 1 : s[k];
}

}  // namespace detail

/// Rewrites, in one forward sweep:
/// - x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 -> x (when x already has the result's shape and dtype)
/// - neg(neg(x)) -> x; cast(x) to x's own dtype -> x; cast(cast(x, a), b) -> cast(x, b) when a
///   holds every value of x exactly
/// - sum over axes M of a * b, where on every axis of M one factor is broadcast (size 1):
///   (sum of a over its varying axes) * (sum of b over its varying axes) * (size of axes where
///   both are broadcast). The sum over (j, k) of a[i, j] * b[i, k] never forms the product.
inline ir::Graph simplify(const ir::Graph& g) {
    using ir::Kind;
    ir::Graph out;
    std::vector<int> remap(static_cast<std::size_t>(g.size()), -1);
    for (int i = 0; i < g.size(); ++i) {
        ir::Node n = g[i];
        for (int& j : n.in) j = remap[static_cast<std::size_t>(j)];
        int result = -1;
        auto same_as = [&](int j) { return out[j].kind != Kind::scalar && out[j].shape == n.shape && out[j].dtype == n.dtype; };
        if (n.kind == Kind::elementwise) {
            const ops::OpId op = n.op;
            using ops::op_id;
            if (n.in.size() == 2) {
                const int a = n.in[0], b = n.in[1];
                if ((op == op_id<ops::Add> || op == op_id<ops::Sub>) && detail::is_scalar_value(out, b, 0) && same_as(a)) result = a;
                else if (op == op_id<ops::Add> && detail::is_scalar_value(out, a, 0) && same_as(b)) result = b;
                else if ((op == op_id<ops::Mul> || op == op_id<ops::Div>) && detail::is_scalar_value(out, b, 1) && same_as(a)) result = a;
                else if (op == op_id<ops::Mul> && detail::is_scalar_value(out, a, 1) && same_as(b)) result = b;
            } else if (op == op_id<ops::Neg>) {
                const ir::Node& x = out[n.in[0]];
                if (x.kind == Kind::elementwise && x.op == n.op && same_as(x.in[0])) result = x.in[0];
            } else if (op == op_id<ops::Cast>) {
                const ir::Node& x = out[n.in[0]];
                if (x.kind != Kind::scalar && x.dtype == n.attr && x.shape == n.shape) {
                    result = n.in[0];
                } else if (x.kind == Kind::elementwise && x.op == n.op && detail::widens_exactly(out[x.in[0]].dtype, x.attr) &&
                           out[x.in[0]].kind != Kind::scalar) {
                    n.in[0] = x.in[0];  // cast(cast(y, a), b) = cast(y, b)
                    if (out[n.in[0]].dtype == n.attr && out[n.in[0]].shape == n.shape) result = n.in[0];
                }
            }
        } else if (n.kind == Kind::reduce && n.rkind == ir::ReduceKind::sum && is_floating(n.dtype)) {
            result = [&]() -> int {
                const ir::Node m = out[n.in[0]];  // a copy: out.add() below may move the nodes
                if (m.kind != Kind::elementwise || m.op != ops::op_id<ops::Mul> || !is_floating(m.dtype)) return -1;
                const int a = m.in[0], b = m.in[1];
                if (out[a].kind == Kind::scalar || out[b].kind == Kind::scalar) return -1;
                if (out[a].dtype != m.dtype || out[b].dtype != m.dtype) return -1;
                const Shape& S = m.shape;
                const int R = S.rank();
                unsigned ma = 0, mb = 0;
                double both = 1;
                for (int d = 0; d < R; ++d) {
                    if (!(n.mask & (1u << d))) continue;
                    const bool ac = detail::aligned_size(out[a].shape, d, R) == 1, bc = detail::aligned_size(out[b].shape, d, R) == 1;
                    if (!ac && !bc) return -1;  // both vary along d: no factoring
                    if (!ac) ma |= 1u << (d - (R - out[a].shape.rank()));
                    else if (!bc) mb |= 1u << (d - (R - out[b].shape.rank()));
                    else both *= static_cast<double>(S[d]);
                }
                auto partial = [&](int x, unsigned mask) {
                    if (mask == 0) return x;
                    ir::Node r = n;
                    r.in = {x};
                    r.mask = mask;
                    r.keepdim = true;
                    r.shape = out[x].shape;
                    for (int d = 0; d < r.shape.rank(); ++d)
                        if (mask & (1u << d)) r.shape[d] = 1;
                    return out.add(std::move(r));
                };
                const int sa = partial(a, ma), sb = partial(b, mb);
                ir::Node prod = m;
                prod.in = {sa, sb};
                Shape ps;
                kiln::detail::try_broadcast(out[sa].shape, out[sb].shape, ps);
                // broadcast dims the product never had: make the keepdim shape of the reduction
                Shape keep = S;
                for (int d = 0; d < R; ++d)
                    if (n.mask & (1u << d)) keep[d] = 1;
                prod.shape = ps;
                int r = out.add(std::move(prod));
                if (both != 1) {
                    ir::Node c;
                    c.kind = Kind::scalar;
                    c.value = both;
                    c.dtype = m.ct;
                    const int cs = out.add(std::move(c));
                    ir::Node mul = m;
                    mul.in = {r, cs};
                    mul.shape = ps;
                    r = out.add(std::move(mul));
                }
                if (!(ps == keep)) {
                    // the product lacks leading dims the reduction keeps: broadcast it (a view)
                    ir::Node v;
                    v.kind = Kind::view;
                    v.dtype = m.dtype;
                    v.shape = keep;
                    v.in = {r};
                    v.args = kiln::detail::broadcast_strides(ps, contiguous_strides(ps), keep);
                    r = out.add(std::move(v));
                }
                if (!n.keepdim && !(keep == n.shape)) {
                    ir::Node v;
                    v.kind = Kind::view;
                    v.dtype = m.dtype;
                    v.shape = n.shape;
                    v.in = {r};
                    v.args = contiguous_strides(n.shape);
                    r = out.add(std::move(v));
                }
                return r;
            }();
        }
        if (result >= 0) {
            remap[static_cast<std::size_t>(i)] = result;
            continue;
        }
        const int id = out.add(std::move(n));
        remap[static_cast<std::size_t>(i)] = id;
        if (g[i].kind == Kind::input) out.inputs.push_back(id);
    }
    for (int o : g.outputs) out.outputs.push_back(remap[static_cast<std::size_t>(o)]);
    return out;
}

}  // namespace kiln::passes
