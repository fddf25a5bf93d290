// Folding the elementwise work after a library op into the op's own epilogue: a residual add and
// a relu (conv2d's fused bias + residual + relu), through the op's with_residual / with_relu hooks.
#pragma once

#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::passes {

/// Rewrites, for a library op y = op(operands) whose only reader is the pattern:
/// - y + z or z + y (z of y's shape and dtype, not y) -> op.with_residual()(operands, z);
/// - relu(y) (also after the residual) -> op.with_relu()(operands);
/// - relu(view(y)), y read only by the view -> view(op.with_relu()(operands)) (relu commutes with
///   a view).
/// The folded op takes the place of the last node it absorbs (where z is computed already); the
/// absorbed nodes are dropped. Reads no tensor: runs on every graph. Inference graphs in C++
/// write these epilogues themselves (nn::ResNet18); graphs from elsewhere (an imported ONNX model,
/// a BatchNorm folded by fold_conv_affine) get them here.
inline ir::Graph fold_call_epilogue(const ir::Graph& g) {
    using ir::Kind;
    const std::vector<int> uses = g.use_counts();
    std::vector<int> reader(static_cast<std::size_t>(g.size()), -1);
    for (int i = 0; i < g.size(); ++i)
        for (int j : g[i].in) reader[static_cast<std::size_t>(j)] = i;
    auto only_reader = [&](int id) { return uses[static_cast<std::size_t>(id)] == 1 ? reader[static_cast<std::size_t>(id)] : -1; };
    auto is_relu_of = [&](int r, int of) {
        return r >= 0 && g[r].kind == Kind::elementwise && g[r].op == ops::op_id<ops::Relu> && g[r].in.size() == 1 && g[r].in[0] == of &&
               g[r].dtype == g[of].dtype && g[r].shape == g[of].shape;
    };

    struct Fold {
        int call = -1;
        int residual = -1;  ///< z, or -1
        int view = -1;      ///< the view between the op and the relu, or -1
        std::shared_ptr<const ir::CallOp> op;
    };
    std::vector<Fold> folds;
    std::vector<int> at(static_cast<std::size_t>(g.size()), -1);  // the node a fold replaces -> the fold
    std::vector<char> drop(static_cast<std::size_t>(g.size()), 0);
    std::vector<char> pinned(static_cast<std::size_t>(g.size()), 0);  // a residual z: stays as it is
    for (int c = 0; c < g.size(); ++c) {
        const ir::Node& n = g[c];
        if (n.kind != Kind::call || pinned[static_cast<std::size_t>(c)] || (!n.call->with_relu && !n.call->with_residual)) continue;
        Fold f;
        f.call = c;
        std::shared_ptr<const ir::CallOp> op = n.call;
        int last = c;
        if (const int a = only_reader(c); a >= 0 && op->with_residual && g[a].kind == Kind::elementwise && g[a].op == ops::op_id<ops::Add> &&
                                          g[a].in.size() == 2 && g[a].dtype == n.dtype && g[a].shape == n.shape) {
            const int z = g[a].in[0] == c ? g[a].in[1] : g[a].in[0];
            if (z != c && g[z].kind != Kind::scalar && g[z].shape == n.shape && g[z].dtype == n.dtype)
                if (std::shared_ptr<const ir::CallOp> with = op->with_residual()) {
                    op = std::move(with);
                    f.residual = z;
                    last = a;
                }
        }
        if (const int r = only_reader(last); is_relu_of(r, last) && op->with_relu) {
            if (std::shared_ptr<const ir::CallOp> with = op->with_relu()) {
                op = std::move(with);
                last = r;
            }
        } else if (last == c && r >= 0 && g[r].kind == Kind::view && op->with_relu) {
            if (const int rr = only_reader(r); is_relu_of(rr, r))
                if (std::shared_ptr<const ir::CallOp> with = op->with_relu()) {
                    op = std::move(with);
                    f.view = r;
                    last = rr;
                }
        }
        if (last == c) continue;
        if (f.residual >= 0) pinned[static_cast<std::size_t>(f.residual)] = 1;
        for (int k = c; k != last; k = reader[static_cast<std::size_t>(k)]) drop[static_cast<std::size_t>(k)] = 1;  // c .. before last
        f.op = std::move(op);
        at[static_cast<std::size_t>(last)] = static_cast<int>(folds.size());
        folds.push_back(std::move(f));
    }
    if (folds.empty()) return g;

    ir::Graph out;
    std::vector<int> remap(static_cast<std::size_t>(g.size()), -1);
    for (int i = 0; i < g.size(); ++i) {
        if (drop[static_cast<std::size_t>(i)]) continue;
        const int fi = at[static_cast<std::size_t>(i)];
        if (fi < 0) {
            ir::Node n = g[i];
            for (int& j : n.in) j = remap[static_cast<std::size_t>(j)];
            remap[static_cast<std::size_t>(i)] = out.add(std::move(n));
            if (g[i].kind == Kind::input) out.inputs.push_back(remap[static_cast<std::size_t>(i)]);
            continue;
        }
        const Fold& f = folds[static_cast<std::size_t>(fi)];
        ir::Node n = g[f.call];
        for (int& j : n.in) j = remap[static_cast<std::size_t>(j)];
        if (f.residual >= 0) n.in.push_back(remap[static_cast<std::size_t>(f.residual)]);
        n.call = f.op;
        int id = out.add(std::move(n));
        if (f.view >= 0) {
            ir::Node v = g[f.view];
            v.in = {id};
            id = out.add(std::move(v));
        }
        remap[static_cast<std::size_t>(i)] = id;
    }
    for (int o : g.outputs) out.outputs.push_back(remap[static_cast<std::size_t>(o)]);
    return out;
}

}  // namespace kiln::passes
