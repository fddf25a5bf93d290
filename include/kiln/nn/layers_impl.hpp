// nn/layers.hpp's definitions (compiled once in separate compilation), included by nn/layers.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/cuda/attention.hpp"
#include "kiln/backends/cuda/gather.hpp"
#include "kiln/backends/cuda/matmul.hpp"
#include "kiln/backends/cuda/rng.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::nn {
namespace detail {
KILN_DECL Tensor uniform(const Shape& s, double bound, const Init& o) {
    return Tensor((rand(s) * 2.0 - 1.0) * bound).to(o.dtype).to(o.device);
}

KILN_DECL Tensor add_act(const Tensor& y, const Tensor& b, Act act, const Loc& loc) { return apply_act(act, y + b, loc); }

KILN_DECL Tensor linear_expr(const Tensor& x, const Tensor& w, const Tensor& b, Act act, const Loc& loc) {
    const Tensor y = kiln::matmul(x, w.t(), loc);
    return b.defined() ? add_act(y, b, act, loc) : apply_act(act, y, loc);
}

}  // namespace detail
KILN_DECL Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Act act, Loc loc) {
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

KILN_DECL Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias, Act activation, Init o) : act(activation) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight = detail::uniform({out_features, in_features}, bound, o);
    if (with_bias) bias = detail::uniform({out_features}, bound, o);
}

KILN_DECL LayerNorm::LayerNorm(std::int64_t features, double epsilon, Init o) : eps(epsilon) {
    weight = ones({features}, o.dtype, o.device);
    bias = zeros({features}, o.dtype, o.device);
}

namespace detail {
KILN_DECL Tensor dropout_keep(const Tensor& like, double p, Generator& gen, const Loc& loc) {
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
KILN_DECL Tensor dropout(const Tensor& x, double p, bool training, Generator& gen, Loc loc) {
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

namespace detail {
KILN_DECL Tensor embedding_now(const Tensor& weight, const Tensor& ids_in, const Loc& loc) {
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

KILN_DECL std::shared_ptr<ir::CallOp> embedding_op(const Loc& loc) {
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

KILN_DECL void register_embedding() {
    ir::register_library_op("embedding", [](const ir::CallAttrs&) -> std::shared_ptr<const ir::CallOp> { return embedding_op(Loc::current()); });
}

}  // namespace detail
KILN_DECL Tensor embedding(const Tensor& weight, const Tensor& ids, Loc loc) {
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

KILN_DECL Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Init o)
    : weight(randn({num_embeddings, embedding_dim}).to(o.dtype).to(o.device)) {}

namespace detail {
KILN_DECL Tensor attention_decomposed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Loc& loc) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const Tensor scores = kiln::matmul(q, k.transpose(-2, -1), loc);
    Tensor p;
    if (!mask.defined()) p = softmax(scores * scale, -1, loc);
    else if (mask.dtype() == DType::boolean) p = softmax(where(mask, scores * scale, -INFINITY), -1, loc);
    else p = softmax(scores * scale + mask, -1, loc);
    return kiln::matmul(p.to(v.dtype(), loc), v, loc);
}

KILN_DECL bool fused_attention_on() {
    static const bool on = [] {
        const char* e = std::getenv("KILN_FUSED_ATTENTION");
        return !(e && std::string(e) == "0");
    }();
    return on;
}

KILN_DECL Tensor attention_now(const std::vector<Tensor>& in, const Loc& loc) {
    const Tensor mask = in.size() > 3 ? in[3] : Tensor();
    cuda::detail::AttentionSignature sig;
    if (cuda::detail::attention_signature(in[0], in[1], in[2], mask, sig))
        return cuda::detail::run_attention(sig, in[0], in[1], in[2], mask, 1.0 / std::sqrt(static_cast<double>(in[0].size(3))));
    return attention_decomposed(in[0], in[1], in[2], mask, loc).permute({0, 2, 1, 3}, loc).contiguous();
}

KILN_DECL std::shared_ptr<ir::CallOp> attention_op(const Loc& loc) {
    auto call = std::make_shared<ir::CallOp>();
    call->key = "attention";
    call->name = "attention";
    call->shape = [](const std::vector<Shape>& s) { return Shape{s[0][0], s[0][2], s[0][1], s[2][3]}; };
    call->run = [loc](const std::vector<Tensor>& in) { return attention_now(in, loc); };
    return call;
}

KILN_DECL void register_attention() {
    ir::register_library_op("attention", [](const ir::CallAttrs&) -> std::shared_ptr<const ir::CallOp> { return attention_op(Loc::current()); });
}
}  // namespace detail

KILN_DECL Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, Loc loc) {
    if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank() || q.size(-1) != k.size(-1) || k.size(-2) != v.size(-2))
        kiln::detail::fail<ShapeError>("scaled_dot_product_attention", "q " + q.shape().str() + ", k " + k.shape().str() +
                                                                           " and v " + v.shape().str() + " do not fit together", loc);
    // the library op "attention": on CUDA where its kernel takes the operands; on other devices
    // always (it decomposes there when it runs), so that a program traced on the CPU and run on
    // CUDA (a loaded program, an imported ONNX file) gets the kernel
    cuda::detail::AttentionSignature sig;
    if (detail::fused_attention_on() && !autograd::detail::needs_grad({&q, &k, &v, &mask}) &&
        (q.device().is_cuda() ? cuda::detail::attention_signature(q, k, v, mask, sig) : cuda::detail::attention_operands(q, k, v, mask))) {
        std::vector<Tensor> in{q, k, v};
        if (mask.defined()) in.push_back(mask);
        // (B, Sq, H, D) memory seen as (B, H, Sq, D)
        return trace::call_op(detail::attention_op(loc), in, q.dtype(), loc).permute({0, 2, 1, 3}, loc);
    }
    return detail::attention_decomposed(q, k, v, mask, loc);
}

KILN_DECL MultiheadAttention::MultiheadAttention(std::int64_t embed, std::int64_t heads, Init o)
    : embed_dim(embed), num_heads(heads), out_proj(embed, embed, true, Act::none, o) {
    if (heads <= 0 || embed % heads != 0)
        throw ShapeError("kiln::nn::MultiheadAttention: embed_dim " + std::to_string(embed) + " is not divisible by num_heads " +
                         std::to_string(heads));
    const double bound = std::sqrt(6.0 / static_cast<double>(4 * embed));  // xavier_uniform on (3E, E)
    in_proj_weight = detail::uniform({3 * embed, embed}, bound, o);
    in_proj_bias = zeros({3 * embed}, o.dtype, o.device);
}

KILN_DECL Tensor MultiheadAttention::operator()(const Tensor& x, const Tensor& mask, Loc loc) const {
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

KILN_DECL Mlp::Mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, Init o)
    : fc1(in, hidden, true, Act::gelu_tanh, o), fc2(hidden, out, true, Act::none, o) {}

KILN_DECL BertLayer::BertLayer(std::int64_t hidden, std::int64_t heads, std::int64_t ffn, double eps, Init o)
    : self_attn(hidden, heads, o), linear1(hidden, ffn, true, Act::gelu_tanh, o), linear2(ffn, hidden, true, Act::none, o),
      norm1(hidden, eps, o), norm2(hidden, eps, o) {}

KILN_DECL Tensor BertLayer::operator()(const Tensor& x, const Tensor& mask, Loc loc) const {
    const Tensor h = norm1(x + dropout(self_attn(x, mask, loc)), loc);
    return norm2(h + dropout(linear2(linear1(h, loc), loc)), loc);
}

}  // namespace kiln::nn
