// The CPU backend for runtime graphs: runs a fused plan group by group with the tile interpreter,
// row kernels for reductions with their producers and consumers, and Eigen for matmul.
#pragma once

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backends/cpu/cpp_build.hpp"
#include "kiln/backends/cpu/cpp_codegen.hpp"
#include "kiln/backends/cpu/program.hpp"
#include "kiln/backends/cpu/reduce.hpp"
#include "kiln/fuse/execute.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/fuse/memory_plan.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/backends/cpu/matmul.hpp"
#include "kiln/tables/reduce_table.hpp"

namespace kiln::detail {

/// out[i] = out[i] / div over a contiguous tensor, as eager's `out / div` computes it (in f64 for
/// f64, else in f32) and stores it back.
inline void divide_in_place(const Tensor& out, double div) {
    if (!out.is_contiguous()) throw InternalError("kiln: divide_in_place needs a contiguous tensor");
    visit_dtype(out.dtype(), [&](auto tag) {
        using S = typename decltype(tag)::type;
        using T = std::conditional_t<std::is_same_v<S, double>, double, float>;
        S* p = static_cast<S*>(out.data_ptr());
        const T d = static_cast<T>(div);
        parallel_for(out.numel(), parallel_grain, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) p[i] = store_as<S>(load_as<T>(p[i]) / d);
        });
    });
}

/// Calls f(type_identity<R>) for what a ReduceKind's kernels accumulate (its table entry's
/// Accumulate: mean sums).
template <class F>
decltype(auto) visit_reduce(ir::ReduceKind k, F&& f) {
    return ir::visit_reduction(k, [&](auto t) { return f(std::type_identity<typename decltype(t)::type::Accumulate>{}); });
}

/// Builds the tile program computing `root` over `shape` from a group's inlined elementwise nodes
/// (a root outside the group is read through an identity conversion computed in `identity_ct`);
/// `vals` holds the materialized values (leaves). The result is the last instruction; `values`
/// (optional) receives each node's value index in the program.
inline TileProgram tree_program(const ir::Graph& g, const std::vector<int>& nodes, int root, const Shape& shape,
                                const std::vector<Tensor>& vals, std::vector<int>* values = nullptr,
                                DType identity_ct = DType::boolean) {
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
        const DType ct = identity_ct != DType::boolean ? identity_ct : cast_compute_dtype(g[root].dtype, g[root].dtype);
        p.instrs.push_back({ops::op_id<ops::Cast>, ct, g[root].dtype, {p.leaf_value(0), -1, -1}});
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
    if (values) *values = std::move(value_of);
    return p;
}

/// The tensor a group writes node `id` into: the planned buffer already bound in vals (memory
/// planning), or a new one.
inline Tensor output_tensor(std::vector<Tensor>& vals, int id, const Shape& shape, DType dtype) {
    Tensor& v = vals[static_cast<std::size_t>(id)];
    if (!v.defined() || !(v.shape() == shape) || v.dtype() != dtype) v = Tensor(shape, dtype);
    return v;
}

/// A group's generated C++ kernels, one per operand layout seen (rank, dtypes, innermost stride
/// class): the source is made once per layout, the kernel asked for until it is loaded.
struct GroupKernels {
    struct Entry {
        std::string layout, source;
        void* fn = nullptr;
    };
    std::mutex mu;
    std::vector<Entry> entries;

    /// The kernel for a layout: its source made once (by `make`, "" where not covered), the
    /// kernel asked for until it is loaded; nullptr meanwhile.
    template <class Make>
    void* get(const std::string& layout, Make&& make) {
        std::lock_guard lock(mu);
        Entry* e = nullptr;
        for (auto& x : entries)
            if (x.layout == layout) e = &x;
        if (!e) {
            entries.push_back({layout, make(), nullptr});
            e = &entries.back();
        }
        if (!e->fn && !e->source.empty()) e->fn = cppgen::kernel_for(e->source);
        return e->fn;
    }
};

/// Reusable per-thread buffers for the row kernels' transposed copies (no allocation once warm).
template <class T>
inline T* transpose_scratch(std::size_t which, std::size_t n) {
    thread_local std::vector<std::vector<T>> bufs;
    if (bufs.size() <= which) bufs.resize(which + 1);
    if (bufs[which].size() < n) bufs[which].resize(n);
    return bufs[which].data();
}

/// Whether a value of shape s (aligned right to space) varies along any axis in mask.
inline bool varies_along(const Shape& s, const Shape& space, unsigned mask) {
    for (int d = 0; d < space.rank(); ++d) {
        const int k = d - (space.rank() - s.rank());
        if ((mask & (1u << d)) && k >= 0 && s[k] != 1) return true;
    }
    return false;
}

/// One row group: for each row (kept index), every member in order, on row buffers; through its
/// generated C++ kernel once that is loaded (memo), where the rows are contiguous.
inline void run_row_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, GroupKernels* memo = nullptr) {
    const Shape& S = G.space;
    Shape outer_shape, inner_shape;
    for (int d = 0; d < S.rank(); ++d) ((G.mask & (1u << d)) ? inner_shape : outer_shape).push_back(S[d]);
    const std::int64_t outer = outer_shape.numel(), inner = inner_shape.numel();
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
    std::vector<char> is_member(static_cast<std::size_t>(g.size()), 0);  // decided once, read per row
    for (int i : G.nodes) is_member[static_cast<std::size_t>(i)] = 1;
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
        Tensor t = output_tensor(vals, o, g[o].shape, g[o].dtype);
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
    const IterSpace inner_space{inner_shape};
    if (memo && cpu_codegen() != CpuCodegen::off && inner_shape.rank() == 1 && inner > 0 && outer > 0) {
        // generated: rows read and written with inner stride 1 (a strided row is the interpreter's,
        // which transposes it in blocks first)
        bool rows_contiguous = true;
        for (const Leaf& lf : leaves) rows_contiguous = rows_contiguous && (!lf.varies || lf.inner.strides[0] == 1);
        for (const Out& out : outs) rows_contiguous = rows_contiguous && (!vec[out.member] || out.inner.strides[0] == 1);
        bool covered = rows_contiguous;
        for (int i : G.nodes) covered = covered && g[i].kind != ir::Kind::arg_reduce;
        if (covered) {
            std::vector<double> scalars;
            std::vector<int> scalar_ids;
            for (int i : G.nodes)
                for (int j : g[i].in)
                    if (g[j].kind == ir::Kind::scalar && std::find(scalar_ids.begin(), scalar_ids.end(), j) == scalar_ids.end()) {
                        scalar_ids.push_back(j);
                        scalars.push_back(g[j].value);
                    }
            auto make = [&] {
                cppgen::RowProgram rp;
                rp.ct = G.ct;
                rp.outer_rank = std::max(1, outer_shape.rank());
                for (const Leaf& lf : leaves) rp.leaves.push_back({lf.inner.dtype, lf.varies});
                rp.scalars = scalars.size();
                const int nl = static_cast<int>(leaves.size()), ns = static_cast<int>(scalars.size());
                for (std::size_t m = 0; m < nm; ++m) {
                    const ir::Node& n = g[G.nodes[m]];
                    cppgen::RowProgram::Member mb;
                    mb.reduce = n.kind != ir::Kind::elementwise;
                    mb.vec = vec[m] != 0;
                    mb.op = n.op;
                    mb.attr = n.attr;
                    mb.rid = static_cast<ops::ReduceId>(n.rkind);
                    mb.mean = n.rkind == ir::ReduceKind::mean;
                    mb.correction = n.correction;
                    for (std::size_t k = 0; k < n.in.size() && k < 3; ++k) {
                        const int j = n.in[k];
                        if (g[j].kind == ir::Kind::scalar)
                            mb.in[k] = nl + static_cast<int>(std::find(scalar_ids.begin(), scalar_ids.end(), j) - scalar_ids.begin());
                        else if (is_member[static_cast<std::size_t>(j)])
                            mb.in[k] = nl + ns + slot[static_cast<std::size_t>(j)];
                        else
                            mb.in[k] = slot[static_cast<std::size_t>(j)];
                    }
                    rp.members.push_back(mb);
                }
                for (const Out& out : outs) rp.outs.push_back({static_cast<int>(out.member), out.dtype});
                return cppgen::row_source(rp);
            };
            if (const auto fn = reinterpret_cast<cppgen::RowsFn>(memo->get("rows", make))) {
                const int O = std::max(1, outer_shape.rank());
                const Shape oshape = outer_shape.rank() ? outer_shape : Shape{1};
                std::vector<void*> ptrs;
                std::vector<std::int64_t> ostr;
                auto outer_strides = [&](const Strides& st) {
                    for (int d = 0; d < O; ++d) ostr.push_back(outer_shape.rank() ? st[d] : 0);
                };
                for (const Leaf& lf : leaves) {
                    ptrs.push_back(lf.inner.base);
                    outer_strides(lf.outer);
                }
                const Strides flat = contiguous_strides(oshape);
                for (const Out& out : outs) {
                    ptrs.push_back(vec[out.member] ? out.inner.base : out.flat);
                    outer_strides(vec[out.member] ? out.outer : flat);
                }
                const std::int64_t grain = std::max<std::int64_t>(1, parallel_grain / inner);
                parallel_for(outer, grain, [&](std::int64_t b, std::int64_t e) {
                    fn(ptrs.data(), oshape.begin(), ostr.data(), scalars.data(), inner, b, e);
                });
                return;
            }
        }
    }
    visit_ct(G.ct, [&](auto tag) {
        using T = typename decltype(tag)::type;
        // Rows along a strided axis (a reduction over a leading axis): rows would gather one
        // element per cache line. Transpose such leaves once, in blocks whose reads are whole
        // cache lines, into row-contiguous copies; outputs likewise go through a row-contiguous
        // buffer transposed back at the end.
        const bool two_d = outer_shape.rank() == 1 && inner_shape.rank() == 1 && inner > 1 && outer > 1;
        constexpr std::int64_t B = 16;
        // rows of the copies are padded by a cache line: 16 rows exactly 4 KiB apart would all
        // fall in one L1 set (and alias each other's stores)
        const std::int64_t ld = inner + static_cast<std::int64_t>(64 / sizeof(T));
        std::size_t scratch_used = 0;
        if (two_d) {
            for (Leaf& lf : leaves) {
                if (!lf.varies || lf.inner.strides[0] == 1 || lf.outer[0] != 1) continue;
                T* dst = transpose_scratch<T>(scratch_used++, static_cast<std::size_t>(outer * ld));
                const std::int64_t si = lf.inner.strides[0];
                visit_dtype(lf.inner.dtype, [&](auto st) {
                    using Sx = typename decltype(st)::type;
                    const Sx* src = reinterpret_cast<const Sx*>(lf.inner.base);
                    parallel_for((outer + B - 1) / B, 1, [&](std::int64_t b0, std::int64_t b1) {
                        for (std::int64_t ob = b0 * B; ob < std::min(outer, b1 * B); ob += B) {
                            const std::int64_t nb = std::min(B, outer - ob);
                            for (std::int64_t k = 0; k < inner; ++k)
                                for (std::int64_t j = 0; j < nb; ++j) dst[(ob + j) * ld + k] = load_as<T>(src[ob + j + k * si]);
                        }
                    });
                });
                lf.inner = {reinterpret_cast<char*>(dst), dtype_of<T>, Strides{1}};
                lf.outer = Strides{ld};
            }
        }
        struct Back {
            T* buf;
            Access dst;  // the real output: inner stride si, outer stride 1
        };
        std::vector<Back> backs;
        if (two_d) {
            for (Out& out : outs) {
                if (!vec[out.member] || out.inner.strides[0] == 1 || out.outer[0] != 1) continue;
                Back bk{transpose_scratch<T>(scratch_used++, static_cast<std::size_t>(outer * ld)), out.inner};
                out.inner = {reinterpret_cast<char*>(bk.buf), dtype_of<T>, Strides{1}};
                out.outer = Strides{ld};
                backs.push_back(std::move(bk));
            }
        }
        // per member: the kernel, and for binary ops the variants with operand 0 or 1 scalar
        std::vector<std::array<AnyTileKernel, 3>> kernels(nm, {nullptr, nullptr, nullptr});
        for (std::size_t m = 0; m < nm; ++m)
            if (g[G.nodes[m]].kind == ir::Kind::elementwise)
                for (unsigned mask = 0; mask < (g[G.nodes[m]].in.size() == 2 ? 3u : 1u); ++mask)
                    kernels[m][mask] = any_tile_kernel(g[G.nodes[m]].op, dtype_of<T>, mask);
        const AnyTileKernel mul_by_scalar = any_tile_kernel(ops::op_id<ops::Mul>, dtype_of<T>, 2u);
        const std::int64_t grain = std::max<std::int64_t>(1, parallel_grain / std::max<std::int64_t>(inner, 1));
        parallel_for(outer, grain, [&](std::int64_t b, std::int64_t e) {
            const std::size_t L = static_cast<std::size_t>(inner) + 64;
            std::vector<T> mbuf(nm * L), lbuf(leaves.size() * L), tmp(3 * L);
            std::vector<T> scal(nm + leaves.size());
            std::vector<const T*> lptr(leaves.size());
            std::vector<T*> mp(nm);  // where member m's row lives: its buffer, or straight in its output
            for (std::size_t m = 0; m < nm; ++m) mp[m] = mbuf.data() + m * L;
            std::vector<char> direct(outs.size(), 0);
            for (std::size_t k = 0; k < outs.size(); ++k) {
                const Out& out = outs[k];
                direct[k] = vec[out.member] && out.inner.dtype == dtype_of<T> && is_linear(inner_space, out.inner);
                for (std::size_t q = 0; q < k; ++q) direct[k] = direct[k] && outs[q].member != out.member;
            }
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
                for (std::size_t k = 0; k < outs.size(); ++k)
                    if (direct[k])
                        mp[outs[k].member] = reinterpret_cast<T*>(outs[k].inner.base) + row_offset(outs[k].outer);
                for (std::size_t m = 0; m < nm; ++m) {
                    const ir::Node& n = g[G.nodes[m]];
                    T* out = mp[m];
                    // operand k as a pointer to inner values (vector) or a scalar
                    auto operand = [&](int j, std::size_t k, bool want_vec) -> const T* {
                        const int s = slot[static_cast<std::size_t>(j)];
                        const bool member = is_member[static_cast<std::size_t>(j)] != 0;
                        T v{};
                        if (g[j].kind == ir::Kind::scalar) v = static_cast<T>(g[j].value);
                        else if (member && vec[static_cast<std::size_t>(s)]) return mp[static_cast<std::size_t>(s)];
                        else if (member) v = scal[static_cast<std::size_t>(s)];
                        else if (leaves[static_cast<std::size_t>(s)].varies) return lptr[static_cast<std::size_t>(s)];
                        else v = scal[nm + static_cast<std::size_t>(s)];
                        T* t = tmp.data() + k * L;
                        if (want_vec) std::fill_n(t, inner, v);
                        else t[0] = v;
                        return t;
                    };
                    // whether operand j has a value per element of the row
                    auto varies = [&](int j) {
                        const int s = slot[static_cast<std::size_t>(j)];
                        if (g[j].kind == ir::Kind::scalar) return false;
                        if (is_member[static_cast<std::size_t>(j)]) return vec[static_cast<std::size_t>(s)] != 0;
                        return leaves[static_cast<std::size_t>(s)].varies;
                    };
                    if (n.kind == ir::Kind::elementwise) {
                        const void* in[3] = {};
                        // a binary op with one row-constant operand reads it as one value
                        unsigned mask = 0;
                        if (vec[m] && n.in.size() == 2 && varies(n.in[0]) != varies(n.in[1])) mask = varies(n.in[0]) ? 2u : 1u;
                        for (std::size_t k = 0; k < n.in.size(); ++k) in[k] = operand(n.in[k], k, vec[m] && !(mask >> k & 1u));
                        if (vec[m] && mask == 2u && n.op == ops::op_id<ops::Div>) {
                            // a row divided by one value (softmax's normalization): multiply by its
                            // reciprocal, one division per row instead of one per element, as
                            // torch's CPU softmax does (within an ulp of the quotient)
                            const T r = T(1) / *static_cast<const T*>(in[1]);
                            in[1] = &r;
                            mul_by_scalar(in, out, inner, n.attr);
                        } else if (vec[m]) {
                            kernels[m][mask](in, out, inner, n.attr);
                        } else {
                            T r{};
                            kernels[m][0](in, &r, 1, n.attr);
                            scal[m] = r;
                        }
                    } else {  // reduce over the row
                        const int x = n.in[0];
                        const int sx = slot[static_cast<std::size_t>(x)];
                        const bool xmember = is_member[static_cast<std::size_t>(x)] != 0;
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
                for (std::size_t k = 0; k < outs.size(); ++k) {
                    const Out& out = outs[k];
                    if (direct[k]) continue;
                    if (vec[out.member]) {
                        Access a = out.inner;
                        a.base += row_offset(out.outer) * static_cast<std::int64_t>(dtype_size(a.dtype));
                        scatter(inner_space, a, 0, inner, mp[out.member]);
                    } else {
                        visit_dtype(out.dtype, [&](auto st) {
                            using Sx = typename decltype(st)::type;
                            reinterpret_cast<Sx*>(out.flat)[o] = store_as<Sx>(scal[out.member]);
                        });
                    }
                }
            }
        });
        for (const Back& bk : backs) {
            const T* src = bk.buf;
            const std::int64_t si = bk.dst.strides[0];
            visit_dtype(bk.dst.dtype, [&](auto st) {
                using Sx = typename decltype(st)::type;
                Sx* dst = reinterpret_cast<Sx*>(bk.dst.base);
                parallel_for((outer + B - 1) / B, 1, [&](std::int64_t b0, std::int64_t b1) {
                    for (std::int64_t ob = b0 * B; ob < std::min(outer, b1 * B); ob += B) {
                        const std::int64_t nb = std::min(B, outer - ob);
                        for (std::int64_t k = 0; k < inner; ++k)
                            for (std::int64_t j = 0; j < nb; ++j) dst[ob + j + k * si] = store_as<Sx>(src[(ob + j) * ld + k]);
                    }
                });
            });
        }
    });
}

/// A reduction (or arg-reduction) with its elementwise prologue, rows of any length.
inline void run_reduce_output(const ir::Graph& g, const fuse::Group& G, int r, std::vector<Tensor>& vals, GroupKernels* memo);
/// The generated kernel for a collapsed program, or nullptr (codegen off, not covered, building);
/// `program` names which of its group's programs p is where a group has several (a reduce group's
/// outputs: each its own prologue), "" for the group's one.
/// p's generated kernel, built or looked up once per layout. `streams`: large outputs may be written
/// with streaming stores (not where the output is a caller's tile, read back at once).
inline cppgen::GroupFn generated_kernel(const TileProgram& p, GroupKernels& memo, const std::string& program = {}, bool streams = true);
/// A reduce group: each of its reductions (several when fuse::merge_reduce_groups joined them,
/// which the CPU's limits leave off: its row groups join reductions) over its prologue, whose
/// values come from its generated C++ kernel once that is loaded (memo), else from the tile interpreter.
inline void run_reduce_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, GroupKernels* memo = nullptr) {
    for (int r : G.outputs) run_reduce_output(g, G, r, vals, memo);
}
inline void run_reduce_output(const ir::Graph& g, const fuse::Group& G, int r, std::vector<Tensor>& vals, GroupKernels* memo) {
    const ir::Node& n = g[r];
    const int x = n.in[0];
    const Shape& S = g[x].shape;
    // bools read straight into a sum or product accumulate as their (int64) result, exactly
    const DType bool_ct = n.kind == ir::Kind::reduce && compute_dtype(n.dtype) != DType::boolean ? compute_dtype(n.dtype) : DType::f32;
    TileProgram p = tree_program(g, G.nodes, x, S, vals, nullptr, g[x].dtype == DType::boolean ? bool_ct : DType::boolean);
    // rows of the permuted order, or columns (reduce_layout)
    const ReduceLayout lay = reduce_layout(S, n.mask, n.kind != ir::Kind::arg_reduce);
    const std::vector<int>& perm = lay.perm;
    const std::int64_t outer = lay.outer, inner = lay.inner, kept_run = lay.kept_run;
    const bool columns = lay.columns;
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
    Tensor out = output_tensor(vals, r, n.shape, n.dtype);
    if (outer == 0 || kept_run == 0) return;
    if (inner == 0) {
        if (n.kind == ir::Kind::arg_reduce || n.rkind == ir::ReduceKind::max || n.rkind == ir::ReduceKind::min)
            throw ValueError("kiln::" + std::string(n.kind == ir::Kind::arg_reduce ? "argmax" : ir::reduce_name(n.rkind)) +
                             ": cannot reduce over an empty dimension of shape " + S.str());
        out.fill_(Scalar(n.rkind == ir::ReduceKind::prod ? 1.0 : 0.0));
        return;
    }
    const ProgramRunner runner(p);
    // the prologue's values through its generated kernel: p with a result access whose element at
    // position b lands in dst[0] (contiguous strides, base moved back by b elements per call)
    constexpr std::size_t max_generated_accesses = 64;
    TileProgram q;
    cppgen::GroupFn gen = nullptr;
    std::vector<void*> gptrs;
    std::vector<std::int64_t> gstrides;
    if (memo && !p.instrs.empty() && p.leaves.size() < max_generated_accesses) {
        q = p;
        q.out = Access{nullptr, runner.result_ct(), contiguous_strides(q.space.shape)};
        if ((gen = generated_kernel(q, *memo, "reduce " + std::to_string(r) + ":", false))) {
            for (const Access* a : q.accesses()) {
                gptrs.push_back(a->base);
                for (int d = 0; d < q.space.shape.rank(); ++d) gstrides.push_back(a->strides[d]);
            }
        }
    }
    const std::size_t out_slot = p.leaves.size();
    const std::int64_t out_size = static_cast<std::int64_t>(dtype_size(runner.result_ct()));
    auto source = [&](std::int64_t b, std::int64_t len, void* dst) {
        if (!gen) return runner.tile(b, len, dst);
        void* ptrs[max_generated_accesses];
        std::copy(gptrs.begin(), gptrs.end(), ptrs);
        ptrs[out_slot] = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(dst) - static_cast<std::uintptr_t>(b * out_size));
        gen(ptrs, q.space.shape.begin(), gstrides.data(), q.scalars.data(), b, b + len);
    };
    if (n.kind == ir::Kind::arg_reduce) {
        if (n.arg_max) arg_reduce_rows<true>(outer, inner, runner.result_ct(), source, out.data<std::int64_t>());
        else arg_reduce_rows<false>(outer, inner, runner.result_ct(), source, out.data<std::int64_t>());
        return;
    }
    visit_reduce(n.rkind, [&](auto rt) {
        using R = typename decltype(rt)::type;
        if (columns) reduce_cols<R>(outer, inner, kept_run, runner.result_ct(), source, out);
        else reduce_rows<R>(outer, inner, runner.result_ct(), source, out);
    });
    if (n.rkind == ir::ReduceKind::mean) {
        const double div = std::max(0.0, static_cast<double>(inner) - n.correction);
        divide_in_place(out, div);
    }
}

inline cppgen::GroupFn generated_kernel(const TileProgram& p, GroupKernels& memo, const std::string& program, bool streams) {
    if (cpu_codegen() == CpuCodegen::off) return nullptr;
    std::string layout = program;
    layout += streams ? 's' : 'n';
    layout += static_cast<char>(p.space.shape.rank());
    for (const Access* a : p.accesses()) {
        const std::int64_t in = a->strides.rank() ? a->strides[a->strides.rank() - 1] : 1;
        layout += static_cast<char>(a->dtype);
        layout += static_cast<char>(in == 0 ? 0 : in == 1 ? 1 : 2);
    }
    return reinterpret_cast<cppgen::GroupFn>(memo.get(layout, [&] { return cppgen::group_source(p, streams); }));
}

/// A collapsed program's arguments for its generated kernel (cppgen::GroupFn): each access's base
/// and strides; calls the kernel on elements [begin, end) of the program's space.
struct GeneratedCall {
    const TileProgram* p = nullptr;
    cppgen::GroupFn fn = nullptr;
    std::vector<void*> ptrs;
    std::vector<std::int64_t> strides;

    GeneratedCall() = default;
    GeneratedCall(const TileProgram& prog, cppgen::GroupFn f) : p(&prog), fn(f) {
        const int R = prog.space.shape.rank();
        for (const Access* a : prog.accesses()) {
            ptrs.push_back(a->base);
            for (int d = 0; d < R; ++d) strides.push_back(a->strides[d]);
        }
    }
    void operator()(std::int64_t begin, std::int64_t end) const {
        fn(ptrs.data(), p->space.shape.begin(), strides.data(), p->scalars.data(), begin, end);
    }
};

/// Runs a collapsed program through its generated kernel, threaded over tile-aligned runs.
inline void run_generated(const TileProgram& p, cppgen::GroupFn fn) {
    const GeneratedCall call(p, fn);
    const std::int64_t n = p.space.numel(), tiles = (n + tile_elems - 1) / tile_elems;
    parallel_for(tiles, parallel_grain / tile_elems, [&](std::int64_t tb, std::int64_t te) { call(tb * tile_elems, std::min(n, te * tile_elems)); });
}

/// An elementwise group's tile program over its outputs' tensors (bound in vals, made where
/// missing), not yet collapsed; false when it has nothing to compute.
inline bool elementwise_program(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, TileProgram& p) {
    const int root = G.outputs.back();
    const ir::Node& n = g[root];
    Tensor out = output_tensor(vals, root, n.shape, n.dtype);
    if (out.numel() == 0) return false;
    std::vector<int> value_of;
    p = tree_program(g, G.nodes, root, n.shape, vals, &value_of);
    p.out = access_of(out, n.shape);
    for (std::size_t k = 0; k + 1 < G.outputs.size(); ++k) {
        const int o = G.outputs[k];
        const Tensor t = output_tensor(vals, o, g[o].shape, g[o].dtype);
        p.side.push_back({value_of[static_cast<std::size_t>(o)], access_of(t, n.shape)});
    }
    return true;
}

/// Every access of p: its result, its leaves, its side outputs.
inline std::vector<Access*> program_accesses(TileProgram& p) {
    std::vector<Access*> all{&p.out};
    for (auto& a : p.leaves) all.push_back(&a);
    for (auto& sd : p.side) all.push_back(&sd.second);
    return all;
}

/// Merges p's dims where every access allows (rank 1 at least).
inline void collapse_program(TileProgram& p) {
    const std::vector<Access*> all = program_accesses(p);
    collapse(p.space, all);
    if (p.space.shape.rank() == 0) {  // one element: a rank-1 space of one
        p.space.shape = Shape{1};
        for (Access* a : all) a->strides = Strides{1};
    }
}

/// An elementwise group: its members in one tile program writing each output's new tensor (the
/// last output as the program's result, the others stored beside it tile by tile); through its
/// generated C++ kernel once that is loaded (memo), else on the tile interpreter.
inline void run_elementwise_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, GroupKernels* memo = nullptr) {
    TileProgram p;
    if (!elementwise_program(g, G, vals, p)) return;
    // an output placed in channels-last memory (a parameter's update stored in place): walk it in
    // that order, so its operands laid out alike are read contiguously
    if (std::vector<std::int64_t> order; walk_in_memory_order(p.space.shape, p.out.strides, order)) {
        p.space.shape = permuted(p.space.shape, order);
        for (Access* a : program_accesses(p)) a->strides = permuted(a->strides, order);
    }
    collapse_program(p);
    if (memo)
        if (const cppgen::GroupFn fn = generated_kernel(p, *memo)) return run_generated(p, fn);
    run_program(p);
}

/// A matmul group's epilogue on the CPU: the elementwise group right after it in the plan, run by
/// its generated kernel on each part of the product as soon as kiln's GEMM has finished it (on the
/// same thread, while the part is in cache), instead of as its own pass over the whole product.
/// Taken when that group has a loaded kernel, computes over the product's shape and reads the
/// product only element for element (its (i, j) reads the product's (i, j)), and its outputs share
/// no memory with the GEMM's operands or result; otherwise the group runs after the GEMM as usual.
struct MatmulEpilogueRun {
    const ir::Graph* g = nullptr;
    const fuse::Group* G = nullptr;  ///< the elementwise group
    std::vector<Tensor>* vals = nullptr;
    GroupKernels* memo = nullptr;
    int product = -1;               ///< the matmul's node
    const Tensor* operands[2] = {};  ///< the GEMM's inputs
    TileProgram p;
    GeneratedCall call;  ///< its kernel (fn null: not taken)
    std::int64_t n = 0;

    static bool same_memory(const Tensor& a, const Tensor& b) { return a.defined() && b.defined() && a.storage() == b.storage(); }

    void prepare(const Tensor& c, std::int64_t cols) {
        const ir::Node& pn = (*g)[product];
        Tensor prod = c.view(pn.shape);
        (*vals)[static_cast<std::size_t>(product)] = prod;
        if (!elementwise_program(*g, *G, *vals, p)) return;
        const char* const lo = static_cast<const char*>(prod.data_ptr());
        const char* const hi = lo + prod.numel() * static_cast<std::int64_t>(dtype_size(prod.dtype()));
        const Strides natural = contiguous_strides(pn.shape);
        for (const Access& a : p.leaves) {
            if (a.base < lo || a.base >= hi) continue;
            // the product read element for element: (i, j) at (i, j); any other view of it (a
            // transpose, a slice, a broadcast) would read parts not computed yet
            if (a.base != lo || a.dtype != prod.dtype() || a.strides.rank() != natural.rank()) return;
            for (int d = 0; d < natural.rank(); ++d)
                if (pn.shape[d] > 1 && a.strides[d] != natural[d]) return;
        }
        for (const int o : G->outputs) {
            const Tensor& t = (*vals)[static_cast<std::size_t>(o)];
            if (same_memory(t, prod) || same_memory(t, *operands[0]) || same_memory(t, *operands[1])) return;
        }
        collapse_program(p);
        if (const cppgen::GroupFn fn = generated_kernel(p, *memo)) {
            call = GeneratedCall(p, fn);
            n = cols;
        }
    }
    bool taken() const { return call.fn != nullptr; }
    void rows(std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) const {
        if (!taken()) return;
        for (std::int64_t r = r0; r < r1; ++r) call(r * n + c0, r * n + c1);
    }
};

/// Whether matmul epilogues run inside the GEMM: yes, unless KILN_CPU_MATMUL_EPILOGUE=0 (to
/// measure them, or to rule them out).
inline bool cpu_matmul_epilogues_on() {
    static const bool on = [] {
        const char* v = std::getenv("KILN_CPU_MATMUL_EPILOGUE");
        return !(v && std::string(v) == "0");
    }();
    return on;
}

/// Whether plan group `e` can be the epilogue of matmul group `m`: elementwise, over the product's
/// shape, reading the product (the rest is checked on the bound tensors: MatmulEpilogueRun).
inline bool epilogue_candidate(const ir::Graph& g, const fuse::Group& m, const fuse::Group& e) {
    if (m.kind != fuse::Group::Kind::matmul || e.kind != fuse::Group::Kind::elementwise) return false;
    const int product = m.outputs[0];
    if (std::find(e.leaves.begin(), e.leaves.end(), product) == e.leaves.end()) return false;
    return g[e.outputs.back()].shape == g[product].shape;
}

/// The CPU's steps for the executor (fuse/execute.hpp): the tile interpreter, row and reduce
/// kernels, Eigen for matmul; writes go into the planned buffers bound in vals.
class CpuSteps final : public fuse::Steps {
public:
    /// kernels: one memo per plan group (generated C++), or nullptr for the interpreter alone;
    /// plan: the groups (for matmul epilogues), or nullptr.
    explicit CpuSteps(const ir::Graph& g, std::vector<GroupKernels>* kernels = nullptr, const fuse::Plan* plan = nullptr)
        : g_(g), kernels_(kernels), plan_(plan) {}
    void kernel(std::size_t k, const fuse::Group& G, std::vector<Tensor>& vals) override {
        switch (G.kind) {
            case fuse::Group::Kind::elementwise:
                if (k == epilogue_done_) break;  // ran inside the matmul before it
                run_elementwise_group(g_, G, vals, kernels_ && k < kernels_->size() ? &(*kernels_)[k] : nullptr);
                break;
            case fuse::Group::Kind::row:
                run_row_group(g_, G, vals, kernels_ && k < kernels_->size() ? &(*kernels_)[k] : nullptr);
                break;
            case fuse::Group::Kind::reduce: run_reduce_group(g_, G, vals, kernels_ && k < kernels_->size() ? &(*kernels_)[k] : nullptr); break;
            case fuse::Group::Kind::matmul: {
                const ir::Node& n = g_[G.outputs[0]];
                const Tensor& a = vals[static_cast<std::size_t>(n.in[0])];
                const Tensor& b = vals[static_cast<std::size_t>(n.in[1])];
                const std::size_t e = k + 1;
                if (plan_ && kernels_ && e < plan_->groups.size() && e < kernels_->size() && cpu_codegen() != CpuCodegen::off && cpu_matmul_epilogues_on() &&
                    epilogue_candidate(g_, G, plan_->groups[e])) {
                    MatmulEpilogueRun run;
                    run.g = &g_;
                    run.G = &plan_->groups[e];
                    run.vals = &vals;
                    run.memo = &(*kernels_)[e];
                    run.product = G.outputs[0];
                    run.operands[0] = &a;
                    run.operands[1] = &b;
                    MatmulEpilogue hooks;
                    hooks.ctx = &run;
                    hooks.prepare = [](void* x, const Tensor& c, std::int64_t cols) { static_cast<MatmulEpilogueRun*>(x)->prepare(c, cols); };
                    hooks.rows = [](void* x, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                        static_cast<const MatmulEpilogueRun*>(x)->rows(r0, r1, c0, c1);
                    };
                    const Tensor c = cpu_matmul(a, b, &hooks);
                    vals[static_cast<std::size_t>(G.outputs[0])] = c;
                    if (run.taken()) {  // prepare ran (so did the GEMM's rows) and found the group's kernel
                        epilogue_done_ = e;
                        cppgen::note_matmul_epilogue();
                    }
                    break;
                }
                vals[static_cast<std::size_t>(G.outputs[0])] = cpu_matmul(a, b);
                break;
            }
            default: throw InternalError("kiln: the CPU executor got a non-kernel step as a kernel");
        }
    }
    Tensor output(std::vector<Tensor>& vals, int id, const Shape& shape, DType dtype) override {
        return output_tensor(vals, id, shape, dtype);
    }
    bool on_device(const Tensor& t) const override { return t.device().is_cpu(); }
    std::string name() const override { return "cpu"; }

private:
    const ir::Graph& g_;
    std::vector<GroupKernels>* kernels_;
    const fuse::Plan* plan_;
    std::size_t epilogue_done_ = static_cast<std::size_t>(-1);  ///< the group a matmul ran as its epilogue
};

/// A compiled graph on the CPU: the fused plan, run by the executor over CpuSteps.
class CpuGraphProgram final : public fuse::GraphProgram {
public:
    CpuGraphProgram(ir::Graph g, fuse::Plan plan, bool plan_memory = true)
        : g_(std::move(g)), plan_(std::move(plan)), memory_(fuse::plan_memory(g_, plan_, plan_memory)),
          kernels_(plan_.groups.size()) {}

    const ir::Graph& graph() const override { return g_; }
    const fuse::Plan& plan() const override { return plan_; }

    /// Buffers the memory plan shares between intermediates (0 without a plan).
    int planned_buffers() const { return static_cast<int>(memory_.slot_bytes.size()); }

    std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
        std::vector<Tensor> vals(static_cast<std::size_t>(g_.size()));
        // the planned buffers, unless another thread is running this program right now
        std::unique_lock arena_lock(arena_mu_, std::try_to_lock);
        if (arena_lock.owns_lock() && !memory_.slot_of.empty()) {
            if (arena_.empty())
                for (std::size_t b : memory_.slot_bytes) arena_.push_back(Tensor(Shape{static_cast<std::int64_t>(b)}, DType::boolean));
            for (int i = 0; i < g_.size(); ++i) {
                const int sl = memory_.slot_of[static_cast<std::size_t>(i)];
                if (sl < 0) continue;
                const Tensor& a = arena_[static_cast<std::size_t>(sl)];
                vals[static_cast<std::size_t>(i)] = Tensor(a.storage(), 0, g_[i].shape, contiguous_strides(g_[i].shape), g_[i].dtype);
            }
        }
        for (std::size_t k = 0; k < g_.inputs.size(); ++k) vals[static_cast<std::size_t>(g_.inputs[k])] = inputs[k];
        for (int i = 0; i < g_.size(); ++i)
            if (g_[i].kind == ir::Kind::constant) vals[static_cast<std::size_t>(i)] = g_[i].tensor;
        CpuSteps steps(g_, &kernels_, &plan_);
        return fuse::execute(g_, plan_, memory_, vals, steps);
    }

    /// Each input shape gets its own program: the memory plan's buffers follow the shapes.
    std::shared_ptr<const fuse::GraphProgram> reshaped(ir::Graph g, fuse::Plan p) const override {
        return std::make_shared<CpuGraphProgram>(std::move(g), std::move(p));
    }

private:
    ir::Graph g_;
    fuse::Plan plan_;
    /// memory planning (fuse/memory_plan.hpp): each intermediate a group writes and only later
    /// groups read gets a buffer slot, reused once every reader of its value has run; outputs, and
    /// values an output views, keep memory of their own. A steady-state call then allocates
    /// nothing but its outputs.
    fuse::MemoryPlan memory_;
    mutable std::mutex arena_mu_;
    mutable std::vector<Tensor> arena_;
    mutable std::vector<GroupKernels> kernels_;  ///< per plan group: its generated C++ kernels
};

/// The CPU as a device for compile.
class CpuBackend final : public fuse::DeviceBackend {
public:
    std::shared_ptr<const fuse::GraphProgram> program(ir::Graph g, fuse::Plan plan) const override {
        return std::make_shared<CpuGraphProgram>(std::move(g), std::move(plan));
    }
};

}  // namespace kiln::detail
