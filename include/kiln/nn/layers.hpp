// nn building blocks written as tensor expressions: Linear, LayerNorm, GELU, ReLU, Dropout,
// Embedding, multi-head attention, an MLP and a BERT-style encoder layer.
//
// A module is a plain struct: its parameters are Tensor members, `operator()` is its forward pass
// (inference), and `visit(prefix, f)` names every parameter the way torch's state_dict does, so
// nn::load_state, nn::state_dict and nn::to work on any module. Called directly, each statement
// is one fused kernel (matmuls are library calls); under kiln::compile the whole forward pass is
// one graph (a Linear's bias and activation become the GEMM's cuBLASLt epilogue on CUDA).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/gather.hpp"
#include "kiln/backends/cuda/matmul.hpp"
#include "kiln/backends/cuda/rng.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ir/library_ops.hpp"
#include "kiln/ops/composites.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/reductions.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::nn {

using Loc = std::source_location;

/// Where new parameters live and their dtype.
struct Init {
    DType dtype = DType::f32;
    Device device = Device::cpu();
};

/// The activation a Linear applies to its output (the activation table, tables/activations.hpp).
using kiln::Act;

// ------------------------------------------------------------------ what visit() hands a visitor
// A module's visit(prefix, f) calls f(name, tensor) for each parameter. Beyond that, a visitor that
// accepts them also gets f(name, tensor, Buffer{}) for buffers (BatchNorm's running statistics:
// in the state dict, not parameters) and f(ModeFlag) for each training flag (Dropout, BatchNorm).
/// Marks a tensor handed to a visitor as a buffer.
struct Buffer {};
/// A module's training flag, handed to visitors that set it (nn::train, nn::eval).
struct ModeFlag {
    bool* training;
};

namespace detail {
template <class F> void visit_buffer(F& f, const std::string& name, Tensor& t) {
    if constexpr (std::is_invocable_v<F&, const std::string&, Tensor&, Buffer>)
        f(name, t, Buffer{});
    else
        f(name, t);
}
template <class F> void visit_mode(F& f, bool& training) {
    if constexpr (std::is_invocable_v<F&, ModeFlag>) f(ModeFlag{&training});
}
/// Sets every training flag of a module.
struct SetMode {
    bool on;
    void operator()(const std::string&, Tensor&) const {}
    void operator()(ModeFlag m) const { *m.training = on; }
};
}  // namespace detail

/// Anything with visit(prefix, visitor).
template <class M>
concept Module = requires(M& m, detail::SetMode v) { m.visit(std::string{}, v); };

/// Training mode (torch's module.train()): Dropout drops, BatchNorm2d normalizes with the batch's
/// statistics and updates its running ones. Modules are built in eval mode (unlike torch, whose
/// modules start in training mode: kiln's forward passes serve inference first).
template <Module M> M& train(M& m, bool on = true) {
    m.visit("", detail::SetMode{on});
    return m;
}
/// Eval mode (torch's module.eval()): Dropout is the identity, BatchNorm2d uses running statistics.
template <Module M> M& eval(M& m) { return train(m, false); }

namespace detail {

/// torch's default Linear/Embedding init bounds: uniform(-bound, bound), on the CPU's generator.
inline Tensor uniform(const Shape& s, double bound, const Init& o) {
    return Tensor((rand(s) * 2.0 - 1.0) * bound).to(o.dtype).to(o.device);
}

/// act(y + b) (b broadcast against y) as one expression statement.
inline Tensor add_act(const Tensor& y, const Tensor& b, Act act, const Loc& loc) { return apply_act(act, y + b, loc); }

/// act(x @ w^T + b) as an expression statement (the CPU, and every traced call: the fuser hands
/// bias and activation to cuBLASLt where it can).
inline Tensor linear_expr(const Tensor& x, const Tensor& w, const Tensor& b, Act act, const Loc& loc) {
    const Tensor y = kiln::matmul(x, w.t(), loc);
    return b.defined() ? add_act(y, b, act, loc) : apply_act(act, y, loc);
}

}  // namespace detail

/// act(x @ weight^T + bias), weight (out, in) as torch lays it out. On a CUDA device outside
/// kiln::compile this is one cuBLASLt call with the bias and activation as its epilogue.
inline Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Act act = Act::none,
                     Loc loc = Loc::current()) {
    if (weight.rank() != 2)
        kiln::detail::fail<ShapeError>("linear", "weight must be 2-D (out, in), got " + weight.shape().str(), loc);
    if (x.rank() == 0 || x.size(-1) != weight.size(1))
        kiln::detail::fail<ShapeError>("linear", "input of shape " + x.shape().str() + " does not end in in_features = " +
                                                     std::to_string(weight.size(1)) + " (weight " + weight.shape().str() + ")", loc);
    if (bias.defined() && (bias.rank() != 1 || bias.size(0) != weight.size(0)))
        kiln::detail::fail<ShapeError>("linear", "bias of shape " + bias.shape().str() + " does not match out_features = " +
                                                     std::to_string(weight.size(0)), loc);
    const bool traced = trace::recorded(x) || trace::recorded(weight) || trace::recorded(bias);
    // an activation without a cuBLASLt epilogue (exact gelu) is a GEMM and one fused kernel
    const bool recorded = autograd::detail::grad_mode() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad());
    if (!traced && !recorded && act_info(act).gemm_epilogue && x.device().is_cuda() && x.rank() >= 2 && x.dtype() == weight.dtype() &&
        (!bias.defined() || bias.dtype() == weight.dtype()))
        return cuda::matmul(x, weight.t(), cuda::Epilogue{act, bias.defined()}, bias.defined() ? &bias : nullptr, loc);
    return detail::linear_expr(x, weight, bias, act, loc);
}

/// y = act(x W^T + b).
struct Linear {
    Tensor weight;  ///< (out_features, in_features)
    Tensor bias;    ///< (out_features), or undefined
    Act act = Act::none;

    Linear() = default;
    Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias = true, Act activation = Act::none, Init o = {})
        : act(activation) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
        weight = detail::uniform({out_features, in_features}, bound, o);
        if (with_bias) bias = detail::uniform({out_features}, bound, o);
    }
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const { return linear(x, weight, bias, act, loc); }
    template <class F> void visit(const std::string& prefix, F&& f) {
        f(prefix + "weight", weight);
        if (bias.defined()) f(prefix + "bias", bias);
    }
};

/// Layer normalization over the last dim, with weight and bias (torch.nn.LayerNorm).
struct LayerNorm {
    Tensor weight, bias;
    double eps = 1e-5;

    LayerNorm() = default;
    explicit LayerNorm(std::int64_t features, double epsilon = 1e-5, Init o = {}) : eps(epsilon) {
        weight = ones({features}, o.dtype, o.device);
        bias = zeros({features}, o.dtype, o.device);
    }
    /// The norm of any expression (x + residual is one kernel with the norm).
    template <class X> Tensor operator()(const X& x, Loc loc = Loc::current()) const { return layer_norm(x, 1, weight, bias, eps, loc); }
    template <class F> void visit(const std::string& prefix, F&& f) {
        f(prefix + "weight", weight);
        f(prefix + "bias", bias);
    }
};

/// GELU: exact (erf) or the tanh approximation (torch's approximate='tanh').
struct GELU {
    bool tanh_approximation = false;
    template <class X> Tensor operator()(const X& x, Loc loc = Loc::current()) const {
        return tanh_approximation ? Tensor(gelu_tanh(x), loc) : Tensor(gelu(x), loc);
    }
    template <class F> void visit(const std::string&, F&&) {}
};

/// max(x, 0).
struct ReLU {
    template <class X> Tensor operator()(const X& x, Loc loc = Loc::current()) const { return Tensor(relu(x), loc); }
    template <class F> void visit(const std::string&, F&&) {}
};

namespace detail {
/// Keeps an element when its Philox word, shifted right by 8, reaches this (P(keep) = 1 - p).
inline std::int64_t dropout_threshold(double p) { return static_cast<std::int64_t>(std::ceil(p * 16777216.0)); }

/// dropout's keep mask (bool, like's shape and device) from the generator: on the CPU element i
/// takes counter offset + i of the generator (which moves on by the count); on CUDA the generator's
/// device stream (backends/cuda/rng.hpp) does the same in device memory.
inline Tensor dropout_keep(const Tensor& like, double p, Generator& gen, const Loc& loc) {
    Tensor keep(like.shape(), DType::boolean, like.device(), loc);
    const std::int64_t n = keep.numel(), threshold = dropout_threshold(p);
    if (n == 0) return keep;
    if (like.device().is_cuda()) {
        cuda::detail::dropout_mask(keep, gen, threshold, loc);
        return keep;
    }
    const std::uint64_t seed = gen.seed(), c0 = gen.advance(static_cast<std::uint64_t>(n));
    bool* k = static_cast<bool*>(keep.data_ptr());
    kiln::detail::parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i)
            k[i] = static_cast<std::int64_t>(philox_word(seed, c0 + static_cast<std::uint64_t>(i)) >> 8) >= threshold;
    });
    return keep;
}
}  // namespace detail

/// torch.nn.functional.dropout: in training, each element is zeroed with probability p and the rest
/// scaled by 1 / (1 - p); otherwise x itself. The keep mask comes from Philox4x32-10 counters of
/// `gen` (kiln::philox4x32_10), so the same seed gives the same mask eagerly and under
/// kiln::compile, on any thread count. Under compile the mask is one library call in the graph,
/// drawn anew on each call (on CUDA also on each replay of a captured graph), and x * mask * scale
/// fuses with its neighbours; the gradient is g * mask * scale.
inline Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator& gen = default_generator(),
                      Loc loc = Loc::current()) {
    if (!(p >= 0 && p <= 1)) kiln::detail::fail<ValueError>("dropout", "p must lie in [0, 1], got " + std::to_string(p), loc);
    if (!is_floating(x.dtype()))
        kiln::detail::fail<DTypeError>("dropout", "needs a floating tensor, got " + std::string(dtype_name(x.dtype())), loc);
    if (!training || p == 0) return x;
    if (p == 1) return Tensor(x * 0.0, loc);
    auto op = std::make_shared<ir::CallOp>();
    // the key names the call site within its graph: two masks of one input are different draws
    trace::Tracer* tr = trace::Tracer::active();
    op->key = "dropout_mask(p=" + std::to_string(p) + ", gen=" + std::to_string(reinterpret_cast<std::uintptr_t>(&gen)) +
              ", #" + std::to_string(tr ? tr->graph().size() : 0) + ")";
    op->shape = [](const std::vector<Shape>& s) { return s[0]; };
    op->run = [p, &gen, loc](const std::vector<Tensor>& in) { return detail::dropout_keep(in[0], p, gen, loc); };
    const Tensor keep = trace::call_op(std::move(op), {x.detach()}, DType::boolean, loc, /*every_call=*/true);
    return Tensor(x * keep * (1.0 / (1.0 - p)), loc);
}

/// torch.nn.Dropout: dropout(x, p) in training mode (nn::train), the identity in eval mode.
struct Dropout {
    double p = 0.1;
    bool training = false;
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const { return dropout(x, p, training, default_generator(), loc); }
    template <class F> void visit(const std::string&, F&& f) { detail::visit_mode(f, training); }
};

namespace detail {

/// The lookup on concrete tensors (weight and ids on one device): ids checked against the table
/// (ValueError; on a GPU one min/max read back, which a CUDA graph being captured skips: the calls
/// before a capture checked theirs, as gather's), then one row copy per id.
inline Tensor embedding_now(const Tensor& weight, const Tensor& ids_in, const Loc& loc) {
    if (ids_in.device() != weight.device())
        kiln::detail::fail<DeviceError>("embedding", "ids are on " + ids_in.device().str() + " but the weight is on " +
                                                         weight.device().str(), loc);
    const Tensor ids = ids_in.to(DType::i64, loc).contiguous();
    const std::int64_t num = weight.size(0), dim = weight.size(1);
    Shape out_shape = ids.shape();
    out_shape.push_back(dim);
    Tensor out(out_shape, weight.dtype(), weight.device(), loc);
    if (ids.numel() == 0) return out;
    const bool capturing = ids.device().is_cuda() && cuda::capturing(cuda::current_stream(ids.device().index));
    if (!capturing) {
        const std::int64_t lo_v = min(ids).item<std::int64_t>(), hi_v = max(ids).item<std::int64_t>();
        if (lo_v < 0 || hi_v >= num)
            kiln::detail::fail<ValueError>("embedding", "id " + std::to_string(lo_v < 0 ? lo_v : hi_v) +
                                                            " is out of range for an embedding of " + std::to_string(num) + " rows", loc);
    }
    const Tensor w = weight.contiguous();
    if (w.device().is_cuda()) {
        cuda::detail::gather_rows(w, ids, out);
        return out;
    }
    const std::size_t row_bytes = static_cast<std::size_t>(dim) * w.element_size();
    const auto* src = static_cast<const unsigned char*>(w.data_ptr());
    auto* dst = static_cast<unsigned char*>(out.data_ptr());
    const std::int64_t* id = ids.data<std::int64_t>();
    for (std::int64_t i = 0; i < ids.numel(); ++i)
        std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes, src + static_cast<std::size_t>(id[i]) * row_bytes, row_bytes);
    return out;
}
/// The library op of embedding (operands {weight, ids}).
inline std::shared_ptr<ir::CallOp> embedding_op(const Loc& loc) {
    auto call = std::make_shared<ir::CallOp>();
    call->key = "embedding";
    call->name = "embedding";
    call->shape = [](const std::vector<Shape>& s) {
        Shape o = s[1];
        o.push_back(s[0][1]);
        return o;
    };
    call->run = [loc](const std::vector<Tensor>& in) { return embedding_now(in[0], in[1], loc); };
    return call;
}
inline const bool embedding_registered =
    ir::register_library_op("embedding", [](const ir::CallAttrs&) -> std::shared_ptr<const ir::CallOp> { return embedding_op(Loc::current()); });

}  // namespace detail

/// Rows of `weight` (num, dim) picked by integer `ids` of any shape: the result has shape
/// ids.shape + (dim). Every id must lie in [0, num) (ValueError otherwise; checked on the host,
/// which waits for the device when ids are on a GPU; replays of a captured CUDA graph do not
/// check). Under kiln::compile it is a library call inside the graph (no graph break).
inline Tensor embedding(const Tensor& weight, const Tensor& ids, Loc loc = Loc::current()) {
    if (weight.rank() != 2)
        kiln::detail::fail<ShapeError>("embedding", "weight must be 2-D (num_embeddings, dim), got " + weight.shape().str(), loc);
    if (ids.dtype() != DType::i32 && ids.dtype() != DType::i64)
        kiln::detail::fail<DTypeError>("embedding", "ids must be int32 or int64, got " + std::string(dtype_name(ids.dtype())), loc);
    if (autograd::detail::needs_grad({&weight}))  // the rows' gradients added into a zero table
        return autograd::detail::library(
            "embedding", {&weight, &ids}, [&] { return embedding(weight, ids, loc); },
            [ids, ws = weight.shape(), dev = weight.device()](const Tensor& g) {
                const std::int64_t dim = ws[1];
                const Tensor rows = g.reshape({-1, dim});
                const Tensor where_to = ids.to(DType::i64).reshape({-1, 1}).expand({-1, dim});
                return std::vector<Tensor>{scatter_add(zeros(ws, g.dtype(), dev), 0, where_to, rows), Tensor()};
            },
            loc);
    return trace::call_op(detail::embedding_op(loc), {weight, ids}, weight.dtype(), loc);
}

/// A lookup table of num_embeddings rows of embedding_dim (torch.nn.Embedding, init N(0, 1)).
struct Embedding {
    Tensor weight;  ///< (num_embeddings, embedding_dim)

    Embedding() = default;
    Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Init o = {})
        : weight(randn({num_embeddings, embedding_dim}).to(o.dtype).to(o.device)) {}
    Tensor operator()(const Tensor& ids, Loc loc = Loc::current()) const { return embedding(weight, ids, loc); }
    template <class F> void visit(const std::string& prefix, F&& f) { f(prefix + "weight", weight); }
};

/// softmax(q k^T * scale + mask) v over (..., S, D) operands: one batched GEMM, one fused row
/// kernel for the scaled, masked softmax, one batched GEMM. `mask` (optional) broadcasts to the
/// scores (..., S_q, S_k): a bool mask keeps the positions where it is true (like torch's
/// scaled_dot_product_attention), a float mask is added.
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                                           Loc loc = Loc::current()) {
    if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank() || q.size(-1) != k.size(-1) || k.size(-2) != v.size(-2))
        kiln::detail::fail<ShapeError>("scaled_dot_product_attention", "q " + q.shape().str() + ", k " + k.shape().str() +
                                                                           " and v " + v.shape().str() + " do not fit together", loc);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const Tensor scores = kiln::matmul(q, k.transpose(-2, -1), loc);
    Tensor p;
    if (!mask.defined()) p = softmax(scores * scale, -1, loc);
    else if (mask.dtype() == DType::boolean) p = softmax(where(mask, scores * scale, -INFINITY), -1, loc);
    else p = softmax(scores * scale + mask, -1, loc);
    return kiln::matmul(p.to(v.dtype(), loc), v, loc);
}

/// Multi-head self-attention over batch-first (B, S, E) inputs with torch.nn.MultiheadAttention's
/// parameters: in_proj (3E, E) packing q, k, v, and out_proj.
struct MultiheadAttention {
    std::int64_t embed_dim = 0, num_heads = 1;
    Tensor in_proj_weight, in_proj_bias;  ///< (3E, E), (3E)
    Linear out_proj;

    MultiheadAttention() = default;
    MultiheadAttention(std::int64_t embed, std::int64_t heads, Init o = {}) : embed_dim(embed), num_heads(heads), out_proj(embed, embed, true, Act::none, o) {
        if (heads <= 0 || embed % heads != 0)
            throw ShapeError("kiln::nn::MultiheadAttention: embed_dim " + std::to_string(embed) + " is not divisible by num_heads " +
                             std::to_string(heads));
        const double bound = std::sqrt(6.0 / static_cast<double>(4 * embed));  // xavier_uniform on (3E, E)
        in_proj_weight = detail::uniform({3 * embed, embed}, bound, o);
        in_proj_bias = zeros({3 * embed}, o.dtype, o.device);
    }

    /// x (B, S, E) -> (B, S, E); mask as in scaled_dot_product_attention, broadcast over (B, H, S, S).
    Tensor operator()(const Tensor& x, const Tensor& mask = {}, Loc loc = Loc::current()) const {
        if (x.rank() != 3 || x.size(2) != embed_dim)
            kiln::detail::fail<ShapeError>("MultiheadAttention", "input must be (batch, seq, " + std::to_string(embed_dim) +
                                                                     "), got " + x.shape().str(), loc);
        const std::int64_t B = x.size(0), S = x.size(1), H = num_heads, D = embed_dim / num_heads;
        const Tensor qkv = linear(x, in_proj_weight, in_proj_bias, Act::none, loc).reshape({B, S, 3, H, D}, loc);
        // (B, H, S, D) views of q, k and v
        const Tensor q = qkv.select(2, 0, loc).permute({0, 2, 1, 3}, loc);
        const Tensor k = qkv.select(2, 1, loc).permute({0, 2, 1, 3}, loc);
        const Tensor v = qkv.select(2, 2, loc).permute({0, 2, 1, 3}, loc);
        const Tensor a = scaled_dot_product_attention(q, k, v, mask, loc).permute({0, 2, 1, 3}, loc).reshape({B, S, embed_dim}, loc);
        return out_proj(a, loc);
    }
    template <class F> void visit(const std::string& prefix, F&& f) {
        f(prefix + "in_proj_weight", in_proj_weight);
        f(prefix + "in_proj_bias", in_proj_bias);
        out_proj.visit(prefix + "out_proj.", f);
    }
};

/// Linear -> GELU (tanh) -> Linear.
struct Mlp {
    Linear fc1, fc2;

    Mlp() = default;
    Mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, Init o = {})
        : fc1(in, hidden, true, Act::gelu_tanh, o), fc2(hidden, out, true, Act::none, o) {}
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const { return fc2(fc1(x, loc), loc); }
    template <class F> void visit(const std::string& prefix, F&& f) {
        fc1.visit(prefix + "fc1.", f);
        fc2.visit(prefix + "fc2.", f);
    }
};

/// A BERT-style (post-norm) encoder layer with torch.nn.TransformerEncoderLayer's parameter names
/// (batch_first, activation gelu with the tanh approximation):
///   h = norm1(x + self_attn(x)),  y = norm2(h + linear2(gelu(linear1(h)))).
struct BertLayer {
    MultiheadAttention self_attn;
    Linear linear1, linear2;
    LayerNorm norm1, norm2;
    Dropout dropout{};

    BertLayer() = default;
    BertLayer(std::int64_t hidden, std::int64_t heads, std::int64_t ffn, double eps = 1e-5, Init o = {})
        : self_attn(hidden, heads, o), linear1(hidden, ffn, true, Act::gelu_tanh, o), linear2(ffn, hidden, true, Act::none, o),
          norm1(hidden, eps, o), norm2(hidden, eps, o) {}

    Tensor operator()(const Tensor& x, const Tensor& mask = {}, Loc loc = Loc::current()) const {
        const Tensor h = norm1(x + dropout(self_attn(x, mask, loc)), loc);
        return norm2(h + dropout(linear2(linear1(h, loc), loc)), loc);
    }
    template <class F> void visit(const std::string& prefix, F&& f) {
        self_attn.visit(prefix + "self_attn.", f);
        linear1.visit(prefix + "linear1.", f);
        linear2.visit(prefix + "linear2.", f);
        norm1.visit(prefix + "norm1.", f);
        norm2.visit(prefix + "norm2.", f);
        dropout.visit(prefix + "dropout.", f);
    }
};

// ------------------------------------------------------------------ parameters of any module
/// name -> parameter (a handle sharing the module's memory), in the module's order.
template <class M> std::map<std::string, Tensor> state_dict(M& m) {
    std::map<std::string, Tensor> out;
    m.visit("", [&](const std::string& name, Tensor& t) { out.emplace(name, t); });
    return out;
}

/// Every parameter moved to `device` (or converted to `dtype`).
template <class M> M& to(M& m, Device device) {
    m.visit("", [&](const std::string&, Tensor& t) { t = t.to(device); });
    return m;
}
template <class M> M& to(M& m, DType dtype) {
    m.visit("", [&](const std::string&, Tensor& t) { t = t.to(dtype); });
    return m;
}

/// Replaces every parameter of m by the tensor of the same name in `params`, converted to the
/// parameter's dtype and device. Shapes must match; a missing name, and (when strict) a name m
/// does not have, is a ValueError listing them. BatchNorm's `num_batches_tracked` counters (in
/// torch state dicts, unused at inference) are ignored.
template <class M>
void load_state(M& m, const std::map<std::string, Tensor>& params, bool strict = true, Loc loc = Loc::current()) {
    std::vector<std::string> missing, seen;
    m.visit("", [&](const std::string& name, Tensor& t) {
        const auto it = params.find(name);
        if (it == params.end()) {
            missing.push_back(name);
            return;
        }
        seen.push_back(name);
        if (it->second.shape() != t.shape())
            kiln::detail::fail<ShapeError>("load_state", "parameter '" + name + "' has shape " + t.shape().str() +
                                                             " but the loaded tensor has shape " + it->second.shape().str(), loc);
        t = it->second.to(t.dtype(), loc).to(t.device(), loc);
    });
    std::string msg;
    if (!missing.empty()) {
        msg += "missing parameter(s):";
        for (const auto& n : missing) msg += " '" + n + "'";
    }
    if (strict) {
        std::string extra;
        for (const auto& [name, t] : params)
            if (std::find(seen.begin(), seen.end(), name) == seen.end() && !name.ends_with("num_batches_tracked"))
                extra += " '" + name + "'";
        if (!extra.empty()) msg += std::string(msg.empty() ? "" : "; ") + "unexpected parameter(s):" + extra;
    }
    if (!msg.empty()) kiln::detail::fail<ValueError>("load_state", msg, loc);
}

}  // namespace kiln::nn
