// The CPU backend for runtime graphs: runs a fused plan group by group with the tile interpreter,
// row kernels for reductions with their producers and consumers, and Eigen for matmul.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kiln/backends/cpu/program.hpp"
#include "kiln/backends/cpu/reduce.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/reduce_table.hpp"

namespace kiln::detail {

/// Calls f(type_identity<R>) for the reduction table entry of a ReduceKind (mean sums).
template <class F>
decltype(auto) visit_reduce(ir::ReduceKind k, F&& f) {
    switch (k) {
        case ir::ReduceKind::prod: return f(std::type_identity<ops::ProdR>{});
        case ir::ReduceKind::max: return f(std::type_identity<ops::MaxR>{});
        case ir::ReduceKind::min: return f(std::type_identity<ops::MinR>{});
        default: return f(std::type_identity<ops::SumR>{});
    }
}

/// Builds the tile program computing `root` over `shape` from a group's inlined elementwise nodes;
/// `vals` holds the materialized values (leaves). The result is the last instruction.
inline TileProgram tree_program(const ir::Graph& g, const std::vector<int>& nodes, int root, const Shape& shape,
                                const std::vector<Tensor>& vals) {
    TileProgram p;
    p.space.shape = shape;
    std::vector<int> value_of(static_cast<std::size_t>(g.size()), -1);
    std::vector<int> leaf_ids, scalar_ids;
    auto in_group = [&](int j) { return std::find(nodes.begin(), nodes.end(), j) != nodes.end() && g[j].kind == ir::Kind::elementwise; };
    for (int i : nodes) {
        if (i > root || !in_group(i)) continue;
        for (int j : g[i].in) {
            if (in_group(j)) continue;
            if (g[j].kind == ir::Kind::scalar) {
                if (std::find(scalar_ids.begin(), scalar_ids.end(), j) == scalar_ids.end()) scalar_ids.push_back(j);
            } else if (std::find(leaf_ids.begin(), leaf_ids.end(), j) == leaf_ids.end()) {
                leaf_ids.push_back(j);
            }
        }
    }
    if (!in_group(root)) leaf_ids = {root};  // a reduction straight over a materialized value
    for (int j : leaf_ids) {
        p.leaves.push_back(access_of(vals[static_cast<std::size_t>(j)], shape));
        value_of[static_cast<std::size_t>(j)] = p.leaf_value(static_cast<int>(p.leaves.size()) - 1);
    }
    for (int j : scalar_ids) p.scalars.push_back(g[j].value);
    for (std::size_t k = 0; k < scalar_ids.size(); ++k)
        value_of[static_cast<std::size_t>(scalar_ids[k])] = p.scalar_value(static_cast<int>(k));
    if (!in_group(root)) {  // identity: a cast to the value's own dtype
        p.instrs.push_back({ops::op_id<ops::Cast>, compute_dtype(g[root].dtype), g[root].dtype, {p.leaf_value(0), -1, -1}});
        return p;
    }
    for (int i : nodes) {
        if (i > root || !in_group(i)) continue;
        const ir::Node& n = g[i];
        TileProgram::Instr ins{n.op, n.ct, n.attr, {-1, -1, -1}};
        for (std::size_t k = 0; k < n.in.size(); ++k) ins.in[k] = value_of[static_cast<std::size_t>(n.in[k])];
        p.instrs.push_back(ins);
        value_of[static_cast<std::size_t>(i)] = p.instr_value(static_cast<int>(p.instrs.size()) - 1);
    }
    return p;
}

/// Whether a value of shape s (aligned right to space) varies along any axis in mask.
inline bool varies_along(const Shape& s, const Shape& space, unsigned mask) {
    for (int d = 0; d < space.rank(); ++d) {
        const int k = d - (space.rank() - s.rank());
        if ((mask & (1u << d)) && k >= 0 && s[k] != 1) return true;
    }
    return false;
}

/// One row group: for each row (kept index), every member in order, on row buffers.
inline void run_row_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals) {
    const Shape& S = G.space;
    Shape outer_shape, inner_shape;
    for (int d = 0; d < S.rank(); ++d) ((G.mask & (1u << d)) ? inner_shape : outer_shape).push_back(S[d]);
    const std::int64_t outer = outer_shape.numel(), inner = inner_shape.numel();
    const Shape keep = fuse::detail::keep_shape(S, G.mask);
    auto split = [&](const Strides& st, Strides& o, Strides& in) {
        for (int d = 0; d < S.rank(); ++d) ((G.mask & (1u << d)) ? in : o).push_back(st[d]);
    };
    struct Leaf {
        Access inner;  // over inner_shape, base at row 0
        Strides outer;
        bool varies;
    };
    std::vector<Leaf> leaves;
    std::vector<int> slot(static_cast<std::size_t>(g.size()), -1);  // node -> leaf or member index
    for (int j : G.leaves) {
        const Access a = access_of(vals[static_cast<std::size_t>(j)], S);
        Leaf l{{a.base, a.dtype, {}}, {}, varies_along(g[j].shape, S, G.mask)};
        split(a.strides, l.outer, l.inner.strides);
        slot[static_cast<std::size_t>(j)] = static_cast<int>(leaves.size());
        leaves.push_back(std::move(l));
    }
    const std::size_t nm = G.nodes.size();
    std::vector<char> vec(nm);
    for (std::size_t m = 0; m < nm; ++m) {
        const int i = G.nodes[m];
        slot[static_cast<std::size_t>(i)] = static_cast<int>(m);
        vec[m] = g[i].kind == ir::Kind::elementwise && varies_along(g[i].shape, S, G.mask);
    }
    // outputs
    struct Out {
        std::size_t member;
        Access inner;
        Strides outer;
        char* flat;  // row scalars: contiguous, one per row
        DType dtype;
    };
    std::vector<Out> outs;
    for (int o : G.outputs) {
        Tensor t(g[o].shape, g[o].dtype);
        vals[static_cast<std::size_t>(o)] = t;
        Out out{static_cast<std::size_t>(slot[static_cast<std::size_t>(o)]), {}, {}, nullptr, t.dtype()};
        if (vec[out.member]) {
            const Access a = access_of(t, S);
            out.inner = {a.base, a.dtype, {}};
            split(a.strides, out.outer, out.inner.strides);
        } else {
            out.flat = static_cast<char*>(t.data_ptr());
        }
        outs.push_back(std::move(out));
    }
    (void)keep;
    const IterSpace inner_space{inner_shape};
    visit_ct(G.ct, [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::vector<TileKernel<T>> kernels(nm, nullptr);
        for (std::size_t m = 0; m < nm; ++m)
            if (g[G.nodes[m]].kind == ir::Kind::elementwise) kernels[m] = tile_kernel<T>(g[G.nodes[m]].op);
        const std::int64_t grain = std::max<std::int64_t>(1, parallel_grain / std::max<std::int64_t>(inner, 1));
        parallel_for(outer, grain, [&](std::int64_t b, std::int64_t e) {
            const std::size_t L = static_cast<std::size_t>(inner) + 64;
            std::vector<T> mbuf(nm * L), lbuf(leaves.size() * L), tmp(3 * L);
            std::vector<T> scal(nm + leaves.size());
            std::vector<const T*> lptr(leaves.size());
            std::int64_t idx[max_rank];
            for (std::int64_t o = b; o < e; ++o) {
                std::int64_t rem = o;
                for (int d = outer_shape.rank() - 1; d >= 0; --d) {
                    idx[d] = rem % outer_shape[d];
                    rem /= outer_shape[d];
                }
                auto row_offset = [&](const Strides& st) {
                    std::int64_t off = 0;
                    for (int d = 0; d < outer_shape.rank(); ++d) off += idx[d] * st[d];
                    return off;
                };
                for (std::size_t l = 0; l < leaves.size(); ++l) {
                    const Leaf& lf = leaves[l];
                    const std::int64_t es = static_cast<std::int64_t>(dtype_size(lf.inner.dtype));
                    Access a = lf.inner;
                    a.base += row_offset(lf.outer) * es;
                    if (!lf.varies) {
                        visit_dtype(a.dtype, [&](auto st) {
                            using Sx = typename decltype(st)::type;
                            scal[nm + l] = load_as<T>(*reinterpret_cast<const Sx*>(a.base));
                        });
                    } else if (a.dtype == dtype_of<T> && is_linear(inner_space, a)) {
                        lptr[l] = reinterpret_cast<const T*>(a.base);
                    } else {
                        gather(inner_space, a, 0, inner, lbuf.data() + l * L);
                        lptr[l] = lbuf.data() + l * L;
                    }
                }
                for (std::size_t m = 0; m < nm; ++m) {
                    const ir::Node& n = g[G.nodes[m]];
                    T* out = mbuf.data() + m * L;
                    // operand k as a pointer to inner values (vector) or a scalar
                    auto operand = [&](int j, std::size_t k, bool want_vec) -> const T* {
                        const int s = slot[static_cast<std::size_t>(j)];
                        const bool member = s >= 0 && std::find(G.nodes.begin(), G.nodes.end(), j) != G.nodes.end();
                        T v{};
                        if (g[j].kind == ir::Kind::scalar) v = static_cast<T>(g[j].value);
                        else if (member && vec[static_cast<std::size_t>(s)]) return mbuf.data() + static_cast<std::size_t>(s) * L;
                        else if (member) v = scal[static_cast<std::size_t>(s)];
                        else if (leaves[static_cast<std::size_t>(s)].varies) return lptr[static_cast<std::size_t>(s)];
                        else v = scal[nm + static_cast<std::size_t>(s)];
                        T* t = tmp.data() + k * L;
                        if (want_vec) std::fill_n(t, inner, v);
                        else t[0] = v;
                        return t;
                    };
                    if (n.kind == ir::Kind::elementwise) {
                        const T* in[3] = {};
                        for (std::size_t k = 0; k < n.in.size(); ++k) in[k] = operand(n.in[k], k, vec[m]);
                        if (vec[m]) {
                            kernels[m](in, out, inner, n.attr);
                        } else {
                            T r{};
                            kernels[m](in, &r, 1, n.attr);
                            scal[m] = r;
                        }
                    } else {  // reduce over the row
                        const int x = n.in[0];
                        const int sx = slot[static_cast<std::size_t>(x)];
                        const bool xmember = std::find(G.nodes.begin(), G.nodes.end(), x) != G.nodes.end();
                        const bool xvec = xmember ? vec[static_cast<std::size_t>(sx)] != 0 : leaves[static_cast<std::size_t>(sx)].varies;
                        const T* v = operand(x, 0, xvec);
                        visit_reduce(n.rkind, [&](auto rt) {
                            using R = typename decltype(rt)::type;
                            using C = typename R::Combine;
                            using Acc = reduce_acc_t<R, T>;
                            Acc acc = static_cast<Acc>(R::template identity<T>());
                            if (xvec) {
                                for (std::int64_t s = 0; s < inner; s += tile_elems) {
                                    const std::int64_t len = std::min(tile_elems, inner - s);
                                    acc = C::eval(acc, static_cast<Acc>(reduce_tile<R, T>(v + s, len)));
                                }
                            } else {
                                for (std::int64_t s = 0; s < inner; ++s) acc = C::eval(acc, static_cast<Acc>(v[0]));
                            }
                            if (n.rkind == ir::ReduceKind::mean)
                                acc = static_cast<Acc>(acc / static_cast<Acc>(std::max(0.0, static_cast<double>(inner) - n.correction)));
                            scal[m] = static_cast<T>(acc);
                        });
                    }
                }
                for (const Out& out : outs) {
                    if (vec[out.member]) {
                        Access a = out.inner;
                        a.base += row_offset(out.outer) * static_cast<std::int64_t>(dtype_size(a.dtype));
                        scatter(inner_space, a, 0, inner, mbuf.data() + out.member * L);
                    } else {
                        visit_dtype(out.dtype, [&](auto st) {
                            using Sx = typename decltype(st)::type;
                            reinterpret_cast<Sx*>(out.flat)[o] = store_as<Sx>(scal[out.member]);
                        });
                    }
                }
            }
        });
    });
}

/// A reduction (or arg-reduction) with its elementwise prologue, rows of any length.
inline void run_reduce_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals) {
    const int r = G.outputs[0];
    const ir::Node& n = g[r];
    const int x = n.in[0];
    const Shape& S = g[x].shape;
    TileProgram p = tree_program(g, G.nodes, x, S, vals);
    // kept dims first, then reduced ones; each output element reduces a run of the iteration order
    std::vector<int> perm;
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < S.rank(); ++d)
        if (!(n.mask & (1u << d))) { perm.push_back(d); outer *= S[d]; }
    for (int d = 0; d < S.rank(); ++d)
        if (n.mask & (1u << d)) { perm.push_back(d); inner *= S[d]; }
    Shape ps = S;
    for (std::size_t i = 0; i < perm.size(); ++i) ps[static_cast<int>(i)] = S[perm[i]];
    for (auto& a : p.leaves) {
        Strides st = a.strides;
        for (std::size_t i = 0; i < perm.size(); ++i) st[static_cast<int>(i)] = a.strides[perm[i]];
        a.strides = st;
    }
    p.space.shape = ps;
    std::vector<Access*> all;
    for (auto& a : p.leaves) all.push_back(&a);
    collapse(p.space, all);
    Tensor out(n.shape, n.dtype);
    vals[static_cast<std::size_t>(r)] = out;
    if (outer == 0) return;
    if (inner == 0) {
        if (n.kind == ir::Kind::arg_reduce || n.rkind == ir::ReduceKind::max || n.rkind == ir::ReduceKind::min)
            throw ValueError("kiln::" + std::string(n.kind == ir::Kind::arg_reduce ? "argmax" : ir::reduce_name(n.rkind)) +
                             ": cannot reduce over an empty dimension of shape " + S.str());
        out.fill_(Scalar(n.rkind == ir::ReduceKind::prod ? 1.0 : 0.0));
        return;
    }
    const ProgramRunner runner(p);
    auto source = [&](std::int64_t b, std::int64_t len, void* dst) { runner.tile(b, len, dst); };
    if (n.kind == ir::Kind::arg_reduce) {
        if (n.arg_max) arg_reduce_rows<true>(outer, inner, runner.result_ct(), source, out.data<std::int64_t>());
        else arg_reduce_rows<false>(outer, inner, runner.result_ct(), source, out.data<std::int64_t>());
        return;
    }
    visit_reduce(n.rkind, [&](auto rt) {
        using R = typename decltype(rt)::type;
        reduce_rows<R>(outer, inner, runner.result_ct(), source, out);
    });
    if (n.rkind == ir::ReduceKind::mean) {
        const double div = std::max(0.0, static_cast<double>(inner) - n.correction);
        out.assign(out / div);
    }
}

/// An elementwise group: its tree in one tile program writing the root's new tensor.
inline void run_elementwise_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals) {
    const int root = G.outputs[0];
    const ir::Node& n = g[root];
    Tensor out(n.shape, n.dtype);
    vals[static_cast<std::size_t>(root)] = out;
    if (out.numel() == 0) return;
    TileProgram p = tree_program(g, G.nodes, root, n.shape, vals);
    p.out = access_of(out, n.shape);
    std::vector<Access*> all{&p.out};
    for (auto& a : p.leaves) all.push_back(&a);
    collapse(p.space, all);
    run_program(p);
}

/// A compiled graph on the CPU: the fused plan, run group by group.
class CpuGraphProgram {
public:
    CpuGraphProgram(ir::Graph g, fuse::Plan plan) : g_(std::move(g)), plan_(std::move(plan)) {}

    const ir::Graph& graph() const { return g_; }
    const fuse::Plan& plan() const { return plan_; }

    std::vector<Tensor> run(const std::vector<Tensor>& inputs) const {
        std::vector<Tensor> vals(static_cast<std::size_t>(g_.size()));
        for (std::size_t k = 0; k < g_.inputs.size(); ++k) vals[static_cast<std::size_t>(g_.inputs[k])] = inputs[k];
        for (int i = 0; i < g_.size(); ++i)
            if (g_[i].kind == ir::Kind::constant) vals[static_cast<std::size_t>(i)] = g_[i].tensor;
        for (const fuse::Group& G : plan_.groups) {
            switch (G.kind) {
                case fuse::Group::Kind::elementwise: run_elementwise_group(g_, G, vals); break;
                case fuse::Group::Kind::row: run_row_group(g_, G, vals); break;
                case fuse::Group::Kind::reduce: run_reduce_group(g_, G, vals); break;
                case fuse::Group::Kind::matmul: {
                    const ir::Node& n = g_[G.outputs[0]];
                    vals[static_cast<std::size_t>(G.outputs[0])] =
                        matmul(vals[static_cast<std::size_t>(n.in[0])], vals[static_cast<std::size_t>(n.in[1])]);
                    break;
                }
                case fuse::Group::Kind::view: {
                    const ir::Node& n = g_[G.outputs[0]];
                    const Tensor src = vals[static_cast<std::size_t>(n.in[0])].contiguous();
                    vals[static_cast<std::size_t>(G.outputs[0])] =
                        Tensor(src.storage(), src.offset() + static_cast<std::int64_t>(n.value), n.shape, n.args, n.dtype);
                    break;
                }
            }
        }
        std::vector<Tensor> out;
        out.reserve(g_.outputs.size());
        for (int o : g_.outputs) out.push_back(vals[static_cast<std::size_t>(o)]);
        return out;
    }

private:
    ir::Graph g_;
    fuse::Plan plan_;
};

}  // namespace kiln::detail
