// BertModel with Hugging Face's architecture and parameter names, built from a config.json and
// loaded from a model.safetensors (a Hugging Face folder, e.g. all-MiniLM-L6-v2 or
// bert-base-uncased), plus the sentence-embedding helpers (mean pooling, L2 normalization).
//
//   embeddings: word + position + token_type, LayerNorm       embeddings.{word,position,token_type}_embeddings, embeddings.LayerNorm
//   encoder.layer.N: attention.self.{query,key,value}, attention.output.{dense,LayerNorm},
//                    intermediate.dense (+ hidden_act), output.{dense,LayerNorm}   (post-norm)
//   pooler (optional): tanh(dense(h[:, 0]))                   pooler.dense
// The attention mask (batch, seq) of 1 for tokens and 0 for padding masks keys, as Hugging Face's
// extended attention mask does. Each module is a plain struct like those of nn/layers.hpp, so
// nn::state_dict, nn::load_state and nn::to work on it, and it runs eagerly, under kiln::compile
// and with mode reduce_overhead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/nn/layers.hpp"

namespace kiln::nn {

/// A BERT config.json's fields (Hugging Face's names and defaults: bert-base-uncased's).
struct BertConfig {
    std::int64_t vocab_size = 30522, hidden_size = 768, num_hidden_layers = 12, num_attention_heads = 12,
                 intermediate_size = 3072, max_position_embeddings = 512, type_vocab_size = 2, pad_token_id = 0;
    std::string hidden_act = "gelu";  ///< gelu (erf), gelu_new / gelu_pytorch_tanh (tanh approximation), relu
    double layer_norm_eps = 1e-12;

    /// Reads config.json; ValueError for a field of the wrong type, an unsupported hidden_act or
    /// position_embedding_type, a model_type other than bert, or sizes that do not fit together.
    KILN_DECL static BertConfig from_json(const std::filesystem::path& path, std::source_location loc = std::source_location::current());
    /// ValueError unless every size is positive and hidden_size divides into the heads.
    KILN_DECL void validate(std::source_location loc = std::source_location::current()) const;
    KILN_DECL Act act(std::source_location loc = std::source_location::current()) const;
};

struct BertEmbeddings {
    Embedding word_embeddings, position_embeddings, token_type_embeddings;
    LayerNorm layer_norm;  ///< "LayerNorm"

    template <class F> void visit(const std::string& p, F&& f) {
        word_embeddings.visit(p + "word_embeddings.", f);
        position_embeddings.visit(p + "position_embeddings.", f);
        token_type_embeddings.visit(p + "token_type_embeddings.", f);
        layer_norm.visit(p + "LayerNorm.", f);
    }
};

/// One encoder layer: self-attention, then the feed-forward block, each with a residual and a
/// LayerNorm after it.
struct BertEncoderLayer {
    std::int64_t num_heads = 12;
    Linear query, key, value;      ///< attention.self.*
    Linear attention_dense;        ///< attention.output.dense
    LayerNorm attention_norm;      ///< attention.output.LayerNorm
    Linear intermediate;           ///< intermediate.dense (with hidden_act)
    Linear output_dense;           ///< output.dense
    LayerNorm output_norm;         ///< output.LayerNorm
    /// query, key and value's weights and biases in one (3 hidden, hidden) and one (3 hidden)
    /// tensor, whose rows the three Linears' parameters are views of (pack() makes them): one GEMM
    /// instead of three. Not parameters of their own (state_dict names the three views).
    Tensor qkv_weight, qkv_bias;

    /// h (batch, seq, hidden) -> (batch, seq, hidden); key_mask: bool (batch, 1, 1, seq) or undefined.
    KILN_DECL Tensor operator()(const Tensor& h, const Tensor& key_mask = {}, std::source_location loc = std::source_location::current()) const;
    /// Puts query, key and value's parameters into qkv_weight / qkv_bias and makes them views of
    /// those. Writes into the views (copy_, load in place) keep them packed; rebinding one (nn::to,
    /// nn::load_state) unpacks it, and the layer then runs three GEMMs (the same result) until
    /// pack() is called again.
    KILN_DECL void pack();
    /// Whether the three Linears are still views of qkv_weight / qkv_bias.
    KILN_DECL bool packed() const;
    template <class F> void visit(const std::string& p, F&& f) {
        query.visit(p + "attention.self.query.", f);
        key.visit(p + "attention.self.key.", f);
        value.visit(p + "attention.self.value.", f);
        attention_dense.visit(p + "attention.output.dense.", f);
        attention_norm.visit(p + "attention.output.LayerNorm.", f);
        intermediate.visit(p + "intermediate.dense.", f);
        output_dense.visit(p + "output.dense.", f);
        output_norm.visit(p + "output.LayerNorm.", f);
    }
};

/// What BertModel returns: the last layer's hidden states (batch, seq, hidden) and, with a
/// pooler, tanh(dense(hidden[:, 0])) (batch, hidden).
struct BertModelOutput {
    Tensor last_hidden_state, pooler_output;
};

/// How from_pretrained builds the model.
struct BertLoadOptions {
    DType dtype = DType::f32;          ///< parameters converted to this (f32, bf16, f16)
    Device device = Device::cpu();
    std::optional<bool> add_pooling_layer = std::nullopt;  ///< unset: when the weights have one
};

struct BertModel {
    BertConfig config;
    BertEmbeddings embeddings;
    std::vector<BertEncoderLayer> layers;  ///< "encoder.layer.N"
    std::optional<Linear> pooler;     ///< "pooler.dense"

    BertModel() = default;
    /// Random weights (N(0, 0.02) as BertPreTrainedModel initializes them, LayerNorm 1 and 0).
    KILN_DECL explicit BertModel(const BertConfig& config, bool add_pooling_layer = true, Init o = {},
                                 std::source_location loc = std::source_location::current());

    /// A Hugging Face folder: config.json and model.safetensors. Loading is strict: a missing,
    /// unexpected or mis-shaped weight is a ValueError / ShapeError naming it. Names may carry
    /// the "bert." prefix of checkpoints with heads; the heads ("cls.*") and the
    /// "embeddings.position_ids" buffer are skipped, as transformers does.
    KILN_DECL static BertModel from_pretrained(const std::filesystem::path& folder, const BertLoadOptions& options = {},
                                               std::source_location loc = std::source_location::current());

    /// input_ids (batch, seq) int32/int64; attention_mask (batch, seq), 1 for tokens and 0 for
    /// padding (any dtype; undefined: no padding); token_type_ids (batch, seq) (undefined: 0).
    KILN_DECL BertModelOutput operator()(const Tensor& input_ids, const Tensor& attention_mask = {}, const Tensor& token_type_ids = {},
                                         std::source_location loc = std::source_location::current()) const;

    /// BertEncoderLayer::pack() for every layer (from_pretrained and the constructor do it; again
    /// after nn::to or nn::load_state, which unpack).
    KILN_DECL void pack();

    template <class F> void visit(const std::string& p, F&& f) {
        embeddings.visit(p + "embeddings.", f);
        for (std::size_t i = 0; i < layers.size(); ++i) layers[i].visit(p + "encoder.layer." + std::to_string(i) + ".", f);
        if (pooler) pooler->visit(p + "pooler.dense.", f);
    }
};

/// Mean of the hidden states (batch, seq, hidden) over the tokens the mask (batch, seq) keeps:
/// sentence-transformers' mean pooling. (batch, hidden), in f32 for f32/bf16/f16 inputs' sums.
KILN_DECL Tensor mean_pooling(const Tensor& hidden, const Tensor& attention_mask, std::source_location loc = std::source_location::current());
/// x / max(||x||_2, eps) over the last dim (torch.nn.functional.normalize).
KILN_DECL Tensor l2_normalize(const Tensor& x, double eps = 1e-12, std::source_location loc = std::source_location::current());

}  // namespace kiln::nn

#if KILN_HEADER_ONLY
#include "kiln/nn/bert_impl.hpp"
#endif
