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
#include <map>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ir/library_ops.hpp"
#include "kiln/ops/composites.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/reductions.hpp"
#include "kiln/ops/shape_ops.hpp"

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
KILN_DECL Tensor uniform(const Shape& s, double bound, const Init& o);

/// act(y + b) (b broadcast against y) as one expression statement.
KILN_DECL Tensor add_act(const Tensor& y, const Tensor& b, Act act, const Loc& loc);

/// act(x @ w^T + b) as an expression statement (the CPU, and every traced call: the fuser hands
/// bias and activation to cuBLASLt where it can).
KILN_DECL Tensor linear_expr(const Tensor& x, const Tensor& w, const Tensor& b, Act act, const Loc& loc);

}  // namespace detail

/// act(x @ weight^T + bias), weight (out, in) as torch lays it out. On a CUDA device outside
/// kiln::compile this is one cuBLASLt call with the bias and activation as its epilogue.
KILN_DECL Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Act act = Act::none,
                       Loc loc = Loc::current());

/// y = act(x W^T + b).
struct Linear {
    Tensor weight;  ///< (out_features, in_features)
    Tensor bias;    ///< (out_features), or undefined
    Act act = Act::none;

    Linear() = default;
    Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias = true, Act activation = Act::none, Init o = {});
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
    explicit LayerNorm(std::int64_t features, double epsilon = 1e-5, Init o = {});
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
KILN_DECL Tensor dropout_keep(const Tensor& like, double p, Generator& gen, const Loc& loc);
}  // namespace detail

/// torch.nn.functional.dropout: in training, each element is zeroed with probability p and the rest
/// scaled by 1 / (1 - p); otherwise x itself. The keep mask comes from Philox4x32-10 counters of
/// `gen` (kiln::philox4x32_10), so the same seed gives the same mask eagerly and under
/// kiln::compile, on any thread count. Under compile the mask is one library call in the graph,
/// drawn anew on each call (on CUDA also on each replay of a captured graph), and x * mask * scale
/// fuses with its neighbours; the gradient is g * mask * scale.
KILN_DECL Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator& gen = default_generator(),
                        Loc loc = Loc::current());

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
KILN_DECL Tensor embedding_now(const Tensor& weight, const Tensor& ids_in, const Loc& loc);
/// The library op of embedding (operands {weight, ids}).
KILN_DECL std::shared_ptr<ir::CallOp> embedding_op(const Loc& loc);
/// Registers embedding's library-op factory (called by export/program_file.hpp).
KILN_DECL void register_embedding();

/// scaled_dot_product_attention of concrete (B, H, Sq, D) operands {q, k, v[, mask]} as a (B, Sq, H,
/// D) contiguous tensor: one kernel on CUDA where cuda::detail::attention_signature takes them,
/// else the decomposition.
KILN_DECL Tensor attention_now(const std::vector<Tensor>& in, const Loc& loc);
/// The library op "attention" (operands {q, k, v} or {q, k, v, mask}; result (B, Sq, H, D)).
KILN_DECL std::shared_ptr<ir::CallOp> attention_op(const Loc& loc);
/// Registers attention's library-op factory (called by export/program_file.hpp).
KILN_DECL void register_attention();

}  // namespace detail

/// Rows of `weight` (num, dim) picked by integer `ids` of any shape: the result has shape
/// ids.shape + (dim). Every id must lie in [0, num) (ValueError otherwise; checked on the host,
/// which waits for the device when ids are on a GPU; replays of a captured CUDA graph do not
/// check). Under kiln::compile it is a library call inside the graph (no graph break).
KILN_DECL Tensor embedding(const Tensor& weight, const Tensor& ids, Loc loc = Loc::current());

/// A lookup table of num_embeddings rows of embedding_dim (torch.nn.Embedding, init N(0, 1)).
struct Embedding {
    Tensor weight;  ///< (num_embeddings, embedding_dim)

    Embedding() = default;
    Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Init o = {});
    Tensor operator()(const Tensor& ids, Loc loc = Loc::current()) const { return embedding(weight, ids, loc); }
    template <class F> void visit(const std::string& prefix, F&& f) { f(prefix + "weight", weight); }
};

/// softmax(q k^T * scale + mask) v over (..., S, D) operands, scale 1/sqrt(D). `mask` (optional)
/// broadcasts to the scores (..., S_q, S_k): a bool mask keeps the positions where it is true (like
/// torch's scaled_dot_product_attention), a float mask is added. (B, H, S, D) operands that need
/// no gradient are one library op, "attention" (as torch.export keeps SDPA one op), whose result is
/// a (B, H, Sq, D) view of (B, Sq, H, D) memory, so merging the heads after it copies nothing. On
/// CUDA it is one kernel for f32 (D <= 64, <= 64 keys), f16 and bf16 (D <= 128): scores and softmax
/// in f32, never in memory; traced on CUDA, operands the kernel does not take are decomposed in the
/// program; on other devices (or a CPU-traced program run on CUDA with such operands) the op runs
/// the decomposition when called. KILN_FUSED_ATTENTION=0 turns the op off. The decomposition: one
/// batched GEMM, one fused row kernel for the scaled, masked softmax, one batched GEMM.
KILN_DECL Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                                             Loc loc = Loc::current());

/// Multi-head self-attention over batch-first (B, S, E) inputs with torch.nn.MultiheadAttention's
/// parameters: in_proj (3E, E) packing q, k, v, and out_proj.
struct MultiheadAttention {
    std::int64_t embed_dim = 0, num_heads = 1;
    Tensor in_proj_weight, in_proj_bias;  ///< (3E, E), (3E)
    Linear out_proj;

    MultiheadAttention() = default;
    MultiheadAttention(std::int64_t embed, std::int64_t heads, Init o = {});

    /// x (B, S, E) -> (B, S, E); mask as in scaled_dot_product_attention, broadcast over (B, H, S, S).
    Tensor operator()(const Tensor& x, const Tensor& mask = {}, Loc loc = Loc::current()) const;
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
    Mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, Init o = {});
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
    BertLayer(std::int64_t hidden, std::int64_t heads, std::int64_t ffn, double eps = 1e-5, Init o = {});

    Tensor operator()(const Tensor& x, const Tensor& mask = {}, Loc loc = Loc::current()) const;
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

/// Every parameter moved to `device` (or converted to `dtype`), each in its memory order (a
/// convolution's channels-last weight stays channels-last).
template <class M> M& to(M& m, Device device) {
    m.visit("", [&](const std::string&, Tensor& t) { t = laid_out_like(t.to(device), t); });
    return m;
}
template <class M> M& to(M& m, DType dtype) {
    m.visit("", [&](const std::string&, Tensor& t) { t = laid_out_like(t.to(dtype), t); });
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
        t = laid_out_like(it->second.to(t.dtype(), loc).to(t.device(), loc), t, loc);
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

#if KILN_HEADER_ONLY
#include "kiln/nn/layers_impl.hpp"
#endif
