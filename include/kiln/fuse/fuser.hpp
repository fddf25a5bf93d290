// The fuser: partitions a graph into kernels (fusion groups) for a backend to generate and run.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "kiln/fuse/limits.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/tables/activations.hpp"

namespace kiln::fuse {

/// One kernel (or a free view). Groups are listed in the order they run.
struct Group {
    enum class Kind : std::uint8_t {
        elementwise,  ///< a tree of elementwise ops writing one materialized value
        row,          ///< reductions over the same axes with their producers and consumers, row by row
        reduce,       ///< one reduction with its elementwise prologue (rows too long for `row`)
        matmul,       ///< a library call
        call,         ///< a library op (Kind::call)
        write,        ///< a write into a view of a value (Kind::view_write): a copy of the base (or none, in
                      ///< place), then the value stored into the view
        view,         ///< an alias of a materialized value: no kernel
    } kind;
    std::vector<int> nodes;    ///< nodes computed inside, in topological order
    std::vector<int> outputs;  ///< nodes this group materializes
    std::vector<int> leaves;   ///< materialized nodes (and inputs, constants) it reads
    Shape space;               ///< row: the iteration shape the rows live in
    unsigned mask = 0;         ///< row: the reduced axes of `space`
    DType ct = DType::f32;     ///< row: the compute type of every member
    int bias = -1;             ///< matmul: the leaf added as a per-column bias by the library's epilogue
    int act = -1;              ///< matmul: the node whose value the epilogue's activation gives (its last)
    Act act_kind = Act::none;  ///< matmul: that activation (an op, or the exact gelu's composite)
    bool in_place = false;     ///< write: stores into its base's memory (the base is a kernel's fresh
                               ///< output that nothing else reads), so the base is not copied
    bool stored = false;       ///< write: its value's kernel stores it (Plan::store_into), nothing runs

    bool is_kernel() const { return kind != Kind::view && !stored; }
};

inline const char* group_kind_name(Group::Kind k) {
    switch (k) {
        case Group::Kind::elementwise: return "elementwise";
        case Group::Kind::row: return "row";
        case Group::Kind::reduce: return "reduce";
        case Group::Kind::matmul: return "matmul";
        case Group::Kind::call: return "call";
        case Group::Kind::write: return "write";
        case Group::Kind::view: return "view";
    }
    return "?";
}


struct Plan {
    std::vector<Group> groups;
    std::vector<int> group_of;       ///< node -> group that computes it (-1: leaf or scalar)
    std::vector<char> materialized;  ///< node has memory of its own (or is an input/constant/view)
    /// node -> the in-place write into captured memory that stores it (-1: none): the group that
    /// computes it (elementwise, row or reduce) writes straight into that memory, in row-major
    /// order (the node is the write's value, or the value a reshaping view of it reads), and the
    /// write then copies nothing
    std::vector<int> store_into;

    int kernels() const {
        int k = 0;
        for (const Group& g : groups) k += g.is_kernel() ? 1 : 0;
        return k;
    }
};

namespace detail {

/// Who reads each node of g, and which nodes are program outputs.
struct Readers {
    std::vector<std::vector<int>> users;
    std::vector<char> is_output;
};
inline Readers readers_of(const ir::Graph& g) {
    Readers r;
    r.users.resize(static_cast<std::size_t>(g.size()));
    r.is_output.assign(static_cast<std::size_t>(g.size()), 0);
    for (int i = 0; i < g.size(); ++i)
        for (int j : g[i].in) r.users[static_cast<std::size_t>(j)].push_back(i);
    for (int o : g.outputs) r.is_output[static_cast<std::size_t>(o)] = 1;
    return r;
}

inline bool aligned_to(const Shape& s, const Shape& space) {
    if (s.rank() > space.rank()) return false;
    for (int d = 0; d < s.rank(); ++d) {
        const std::int64_t sz = s[d], sp = space[space.rank() - s.rank() + d];
        if (sz != sp && sz != 1) return false;
    }
    return true;
}
/// Whether a reduction's value of shape s, broadcast (right-aligned) against the row space, means
/// one value per row: 1 (or absent) along the reduced axes, the full size along the others. A
/// reduction without keepdim over leading or middle axes does not (its dims shift right), so an
/// elementwise node reading it cannot be computed per row.
inline bool per_row(const Shape& s, const Shape& space, unsigned mask) {
    if (s.rank() > space.rank()) return false;
    for (int d = 0; d < space.rank(); ++d) {
        const int k = d - (space.rank() - s.rank());
        const std::int64_t v = k < 0 ? 1 : s[k];
        if ((mask & (1u << d)) ? v != 1 : (v != space[d] && space[d] != 1)) return false;
    }
    return true;
}
/// Whether an elementwise value of shape s can live in a row group over `space`: it is either one
/// value per row element (the whole space, leading 1s aside) or one value per row (per_row). Any
/// other shape (a value constant along some kept axis but varying along the reduced ones, say)
/// has no place to be stored row by row, so such a node runs as a kernel of its own.
inline bool row_storable(const Shape& s, const Shape& space, unsigned mask) {
    if (!aligned_to(s, space)) return false;
    for (int d = 0; d < space.rank(); ++d) {
        const int k = d - (space.rank() - s.rank());
        if ((mask & (1u << d)) && k >= 0 && s[k] != 1) return s.numel() == space.numel();
    }
    return per_row(s, space, mask);
}
inline Shape keep_shape(const Shape& s, unsigned mask) {
    Shape k = s;
    for (int d = 0; d < s.rank(); ++d)
        if (mask & (1u << d)) k[d] = 1;
    return k;
}
inline std::int64_t row_length(const Shape& s, unsigned mask) {
    std::int64_t n = 1;
    for (int d = 0; d < s.rank(); ++d)
        if (mask & (1u << d)) n *= s[d];
    return n;
}

/// The groups in order, `dead` ones left out, and node -> group again (a node recomputed in
/// several groups maps to the first).
inline void drop_groups(Plan& p, const std::vector<char>& dead) {
    std::vector<Group> kept;
    for (std::size_t k = 0; k < p.groups.size(); ++k)
        if (!dead[k]) kept.push_back(std::move(p.groups[k]));
    p.groups = std::move(kept);
    std::fill(p.group_of.begin(), p.group_of.end(), -1);
    for (std::size_t k = 0; k < p.groups.size(); ++k)
        for (int j : p.groups[k].nodes)
            if (p.group_of[static_cast<std::size_t>(j)] < 0) p.group_of[static_cast<std::size_t>(j)] = static_cast<int>(k);
}

/// Whether group G reads a matmul's result (such groups stay as they are: a GEMM library may take
/// them as its epilogue).
inline bool reads_matmul(const ir::Graph& g, const Group& G) {
    for (int l : G.leaves)
        if (g[l].kind == ir::Kind::matmul) return true;
    return false;
}

/// Multi-output fusion: an elementwise group joins an earlier elementwise group over the same
/// shape that it reads from or shares a tensor with (Black-Scholes' call and put prices and the
/// values they share become one kernel with two outputs). The joined group runs at the later
/// group's place, so no group in between may read the earlier one's outputs; a member stays an
/// output only while something outside the group reads it, and every output must have the
/// group's full shape. Groups reading a matmul stay alone (a GEMM library may take them as its
/// epilogue). Bounded by the limits; searches at most `window` groups back.
inline void merge_elementwise_groups(const ir::Graph& g, Plan& p, const Limits& lim, int window = 32) {
    auto sz = [](int i) { return static_cast<std::size_t>(i); };
    detail::Readers readers = detail::readers_of(g);
    auto& users = readers.users;
    auto& is_output = readers.is_output;
    auto has = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    std::vector<char> dead(p.groups.size(), 0);
    for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
        Group& G = p.groups[gi];
        if (G.kind != Group::Kind::elementwise || reads_matmul(g, G)) continue;
        const Shape space = g[G.outputs[0]].shape;
        for (std::size_t kk = gi; kk-- > 0 && gi - kk <= static_cast<std::size_t>(window);) {
            Group& K = p.groups[kk];
            if (dead[kk] || K.kind != Group::Kind::elementwise || reads_matmul(g, K) || !(g[K.outputs[0]].shape == space)) continue;
            bool connected = false;
            for (int l : G.leaves) connected = connected || has(K.outputs, l) || has(K.leaves, l);
            if (!connected) continue;
            bool blocked = false;
            for (std::size_t j = kk + 1; j < gi && !blocked; ++j)
                if (!dead[j])
                    for (int l : p.groups[j].leaves) blocked = blocked || has(K.outputs, l);
            if (blocked) continue;
            std::vector<int> nodes = K.nodes;
            nodes.insert(nodes.end(), G.nodes.begin(), G.nodes.end());
            std::sort(nodes.begin(), nodes.end());
            std::vector<int> leaves;
            for (const Group* X : {&K, &G})
                for (int l : X->leaves)
                    if (!has(nodes, l) && !has(leaves, l)) leaves.push_back(l);
            if (static_cast<int>(nodes.size()) > lim.max_nodes || static_cast<int>(leaves.size()) > lim.max_inputs) continue;
            std::vector<int> outs;
            bool storable = true;
            for (int j : nodes) {
                bool out = is_output[sz(j)] != 0;
                for (int u : users[sz(j)]) out = out || !has(nodes, u);
                if (!out) continue;
                storable = storable && g[j].shape == space;
                outs.push_back(j);
            }
            if (!storable) continue;
            for (int j : K.outputs)
                if (!has(outs, j)) p.materialized[sz(j)] = 0;
            std::sort(leaves.begin(), leaves.end());
            G.nodes = std::move(nodes);
            G.leaves = std::move(leaves);
            G.outputs = std::move(outs);
            dead[kk] = 1;
        }
    }
    drop_groups(p, dead);
}

/// Sibling reductions (Limits::merge_reductions): a reduce group joins an earlier reduce group
/// that reduces values of the same shape over the same axes when it does not read that group's
/// results (BatchNorm's backward: sum(g) and sum(g * xhat) over (N, H, W)). The joined group has
/// an output per reduction, in node order, and runs at the later group's place, so no group in
/// between may read the earlier one's results. Arg-reductions stay alone. Bounded by the limits;
/// searches at most `window` groups back.
inline void merge_reduce_groups(const ir::Graph& g, Plan& p, const Limits& lim, int window = 32) {
    auto has = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    auto sums = [&](const Group& G) {
        if (G.kind != Group::Kind::reduce) return false;
        for (int o : G.outputs)
            if (g[o].kind != ir::Kind::reduce) return false;
        return true;
    };
    std::vector<char> dead(p.groups.size(), 0);
    for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
        Group& G = p.groups[gi];
        if (!sums(G)) continue;
        const ir::Node& gr = g[G.outputs[0]];
        for (std::size_t kk = gi; kk-- > 0 && gi - kk <= static_cast<std::size_t>(window);) {
            Group& K = p.groups[kk];
            if (dead[kk] || !sums(K)) continue;
            const ir::Node& kr = g[K.outputs[0]];
            if (!(g[kr.in[0]].shape == g[gr.in[0]].shape) || kr.mask != gr.mask ||
                static_cast<int>(K.outputs.size() + G.outputs.size()) > lim.max_reduce_outputs)
                continue;
            bool blocked = false;
            for (std::size_t j = kk + 1; j <= gi && !blocked; ++j)
                if (!dead[j])
                    for (int l : p.groups[j].leaves) blocked = blocked || has(K.outputs, l);
            if (blocked) continue;
            std::vector<int> nodes = K.nodes;
            for (int j : G.nodes)
                if (!has(nodes, j)) nodes.push_back(j);
            std::sort(nodes.begin(), nodes.end());
            std::vector<int> leaves = K.leaves;
            for (int l : G.leaves)
                if (!has(leaves, l)) leaves.push_back(l);
            if (static_cast<int>(nodes.size()) > lim.max_nodes || static_cast<int>(leaves.size()) > lim.max_inputs) continue;
            std::sort(leaves.begin(), leaves.end());
            std::vector<int> outs = K.outputs;
            outs.insert(outs.end(), G.outputs.begin(), G.outputs.end());
            std::sort(outs.begin(), outs.end());
            G.nodes = std::move(nodes);
            G.leaves = std::move(leaves);
            G.outputs = std::move(outs);
            dead[kk] = 1;
        }
    }
    drop_groups(p, dead);
}

/// Recomputation (Limits::recompute): an elementwise group with one value, read only by
/// elementwise groups and reduce groups over a shape it broadcasts to, is computed again inside
/// each of them instead of stored, when the memory those kernels then read besides (the group's
/// operands of their full shape that they did not read already) is no more than what storing the
/// value and reading it back costs (its own kernel's reads, its store, one read per reader).
/// BatchNorm's backward: the relu's gradient and the normalized input, read by both column sums
/// and by the input's gradient, are recomputed from dy, y and x in the two kernels left; a
/// per-channel value (rsqrt(var + eps)) is recomputed where it is read instead of being a launch
/// of its own (at most Limits::recompute_broadcast nodes: its ops then run per element). Groups
/// reading a matmul, and readers that do, stay as they are (a GEMM may take them as its epilogue).
/// A group whose operands are captured memory (a parameter) is recomputed only where no write
/// runs between it and the reader.
inline void recompute_producers(const ir::Graph& g, Plan& p, const Limits& lim) {
    auto sz = [](int i) { return static_cast<std::size_t>(i); };
    auto has = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    detail::Readers readers = detail::readers_of(g);
    auto bytes = [&](int i) { return static_cast<double>(g[i].shape.numel()) * static_cast<double>(dtype_size(g[i].dtype)); };
    auto captured = [&](int l) {  // a constant, or a view of one
        while (g[l].kind == ir::Kind::view) l = g[l].in[0];
        return g[l].kind == ir::Kind::constant;
    };
    // the shape a kernel group computes over (null: not a group to recompute into)
    auto space_of = [&](const Group& C) -> const Shape* {
        if (reads_matmul(g, C)) return nullptr;
        if (C.kind == Group::Kind::elementwise) return &g[C.outputs[0]].shape;
        if (C.kind == Group::Kind::reduce && g[C.outputs[0]].kind == ir::Kind::reduce) return &g[g[C.outputs[0]].in[0]].shape;
        return nullptr;
    };
    std::vector<char> dead(p.groups.size(), 0);
    for (std::size_t e = 0; e < p.groups.size(); ++e) {
        const Group& E = p.groups[e];
        if (E.kind != Group::Kind::elementwise || E.outputs.size() != 1 || reads_matmul(g, E) ||
            static_cast<int>(E.nodes.size()) > lim.recompute_nodes)
            continue;
        const int o = E.outputs[0];
        if (readers.is_output[sz(o)] || (!p.store_into.empty() && p.store_into[sz(o)] >= 0)) continue;
        const Shape& S = g[o].shape;
        std::vector<std::size_t> cons;
        bool ok = true, broadcast = false;
        for (std::size_t k = e + 1; k < p.groups.size() && ok; ++k) {
            if (dead[k] || !has(p.groups[k].leaves, o)) continue;
            const Shape* sp = space_of(p.groups[k]);
            ok = sp && detail::aligned_to(S, *sp);
            broadcast = broadcast || (ok && sp->numel() != S.numel());
            cons.push_back(k);
        }
        for (int u : readers.users[sz(o)]) {  // every reader is one of them
            bool found = false;
            for (std::size_t k : cons) found = found || has(p.groups[k].nodes, u);
            ok = ok && found;
        }
        if (!ok || cons.empty() || (broadcast && static_cast<int>(E.nodes.size()) > lim.recompute_broadcast)) continue;
        // memory: stored = E's reads of its whole-shape operands, its store, a read per reader
        // (where it is not broadcast); recomputed = each reader's reads of E's operands of the
        // reader's whole shape that it does not read yet
        double stored = bytes(o), again = 0;
        for (int l : E.leaves)
            if (g[l].shape.numel() == S.numel()) stored += bytes(l);
        bool fits = true, captures = false;
        for (int l : E.leaves) captures = captures || captured(l);
        for (std::size_t k : cons) {
            const Group& C = p.groups[k];
            const std::int64_t space = space_of(C)->numel();
            if (space == S.numel()) stored += bytes(o);
            std::vector<int> leaves;
            for (int l : C.leaves)
                if (l != o) leaves.push_back(l);
            for (int l : E.leaves)
                if (!has(leaves, l) && !has(C.nodes, l)) {
                    leaves.push_back(l);
                    if (g[l].shape.numel() == space) again += bytes(l);
                }
            std::size_t nodes = C.nodes.size();
            for (int j : E.nodes) nodes += has(C.nodes, j) ? 0 : 1;
            fits = fits && static_cast<int>(leaves.size()) <= lim.max_inputs && static_cast<int>(nodes) <= lim.max_nodes;
            if (captures)
                for (std::size_t j = e + 1; j < k; ++j) fits = fits && (dead[j] || p.groups[j].kind != Group::Kind::write);
        }
        if (!fits || again > stored) continue;
        for (std::size_t k : cons) {
            Group& C = p.groups[k];
            std::erase(C.leaves, o);
            for (int j : E.nodes)  // (a node recomputed into E may be in C already, by way of another group)
                if (!has(C.nodes, j)) C.nodes.push_back(j);
            for (int l : E.leaves)
                if (!has(C.leaves, l) && !has(C.nodes, l)) C.leaves.push_back(l);
            std::sort(C.leaves.begin(), C.leaves.end());
            std::sort(C.nodes.begin(), C.nodes.end());
        }
        p.materialized[sz(o)] = 0;
        dead[e] = 1;
    }
    drop_groups(p, dead);
}

}  // namespace detail

/// Partitions g. Elementwise nodes with one user inline into it; a node with several users, an
/// output, or an operand of a view or matmul is materialized once. Reductions gather their
/// producers, and every later elementwise node and reduction over the same rows, into one row
/// group (row softmax and layer_norm are one kernel each), unless the rows are too long.
inline Plan plan(const ir::Graph& g, const Limits& lim = {}) {
    using ir::Kind;
    const int N = g.size();
    Plan p;
    p.group_of.assign(static_cast<std::size_t>(N), -1);
    p.materialized.assign(static_cast<std::size_t>(N), 0);
    std::vector<int> uses = g.use_counts();
    auto sz = [](int i) { return static_cast<std::size_t>(i); };
    detail::Readers readers = detail::readers_of(g);  // users of each node, outputs
    auto& users = readers.users;
    auto& is_output = readers.is_output;

    // 1. row groups: seeded by each reduction whose rows are short enough
    std::vector<int> row_of(sz(N), -1);
    std::vector<Group> rows;
    auto member_ok = [&](int i, const Group& G) {
        const ir::Node& n = g[i];
        if (n.kind == Kind::elementwise)
            return n.ct == G.ct && (n.dtype == DType::boolean || compute_dtype(n.dtype) == G.ct) &&
                   detail::aligned_to(n.shape, G.space);
        if (n.kind == Kind::reduce)
            return n.in.size() == 1 && g[n.in[0]].shape == G.space && n.mask == G.mask && compute_dtype(n.dtype) == G.ct;
        return false;
    };
    // how many distinct tensors the nodes `members` read from outside (member(k): k is one of them)
    auto outside_reads = [&](const std::vector<int>& members, auto&& member) {
        std::vector<int> reads;
        for (int j : members)
            for (int k : g[j].in)
                if (g[k].kind != Kind::scalar && !member(k) && std::find(reads.begin(), reads.end(), k) == reads.end())
                    reads.push_back(k);
        return static_cast<int>(reads.size());
    };
    // tensors row group G reads with node extra as a member too
    auto row_reads = [&](const Group& G, int extra) {
        std::vector<int> members = G.nodes;
        members.push_back(extra);
        return outside_reads(members, [&](int k) { return std::find(members.begin(), members.end(), k) != members.end(); });
    };
    std::vector<char> closed;  // a group read by a later non-member takes no more members
    auto close_operands = [&](int i) {
        for (int j : g[i].in)
            if (row_of[sz(j)] >= 0) closed[sz(row_of[sz(j)])] = 1;
    };
    for (int i = 0; i < N; ++i) {
        const ir::Node& n = g[i];
        if (n.kind == Kind::reduce) {
            const int x = n.in[0];
            const Shape& S = g[x].shape;
            // a row group reduces each row in one block (one thread on the CPU): a few long rows
            // (a loss summed to a scalar) go to the reduce kernels instead, which split a row
            const std::int64_t len = detail::row_length(S, n.mask), rows_n = len > 0 ? S.numel() / len : 0;
            const bool inner_reduced = S.rank() == 0 || (n.mask & (1u << (S.rank() - 1))) != 0 || S[S.rank() - 1] == 1;
            const bool short_rows = S.numel() > 0 && len <= lim.max_row && (len <= lim.long_row || rows_n >= lim.min_rows) &&
                                    compute_dtype(n.dtype) == compute_dtype(g[x].dtype) && (lim.column_rows || inner_reduced);
            const int xg = row_of[sz(x)];
            if (short_rows && xg >= 0 && !closed[sz(xg)] && member_ok(i, rows[sz(xg)]) &&
                static_cast<int>(rows[sz(xg)].nodes.size()) < lim.max_nodes) {
                row_of[sz(i)] = xg;  // more rows work over the same rows: same group
                rows[sz(xg)].nodes.push_back(i);
                continue;
            }
            close_operands(i);
            if (!short_rows || xg >= 0) continue;
            Group G{Group::Kind::row, {}, {}, {}, S, n.mask, compute_dtype(g[x].dtype)};
            if (!member_ok(i, G)) continue;
            const int gid = static_cast<int>(rows.size());
            // the elementwise producers of the operand: every member_ok ancestor, minus (to a
            // fixpoint) those read by a node outside the group that comes before the reduction
            // (or after it, when the value could not be stored in the row shape); then, while the
            // group would read more than max_inputs tensors or hold more than max_nodes nodes, the
            // producers farthest from the reduction stay outside
            std::vector<int> pro;
            std::vector<char> cand(sz(N), 0);
            std::vector<int> depth(sz(N), 0);
            std::vector<int> queue{x};
            for (std::size_t q = 0; q < queue.size(); ++q) {  // breadth first: depth = distance from x
                const int j = queue[q];
                if (cand[sz(j)] || g[j].kind != Kind::elementwise || row_of[sz(j)] >= 0 || !member_ok(j, G)) continue;
                cand[sz(j)] = 1;
                for (int k : g[j].in)
                    if (!cand[sz(k)]) {
                        if (depth[sz(k)] == 0) depth[sz(k)] = depth[sz(j)] + 1;
                        queue.push_back(k);
                    }
            }
            auto settle = [&] {
                for (bool changed = true; changed;) {
                    changed = false;
                    for (int j = 0; j < i; ++j) {
                        if (!cand[sz(j)]) continue;
                        bool keep = true;
                        for (int u : users[sz(j)])
                            if (u != i && !cand[sz(u)] && !(u > i && g[j].shape == S)) keep = false;
                        if (is_output[sz(j)] && !(g[j].shape == S)) keep = false;
                        if (!keep) {
                            cand[sz(j)] = 0;
                            changed = true;
                        }
                    }
                }
            };
            auto too_big = [&] {
                std::vector<int> members;
                for (int j = 0; j < i; ++j)
                    if (cand[sz(j)]) members.push_back(j);
                members.push_back(i);
                return outside_reads(members, [&](int k) { return k == i || (k < i && cand[sz(k)]); }) > lim.max_inputs ||
                       static_cast<int>(members.size()) > lim.max_nodes;
            };
            settle();
            while (too_big() && std::find(cand.begin(), cand.begin() + i, 1) != cand.begin() + i) {
                int far = 0;
                for (int j = 0; j < i; ++j)
                    if (cand[sz(j)]) far = std::max(far, depth[sz(j)]);
                for (int j = 0; j < i; ++j)
                    if (cand[sz(j)] && depth[sz(j)] == far) cand[sz(j)] = 0;
                settle();
            }
            for (int j = 0; j < i; ++j)
                if (cand[sz(j)]) pro.push_back(j);
            for (int j : pro) row_of[sz(j)] = gid;
            row_of[sz(i)] = gid;
            G.nodes = pro;
            G.nodes.push_back(i);
            rows.push_back(std::move(G));
            closed.push_back(0);
        } else if (n.kind == Kind::elementwise) {
            // an elementwise node over operands of one row group joins it
            int gid = -1;
            bool conflict = false;
            for (int j : n.in) {
                if (row_of[sz(j)] < 0) continue;
                if (gid >= 0 && row_of[sz(j)] != gid) conflict = true;
                gid = row_of[sz(j)];
            }
            bool coords = gid >= 0;
            for (int j : n.in)
                if (coords && row_of[sz(j)] == gid && g[j].kind == Kind::reduce)
                    coords = detail::per_row(g[j].shape, rows[sz(gid)].space, rows[sz(gid)].mask);
            if (gid < 0 || conflict || !coords || closed[sz(gid)] || !member_ok(i, rows[sz(gid)]) ||
                !detail::row_storable(n.shape, rows[sz(gid)].space, rows[sz(gid)].mask) ||
                static_cast<int>(rows[sz(gid)].nodes.size()) >= lim.max_nodes || row_reads(rows[sz(gid)], i) > lim.max_inputs) {
                close_operands(i);
                continue;
            }
            row_of[sz(i)] = gid;
            rows[sz(gid)].nodes.push_back(i);
        } else {
            close_operands(i);
        }
    }
    // members whose values leave the group must have a storable shape; sort members
    for (auto& G : rows) std::sort(G.nodes.begin(), G.nodes.end());

    // 2. materialization. Outside row groups, an elementwise node joins the group of its users
    //    when they all belong to one group (computed once per tile there, however many users);
    //    otherwise it roots a group of its own and is materialized once.
    std::vector<int> root_of(sz(N), -1);
    std::vector<int> group_size(sz(N), 0);
    // what each group reads so far: its members' operands that are not (yet) members. A node
    // joining its users' group leaves this set and adds its own operands; a node whose joining
    // would take the group past max_inputs is materialized instead, so a huge sum splits.
    std::vector<std::vector<int>> reads_of(sz(N));
    auto operands = [&](int i) {
        std::vector<int> r;
        for (int j : g[i].in)
            if (g[j].kind != Kind::scalar && std::find(r.begin(), r.end(), j) == r.end()) r.push_back(j);
        return r;
    };
    for (int i = N - 1; i >= 0; --i) {
        const ir::Node& n = g[i];
        bool m = false;
        switch (n.kind) {
            case Kind::input: case Kind::constant: case Kind::view: case Kind::matmul: case Kind::call: case Kind::arg_reduce:
            case Kind::view_write: m = true; break;
            case Kind::scalar: m = false; break;
            case Kind::reduce: m = row_of[sz(i)] < 0 || is_output[sz(i)]; break;
            case Kind::elementwise: m = is_output[sz(i)]; break;
        }
        for (int u : users[sz(i)])
            if (row_of[sz(i)] >= 0 ? row_of[sz(u)] != row_of[sz(i)] : row_of[sz(u)] >= 0) m = true;  // crosses a row group
        if (n.kind == Kind::elementwise && row_of[sz(i)] < 0 && !m) {
            int target = -1;
            for (int u : users[sz(i)]) {
                const ir::Node& un = g[u];
                int t = -1;
                if (un.kind == Kind::elementwise) t = root_of[sz(u)];
                else if (un.kind == Kind::reduce || un.kind == Kind::arg_reduce) t = u;
                if (t < 0 || (target >= 0 && t != target)) {
                    m = true;
                    break;
                }
                target = t;
            }
            if (target < 0 || group_size[sz(target)] >= lim.max_nodes) m = true;
            if (!m) {
                std::vector<int>& reads = reads_of[sz(target)];
                const std::vector<int> own = operands(i);
                std::size_t after = reads.size() - static_cast<std::size_t>(std::count(reads.begin(), reads.end(), i));
                for (int j : own) after += std::find(reads.begin(), reads.end(), j) == reads.end();
                if (static_cast<int>(after) > lim.max_inputs) m = true;
            }
            if (!m) {
                root_of[sz(i)] = target;
                ++group_size[sz(target)];
                std::vector<int>& reads = reads_of[sz(target)];
                std::erase(reads, i);
                for (int j : operands(i))
                    if (std::find(reads.begin(), reads.end(), j) == reads.end()) reads.push_back(j);
            }
        }
        if (m && row_of[sz(i)] < 0 && n.kind != Kind::input && n.kind != Kind::constant && n.kind != Kind::scalar) {
            root_of[sz(i)] = i;
            group_size[sz(i)] = 1;
            reads_of[sz(i)] = operands(i);
        }
        p.materialized[sz(i)] = m;
    }
    // a row member that must be stored needs the row shape or the kept shape; otherwise it leaves
    for (auto& G : rows) {
        const Shape keep = detail::keep_shape(G.space, G.mask);
        for (int i : G.nodes) {
            if (!p.materialized[sz(i)]) continue;
            const ir::Node& n = g[i];
            const bool storable = n.kind == Kind::reduce ? n.shape.numel() == keep.numel()
                                                         : detail::row_storable(n.shape, G.space, G.mask);
            if (!storable) throw InternalError("kiln: fuser: row member %" + std::to_string(i) + " cannot be stored");
        }
    }

    // 3. groups in node order: each materialized computed node roots a group (row groups once)
    std::vector<int> row_group_index(rows.size(), -1);
    for (int i = 0; i < N; ++i) {
        const ir::Node& n = g[i];
        if (row_of[sz(i)] >= 0) {
            const int r = row_of[sz(i)];
            if (row_group_index[sz(r)] < 0) {
                // placed at its last member, so every leaf it reads exists by then
                const int last = rows[sz(r)].nodes.back();
                if (i != last) continue;
                row_group_index[sz(r)] = static_cast<int>(p.groups.size());
                Group G = rows[sz(r)];
                for (int j : G.nodes) {
                    p.group_of[sz(j)] = row_group_index[sz(r)];
                    if (p.materialized[sz(j)]) G.outputs.push_back(j);
                    for (int k : g[j].in)
                        if (row_of[sz(k)] != r && g[k].kind != Kind::scalar) G.leaves.push_back(k);
                }
                p.groups.push_back(std::move(G));
            }
            continue;
        }
        if (root_of[sz(i)] != i) continue;
        Group G{};
        G.outputs = {i};
        if (n.kind == Kind::view) G.kind = Group::Kind::view;
        else if (n.kind == Kind::matmul) G.kind = Group::Kind::matmul;
        else if (n.kind == Kind::call) G.kind = Group::Kind::call;
        else if (n.kind == Kind::view_write) G.kind = Group::Kind::write;
        else if (n.kind == Kind::elementwise) G.kind = Group::Kind::elementwise;
        else G.kind = Group::Kind::reduce;
        for (int j = 0; j <= i; ++j)
            if (root_of[sz(j)] == i) G.nodes.push_back(j);
        for (int j : G.nodes)
            for (int k : g[j].in)
                if (g[k].kind != Kind::scalar && root_of[sz(k)] != i) G.leaves.push_back(k);
        for (int j : G.nodes) p.group_of[sz(j)] = static_cast<int>(p.groups.size());
        p.groups.push_back(std::move(G));
    }
    for (auto& G : p.groups) {
        std::sort(G.leaves.begin(), G.leaves.end());
        G.leaves.erase(std::unique(G.leaves.begin(), G.leaves.end()), G.leaves.end());
    }
    detail::merge_elementwise_groups(g, p, lim);
    if (lim.merge_reductions) detail::merge_reduce_groups(g, p, lim);
    if (lim.recompute) detail::recompute_producers(g, p, lim);
    for (auto& G : p.groups) {
        if (G.kind != Group::Kind::write) continue;
        const int b = g[G.outputs[0]].in[0];
        const int gb = p.group_of[sz(b)];
        const auto k = gb >= 0 ? p.groups[sz(gb)].kind : Group::Kind::view;
        G.in_place = uses[sz(b)] == 1 && !is_output[sz(b)] &&
                     (k == Group::Kind::elementwise || k == Group::Kind::row || k == Group::Kind::reduce || k == Group::Kind::write);
    }
    // A write into captured memory (a parameter, an optimizer's state, a gradient buffer: written
    // back after every call) stores into that memory itself when every other reader of its old
    // value, through any view of it, runs in an earlier group and none is a result: the write-back
    // is then the memory itself, and no copy is made.
    // A write that continues a chain of in-place writes into one captured memory (gradients that
    // are views of one bucket, DataParallel) is in place already; its value may be stored straight
    // into that memory as below, the memory's other values (the chain's) counting as its aliases.
    for (std::size_t k = 0; k < p.groups.size(); ++k) {
        Group& G = p.groups[k];
        if (G.kind != Group::Kind::write) continue;
        // the captured memory under a chain of in-place writes: a write that continues the chain,
        // or one that replaces the memory's value after it (DataParallel's averaged bucket, read
        // back after its all-reduce, whose old values, the chain's, are read before it)
        int b = g[G.outputs[0]].in[0];
        const bool chained = G.in_place;
        bool through = chained;
        while (g[b].kind == Kind::view_write && p.group_of[sz(b)] >= 0 && p.groups[sz(p.group_of[sz(b)])].kind == Group::Kind::write &&
               p.groups[sz(p.group_of[sz(b)])].in_place) {
            b = g[b].in[0];
            through = true;
        }
        if (g[b].kind != Kind::constant || g[b].fresh) continue;  // (memory the function made: each call sees its first value)
        std::vector<char> alias(sz(N), 0);
        bool ok = true;
        for (int i = b; i < N; ++i) {
            alias[sz(i)] = i == b || (g[i].kind == Kind::view && alias[sz(g[i].in[0])]) ||
                           (through && g[i].kind == Kind::view_write && i < G.outputs[0] && alias[sz(g[i].in[0])]);
            if (!chained && alias[sz(i)] && is_output[sz(i)]) ok = false;
        }
        if (!chained) {
            for (std::size_t j = k + 1; ok && j < p.groups.size(); ++j)
                for (int l : p.groups[j].leaves) ok = ok && !alias[sz(l)];
            G.in_place = ok;
            if (!ok) continue;
        }
        // the value an elementwise group computes only for this write: that group stores it into
        // the captured memory itself, when no group between them reads the old value and the
        // group reads it only element for element at the same place (m = b1 m + ..., p = p - ...)
        const int w = G.outputs[0], src = g[w].in[1];
        const ir::Node& wn = g[w];
        // the node whose kernel computes the value: src, or the value that src reshapes (a
        // reduction's keepdim result seen in a gradient's shape: a view reading it in row-major
        // order), which that kernel then stores in the captured memory's row-major layout
        int prod = src;
        if (const ir::Node& v = g[src]; v.kind == Kind::view && uses[sz(src)] == 1 && !is_output[sz(src)] && v.value == 0 &&
                                        v.args == contiguous_strides(v.shape) && g[v.in[0]].shape.numel() == v.shape.numel() &&
                                        g[v.in[0]].dtype == v.dtype)
            prod = v.in[0];
        const int ks = p.group_of[sz(prod)];
        // every other reader of the value computes in its group (an optimizer's new moment, stored
        // and also read by the parameter's update in the same kernel)
        bool only_here = ks >= 0;
        for (int u : users[sz(prod)]) only_here = only_here && (u == w || u == src || p.group_of[sz(u)] == ks);
        // kernels that write into memory placed for them (elementwise, row and reduce kernels on
        // every backend; a matmul not: the CPU's GEMM makes its own)
        const auto kk = ks >= 0 ? p.groups[sz(ks)].kind : Group::Kind::view;
        const bool placed = kk == Group::Kind::elementwise || kk == Group::Kind::row || kk == Group::Kind::reduce;
        // the memory row-major at the write's place, or (elementwise kernels, which write any
        // strides) dense in another order: a channels-last parameter and its optimizer state
        const bool row_major = wn.args == contiguous_strides(g[src].shape);
        std::vector<std::int64_t> order;
        const bool dense = row_major || (kk == Group::Kind::elementwise && prod == src && dense_order(g[src].shape, wn.args, order));
        if (!only_here || !placed || is_output[sz(prod)] || g[prod].dtype != wn.dtype || !dense) continue;
        bool direct = true;
        for (std::size_t j = sz(ks) + 1; direct && j < k; ++j)
            for (int l : p.groups[j].leaves) direct = direct && !alias[sz(l)];
        for (int l : p.groups[sz(ks)].leaves)
            if (alias[sz(l)]) {
                const ir::Node& v = g[l];
                // a view at the write's place, or the memory itself when the write covers all of it
                const bool same_place = v.shape == g[src].shape && v.dtype == wn.dtype &&
                                        ((v.kind == Kind::view && v.args == wn.args && v.value == wn.value) ||
                                         (l == b && wn.value == 0 && row_major));
                direct = direct && same_place;
            }
        if (direct) {
            if (p.store_into.empty()) p.store_into.assign(sz(N), -1);
            p.store_into[sz(prod)] = w;
            G.stored = true;
        }
    }
    // a kernel walks one set of output strides: an elementwise group storing any output in memory
    // that is not row-major stores every output so, all with the same strides, or none
    if (!p.store_into.empty())
        for (const Group& G : p.groups) {
            if (G.kind != Group::Kind::elementwise) continue;
            const int w0 = p.store_into[sz(G.outputs[0])];
            bool other = false, same = true;
            for (int o : G.outputs) {
                const int w = p.store_into[sz(o)];
                other = other || (w >= 0 && !(g[w].args == contiguous_strides(g[o].shape)));
                same = same && w >= 0 && w0 >= 0 && g[w].args == g[w0].args;
            }
            if (!other || same) continue;
            for (int o : G.outputs)
                if (const int w = p.store_into[sz(o)]; w >= 0) {
                    p.groups[sz(p.group_of[sz(w)])].stored = false;
                    p.store_into[sz(o)] = -1;
                }
        }
    return p;
}

/// Whether node `act` is an activation op a GEMM applies as an epilogue (the activation table's
/// gemm_epilogue rows that are ops: relu, gelu_tanh; the exact gelu is a composite, exact_gelu_nodes).
inline bool is_epilogue_activation(const ir::Graph& g, int act) {
    const ir::Node& n = g[act];
    if (n.kind != ir::Kind::elementwise) return false;
    const std::optional<Act> a = act_of_op(n.op);
    return a && act_info(*a).gemm_epilogue;
}

/// The nodes of the exact gelu of node u, x * 0.5 * (1 + erf(x * (1/sqrt 2))) as ops/composites.hpp
/// writes it (either operand order), when they are all that reads u and each reads only within
/// it: {x*0.5, x*c, erf, 1+erf, the product} in node order (the product last), else empty.
inline std::vector<int> exact_gelu_nodes(const ir::Graph& g, int u, const std::vector<std::vector<int>>& users,
                                         const std::vector<char>& is_output) {
    auto sz = [](int i) { return static_cast<std::size_t>(i); };
    auto only = [&](int i) { return !is_output[sz(i)] && users[sz(i)].size() == 1 ? users[sz(i)][0] : -1; };
    auto is_op = [&](int i, ops::OpId op) { return i >= 0 && g[i].kind == ir::Kind::elementwise && g[i].op == op; };
    // the scalar operand of binary node i whose other operand is x, or NaN
    auto scalar_with = [&](int i, int x) {
        const ir::Node& n = g[i];
        if (n.in.size() != 2) return std::nan("");
        const int other = n.in[0] == x ? n.in[1] : n.in[1] == x ? n.in[0] : -1;
        return other >= 0 && g[other].kind == ir::Kind::scalar ? g[other].value : std::nan("");
    };
    auto near = [](double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); };
    const std::vector<int>& us = users[sz(u)];
    if (is_output[sz(u)] || us.size() != 2 || us[0] == us[1]) return {};
    const ops::OpId mul = ops::op_id<ops::Mul>, add = ops::op_id<ops::Add>, erf = ops::op_id<ops::Erf>;
    int half = -1, scaled = -1;
    for (int x : us) {
        if (!is_op(x, mul)) return {};
        const double v = scalar_with(x, u);
        if (near(v, 0.5)) half = x;
        else if (near(v, 1.0 / std::numbers::sqrt2)) scaled = x;  // as ops/composites.hpp's gelu writes it
    }
    if (half < 0 || scaled < 0) return {};
    const int e = only(scaled);
    if (!is_op(e, erf) || g[e].in[0] != scaled) return {};
    const int one = only(e);
    if (!is_op(one, add) || !near(scalar_with(one, e), 1.0)) return {};
    const int out = only(one);
    if (!is_op(out, mul) || only(half) != out || g[out].in.size() != 2 ||
        !((g[out].in[0] == half && g[out].in[1] == one) || (g[out].in[0] == one && g[out].in[1] == half)))
        return {};
    std::vector<int> nodes{half, scaled, e, one, out};
    std::sort(nodes.begin(), nodes.end());
    if (nodes.back() != out) return {};
    return nodes;
}

/// For backends whose GEMM applies epilogues (cuBLASLt, and the small kernel): an elementwise group
/// that is exactly `act(matmul + bias)`, `matmul + bias` or `act(matmul)` over a matmul read by
/// nothing else, with `bias` one value per output column and no dtype change, moves into the
/// matmul group, which then writes the activation's value: one library call, no kernel. `act` is
/// an activation of the table (relu, gelu_tanh, and the exact gelu's composite). Other epilogues
/// stay one kernel.
inline void absorb_matmul_epilogues(const ir::Graph& g, Plan& p) {
    auto sz = [](int i) { return static_cast<std::size_t>(i); };
    detail::Readers readers = detail::readers_of(g);
    auto& users = readers.users;
    auto& is_output = readers.is_output;
    auto only_user = [&](int i) { return !is_output[sz(i)] && users[sz(i)].size() == 1 ? users[sz(i)][0] : -1; };
    std::vector<char> drop(p.groups.size(), 0);
    for (std::size_t k = 0; k < p.groups.size(); ++k) {
        Group& M = p.groups[k];
        if (M.kind != Group::Kind::matmul) continue;
        const int m = M.outputs[0];
        const ir::Node& mn = g[m];
        if (g[mn.in[0]].shape.rank() < 2 || g[mn.in[1]].shape.rank() < 2) continue;  // vector operands: no columns
        const std::int64_t n = mn.shape[mn.shape.rank() - 1];
        // the product's reader: one elementwise node, or the exact gelu's two
        const std::vector<int> direct_gelu = exact_gelu_nodes(g, m, users, is_output);
        const int u = direct_gelu.empty() ? only_user(m) : direct_gelu.front();
        if (u < 0 || g[u].kind != ir::Kind::elementwise || g[u].dtype != mn.dtype) continue;
        const int e = p.group_of[sz(u)];
        if (e < 0 || p.groups[sz(e)].kind != Group::Kind::elementwise) continue;
        std::vector<int> chain{u};
        int bias = -1;
        Act act = Act::none;
        // the activation after node x (x's only reader, or the exact gelu's nodes) into the chain
        auto take_act = [&](int x) {
            const int v = only_user(x);
            if (v >= 0 && p.group_of[sz(v)] == e && is_epilogue_activation(g, v) && g[v].dtype == mn.dtype) {
                chain.push_back(v);
                act = *act_of_op(g[v].op);
                return;
            }
            const std::vector<int> gl = x == m ? direct_gelu : exact_gelu_nodes(g, x, users, is_output);
            if (gl.empty() || g[gl.back()].dtype != mn.dtype) return;
            for (int j : gl)
                if (p.group_of[sz(j)] != e) return;
            chain.insert(chain.end(), gl.begin(), gl.end());
            act = Act::gelu;
        };
        if (!direct_gelu.empty()) {
            chain.clear();
            take_act(m);
            if (act != Act::gelu) continue;
        } else if (g[u].op == ops::op_id<ops::Add> && g[u].shape == mn.shape) {
            const int other = g[u].in[0] == m ? g[u].in[1] : g[u].in[0];
            const ir::Node& bn = g[other];
            bool per_column = bn.kind != ir::Kind::scalar && p.materialized[sz(other)] && bn.dtype == mn.dtype &&
                              bn.shape.rank() >= 1 && bn.shape[bn.shape.rank() - 1] == n && g[u].in[0] != g[u].in[1] &&
                              p.group_of[sz(other)] < static_cast<int>(k);  // computed before the GEMM runs
            for (int d = 0; per_column && d + 1 < bn.shape.rank(); ++d) per_column = bn.shape[d] == 1;
            if (!per_column) continue;
            bias = other;
            take_act(u);
        } else if (is_epilogue_activation(g, u)) {
            act = *act_of_op(g[u].op);
        } else {
            continue;
        }
        const Group& E = p.groups[sz(e)];
        if (E.nodes != chain || E.outputs.size() != 1 || E.outputs[0] != chain.back()) continue;
        M.bias = bias;
        M.act = act != Act::none ? chain.back() : -1;
        M.act_kind = act;
        M.nodes.insert(M.nodes.end(), chain.begin(), chain.end());
        M.outputs = {chain.back()};
        if (bias >= 0) {
            M.leaves.push_back(bias);
            std::sort(M.leaves.begin(), M.leaves.end());
        }
        p.materialized[sz(m)] = 0;
        drop[sz(e)] = 1;
    }
    // renumber: the absorbed groups go, node -> group follows
    std::vector<Group> kept;
    for (std::size_t k = 0; k < p.groups.size(); ++k)
        if (!drop[k]) kept.push_back(std::move(p.groups[k]));
    p.groups = std::move(kept);
    std::fill(p.group_of.begin(), p.group_of.end(), -1);
    for (std::size_t k = 0; k < p.groups.size(); ++k)
        for (int j : p.groups[k].nodes) p.group_of[sz(j)] = static_cast<int>(k);
}

}  // namespace kiln::fuse
