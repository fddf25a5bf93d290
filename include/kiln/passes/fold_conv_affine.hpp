// Folding a per-channel affine map (BatchNorm at inference) and a relu into the library op before it.
#pragma once

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tables/op_kernels.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/passes/eliminate_dead_code.hpp"

namespace kiln::passes {

namespace detail {

/// Whether a value of shape s, broadcast (aligned right) against values whose channel axis is
/// `from_right` dims from the last, varies along that axis only: every other dim is 1, that one
/// C or 1. From the last dim: (), (C), (1, .., 1, C); from the third last (NCHW): (C, 1, 1).
inline bool per_channel_shape(const Shape& s, std::int64_t C, int from_right) {
    for (int d = 0; d < s.rank(); ++d)
        if (s[d] != 1 && (s.rank() - 1 - d != from_right || s[d] != C)) return false;
    return true;
}

/// The axis of view v that holds the channel (last dim, C entries) of its operand, or -1: the
/// element at any index i of v must be of channel i[axis]. In the operand's row-major layout the
/// channel of an element is its position modulo C, so: stride 1 and size C on that axis, every
/// other stride and the offset multiples of C (a permutation like NHWC -> NCHW, a reshape that
/// keeps C last, a slice or broadcast over the other dims).
inline int channel_axis(const ir::Node& v, std::int64_t C) {
    if (v.kind != ir::Kind::view || v.shape.rank() == 0) return -1;
    if (C == 1) return v.shape.rank() - 1;  // every element is of channel 0
    const auto offset = static_cast<std::int64_t>(v.value);
    if (offset % C != 0) return -1;
    int axis = -1;
    for (int d = 0; d < v.shape.rank(); ++d) {
        if (axis < 0 && v.args[d] == 1 && v.shape[d] == C) axis = d;
        else if (v.args[d] % C != 0 && v.shape[d] != 1) return -1;
    }
    return axis;
}

/// The values of the per-channel constants of a graph: one value (broadcast) or C values each.
class ChannelValues {
public:
    ChannelValues(const ir::Graph& g, std::int64_t C, int from_right) : g_(g), C_(C), from_right_(from_right) {}

    /// The values of node id when it is a captured tensor, a number, or an elementwise expression
    /// over only those, of a per-channel shape; nullopt otherwise. Expressions are evaluated on
    /// the CPU by the op table's kernels in each node's compute type and rounded to its dtype, as
    /// running them would.
    const std::optional<std::vector<double>>& of(int id) {
        if (auto it = memo_.find(id); it != memo_.end()) return it->second;
        std::optional<std::vector<double>> v = compute(id);
        return memo_.emplace(id, std::move(v)).first->second;
    }

private:
    std::optional<std::vector<double>> compute(int id) {
        const ir::Node& n = g_[id];
        if (n.kind == ir::Kind::scalar) return std::vector<double>{n.value};
        if (!per_channel_shape(n.shape, C_, from_right_)) return std::nullopt;
        if (n.kind == ir::Kind::constant) {
            const Tensor t = n.tensor.cpu().to(DType::f64).contiguous();
            return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
        }
        if (n.kind != ir::Kind::elementwise || n.in.empty() || n.in.size() > 3) return std::nullopt;
        std::vector<const std::vector<double>*> args;
        std::size_t len = 1;
        for (int j : n.in) {
            const auto& v = of(j);
            if (!v) return std::nullopt;
            args.push_back(&*v);
            if (v->size() != 1) len = v->size();
        }
        std::optional<std::vector<double>> out;
        kiln::visit_compute_dtype(n.ct, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const kiln::detail::AnyTileKernel k = kiln::detail::any_tile_kernel(n.op, n.ct, 0);
            if (!k) return;
            std::vector<std::vector<T>> a(args.size(), std::vector<T>(len));
            const void* in[3] = {};
            for (std::size_t q = 0; q < args.size(); ++q) {
                for (std::size_t i = 0; i < len; ++i) a[q][i] = static_cast<T>((*args[q])[args[q]->size() == 1 ? 0 : i]);
                in[q] = a[q].data();
            }
            std::vector<T> r(len);
            k(in, r.data(), static_cast<std::int64_t>(len), n.attr);  // the kernel itself: it rounds as running would
            std::vector<double> v(len);
            for (std::size_t i = 0; i < len; ++i)
                v[i] = kiln::visit_dtype(n.dtype, [&](auto dtag) {
                    using S = typename decltype(dtag)::type;
                    return static_cast<double>(kiln::detail::load_as<T>(kiln::detail::store_as<S>(r[i])));
                });
            out = std::move(v);
        });
        return out;
    }

    const ir::Graph& g_;
    std::int64_t C_;
    int from_right_;
    std::map<int, std::optional<std::vector<double>>> memo_;
};

/// y -> y * scale + shift, per channel, composed in float64.
struct Affine {
    std::vector<double> scale, shift;

    /// The map followed by `op` with the per-channel operand k (on the right, or on the left when
    /// `k_first`); false (and the map unchanged) when that is not affine in y or not finite.
    bool then(ops::OpId op, const std::vector<double>& k, bool k_first) {
        using ops::op_id;
        Affine next = *this;
        for (std::size_t c = 0; c < scale.size(); ++c) {
            const double v = k[k.size() == 1 ? 0 : c];
            double& s = next.scale[c];
            double& t = next.shift[c];
            if (op == op_id<ops::Add>) t += v;
            else if (op == op_id<ops::Sub> && !k_first) t -= v;
            else if (op == op_id<ops::Sub>) s = -s, t = v - t;
            else if (op == op_id<ops::Mul>) s *= v, t *= v;
            else if (op == op_id<ops::Div> && !k_first) s /= v, t /= v;
            else return false;
            if (!std::isfinite(s) || !std::isfinite(t)) return false;
        }
        *this = std::move(next);
        return true;
    }
};

inline Tensor f64_vector(const std::vector<double>& v) {
    Tensor t = zeros({static_cast<std::int64_t>(v.size())}, DType::f64);
    std::copy(v.begin(), v.end(), t.data<double>());
    return t;
}

}  // namespace detail

/// Folds into a library op with a `fold_affine` hook (a convolution) the chain of elementwise
/// add / sub / mul / div after it whose other operand is a per-channel constant: a captured
/// tensor, a number, or an expression over only those, that varies along the output's channel
/// (last) dim only. Inference BatchNorm over channels-last values is such a chain:
/// (y - mean) * (gamma * rsqrt(var + eps)) + beta; over NCHW values too, where the chain follows
/// the op through one view that keeps each element's channel on one axis (the NHWC -> NCHW
/// permute of nn::conv2d) and the constants are (C, 1, 1). The op's output, the view and each link
/// but the last must have one reader, and no link may change the dtype or shape. The op's weight
/// and bias become new folded constants (a relu after them joins the op in fold_call_epilogue,
/// which runs next). Reads captured tensors now: only for frozen programs (kiln::Options::freeze).
inline ir::Graph fold_conv_affine(const ir::Graph& g) {
    using ir::Kind;
    const std::vector<int> uses = g.use_counts();
    std::vector<int> reader(static_cast<std::size_t>(g.size()), -1);  // the last user: the only one where uses == 1
    for (int i = 0; i < g.size(); ++i)
        for (int j : g[i].in) reader[static_cast<std::size_t>(j)] = i;
    auto only_reader = [&](int id) { return uses[static_cast<std::size_t>(id)] == 1 ? reader[static_cast<std::size_t>(id)] : -1; };

    struct Fold {
        int call;
        int view;  ///< the view between the op and the chain, or -1
        ir::CallOp::Rewrite rewrite;
    };
    std::map<int, Fold> at;  // the node each fold replaces -> the fold
    for (int c = 0; c < g.size(); ++c) {
        const ir::Node& n = g[c];
        if (n.kind != Kind::call || !n.call->fold_affine || !is_floating(n.dtype) || n.shape.rank() == 0) continue;
        const std::int64_t C = n.shape[n.shape.rank() - 1];
        if (C < 1) continue;
        // the chain runs over the op's output, or over one view of it that keeps channels on an axis
        int head = c, view = -1, from_right = 0;
        if (const int v = only_reader(c); v >= 0 && g[v].kind == Kind::view) {
            const int axis = detail::channel_axis(g[v], C);
            if (axis < 0) continue;
            head = view = v;
            from_right = g[v].shape.rank() - 1 - axis;
        }
        const Shape& shape = g[head].shape;
        detail::ChannelValues values(g, C, from_right);
        detail::Affine map{std::vector<double>(static_cast<std::size_t>(C), 1.0), std::vector<double>(static_cast<std::size_t>(C), 0.0)};
        int last = head;
        for (int r = only_reader(last); r >= 0; r = only_reader(last)) {
            const ir::Node& m = g[r];
            if (m.kind != Kind::elementwise || m.in.size() != 2 || m.dtype != n.dtype || !(m.shape == shape)) break;
            const bool k_first = m.in[1] == last;
            const auto& k = values.of(m.in[k_first ? 0 : 1]);
            if (!k || !map.then(m.op, *k, k_first)) break;
            last = r;
        }
        if (last == head) continue;
        std::vector<Tensor> operands;
        for (int j : n.in) operands.push_back(g[j].kind == Kind::constant ? g[j].tensor : Tensor{});
        std::optional<ir::CallOp::Rewrite> rw = n.call->fold_affine(operands, detail::f64_vector(map.scale), detail::f64_vector(map.shift));
        if (!rw) continue;
        if (!rw->op || !rw->op->run || !rw->op->shape)
            throw InternalError("kiln: fold_conv_affine: " + n.call->key + " folded into an op without run or shape");
        for (std::size_t q = 0; q < rw->operands.size(); ++q)
            if (!rw->operands[q].defined() && q >= n.in.size())
                throw InternalError("kiln: fold_conv_affine: " + n.call->key + " folded into an op with operand " + std::to_string(q) +
                                    " unbound");
        at.emplace(last, Fold{c, view, std::move(*rw)});
    }
    if (at.empty()) return g;

    // one forward sweep: each replaced node becomes the new constants, the folded call and the
    // view; the chains and per-channel constants nothing reads any more are dropped after
    ir::Graph out;
    std::vector<int> remap(static_cast<std::size_t>(g.size()), -1);
    for (int i = 0; i < g.size(); ++i) {
        const auto f = at.find(i);
        if (f == at.end()) {
            ir::Node n = g[i];
            for (int& j : n.in) j = remap[static_cast<std::size_t>(j)];
            remap[static_cast<std::size_t>(i)] = out.add(std::move(n));
            if (g[i].kind == Kind::input) out.inputs.push_back(remap[static_cast<std::size_t>(i)]);
            continue;
        }
        const ir::Node& call = g[f->second.call];
        ir::Node n = call;
        n.in.clear();
        n.call = f->second.rewrite.op;
        const std::vector<Tensor>& operands = f->second.rewrite.operands;
        for (std::size_t q = 0; q < operands.size(); ++q) {
            if (!operands[q].defined()) {
                n.in.push_back(remap[static_cast<std::size_t>(call.in[q])]);
                continue;
            }
            ir::Node k;
            k.kind = Kind::constant;
            k.dtype = operands[q].dtype();
            k.shape = operands[q].shape();
            k.tensor = operands[q];
            k.loc = call.loc;
            n.in.push_back(out.add(std::move(k)));
        }
        int id = out.add(std::move(n));
        if (f->second.view >= 0) {
            ir::Node v = g[f->second.view];
            v.in = {id};
            id = out.add(std::move(v));
        }
        remap[static_cast<std::size_t>(i)] = id;
    }
    for (int o : g.outputs) out.outputs.push_back(remap[static_cast<std::size_t>(o)]);
    return eliminate_dead_code(out);
}

}  // namespace kiln::passes
