// BertTokenizer: text to BERT's token ids, matching Hugging Face's BertTokenizer (transformers 5,
// the Rust `tokenizers` pipeline) token for token.
//
//   text -> special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) matched as written
//        -> normalizer: drop NUL, U+FFFD and control characters (Cc, Cf, Co; not \t \n \r), turn
//           whitespace (Unicode White_Space) into spaces, put spaces around CJK ideographs,
//           strip accents (NFD, then drop nonspacing marks; by default when lower-casing),
//           lower-case (a code point at a time)
//        -> pre-tokenizer: split on whitespace, and punctuation (ASCII or Unicode P*) as its own word
//        -> WordPiece: the longest vocabulary prefix first, "##" on continuations; a word with a
//           piece not in the vocabulary, or over 100 code points, is [UNK]
//        -> [CLS] A [SEP] (B [SEP]), token type 0 for A, 1 for B; truncation (longest first, as
//           the Rust library splits it) and padding to the longest or to max_length.
// Unicode classes and mappings come from include/kiln/nn/unicode_data.hpp, generated from
// Python's unicodedata (tools/gen_unicode_data.py). Text must be valid UTF-8 (ValueError
// otherwise, naming the byte). Not done: NFC composition of decomposed input when neither
// lower-casing nor stripping accents (cased vocabularies with combining characters).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::nn {

/// BertTokenizer's settings, with Hugging Face's names (tokenizer_config.json).
struct BertTokenizerOptions {
    bool do_lower_case = true;
    std::optional<bool> strip_accents;  ///< unset: strip when lower-casing (as BERT does)
    bool tokenize_chinese_chars = true;
    std::int64_t model_max_length = 512;
    std::string unk_token = "[UNK]", sep_token = "[SEP]", pad_token = "[PAD]", cls_token = "[CLS]", mask_token = "[MASK]";
};

/// Padding of a batch: none (every sequence must then have the same length), to the longest in
/// the batch, or to max_length.
enum class Padding : std::uint8_t { none, longest, max_length };

/// How BertTokenizer::operator() builds a batch (Hugging Face's arguments of the same names).
struct EncodeOptions {
    bool add_special_tokens = true;
    Padding padding = Padding::longest;
    bool truncation = true;        ///< cut to max_length (pairs: the longer one first)
    std::int64_t max_length = 0;   ///< 0: the tokenizer's model_max_length
};

/// A batch of encoded texts: (batch, seq) int64 tensors on the CPU, as return_tensors="pt" gives.
struct BatchEncoding {
    Tensor input_ids, attention_mask, token_type_ids;
};

class BertTokenizer {
public:
    BertTokenizer() = default;
    /// vocab[i] is token id i.
    KILN_DECL explicit BertTokenizer(std::vector<std::string> vocab, BertTokenizerOptions options = {},
                                     std::source_location loc = std::source_location::current());
    /// From a vocab.txt (one token per line; its line number is its id).
    KILN_DECL static BertTokenizer from_file(const std::filesystem::path& vocab_txt, BertTokenizerOptions options = {},
                                             std::source_location loc = std::source_location::current());
    /// From a Hugging Face folder: vocab.txt, and tokenizer_config.json when present (do_lower_case,
    /// strip_accents, tokenize_chinese_chars, model_max_length and the special tokens).
    KILN_DECL static BertTokenizer from_pretrained(const std::filesystem::path& folder,
                                                   std::source_location loc = std::source_location::current());

    /// The word pieces of `text`, without [CLS] / [SEP].
    KILN_DECL std::vector<std::string> tokenize(std::string_view text, std::source_location loc = std::source_location::current()) const;
    /// Token ids of one text (or a pair), with [CLS] and [SEP] unless add_special_tokens is false;
    /// not truncated.
    KILN_DECL std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens = true,
                                               std::source_location loc = std::source_location::current()) const;
    KILN_DECL std::vector<std::int64_t> encode(std::string_view text, std::string_view pair, bool add_special_tokens = true,
                                               std::source_location loc = std::source_location::current()) const;
    /// A batch: input_ids, attention_mask and token_type_ids of shape (texts, seq).
    KILN_DECL BatchEncoding operator()(const std::vector<std::string>& texts, const EncodeOptions& options = {},
                                       std::source_location loc = std::source_location::current()) const;
    /// A batch of sentence pairs (texts[i], pairs[i]).
    KILN_DECL BatchEncoding operator()(const std::vector<std::string>& texts, const std::vector<std::string>& pairs,
                                       const EncodeOptions& options = {},
                                       std::source_location loc = std::source_location::current()) const;
    /// Ids back to text: pieces joined, "##" continuations glued, spaces before punctuation
    /// removed (Hugging Face's WordPiece decoder with cleanup).
    KILN_DECL std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = true,
                                 std::source_location loc = std::source_location::current()) const;

    /// The id of `token`, or nothing when it is not in the vocabulary.
    KILN_DECL std::optional<std::int64_t> token_to_id(std::string_view token) const;
    KILN_DECL const std::string& id_to_token(std::int64_t id, std::source_location loc = std::source_location::current()) const;
    std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocab_.size()); }
    const BertTokenizerOptions& options() const { return options_; }
    std::int64_t cls_id() const { return cls_; }
    std::int64_t sep_id() const { return sep_; }
    std::int64_t pad_id() const { return pad_; }
    std::int64_t unk_id() const { return unk_; }

private:
    KILN_DECL std::vector<std::int64_t> ids_of(std::string_view text, const std::source_location& loc) const;
    KILN_DECL BatchEncoding batch(const std::vector<std::string>& texts, const std::vector<std::string>* pairs,
                                  const EncodeOptions& options, const std::source_location& loc) const;

    std::vector<std::string> vocab_;
    std::unordered_map<std::string, std::int64_t> ids_;
    BertTokenizerOptions options_;
    std::int64_t unk_ = -1, cls_ = -1, sep_ = -1, pad_ = -1;
};

}  // namespace kiln::nn

#if KILN_HEADER_ONLY
#include "kiln/nn/tokenizer_impl.hpp"
#endif
