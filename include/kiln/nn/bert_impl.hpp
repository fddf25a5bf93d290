// BertModel's definitions (compiled once in separate compilation), included by nn/bert.hpp.
#pragma once

#include <array>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "kiln/nn/io.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::nn {

KILN_DECL BertConfig BertConfig::from_json(const std::filesystem::path& path, std::source_location loc) {
    constexpr std::string_view op = "BertConfig::from_json";
    const detail::JsonValue v = detail::read_json_file(op, path, loc);
    BertConfig c;
    using K = detail::JsonValue::Kind;
    const auto bad = [&](const std::string& key, const std::string& what) { detail::file_error<ValueError>(op, path, "\"" + key + "\" " + what, loc); };
    const std::pair<const char*, std::int64_t*> ints[] = {
        {"vocab_size", &c.vocab_size}, {"hidden_size", &c.hidden_size}, {"num_hidden_layers", &c.num_hidden_layers},
        {"num_attention_heads", &c.num_attention_heads}, {"intermediate_size", &c.intermediate_size},
        {"max_position_embeddings", &c.max_position_embeddings}, {"type_vocab_size", &c.type_vocab_size}};
    for (std::size_t i = 0; i < v.keys.size(); ++i) {
        const std::string& k = v.keys[i];
        const detail::JsonValue& x = v.items[i];
        bool known = false;
        for (const auto& [name, dst] : ints)
            if (k == name) {
                if (x.kind != K::number || !x.integer) bad(k, "must be an integer");
                *dst = *x.integer;
                known = true;
            }
        if (known) continue;
        if (k == "pad_token_id") {
            if (x.kind == K::number && x.integer) c.pad_token_id = *x.integer;
            else if (x.kind != K::null) bad(k, "must be an integer or null");
        } else if (k == "hidden_act") {
            if (x.kind != K::string) bad(k, "must be a string");
            c.hidden_act = x.text;
        } else if (k == "layer_norm_eps") {
            if (x.kind != K::number) bad(k, "must be a number");
            c.layer_norm_eps = std::stod(x.text);
        } else if (k == "model_type") {
            if (x.kind != K::string || x.text != "bert") bad(k, "is " + (x.kind == K::string ? "'" + x.text + "'" : std::string("not a string")) +
                                                                    ": kiln's BertModel reads BERT checkpoints only");
        } else if (k == "position_embedding_type") {
            if (x.kind != K::string || x.text != "absolute")
                bad(k, "is " + (x.kind == K::string ? "'" + x.text + "'" : std::string("not a string")) + ": only \"absolute\" is supported");
        }
    }
    try {
        c.validate(loc);
        (void)c.act(loc);
    } catch (const ValueError& e) {
        detail::file_error<ValueError>(op, path, e.what(), loc);
    }
    return c;
}

KILN_DECL void BertConfig::validate(std::source_location loc) const {
    const std::pair<const char*, std::int64_t> sizes[] = {
        {"vocab_size", vocab_size}, {"hidden_size", hidden_size}, {"num_hidden_layers", num_hidden_layers},
        {"num_attention_heads", num_attention_heads}, {"intermediate_size", intermediate_size},
        {"max_position_embeddings", max_position_embeddings}, {"type_vocab_size", type_vocab_size}};
    for (const auto& [name, value] : sizes)
        if (value <= 0) kiln::detail::fail<ValueError>("nn::BertConfig", std::string(name) + " must be positive, got " + std::to_string(value), loc);
    if (hidden_size % num_attention_heads != 0)
        kiln::detail::fail<ValueError>("nn::BertConfig", "hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_attention_heads " +
                                                             std::to_string(num_attention_heads), loc);
    if (!(layer_norm_eps > 0)) kiln::detail::fail<ValueError>("nn::BertConfig", "layer_norm_eps must be positive", loc);
}

KILN_DECL Act BertConfig::act(std::source_location loc) const {
    if (hidden_act == "gelu") return Act::gelu;
    if (hidden_act == "gelu_new" || hidden_act == "gelu_pytorch_tanh") return Act::gelu_tanh;
    if (hidden_act == "relu") return Act::relu;
    kiln::detail::fail<ValueError>("nn::BertConfig", "hidden_act '" + hidden_act +
                                                         "' is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)", loc);
}

namespace detail {

/// A BertModel with every parameter allocated (values random when `random`, else unset) on o.
inline BertModel bert_skeleton(BertModel m, bool add_pooling_layer, bool random, const Init& o) {
    const BertConfig& c = m.config;
    const auto param = [&](const Shape& s) {
        return random ? Tensor(randn(s) * 0.02).to(o.dtype).to(o.device) : Tensor(s, o.dtype, o.device);
    };
    const auto linear = [&](std::int64_t in, std::int64_t out, Act act = Act::none) {
        Linear l;
        l.weight = param({out, in});
        l.bias = random ? zeros({out}, o.dtype, o.device) : Tensor({out}, o.dtype, o.device);
        l.act = act;
        return l;
    };
    const auto norm = [&] { return LayerNorm(c.hidden_size, c.layer_norm_eps, o); };
    const auto table = [&](std::int64_t rows) {
        Embedding e;
        e.weight = param({rows, c.hidden_size});
        return e;
    };
    m.embeddings.word_embeddings = table(c.vocab_size);
    m.embeddings.position_embeddings = table(c.max_position_embeddings);
    m.embeddings.token_type_embeddings = table(c.type_vocab_size);
    m.embeddings.layer_norm = norm();
    const Act act = c.act();
    m.layers.clear();
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
        BertEncoderLayer l;
        l.num_heads = c.num_attention_heads;
        l.query = linear(c.hidden_size, c.hidden_size);
        l.key = linear(c.hidden_size, c.hidden_size);
        l.value = linear(c.hidden_size, c.hidden_size);
        l.attention_dense = linear(c.hidden_size, c.hidden_size);
        l.attention_norm = norm();
        l.intermediate = linear(c.hidden_size, c.intermediate_size, act);
        l.output_dense = linear(c.intermediate_size, c.hidden_size);
        l.output_norm = norm();
        m.layers.push_back(std::move(l));
    }
    if (add_pooling_layer) m.pooler = linear(c.hidden_size, c.hidden_size);
    else m.pooler.reset();
    return m;
}

}  // namespace detail

KILN_DECL BertModel::BertModel(const BertConfig& c, bool add_pooling_layer, Init o, std::source_location loc) {
    c.validate(loc);
    (void)c.act(loc);
    config = c;
    *this = detail::bert_skeleton(std::move(*this), add_pooling_layer, true, o);
    pack();
}

KILN_DECL BertModel BertModel::from_pretrained(const std::filesystem::path& folder, const BertLoadOptions& options, std::source_location loc) {
    namespace fs = std::filesystem;
    constexpr std::string_view op = "BertModel::from_pretrained";
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) detail::file_error<ValueError>(op, folder, "is not a folder (a Hugging Face model folder: config.json, model.safetensors)", loc);
    const fs::path weights = folder / "model.safetensors";
    if (!fs::exists(weights, ec))
        detail::file_error<ValueError>(op, folder, "has no model.safetensors (kiln reads safetensors; pytorch_model.bin is a pickle: convert it with "
                                                   "safetensors.torch.save_file(torch.load(...), 'model.safetensors'))", loc);
    if (options.dtype != DType::f32 && options.dtype != DType::bf16 && options.dtype != DType::f16)
        kiln::detail::fail<DTypeError>("nn::BertModel::from_pretrained", "dtype must be f32, bf16 or f16, got " + std::string(dtype_name(options.dtype)), loc);
    BertModel m;
    m.config = BertConfig::from_json(folder / "config.json", loc);
    std::map<std::string, Tensor> all = load_safetensors(weights, loc), params;
    // checkpoints with heads (BertForPreTraining, ...) keep the encoder under "bert."
    bool prefixed = false;
    for (const auto& kv : all) prefixed = prefixed || kv.first.starts_with("bert.");
    for (auto& [name, t] : all) {
        std::string n = name;
        if (prefixed) {
            if (n.starts_with("cls.")) continue;  // the pre-training / classification heads
            if (n.starts_with("bert.")) n = n.substr(5);
        }
        if (n == "embeddings.position_ids" || n == "embeddings.token_type_ids") continue;  // buffers some transformers versions saved
        params.emplace(std::move(n), std::move(t));
    }
    const bool pool = options.add_pooling_layer.value_or(params.count("pooler.dense.weight") != 0);
    if (!pool) {
        params.erase("pooler.dense.weight");
        params.erase("pooler.dense.bias");
    }
    m = detail::bert_skeleton(std::move(m), pool, false, Init{options.dtype, options.device});
    try {
        load_state(m, params, true, loc);
    } catch (const Error& e) {
        // name the file the weights came from
        if (dynamic_cast<const ShapeError*>(&e)) detail::file_error<ShapeError>(op, weights, e.what(), loc);
        detail::file_error<ValueError>(op, weights, e.what(), loc);
    }
    m.pack();
    return m;
}

KILN_DECL void BertEncoderLayer::pack() {
    const std::array<Linear*, 3> qkv{&query, &key, &value};
    for (const Linear* l : qkv)
        if (!l->weight.defined() || !l->bias.defined() || l->weight.is_traced() || l->weight.dtype() != query.weight.dtype() ||
            l->bias.dtype() != query.weight.dtype() || l->weight.device() != query.weight.device() || l->bias.device() != query.weight.device())
            return;  // nothing to pack, or parts that do not go together: three GEMMs
    qkv_weight = cat({query.weight, key.weight, value.weight}, 0);
    qkv_bias = cat({query.bias, key.bias, value.bias}, 0);
    const std::int64_t E = query.weight.size(0);
    for (std::int64_t k = 0; k < 3; ++k) {
        qkv[static_cast<std::size_t>(k)]->weight = qkv_weight.slice(0, k * E, (k + 1) * E);
        qkv[static_cast<std::size_t>(k)]->bias = qkv_bias.slice(0, k * E, (k + 1) * E);
    }
}

KILN_DECL bool BertEncoderLayer::packed() const {
    if (!qkv_weight.defined() || !qkv_bias.defined() || qkv_weight.is_traced() || qkv_bias.is_traced()) return false;
    const std::int64_t E = qkv_weight.size(0) / 3;
    const auto rows_of = [&](const Tensor& part, const Tensor& whole, std::int64_t k) {
        // part is rows [k E, (k + 1) E) of whole, in whole's memory
        if (!part.defined() || part.is_traced() || part.storage() != whole.storage() || part.dtype() != whole.dtype()) return false;
        const std::int64_t row = whole.rank() == 2 ? whole.size(1) : 1;
        return part.offset() == whole.offset() + k * E * row && part.strides() == whole.strides() && part.size(0) == E;
    };
    const std::array<const Linear*, 3> qkv{&query, &key, &value};
    for (std::int64_t k = 0; k < 3; ++k)
        if (!rows_of(qkv[static_cast<std::size_t>(k)]->weight, qkv_weight, k) || !rows_of(qkv[static_cast<std::size_t>(k)]->bias, qkv_bias, k))
            return false;
    return qkv_weight.is_contiguous() && qkv_bias.is_contiguous();
}

KILN_DECL void BertModel::pack() {
    for (BertEncoderLayer& l : layers) l.pack();
}

KILN_DECL Tensor BertEncoderLayer::operator()(const Tensor& h, const Tensor& key_mask, std::source_location loc) const {
    const std::int64_t B = h.size(0), S = h.size(1), H = h.size(2), D = H / num_heads;
    Tensor q, k, v;
    if (packed()) {  // one GEMM for the three projections; (B, H, S, D) views of its result
        const Tensor qkv = linear(h, qkv_weight, qkv_bias, Act::none, loc).view({B, S, 3, num_heads, D}, loc);
        q = qkv.select(2, 0, loc).permute({0, 2, 1, 3}, loc);
        k = qkv.select(2, 1, loc).permute({0, 2, 1, 3}, loc);
        v = qkv.select(2, 2, loc).permute({0, 2, 1, 3}, loc);
    } else {
        const auto heads = [&](const Linear& l) { return l(h, loc).view({B, S, num_heads, D}, loc).permute({0, 2, 1, 3}, loc); };
        q = heads(query);
        k = heads(key);
        v = heads(value);
    }
    const Tensor ctx = scaled_dot_product_attention(q, k, v, key_mask, loc).permute({0, 2, 1, 3}, loc).reshape({B, S, H}, loc);
    const Tensor a = attention_norm(attention_dense(ctx, loc) + h, loc);
    return output_norm(output_dense(intermediate(a, loc), loc) + a, loc);
}

KILN_DECL BertModelOutput BertModel::operator()(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& token_type_ids,
                                                std::source_location loc) const {
    constexpr std::string_view op = "nn::BertModel";
    if (layers.empty() && !embeddings.word_embeddings.weight.defined())
        kiln::detail::fail<ValueError>(op, "the model has no weights (default-constructed; use from_pretrained or BertModel(config))", loc);
    if (input_ids.rank() != 2)
        kiln::detail::fail<ShapeError>(op, "input_ids must be (batch, seq), got " + input_ids.shape().str(), loc);
    const std::int64_t B = input_ids.size(0), S = input_ids.size(1);
    if (S > config.max_position_embeddings)
        kiln::detail::fail<ValueError>(op, "a sequence of " + std::to_string(S) + " tokens is longer than max_position_embeddings " +
                                               std::to_string(config.max_position_embeddings) + " (truncate it)", loc);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"attention_mask", &attention_mask}, {"token_type_ids", &token_type_ids}})
        if (t->defined() && t->shape() != input_ids.shape())
            kiln::detail::fail<ShapeError>(op, std::string(name) + " has shape " + t->shape().str() + " but input_ids " + input_ids.shape().str(), loc);
    const BertEmbeddings& e = embeddings;
    const Tensor words = e.word_embeddings(input_ids, loc);
    const Tensor pos = e.position_embeddings.weight.slice(0, 0, S, 1, loc);
    const Tensor types = token_type_ids.defined() ? e.token_type_embeddings(token_type_ids, loc) : e.token_type_embeddings.weight.select(0, 0, loc);
    Tensor h = e.layer_norm(words + pos + types, loc);
    Tensor key_mask;
    if (attention_mask.defined()) key_mask = Tensor(attention_mask != 0, loc).reshape({B, 1, 1, S}, loc);
    for (const BertEncoderLayer& l : layers) h = l(h, key_mask, loc);
    BertModelOutput out{h, {}};
    if (pooler) out.pooler_output = Tensor(kiln::tanh((*pooler)(h.select(1, 0, loc), loc)), loc);
    return out;
}

KILN_DECL Tensor mean_pooling(const Tensor& hidden, const Tensor& attention_mask, std::source_location loc) {
    if (hidden.rank() != 3 || attention_mask.rank() != 2 || attention_mask.size(0) != hidden.size(0) || attention_mask.size(1) != hidden.size(1))
        kiln::detail::fail<ShapeError>("nn::mean_pooling", "hidden states " + hidden.shape().str() + " and attention mask " +
                                                               attention_mask.shape().str() + " must be (batch, seq, hidden) and (batch, seq)", loc);
    const Tensor m = attention_mask.to(DType::f32, loc).unsqueeze(-1, loc);  // (B, S, 1)
    const Tensor total = sum(hidden * m, {1}, false, loc);                     // (B, H)
    const Tensor count = sum(m, {1}, false, loc);                              // (B, 1)
    return Tensor(total / maximum(count, 1e-9), loc);
}

KILN_DECL Tensor l2_normalize(const Tensor& x, double eps, std::source_location loc) {
    const Tensor ss = sum(x * x, {-1}, true, loc);
    return Tensor(x / maximum(sqrt(ss), eps), loc);
}

}  // namespace kiln::nn
