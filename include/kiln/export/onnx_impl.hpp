// ONNX export's definitions (compiled once in separate compilation: kiln::onnx_compiled), included
// by export/onnx.hpp.
#pragma once

#include "kiln/export/onnx_proto.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/export/program.hpp"
#include "kiln/nn/io.hpp"

namespace kiln::onnx {

namespace detail {

inline int elem_type(DType d) {
    switch (d) {
        case DType::boolean: return ::onnx::TensorProto::BOOL;
        case DType::i32: return ::onnx::TensorProto::INT32;
        case DType::i64: return ::onnx::TensorProto::INT64;
        case DType::f16: return ::onnx::TensorProto::FLOAT16;
        case DType::bf16: return ::onnx::TensorProto::BFLOAT16;
        case DType::f32: return ::onnx::TensorProto::FLOAT;
        case DType::f64: return ::onnx::TensorProto::DOUBLE;
    }
    return 0;
}

/// A composite found in the canonical graph and written as one ONNX op (softmax, log_softmax and
/// layer_norm are traced as the ops they are made of): its root node, operand and attributes.
struct Composite {
    enum class Kind { none, softmax, log_softmax, layer_norm } kind = Kind::none;
    int x = -1, scale = -1, bias = -1;  ///< the operand; layer_norm's weight and bias (-1: none)
    std::int64_t axis = 0;              ///< the softmaxes' axis; layer_norm's first normalized axis
    double eps = 0;
};

/// The composites of g by root node: softmax = div(e, sum(e)), log_softmax = sub(x, add(log(sum(e)),
/// m)), e = exp(sub(x, m)), m = max(x) over one axis; layer_norm = [add(][mul(]mul(c, rsqrt(add(
/// mean(mul(c, c)), eps))) [, w)][, b)], c = sub(x, mean(x)) over trailing axes. Matched on structure
/// only (kiln's own composites as traced), one floating dtype throughout (f32 or f64; f32 for
/// layer_norm), kept dims; anything else is written op by op.
inline std::vector<Composite> find_composites(const ir::Graph& g) {
    std::vector<Composite> out(static_cast<std::size_t>(g.size()));
    auto ew = [&](int id, ops::OpId op) { return id >= 0 && g[id].kind == ir::Kind::elementwise && g[id].op == op; };
    auto operand = [&](int id, int k) { return g[id].in[static_cast<std::size_t>(k)]; };
    auto same_t = [&](int a, int b) { return g[a].dtype == g[b].dtype; };
    auto floating = [&](int id) { return g[id].dtype == DType::f32 || g[id].dtype == DType::f64; };
    // a keepdim reduction of kind rk over x
    auto red = [&](int id, ir::ReduceKind rk, int x) {
        return id >= 0 && g[id].kind == ir::Kind::reduce && g[id].rkind == rk && g[id].keepdim && operand(id, 0) == x &&
               (rk != ir::ReduceKind::mean || g[id].correction == 0) && same_t(id, x);
    };
    auto single_axis = [](unsigned mask) { return std::has_single_bit(mask); };
    auto axis_of = [](unsigned mask) { return static_cast<std::int64_t>(std::countr_zero(mask)); };  // the lowest reduced axis
    // e = exp(sub(x, m)), m = max(x) over one axis: x and m, or false
    auto shifted_exp = [&](int e, int& x, int& m) {
        if (!ew(e, ops::op_id<ops::Exp>) || !ew(operand(e, 0), ops::op_id<ops::Sub>)) return false;
        const int d = operand(e, 0);
        x = operand(d, 0);
        m = operand(d, 1);
        return floating(x) && same_t(e, x) && same_t(d, x) && red(m, ir::ReduceKind::max, x) && single_axis(g[m].mask);
    };
    // s = sum(exp(sub(x, m))) over m's axis
    auto exp_sum = [&](int s, int x, int m) {
        int x2 = -1, m2 = -1;
        return s >= 0 && g[s].kind == ir::Kind::reduce && g[s].rkind == ir::ReduceKind::sum && g[s].keepdim && g[s].mask == g[m].mask &&
               shifted_exp(operand(s, 0), x2, m2) && x2 == x && m2 == m && same_t(s, x);
    };
    // the layer norm core mul(c, rsqrt(add(mean(mul(c, c)), eps))) (either operand order of mul / add): x, mask, eps
    auto ln_core = [&](int id, int& x, unsigned& mask, double& eps) {
        if (!ew(id, ops::op_id<ops::Mul>)) return false;
        for (int side = 0; side < 2; ++side) {
            const int c = operand(id, side), r = operand(id, 1 - side);
            if (!ew(c, ops::op_id<ops::Sub>) || !ew(r, ops::op_id<ops::Rsqrt>)) continue;
            x = operand(c, 0);
            const int mu = operand(c, 1);
            // f32 only: LayerNormalization's epsilon is a float attribute and its statistics are
            // kept in float (stash_type): an f64 layer norm stays op by op
            if (g[x].dtype != DType::f32 || !same_t(id, x) || !red(mu, ir::ReduceKind::mean, x)) continue;
            mask = g[mu].mask;
            const int rank = g[x].shape.rank();
            const unsigned trailing = rank > 0 ? ((1u << rank) - 1u) : 0u;  // the mask must be the last k axes
            if (mask == 0 || mask != (trailing & ~((1u << axis_of(mask)) - 1u))) continue;
            const int a = operand(r, 0);
            if (!ew(a, ops::op_id<ops::Add>)) continue;
            for (int s2 = 0; s2 < 2; ++s2) {
                const int v = operand(a, s2), e = operand(a, 1 - s2);
                if (g[e].kind != ir::Kind::scalar || v < 0 || g[v].kind != ir::Kind::reduce || g[v].rkind != ir::ReduceKind::mean ||
                    !g[v].keepdim || g[v].correction != 0 || g[v].mask != mask)
                    continue;
                const int sq = operand(v, 0);
                if (!ew(sq, ops::op_id<ops::Mul>)) continue;
                auto centred = [&](int t) { return t == c || (ew(t, ops::op_id<ops::Sub>) && operand(t, 0) == x && operand(t, 1) == mu); };
                if (!centred(operand(sq, 0)) || !centred(operand(sq, 1))) continue;
                eps = g[e].value;
                return true;
            }
        }
        return false;
    };
    // a parameter-like operand of the normalized dims' shape (weight or bias)
    auto affine = [&](int p, int x, unsigned mask) {
        const Shape& xs = g[x].shape;
        const Shape& ps = g[p].shape;
        const int k = std::popcount(mask);
        if (g[p].kind == ir::Kind::scalar || ps.rank() != k || !same_t(p, x)) return false;
        for (int d = 0; d < k; ++d)
            if (ps[d] != xs[xs.rank() - k + d]) return false;
        return true;
    };
    for (int i = 0; i < g.size(); ++i) {
        Composite& c = out[static_cast<std::size_t>(i)];
        int x = -1, m = -1;
        if (ew(i, ops::op_id<ops::Div>) && shifted_exp(operand(i, 0), x, m) && exp_sum(operand(i, 1), x, m) && same_t(i, x)) {
            c = {Composite::Kind::softmax, x, -1, -1, axis_of(g[m].mask), 0};
            continue;
        }
        if (ew(i, ops::op_id<ops::Sub>) && ew(operand(i, 1), ops::op_id<ops::Add>) && same_t(i, operand(i, 0))) {
            const int l = operand(i, 1);
            for (int side = 0; side < 2 && c.kind == Composite::Kind::none; ++side) {
                const int lg = operand(l, side), mm = operand(l, 1 - side);
                x = operand(i, 0);
                if (ew(lg, ops::op_id<ops::Log>) && floating(x) && red(mm, ir::ReduceKind::max, x) && single_axis(g[mm].mask) &&
                    exp_sum(operand(lg, 0), x, mm))
                    c = {Composite::Kind::log_softmax, x, -1, -1, axis_of(g[mm].mask), 0};
            }
            if (c.kind != Composite::Kind::none) continue;
        }
        unsigned mask = 0;
        double eps = 0;
        auto done = [&](int scale, int bias) { c = {Composite::Kind::layer_norm, x, scale, bias, g[x].shape.rank() - std::popcount(mask), eps}; };
        if (ln_core(i, x, mask, eps)) {
            done(-1, -1);
            continue;
        }
        // mul(core, w) and add(mul(core, w) | core, b), either operand order
        auto scaled = [&](int id, int& w) {
            if (ln_core(id, x, mask, eps)) return w = -1, true;
            if (!ew(id, ops::op_id<ops::Mul>)) return false;
            for (int side = 0; side < 2; ++side)
                if (ln_core(operand(id, side), x, mask, eps) && affine(operand(id, 1 - side), x, mask)) return w = operand(id, 1 - side), true;
            return false;
        };
        int w = -1;
        if (ew(i, ops::op_id<ops::Mul>) && scaled(i, w) && w >= 0 && same_t(i, x)) {
            done(w, -1);
            continue;
        }
        if (ew(i, ops::op_id<ops::Add>) && same_t(i, operand(i, 0)))
            for (int side = 0; side < 2; ++side)
                if (scaled(operand(i, side), w) && affine(operand(i, 1 - side), x, mask) && same_t(i, x)) {
                    done(w, operand(i, 1 - side));
                    break;
                }
    }
    return out;
}

/// Builds the ONNX graph of one exported program, node by node.
class Emitter {
public:
    Emitter(const ExportedProgram& ep, ::onnx::GraphProto& g, const std::source_location& loc) : ep_(ep), g_(g), loc_(loc) {}

    [[noreturn]] void fail(const std::string& what) const { kiln::detail::fail<ExportError>("onnx::export_model", what, loc_); }

    std::string fresh(const std::string& hint) { return hint + "_" + std::to_string(count_++); }

    /// Adds node `op` over `in`; returns its (first) output.
    template <class Attrs = int>
    std::string node(const std::string& op, const std::vector<std::string>& in, Attrs attrs = 0) {
        ::onnx::NodeProto* n = g_.add_node();
        n->set_op_type(op);
        n->set_name(fresh(op));
        for (const std::string& s : in) n->add_input(s);
        const std::string out = fresh(op + "_out");
        n->add_output(out);
        if constexpr (!std::is_same_v<Attrs, int>) attrs(*n);
        return out;
    }
    static void attr_i(::onnx::NodeProto& n, const char* name, std::int64_t v) {
        auto* a = n.add_attribute();
        a->set_name(name);
        a->set_type(::onnx::AttributeProto::INT);
        a->set_i(v);
    }
    static void attr_f(::onnx::NodeProto& n, const char* name, double v) {
        auto* a = n.add_attribute();
        a->set_name(name);
        a->set_type(::onnx::AttributeProto::FLOAT);
        a->set_f(static_cast<float>(v));
    }
    static void attr_ints(::onnx::NodeProto& n, const char* name, const std::vector<std::int64_t>& v) {
        auto* a = n.add_attribute();
        a->set_name(name);
        a->set_type(::onnx::AttributeProto::INTS);
        for (std::int64_t x : v) a->add_ints(x);
    }

    /// An initializer of raw little-endian bytes.
    std::string tensor(const std::string& name, DType d, const Dims& shape, const void* bytes) {
        ::onnx::TensorProto* t = g_.add_initializer();
        t->set_name(name);
        t->set_data_type(elem_type(d));
        for (int k = 0; k < shape.rank(); ++k) t->add_dims(shape[k]);
        t->set_raw_data(bytes, static_cast<std::size_t>(shape.numel()) * dtype_size(d));
        return name;
    }
    /// A 1-D int64 constant (shared by value).
    std::string i64s(const std::vector<std::int64_t>& v) {
        auto it = i64_cache_.find(v);
        if (it != i64_cache_.end()) return it->second;
        Dims shape;
        shape.push_back(static_cast<std::int64_t>(v.size()));
        const std::string name = tensor(fresh("i64"), DType::i64, shape, v.data());
        i64_cache_[v] = name;
        return name;
    }
    /// A 0-d constant of dtype d.
    std::string scalar(double v, DType d) {
        const Tensor t = full(Shape{}, v, d);
        return tensor(fresh("c"), d, Shape{}, t.data_ptr());
    }
    std::string cast(const std::string& x, DType from, DType to) {
        if (from == to) return x;
        return node("Cast", {x}, [&](::onnx::NodeProto& n) { attr_i(n, "to", elem_type(to)); });
    }

    // ---- integer numbers of a view, constant or computed from the inputs' shapes (1-element int64 tensors)
    struct Num {
        bool constant = true;
        std::int64_t c = 0;
        std::string t;
    };
    std::string num_tensor(const Num& x) { return x.constant ? i64s({x.c}) : x.t; }
    Num binop(const char* op, const Num& a, const Num& b) {
        if (a.constant && b.constant) {
            const std::string o = op;
            if (o == "Add") return {true, a.c + b.c, ""};
            if (o == "Sub") return {true, a.c - b.c, ""};
            if (o == "Mul") return {true, a.c * b.c, ""};
            if (o == "Div") return {true, b.c ? a.c / b.c : 0, ""};
            return {true, b.c ? a.c % b.c : 0, ""};
        }
        if (std::string(op) == "Mul" && ((a.constant && a.c == 1) || (b.constant && b.c == 1))) return a.constant ? b : a;
        if ((std::string(op) == "Add" || std::string(op) == "Sub") && b.constant && b.c == 0) return a;
        if (std::string(op) == "Div" && b.constant && b.c == 1) return a;
        return {false, 0, node(op, {num_tensor(a), num_tensor(b)})};
    }
    Num input_dim(int input, int d) {
        const auto key = std::make_pair(input, d);
        if (auto it = dims_.find(key); it != dims_.end()) return {false, 0, it->second};
        const std::string shape = node("Shape", {ep_.input_specs()[static_cast<std::size_t>(input)].name});
        const std::string t = node("Gather", {shape, i64s({d})}, [](::onnx::NodeProto& n) { attr_i(n, "axis", 0); });
        dims_[key] = t;
        return {false, 0, t};
    }
    /// A view's number: its formula over the inputs' dims where it has one, else the recorded value.
    Num number(const ir::SymView* sym, const ir::SymView::Number* f, std::int64_t recorded) {
        if (!sym || !f) return {true, recorded, ""};
        Num sum{true, 0, ""};
        for (const auto& [mask, w] : *f) {
            Num term{true, w, ""};
            for (std::size_t k = 0; k < sym->vars->at.size(); ++k)
                if ((mask >> k) & 1u) {
                    const auto [in, d] = sym->vars->at[k];
                    term = binop("Mul", term, binop("Sub", input_dim(in, d), Num{true, sym->vars->base[k], ""}));
                }
            sum = binop("Add", sum, term);
        }
        return sum;
    }
    std::string shape_tensor(const std::vector<Num>& v) {
        bool all = true;
        std::vector<std::int64_t> c;
        for (const Num& x : v) {
            all = all && x.constant;
            c.push_back(x.c);
        }
        if (all) return i64s(c);
        std::vector<std::string> parts;
        for (const Num& x : v) parts.push_back(num_tensor(x));
        return node("Concat", parts, [](::onnx::NodeProto& n) { attr_i(n, "axis", 0); });
    }

    /// A view (shape, strides, offset over x's row-major layout) as Reshape / Slice / Transpose / Expand.
    std::string view(const ir::Graph& g, int id, const std::string& x) {
        const ir::Node& n = g[id];
        if (n.kind == ir::Kind::view_write) fail("a write into a view (node %" + std::to_string(id) + ") has no ONNX mapping yet");
        const Shape& S = g[n.in[0]].shape;
        const Shape& V = n.shape;
        const ir::SymView* sym = n.sym.get();
        const int r = V.rank();
        std::vector<Num> e(static_cast<std::size_t>(r)), st(static_cast<std::size_t>(r));
        for (int k = 0; k < r; ++k) {
            e[static_cast<std::size_t>(k)] = number(sym, sym ? &sym->shape[static_cast<std::size_t>(k)] : nullptr, V[k]);
            st[static_cast<std::size_t>(k)] = number(sym, sym ? &sym->strides[static_cast<std::size_t>(k)] : nullptr, n.args[k]);
        }
        const std::int64_t off = static_cast<std::int64_t>(n.value);
        const Num offn = number(sym, sym ? &sym->offset : nullptr, off);
        const Strides cs = contiguous_strides(V);
        bool contiguous = off == 0 && V.numel() == S.numel();
        for (int k = 0; k < r; ++k) contiguous = contiguous && (V[k] == 1 || n.args[k] == cs[k]);
        if (contiguous) {
            if (V == S && !sym) return x;
            return node("Reshape", {x, shape_tensor(e)});
        }
        // a permutation of x's dims
        if (off == 0 && r == S.rank()) {
            const Strides ss = contiguous_strides(S);
            std::vector<std::int64_t> perm(static_cast<std::size_t>(r), -1);
            std::vector<char> used(static_cast<std::size_t>(r), 0);
            bool ok = true;
            for (int k = 0; k < r && ok; ++k) {
                ok = false;
                for (int d = 0; d < r; ++d)
                    if (!used[static_cast<std::size_t>(d)] && S[d] == V[k] && (ss[d] == n.args[k] || V[k] == 1)) {
                        perm[static_cast<std::size_t>(k)] = d;
                        used[static_cast<std::size_t>(d)] = 1;
                        ok = true;
                        break;
                    }
            }
            if (ok) return node("Transpose", {x}, [&](::onnx::NodeProto& p) { attr_ints(p, "perm", perm); });
        }
        // general: x as one row, split into factors at the view's strides, sliced, permuted, broadcast
        std::vector<int> walk;
        bool broadcast = false;
        for (int k = 0; k < r; ++k) {
            if (V[k] > 1 && n.args[k] > 0) walk.push_back(k);
            broadcast = broadcast || (V[k] > 1 && n.args[k] == 0);
        }
        std::sort(walk.begin(), walk.end(), [&](int a, int b) { return n.args[a] > n.args[b]; });
        const std::size_t m = walk.size();
        for (std::size_t j = 1; j < m; ++j)
            if (n.args[walk[j - 1]] == n.args[walk[j]] || n.args[walk[j - 1]] % n.args[walk[j]] != 0)
                fail("view " + ir::describe(g, id) + " has strides that do not nest; it has no ONNX mapping");
        const std::string flat = node("Reshape", {x, i64s({-1})});
        std::string cur;
        std::vector<Num> target;  // per view dim: its extent where it walks x, else 1
        if (m == 0) {
            cur = node("Slice", {flat, num_tensor(offn), num_tensor(binop("Add", offn, Num{true, 1, ""})), i64s({0})});
        } else {
            std::vector<Num> factors{Num{true, -1, ""}}, starts, ends;
            for (std::size_t j = 0; j + 1 < m; ++j) factors.push_back(binop("Div", st[static_cast<std::size_t>(walk[j])], st[static_cast<std::size_t>(walk[j + 1])]));
            factors.push_back(st[static_cast<std::size_t>(walk[m - 1])]);
            // recorded check: every slice stays inside its factor
            for (std::size_t j = 0; j < m; ++j) {
                const std::int64_t s = n.args[walk[j]];
                const std::int64_t size = j == 0 ? std::numeric_limits<std::int64_t>::max() : n.args[walk[j - 1]] / s;
                const std::int64_t start = (off / s) % size;
                if (start + V[walk[j]] > size) fail("view " + ir::describe(g, id) + " wraps around its operand's rows; it has no ONNX mapping");
                const Num sn = st[static_cast<std::size_t>(walk[j])];
                Num startn = binop("Div", offn, sn);
                if (j > 0) startn = binop("Mod", startn, factors[j]);
                starts.push_back(startn);
                ends.push_back(binop("Add", startn, e[static_cast<std::size_t>(walk[j])]));
            }
            const Num last = binop("Mod", offn, st[static_cast<std::size_t>(walk[m - 1])]);
            starts.push_back(last);
            ends.push_back(binop("Add", last, Num{true, 1, ""}));
            const std::string fact = node("Reshape", {flat, shape_tensor(factors)});
            std::vector<std::int64_t> axes(m + 1);
            std::iota(axes.begin(), axes.end(), 0);
            cur = node("Slice", {fact, shape_tensor(starts), shape_tensor(ends), i64s(axes)});
            // factors in view order
            std::vector<int> order = walk;
            std::sort(order.begin(), order.end());
            std::vector<std::int64_t> perm;
            for (int k : order)
                perm.push_back(static_cast<std::int64_t>(std::find(walk.begin(), walk.end(), k) - walk.begin()));
            perm.push_back(static_cast<std::int64_t>(m));
            bool identity = true;
            for (std::size_t j = 0; j < perm.size(); ++j) identity = identity && perm[j] == static_cast<std::int64_t>(j);
            if (!identity) cur = node("Transpose", {cur}, [&](::onnx::NodeProto& p) { attr_ints(p, "perm", perm); });
        }
        for (int k = 0; k < r; ++k)
            target.push_back(V[k] > 1 && n.args[k] > 0 ? e[static_cast<std::size_t>(k)] : (V[k] > 1 ? Num{true, 1, ""} : e[static_cast<std::size_t>(k)]));
        cur = node("Reshape", {cur, shape_tensor(target)});
        if (broadcast) cur = node("Expand", {cur, shape_tensor(e)});
        return cur;
    }

    /// gelu with the tanh approximation, as kiln computes it: x * sigmoid(1.5957691216057308 * (x + 0.044715 x^3)).
    std::string gelu_tanh(const std::string& x, DType ct) {
        const std::string x3 = node("Mul", {node("Mul", {x, x}), x});
        const std::string inner = node("Add", {x, node("Mul", {x3, scalar(0.044715, ct)})});
        return node("Mul", {x, node("Sigmoid", {node("Mul", {inner, scalar(1.5957691216057308, ct)})})});
    }
    /// gelu, exact: x / 2 * (1 + erf(x / sqrt 2)).
    std::string gelu_erf(const std::string& x, DType ct) {
        const std::string e = node("Erf", {node("Mul", {x, scalar(0.7071067811865476, ct)})});
        return node("Mul", {node("Mul", {x, scalar(0.5, ct)}), node("Add", {e, scalar(1.0, ct)})});
    }

    std::string elementwise(const ir::Graph& g, int id, const std::vector<std::string>& name) {
        const ir::Node& n = g[id];
        const DType ct = n.ct;
        auto in = [&](std::size_t k, DType to) { return cast(name[static_cast<std::size_t>(n.in[k])], g[n.in[k]].dtype, to); };
        auto un = [&](const char* op) { return node(op, {in(0, ct)}); };
        auto bin = [&](const char* op) { return node(op, {in(0, ct), in(1, ct)}); };
        const bool is_int = !is_floating(ct);
        std::string y;
        DType yt = ct;
        static_assert(ops::ElementwiseOps::size == 44, "an op was added to the table: map it to ONNX here");
        switch (static_cast<int>(n.op)) {
#define KILN_ONNX_OP(Op) case ops::op_id<ops::Op>:
            KILN_ONNX_OP(Neg) y = un("Neg"); break;
            KILN_ONNX_OP(Abs) y = un("Abs"); break;
            KILN_ONNX_OP(Exp) y = un("Exp"); break;
            KILN_ONNX_OP(Expm1) y = node("Sub", {un("Exp"), scalar(1, ct)}); break;
            KILN_ONNX_OP(Log) y = un("Log"); break;
            KILN_ONNX_OP(Log1p) y = node("Log", {node("Add", {in(0, ct), scalar(1, ct)})}); break;
            KILN_ONNX_OP(Sqrt) y = un("Sqrt"); break;
            KILN_ONNX_OP(Rsqrt) y = node("Reciprocal", {un("Sqrt")}); break;
            KILN_ONNX_OP(Sin) y = un("Sin"); break;
            KILN_ONNX_OP(Cos) y = un("Cos"); break;
            KILN_ONNX_OP(Tan) y = un("Tan"); break;
            KILN_ONNX_OP(Tanh) y = un("Tanh"); break;
            KILN_ONNX_OP(Erf) y = un("Erf"); break;
            KILN_ONNX_OP(Sigmoid) y = un("Sigmoid"); break;
            KILN_ONNX_OP(GeluTanh) y = gelu_tanh(in(0, ct), ct); break;
            KILN_ONNX_OP(Hardswish) y = un("HardSwish"); break;
            KILN_ONNX_OP(Relu) y = un("Relu"); break;
            KILN_ONNX_OP(Floor) y = is_int ? in(0, ct) : un("Floor"); break;
            KILN_ONNX_OP(Ceil) y = is_int ? in(0, ct) : un("Ceil"); break;
            KILN_ONNX_OP(Round) y = is_int ? in(0, ct) : un("Round"); break;
            KILN_ONNX_OP(Sign) y = un("Sign"); break;
            KILN_ONNX_OP(Reciprocal) y = un("Reciprocal"); break;
            KILN_ONNX_OP(LogicalNot) y = node("Not", {in(0, DType::boolean)}), yt = DType::boolean; break;
            KILN_ONNX_OP(Cast) return cast(name[static_cast<std::size_t>(n.in[0])], g[n.in[0]].dtype, n.attr);
            KILN_ONNX_OP(Copy) y = node("Identity", {in(0, n.dtype)}), yt = n.dtype; break;
            KILN_ONNX_OP(Add) y = bin("Add"); break;
            KILN_ONNX_OP(Sub) y = bin("Sub"); break;
            KILN_ONNX_OP(Mul) y = bin("Mul"); break;
            KILN_ONNX_OP(Div) y = bin("Div"); break;
            KILN_ONNX_OP(Pow) y = bin("Pow"); break;
            KILN_ONNX_OP(Remainder)
                if (is_int) y = node("Mod", {in(0, ct), in(1, ct)}, [](::onnx::NodeProto& p) { attr_i(p, "fmod", 0); });
                else y = node("Sub", {in(0, ct), node("Mul", {in(1, ct), node("Floor", {bin("Div")})})});
                break;
            KILN_ONNX_OP(Fmod) y = node("Mod", {in(0, ct), in(1, ct)}, [](::onnx::NodeProto& p) { attr_i(p, "fmod", 1); }); break;
            KILN_ONNX_OP(FloorDivide)
                if (is_int) y = cast(node("Floor", {node("Div", {in(0, DType::f64), in(1, DType::f64)})}), DType::f64, ct);
                else y = node("Floor", {bin("Div")});
                break;
            KILN_ONNX_OP(Maximum) y = bin("Max"); break;
            KILN_ONNX_OP(Minimum) y = bin("Min"); break;
            KILN_ONNX_OP(Eq) y = bin("Equal"), yt = DType::boolean; break;
            KILN_ONNX_OP(Ne) y = node("Not", {bin("Equal")}), yt = DType::boolean; break;
            KILN_ONNX_OP(Lt) y = bin("Less"), yt = DType::boolean; break;
            KILN_ONNX_OP(Le) y = bin("LessOrEqual"), yt = DType::boolean; break;
            KILN_ONNX_OP(Gt) y = bin("Greater"), yt = DType::boolean; break;
            KILN_ONNX_OP(Ge) y = bin("GreaterOrEqual"), yt = DType::boolean; break;
            KILN_ONNX_OP(LogicalAnd) y = node("And", {in(0, DType::boolean), in(1, DType::boolean)}), yt = DType::boolean; break;
            KILN_ONNX_OP(LogicalOr) y = node("Or", {in(0, DType::boolean), in(1, DType::boolean)}), yt = DType::boolean; break;
            KILN_ONNX_OP(Where) y = node("Where", {in(0, DType::boolean), in(1, ct), in(2, ct)}); break;
#undef KILN_ONNX_OP
            default: fail(std::string("op '") + std::string(ops::op_name(n.op)) + "' has no ONNX mapping");
        }
        return cast(y, yt, n.dtype);
    }

    std::string reduce(const ir::Graph& g, int id, const std::string& x) {
        const ir::Node& n = g[id];
        const Shape& s = g[n.in[0]].shape;
        std::vector<std::int64_t> axes;
        std::int64_t count = 1;
        for (int d = 0; d < s.rank(); ++d)
            if ((n.mask >> d) & 1u) {
                axes.push_back(d);
                count *= s[d];
            }
        const DType in_t = g[n.in[0]].dtype;
        const DType acc = n.kind == ir::Kind::arg_reduce ? in_t
                          : !is_floating(n.dtype) ? (n.rkind == ir::ReduceKind::sum || n.rkind == ir::ReduceKind::prod ? DType::i64 : n.dtype)
                          : (n.dtype == DType::f16 || n.dtype == DType::bf16) ? DType::f32 : n.dtype;
        std::string v = cast(x, in_t, acc == DType::boolean ? DType::i32 : acc);
        if (n.kind == ir::Kind::arg_reduce) {
            if (axes.size() != 1) fail("an arg-reduction over " + std::to_string(axes.size()) + " axes has no ONNX mapping");
            const std::string y = node(n.arg_max ? "ArgMax" : "ArgMin", {v}, [&](::onnx::NodeProto& p) {
                attr_i(p, "axis", axes[0]);
                attr_i(p, "keepdims", n.keepdim ? 1 : 0);
            });
            return cast(y, DType::i64, n.dtype);
        }
        if (axes.empty()) return cast(v, acc == DType::boolean ? DType::i32 : acc, n.dtype);
        auto with_axes = [&](const char* op) {
            return node(op, {v}, [&](::onnx::NodeProto& p) {
                attr_ints(p, "axes", axes);
                attr_i(p, "keepdims", n.keepdim ? 1 : 0);
            });
        };
        std::string y;
        switch (n.rkind) {
            case ir::ReduceKind::sum:
                y = node("ReduceSum", {v, i64s(axes)}, [&](::onnx::NodeProto& p) { attr_i(p, "keepdims", n.keepdim ? 1 : 0); });
                break;
            case ir::ReduceKind::prod: y = with_axes("ReduceProd"); break;
            case ir::ReduceKind::max: y = with_axes("ReduceMax"); break;
            case ir::ReduceKind::min: y = with_axes("ReduceMin"); break;
            case ir::ReduceKind::mean:
                if (n.correction == 0) {
                    y = with_axes("ReduceMean");
                } else {
                    for (std::int64_t a : axes)
                        if (!ep_node_dims(n.in[0])[static_cast<std::size_t>(a)].empty())
                            fail("a mean with a correction over a dynamic dim has no ONNX mapping yet");
                    y = node("Div", {node("ReduceSum", {v, i64s(axes)}, [&](::onnx::NodeProto& p) { attr_i(p, "keepdims", n.keepdim ? 1 : 0); }),
                                     scalar(std::max(0.0, static_cast<double>(count) - n.correction), acc)});
                }
                break;
        }
        return cast(y, acc == DType::boolean ? DType::i32 : acc, n.dtype);
    }

    std::string call(const ir::Graph& g, int id, const std::vector<std::string>& name) {
        const ir::Node& n = g[id];
        const ir::CallOp& op = *n.call;
        auto in = [&](std::size_t k) { return name[static_cast<std::size_t>(n.in[k])]; };
        auto attr = [&](const char* key) {
            for (const auto& [k, v] : op.attrs)
                if (k == key) return static_cast<std::int64_t>(v);
            fail("library op '" + op.key + "' lacks attribute " + key);
        };
        auto window = [&](::onnx::NodeProto& p) {
            attr_ints(p, "kernel_shape", {attr("kh"), attr("kw")});
            attr_ints(p, "strides", {attr("sh"), attr("sw")});
            attr_ints(p, "pads", {attr("ph"), attr("pw"), attr("ph"), attr("pw")});
            attr_ints(p, "dilations", {attr("dh"), attr("dw")});
        };
        auto nchw = [&](const std::string& x) { return node("Transpose", {x}, [](::onnx::NodeProto& p) { attr_ints(p, "perm", {0, 3, 1, 2}); }); };
        auto nhwc = [&](const std::string& x) { return node("Transpose", {x}, [](::onnx::NodeProto& p) { attr_ints(p, "perm", {0, 2, 3, 1}); }); };
        if (op.name == "conv2d") {
            const DType dt = g[n.in[0]].dtype;
            std::vector<std::string> args{nchw(in(0)), cast(in(1), g[n.in[1]].dtype, dt)};
            const bool bias = attr("bias") != 0, res = attr("residual") != 0;
            if (bias) args.push_back(cast(in(2), g[n.in[2]].dtype, dt));
            std::string y = nhwc(node("Conv", args, window));
            if (res) y = node("Add", {y, in(bias ? 3 : 2)});
            switch (static_cast<Act>(attr("act"))) {
                case Act::none: break;
                case Act::relu: y = node("Relu", {y}); break;
                case Act::gelu_tanh: y = gelu_tanh(y, dt); break;
                case Act::gelu: y = gelu_erf(y, dt); break;
            }
            return y;
        }
        if (op.name == "max_pool2d") return nhwc(node("MaxPool", {nchw(in(0))}, window));
        if (op.name == "attention") {  // q, k, v (B, H, S, D)[, mask] -> (B, Sq, H, D); f16/bf16 computed in f32 as the kernel does
            const DType dt = n.dtype, ct = dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt;
            auto up = [&](std::size_t k) { return cast(in(k), g[n.in[k]].dtype, ct); };
            const std::string kt = node("Transpose", {up(1)}, [](::onnx::NodeProto& p) { attr_ints(p, "perm", {0, 1, 3, 2}); });
            const double scale = 1.0 / std::sqrt(static_cast<double>(g[n.in[0]].shape[3]));
            std::string s = node("Mul", {node("MatMul", {up(0), kt}), scalar(scale, ct)});
            if (n.in.size() > 3) {
                const DType md = g[n.in[3]].dtype;
                s = md == DType::boolean ? node("Where", {in(3), s, scalar(-INFINITY, ct)}) : node("Add", {s, up(3)});
            }
            const std::string p = node("Softmax", {s}, [](::onnx::NodeProto& x) { attr_i(x, "axis", -1); });
            const std::string o = node("Transpose", {node("MatMul", {p, up(2)})}, [](::onnx::NodeProto& x) { attr_ints(x, "perm", {0, 2, 1, 3}); });
            return cast(o, ct, dt);
        }
        if (op.name == "embedding") return node("Gather", {in(0), in(1)}, [](::onnx::NodeProto& p) { attr_i(p, "axis", 0); });
        if (op.name == "gather") return node("GatherElements", {in(0), in(1)}, [&](::onnx::NodeProto& p) { attr_i(p, "axis", attr("dim")); });
        if (op.name == "scatter" || op.name == "scatter_add" || op.name == "scatter_value") {
            std::string src;
            if (op.name == "scatter_value") {
                double v = 0;
                for (const auto& [k, x] : op.attrs)
                    if (k == "value") v = x;
                src = node("Expand", {scalar(v, n.dtype), node("Shape", {in(1)})});
            } else {
                src = in(2);
            }
            return node("ScatterElements", {in(0), in(1), src}, [&](::onnx::NodeProto& p) {
                attr_i(p, "axis", attr("dim"));
                if (op.name == "scatter_add") {
                    auto* a = p.add_attribute();
                    a->set_name("reduction");
                    a->set_type(::onnx::AttributeProto::STRING);
                    a->set_s("add");
                }
            });
        }
        fail("library op '" + op.key + "' has no ONNX mapping");
    }

    /// Composite c (find_composites) rooted at node id as one ONNX op: Softmax, LogSoftmax, or
    /// LayerNormalization (its Scale, which ONNX requires, ones where the program has no weight).
    std::string composite(const ir::Graph& g, int id, const Composite& c, const std::vector<std::string>& name) {
        const std::string& x = name[static_cast<std::size_t>(c.x)];
        if (c.kind == Composite::Kind::softmax || c.kind == Composite::Kind::log_softmax)
            return node(c.kind == Composite::Kind::softmax ? "Softmax" : "LogSoftmax", {x}, [&](::onnx::NodeProto& p) { attr_i(p, "axis", c.axis); });
        std::string scale;
        if (c.scale >= 0) {
            scale = name[static_cast<std::size_t>(c.scale)];
        } else {
            const Shape& xs = g[c.x].shape;
            Dims dims;
            for (int d = static_cast<int>(c.axis); d < xs.rank(); ++d) dims.push_back(xs[d]);
            const DType dt = g[c.x].dtype;
            const Tensor ones = kiln::ones(Shape(dims), dt);
            scale = tensor("layer_norm_scale_" + std::to_string(id), dt, dims, ones.data_ptr());
        }
        std::vector<std::string> in{x, scale};
        if (c.bias >= 0) in.push_back(name[static_cast<std::size_t>(c.bias)]);
        return node("LayerNormalization", in, [&](::onnx::NodeProto& p) {
            attr_i(p, "axis", c.axis);
            attr_f(p, "epsilon", c.eps);
        });
    }

    const std::vector<std::string>& ep_node_dims(int id) const { return ep_.node_dims()[static_cast<std::size_t>(id)]; }

private:
    const ExportedProgram& ep_;
    ::onnx::GraphProto& g_;
    std::source_location loc_;
    int count_ = 0;
    std::map<std::vector<std::int64_t>, std::string> i64_cache_;
    std::map<std::pair<int, int>, std::string> dims_;
};

inline void set_type(::onnx::ValueInfoProto& v, const std::string& name, DType d, const Shape& shape, const std::vector<std::string>& dims) {
    v.set_name(name);
    auto* t = v.mutable_type()->mutable_tensor_type();
    t->set_elem_type(elem_type(d));
    auto* s = t->mutable_shape();
    for (int k = 0; k < shape.rank(); ++k) {
        auto* dim = s->add_dim();
        if (static_cast<std::size_t>(k) < dims.size() && !dims[static_cast<std::size_t>(k)].empty()) dim->set_dim_param(dims[static_cast<std::size_t>(k)]);
        else dim->set_dim_value(shape[k]);
    }
}

}  // namespace detail

KILN_DECL ::onnx::ModelProto to_model_proto(const ExportedProgram& ep, const Options& opt, std::source_location loc) {
    if (opt.opset < 17) kiln::detail::fail<ExportError>("onnx::export_model", "opset " + std::to_string(opt.opset) + ": kiln writes opset 17 or later", loc);
    ::onnx::ModelProto model;
    model.set_ir_version(8);
    model.set_producer_name("kiln");
    model.set_producer_version(KILN_VERSION_STRING);
    auto* imp = model.add_opset_import();
    imp->set_domain("");
    imp->set_version(opt.opset);
    ::onnx::GraphProto& g = *model.mutable_graph();
    g.set_name("kiln_program");
    detail::Emitter em(ep, g, loc);
    const ir::Graph& ir = ep.graph();
    // inputs and initializers
    for (int k = 0; k < ep.num_user_inputs(); ++k) {
        const TensorSpec& s = ep.input_specs()[static_cast<std::size_t>(k)];
        detail::set_type(*g.add_input(), s.name, s.dtype, s.shape, s.dim_names);
    }
    for (std::size_t k = static_cast<std::size_t>(ep.num_user_inputs()); k < ep.input_specs().size(); ++k) {
        const TensorSpec& s = ep.input_specs()[k];
        const Tensor t = ep.state_dict().at(s.name).cpu().contiguous();
        em.tensor(s.name, s.dtype, s.shape, t.data_ptr());
    }
    // softmax, log_softmax and layer_norm as one ONNX op each; the nodes only they read are not written
    std::vector<detail::Composite> comps = detail::find_composites(ir);
    for (int i = 0; i < ir.size(); ++i) {
        detail::Composite& c = comps[static_cast<std::size_t>(i)];
        if (c.kind == detail::Composite::Kind::layer_norm && c.scale < 0)  // its ones need the normalized dims' sizes
            for (int d = static_cast<int>(c.axis); d < ir[c.x].shape.rank(); ++d)
                if (!em.ep_node_dims(c.x)[static_cast<std::size_t>(d)].empty()) c.kind = detail::Composite::Kind::none;
    }
    std::vector<char> needed(static_cast<std::size_t>(ir.size()), 0);
    for (int o : ir.outputs) needed[static_cast<std::size_t>(o)] = 1;
    for (int i = ir.size() - 1; i >= 0; --i) {
        if (!needed[static_cast<std::size_t>(i)]) continue;
        const detail::Composite& c = comps[static_cast<std::size_t>(i)];
        if (c.kind == detail::Composite::Kind::none) {
            for (int j : ir[i].in) needed[static_cast<std::size_t>(j)] = 1;
            continue;
        }
        for (int j : {c.x, c.scale, c.bias})
            if (j >= 0) needed[static_cast<std::size_t>(j)] = 1;
    }
    std::vector<std::string> name(static_cast<std::size_t>(ir.size()));
    for (int i = 0; i < ir.size(); ++i) {
        const ir::Node& n = ir[i];
        std::string& v = name[static_cast<std::size_t>(i)];
        if (n.kind != ir::Kind::input && !needed[static_cast<std::size_t>(i)]) continue;
        if (comps[static_cast<std::size_t>(i)].kind != detail::Composite::Kind::none) {
            v = em.composite(ir, i, comps[static_cast<std::size_t>(i)], name);
            continue;
        }
        switch (n.kind) {
            case ir::Kind::input: v = ep.input_specs()[static_cast<std::size_t>(n.index)].name; break;
            case ir::Kind::scalar: v = em.scalar(n.value, n.dtype); break;
            case ir::Kind::elementwise: v = em.elementwise(ir, i, name); break;
            case ir::Kind::reduce: case ir::Kind::arg_reduce: v = em.reduce(ir, i, name[static_cast<std::size_t>(n.in[0])]); break;
            case ir::Kind::matmul:
                v = em.node("MatMul", {em.cast(name[static_cast<std::size_t>(n.in[0])], ir[n.in[0]].dtype, n.dtype),
                                        em.cast(name[static_cast<std::size_t>(n.in[1])], ir[n.in[1]].dtype, n.dtype)});
                break;
            case ir::Kind::view: case ir::Kind::view_write: v = em.view(ir, i, name[static_cast<std::size_t>(n.in[0])]); break;
            case ir::Kind::call: v = em.call(ir, i, name); break;
            case ir::Kind::constant: em.fail("a captured tensor that was not lifted (node %" + std::to_string(i) + ")");
        }
    }
    for (std::size_t k = 0; k < ep.output_specs().size(); ++k) {
        const TensorSpec& s = ep.output_specs()[k];
        ::onnx::NodeProto* n = g.add_node();
        n->set_op_type("Identity");
        n->set_name("output_" + std::to_string(k));
        n->add_input(name[static_cast<std::size_t>(ir.outputs[k])]);
        n->add_output(s.name);
        detail::set_type(*g.add_output(), s.name, s.dtype, s.shape, s.dim_names);
    }
    if (opt.check) {
        try {
            ::onnx::checker::check_model(model);
        } catch (const std::exception& e) {
            kiln::detail::fail<ExportError>("onnx::export_model", std::string("ONNX's checker refuses the model: ") + e.what(), loc);
        }
    }
    return model;
}

KILN_DECL void export_model(const ExportedProgram& ep, const std::string& path, const Options& opt, std::source_location loc) {
    const ::onnx::ModelProto model = to_model_proto(ep, opt, loc);
    std::string bytes;
    if (!model.SerializeToString(&bytes)) kiln::detail::fail<ExportError>("onnx::export_model", "the model could not be serialized (over 2 GB?)", loc);
    nn::detail::OutFile out("onnx::export_model", path, loc);
    out.write(bytes);
    out.commit();
}

}  // namespace kiln::onnx
