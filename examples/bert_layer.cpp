// A BERT encoder layer (self-attention, residual layer norms, GELU feed-forward) at inference:
// eager (one kernel per op) vs kiln::compile, with parameters round-tripped through safetensors.
//   example_bert_layer [--cuda] [--full]     (--full: batch 8, seq 128, hidden 768, 12 heads, FFN 3072)
#include "example_util.hpp"

#include <kiln/nn.hpp>

#include <filesystem>

int main(int argc, char** argv) {
    const kiln::Device dev = example::device_from(argc, argv);
    const bool full = example::flag(argc, argv, "--full");
    const std::int64_t B = full ? 8 : 2, S = full ? 128 : 32, E = full ? 768 : 128, H = full ? 12 : 4, F = full ? 3072 : 512;
    kiln::manual_seed(0);
    kiln::nn::BertLayer layer(E, H, F);
    // parameters as a model file would hold them (torch.nn.TransformerEncoderLayer's names)
    const auto path = std::filesystem::temp_directory_path() / "kiln_example_bert_layer.safetensors";
    kiln::nn::save_safetensors(path, kiln::nn::state_dict(layer));
    kiln::nn::BertLayer loaded(E, H, F);
    kiln::nn::load_state(loaded, kiln::nn::load_safetensors(path));
    std::filesystem::remove(path);
    kiln::nn::to(loaded, dev);

    const kiln::Tensor x = kiln::randn({B, S, E}).to(dev);
    auto eager = kiln::compile([&](const kiln::Tensor& t) { return loaded(t); }, {.backend = kiln::Backend::eager});
    auto compiled = kiln::compile([&](const kiln::Tensor& t) { return loaded(t); });
    kiln::Tensor ye = eager(x), yc = compiled(x);
    const double te = example::median_ms([&] { ye = eager(x); }, dev);
    const double tc = example::median_ms([&] { yc = compiled(x); }, dev);
    std::printf("bert layer (%lld, %lld, %lld), %lld heads, FFN %lld on %s, %d kernels compiled\n", static_cast<long long>(B),
                static_cast<long long>(S), static_cast<long long>(E), static_cast<long long>(H), static_cast<long long>(F),
                dev.str().c_str(), compiled.kernels());
    const int rc = example::report("bert_layer", te, tc, example::max_rel_diff(yc, ye), 1e-4);
    return rc | example::report("bert_layer vs the model before saving", te, tc,
                                example::max_rel_diff(yc, layer(x.cpu())), 1e-4);
}
