// BertTokenizer's definitions (compiled once in separate compilation), included by nn/tokenizer.hpp.
#pragma once

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "kiln/nn/io.hpp"
#include "kiln/nn/unicode_data.hpp"

namespace kiln::nn::detail::text {

/// The unicode_data classes of c (control, punctuation, nonspacing_mark bits).
inline std::uint8_t classes(char32_t c) {
    const auto& r = unicode::ranges;
    const auto* it = std::upper_bound(std::begin(r), std::end(r), c, [](char32_t v, const unicode::Range& x) { return v < x.lo; });
    if (it == std::begin(r)) return 0;
    --it;
    return c <= it->hi ? it->flags : 0;
}

/// Unicode's White_Space property (Rust's char::is_whitespace, which the Rust tokenizer uses).
inline bool is_whitespace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
inline bool is_control(char32_t c) { return c != '\t' && c != '\n' && c != '\r' && (classes(c) & unicode::control); }
inline bool is_punctuation(char32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
           (classes(c) & unicode::punctuation);
}
/// The CJK Unified Ideographs blocks BERT puts spaces around (not Hiragana, Katakana or Hangul).
inline bool is_cjk(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/// Appends table's mapping of c to out, or returns false when c has none.
template <std::size_t N>
bool append_mapped(const unicode::Mapping (&table)[N], char32_t c, std::u32string& out) {
    const auto* it = std::lower_bound(table, table + N, c, [](const unicode::Mapping& m, char32_t v) { return m.cp < v; });
    if (it == table + N || it->cp != c) return false;
    out.append(unicode::pool + it->offset, it->length);
    return true;
}

using nn::detail::append_utf8;

/// The code points of UTF-8 text; ValueError naming the first invalid byte.
inline std::u32string decode_utf8(std::string_view s, std::string_view op, const std::source_location& loc) {
    std::u32string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = nn::detail::utf8_sequence_length(s, i);
        if (n == 0)
            kiln::detail::fail<ValueError>(op, "the text is not valid UTF-8: " + nn::detail::describe_byte(s, i) + " at byte " +
                                                   std::to_string(i) + " of " + nn::detail::excerpt(s, 60), loc);
        const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
        char32_t c = n == 1 ? b(0) : n == 2 ? b(0) & 0x1F : n == 3 ? b(0) & 0x0F : b(0) & 0x07;
        for (std::size_t k = 1; k < n; ++k) c = (c << 6) | (b(k) & 0x3F);
        out += c;
        i += n;
    }
    return out;
}

/// The normalizer: clean, space CJK ideographs, strip accents, lower-case (in Rust's order).
inline std::u32string normalize(const std::u32string& in, const BertTokenizerOptions& o) {
    std::u32string a;
    a.reserve(in.size());
    for (char32_t c : in) {
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) c = ' ';
        if (o.tokenize_chinese_chars && is_cjk(c)) {
            a += ' ';
            a += c;
            a += ' ';
        } else a += c;
    }
    if (o.strip_accents.value_or(o.do_lower_case)) {
        std::u32string b;
        b.reserve(a.size());
        for (char32_t c : a) {
            if (c >= 0xAC00 && c <= 0xD7A3) {  // a Hangul syllable: leading consonant, vowel, trailing consonant
                const char32_t s = c - 0xAC00;
                b += static_cast<char32_t>(0x1100 + s / (21 * 28));
                b += static_cast<char32_t>(0x1161 + (s % (21 * 28)) / 28);
                if (s % 28) b += static_cast<char32_t>(0x11A7 + s % 28);
            } else if (!append_mapped(unicode::strip_accents, c, b) && !(classes(c) & unicode::nonspacing_mark)) {
                b += c;
            }
        }
        a = std::move(b);
    }
    if (o.do_lower_case) {
        std::u32string b;
        b.reserve(a.size());
        for (char32_t c : a)
            if (!append_mapped(unicode::lower, c, b)) b += c;
        a = std::move(b);
    }
    return a;
}

/// The pre-tokenizer: words split on whitespace, each punctuation character a word of its own.
inline std::vector<std::u32string> split_words(const std::u32string& s) {
    std::vector<std::u32string> words;
    std::u32string cur;
    const auto flush = [&] {
        if (!cur.empty()) words.push_back(std::move(cur));
        cur.clear();
    };
    for (char32_t c : s) {
        if (is_whitespace(c)) flush();
        else if (is_punctuation(c)) {
            flush();
            words.emplace_back(1, c);
        } else cur += c;
    }
    flush();
    return words;
}

/// A tokenizer_config.json value that may be a string or {"content": "..."} (newer files).
inline std::optional<std::string> token_text(const JsonValue& v) {
    if (v.kind == JsonValue::Kind::string) return v.text;
    if (v.kind == JsonValue::Kind::object)
        for (std::size_t i = 0; i < v.keys.size(); ++i)
            if (v.keys[i] == "content" && v.items[i].kind == JsonValue::Kind::string) return v.items[i].text;
    return std::nullopt;
}

}  // namespace kiln::nn::detail::text

namespace kiln::nn {

KILN_DECL BertTokenizer::BertTokenizer(std::vector<std::string> vocab, BertTokenizerOptions options, std::source_location loc)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
    ids_.reserve(vocab_.size());
    for (std::size_t i = 0; i < vocab_.size(); ++i) ids_[vocab_[i]] = static_cast<std::int64_t>(i);  // a repeated token: its last line
    const auto special = [&](const std::string& name, const std::string& token) {
        const auto it = ids_.find(token);
        if (it == ids_.end())
            kiln::detail::fail<ValueError>("nn::BertTokenizer", "the vocabulary (" + std::to_string(vocab_.size()) +
                                                                    " tokens) has no " + name + " token '" + token + "'", loc);
        return it->second;
    };
    unk_ = special("unknown", options_.unk_token);
    cls_ = special("classifier", options_.cls_token);
    sep_ = special("separator", options_.sep_token);
    pad_ = special("padding", options_.pad_token);
    if (options_.model_max_length <= 0)
        kiln::detail::fail<ValueError>("nn::BertTokenizer", "model_max_length must be positive, got " +
                                                                std::to_string(options_.model_max_length), loc);
}

KILN_DECL BertTokenizer BertTokenizer::from_file(const std::filesystem::path& vocab_txt, BertTokenizerOptions options,
                                                 std::source_location loc) {
    detail::InFile f("BertTokenizer::from_file", vocab_txt, loc);
    const std::string text = f.read_string(0, f.size(), "the vocabulary");
    if (!detail::valid_utf8(text)) f.fail<ValueError>("is not valid UTF-8 text");
    std::vector<std::string> vocab;
    for (std::size_t i = 0; i < text.size();) {
        std::size_t e = text.find('\n', i);
        if (e == std::string::npos) e = text.size();
        std::string line = text.substr(i, e - i);
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
        vocab.push_back(std::move(line));
        i = e + 1;
    }
    if (vocab.empty()) f.fail<ValueError>("holds no tokens");
    return BertTokenizer(std::move(vocab), std::move(options), loc);
}

KILN_DECL BertTokenizer BertTokenizer::from_pretrained(const std::filesystem::path& folder, std::source_location loc) {
    namespace fs = std::filesystem;
    BertTokenizerOptions o;
    const fs::path config = folder / "tokenizer_config.json";
    std::error_code ec;
    if (fs::exists(config, ec)) {
        const detail::JsonValue v = detail::read_json_file("BertTokenizer::from_pretrained", config, loc);
        const auto bad = [&](const std::string& key, const char* want) {
            detail::file_error<ValueError>("BertTokenizer::from_pretrained", config, "\"" + key + "\" must be " + want, loc);
        };
        for (std::size_t i = 0; i < v.keys.size(); ++i) {
            const std::string& k = v.keys[i];
            const detail::JsonValue& x = v.items[i];
            using K = detail::JsonValue::Kind;
            if (k == "do_lower_case") {
                if (x.kind != K::boolean) bad(k, "true or false");
                o.do_lower_case = x.boolean;
            } else if (k == "tokenize_chinese_chars") {
                if (x.kind != K::boolean) bad(k, "true or false");
                o.tokenize_chinese_chars = x.boolean;
            } else if (k == "strip_accents") {
                if (x.kind == K::boolean) o.strip_accents = x.boolean;
                else if (x.kind != K::null) bad(k, "true, false or null");
            } else if (k == "model_max_length") {
                if (x.kind != K::number) bad(k, "a number");
                // transformers writes a huge float (1e30) for "no limit"
                o.model_max_length = x.integer && *x.integer > 0 ? *x.integer : std::numeric_limits<std::int64_t>::max();
            } else if (k == "unk_token" || k == "sep_token" || k == "pad_token" || k == "cls_token" || k == "mask_token") {
                const auto t = detail::text::token_text(x);
                if (!t) bad(k, "a string");
                (k == "unk_token" ? o.unk_token : k == "sep_token" ? o.sep_token : k == "pad_token" ? o.pad_token
                                                 : k == "cls_token" ? o.cls_token : o.mask_token) = *t;
            }
        }
    }
    return from_file(folder / "vocab.txt", std::move(o), loc);
}

KILN_DECL std::optional<std::int64_t> BertTokenizer::token_to_id(std::string_view token) const {
    const auto it = ids_.find(std::string(token));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
}

KILN_DECL const std::string& BertTokenizer::id_to_token(std::int64_t id, std::source_location loc) const {
    if (id < 0 || id >= vocab_size())
        kiln::detail::fail<ValueError>("nn::BertTokenizer::id_to_token", "id " + std::to_string(id) +
                                                                             " is outside the vocabulary of " +
                                                                             std::to_string(vocab_size()) + " tokens", loc);
    return vocab_[static_cast<std::size_t>(id)];
}

KILN_DECL std::vector<std::int64_t> BertTokenizer::ids_of(std::string_view text_in, const std::source_location& loc) const {
    if (vocab_.empty()) kiln::detail::fail<ValueError>("nn::BertTokenizer", "the tokenizer has no vocabulary (default-constructed)", loc);
    const std::u32string text = detail::text::decode_utf8(text_in, "nn::BertTokenizer", loc);
    // special tokens, matched as written, split the text into segments
    std::vector<std::pair<std::u32string, std::int64_t>> specials;
    for (const std::string* t : {&options_.cls_token, &options_.sep_token, &options_.pad_token, &options_.unk_token, &options_.mask_token})
        if (const auto id = token_to_id(*t); id && !t->empty()) specials.emplace_back(detail::text::decode_utf8(*t, "nn::BertTokenizer", loc), *id);
    std::vector<std::int64_t> ids;
    const auto run = [&](const std::u32string& segment) {
        for (const std::u32string& w : detail::text::split_words(detail::text::normalize(segment, options_))) {
            constexpr std::size_t max_chars = 100;
            if (w.size() > max_chars) {
                ids.push_back(unk_);
                continue;
            }
            // the longest vocabulary prefix first; "##" marks a continuation
            std::vector<std::int64_t> pieces;
            std::size_t start = 0;
            bool bad = false;
            while (start < w.size()) {
                std::optional<std::int64_t> found;
                std::size_t end = w.size();
                for (; end > start; --end) {
                    std::string sub = start > 0 ? "##" : "";
                    for (std::size_t k = start; k < end; ++k) detail::text::append_utf8(sub, w[k]);
                    if ((found = token_to_id(sub))) break;
                }
                if (!found) {
                    bad = true;
                    break;
                }
                pieces.push_back(*found);
                start = end;
            }
            if (bad) ids.push_back(unk_);
            else ids.insert(ids.end(), pieces.begin(), pieces.end());
        }
    };
    std::size_t seg = 0;
    for (std::size_t i = 0; i < text.size();) {
        const auto sp = std::find_if(specials.begin(), specials.end(), [&](const auto& s) { return text.compare(i, s.first.size(), s.first) == 0; });
        if (sp == specials.end()) {
            ++i;
            continue;
        }
        run(text.substr(seg, i - seg));
        ids.push_back(sp->second);
        i += sp->first.size();
        seg = i;
    }
    run(text.substr(seg));
    return ids;
}

KILN_DECL std::vector<std::string> BertTokenizer::tokenize(std::string_view text, std::source_location loc) const {
    std::vector<std::string> out;
    for (std::int64_t id : ids_of(text, loc)) out.push_back(vocab_[static_cast<std::size_t>(id)]);
    return out;
}

KILN_DECL std::vector<std::int64_t> BertTokenizer::encode(std::string_view text, bool add_special_tokens, std::source_location loc) const {
    std::vector<std::int64_t> a = ids_of(text, loc);
    if (!add_special_tokens) return a;
    a.insert(a.begin(), cls_);
    a.push_back(sep_);
    return a;
}

KILN_DECL std::vector<std::int64_t> BertTokenizer::encode(std::string_view text, std::string_view pair, bool add_special_tokens,
                                                          std::source_location loc) const {
    std::vector<std::int64_t> a = encode(text, add_special_tokens, loc), b = ids_of(pair, loc);
    a.insert(a.end(), b.begin(), b.end());
    if (add_special_tokens) a.push_back(sep_);
    return a;
}

KILN_DECL BatchEncoding BertTokenizer::batch(const std::vector<std::string>& texts, const std::vector<std::string>* pairs,
                                             const EncodeOptions& o, const std::source_location& loc) const {
    constexpr std::string_view op = "nn::BertTokenizer";
    if (pairs && pairs->size() != texts.size())
        kiln::detail::fail<ValueError>(op, std::to_string(texts.size()) + " texts but " + std::to_string(pairs->size()) + " pairs", loc);
    if (o.max_length < 0) kiln::detail::fail<ValueError>(op, "max_length must not be negative, got " + std::to_string(o.max_length), loc);
    const std::int64_t max_len = o.max_length > 0 ? o.max_length : options_.model_max_length;
    const std::size_t specials = o.add_special_tokens ? (pairs ? 3 : 2) : 0;
    if (o.truncation && max_len < static_cast<std::int64_t>(specials))
        kiln::detail::fail<ValueError>(op, "max_length " + std::to_string(max_len) + " leaves no room for the " +
                                               std::to_string(specials) + " special tokens", loc);
    std::vector<std::vector<std::int64_t>> ids(texts.size()), types(texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) {
        std::vector<std::int64_t> a = ids_of(texts[i], loc), b;
        if (pairs) b = ids_of((*pairs)[i], loc);
        if (o.truncation) {
            const std::size_t target = static_cast<std::size_t>(std::min<std::int64_t>(max_len, std::numeric_limits<std::int32_t>::max())) - specials;
            if (!pairs) {
                if (a.size() > target) a.resize(target);
            } else if (a.size() + b.size() > target) {
                // the Rust library's longest-first split: the shorter keeps what it can up to half
                std::size_t n1 = a.size(), n2 = b.size();
                const bool swap = n1 > n2;
                if (swap) std::swap(n1, n2);
                n2 = n1 > target ? n1 : std::max(n1, target - n1);
                if (n1 + n2 > target) {
                    n1 = target / 2;
                    n2 = n1 + target % 2;
                }
                if (swap) std::swap(n1, n2);
                a.resize(std::min(a.size(), n1));
                b.resize(std::min(b.size(), n2));
            }
        }
        std::vector<std::int64_t>& s = ids[i];
        if (o.add_special_tokens) s.push_back(cls_);
        s.insert(s.end(), a.begin(), a.end());
        if (o.add_special_tokens) s.push_back(sep_);
        types[i].assign(s.size(), 0);
        if (pairs) {
            s.insert(s.end(), b.begin(), b.end());
            if (o.add_special_tokens) s.push_back(sep_);
            types[i].resize(s.size(), 1);
        }
    }
    std::size_t longest = 0;
    for (const auto& s : ids) longest = std::max(longest, s.size());
    std::size_t len = longest;
    if (o.padding == Padding::max_length) {
        if (static_cast<std::int64_t>(longest) > max_len)
            kiln::detail::fail<ValueError>(op, "a sequence of " + std::to_string(longest) + " tokens is longer than max_length " +
                                                   std::to_string(max_len) + " (truncation is off)", loc);
        len = static_cast<std::size_t>(max_len);
    } else if (o.padding == Padding::none) {
        for (std::size_t i = 0; i < ids.size(); ++i)
            if (ids[i].size() != longest)
                kiln::detail::fail<ValueError>(op, "without padding every sequence must have the same length, but text " +
                                                       std::to_string(i) + " has " + std::to_string(ids[i].size()) +
                                                       " tokens and another " + std::to_string(longest) +
                                                       " (use Padding::longest)", loc);
    }
    const std::int64_t B = static_cast<std::int64_t>(texts.size()), S = static_cast<std::int64_t>(len);
    BatchEncoding out{Tensor({B, S}, DType::i64), Tensor({B, S}, DType::i64), Tensor({B, S}, DType::i64)};
    std::int64_t* pi = out.input_ids.data<std::int64_t>();
    std::int64_t* pm = out.attention_mask.data<std::int64_t>();
    std::int64_t* pt = out.token_type_ids.data<std::int64_t>();
    for (std::size_t i = 0; i < ids.size(); ++i)
        for (std::size_t j = 0; j < len; ++j) {
            const bool real = j < ids[i].size();
            const std::size_t at = i * len + j;
            pi[at] = real ? ids[i][j] : pad_;
            pm[at] = real ? 1 : 0;
            pt[at] = real ? types[i][j] : 0;
        }
    return out;
}

KILN_DECL BatchEncoding BertTokenizer::operator()(const std::vector<std::string>& texts, const EncodeOptions& options,
                                                  std::source_location loc) const {
    return batch(texts, nullptr, options, loc);
}

KILN_DECL BatchEncoding BertTokenizer::operator()(const std::vector<std::string>& texts, const std::vector<std::string>& pairs,
                                                  const EncodeOptions& options, std::source_location loc) const {
    return batch(texts, &pairs, options, loc);
}

KILN_DECL std::string BertTokenizer::decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens, std::source_location loc) const {
    const auto mask = token_to_id(options_.mask_token);
    std::string out;
    bool first = true;
    for (std::int64_t id : ids) {
        const std::string& tok = id_to_token(id, loc);
        if (skip_special_tokens && (id == cls_ || id == sep_ || id == pad_ || id == unk_ || (mask && id == *mask))) continue;
        std::string piece;
        if (!first && tok.starts_with("##")) piece = tok.substr(2);
        else piece = (first ? "" : " ") + tok;
        first = false;
        // the WordPiece decoder's cleanup, token by token
        for (const auto& [from, to] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
                 {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
                 {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
            for (std::size_t p = piece.find(from); p != std::string::npos; p = piece.find(from, p + to.size()))
                piece.replace(p, from.size(), to);
        out += piece;
    }
    return out;
}

}  // namespace kiln::nn
