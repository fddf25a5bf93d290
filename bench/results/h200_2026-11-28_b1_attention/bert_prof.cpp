// Probe (session 11): one bert-base forward of kiln_bench's workload (seeded random weights, the
// seed's sentence or 8 x 128 ids) between cuProfilerStart and cuProfilerStop for
// `ncu --profile-from-start off`; also times forwards back to back. Args: method dtype shape.
#include <chrono>
#include <cstdio>
#include <dlfcn.h>
#include <string>
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/nn/bert.hpp>
#include <kiln/nn/tokenizer.hpp>

int main(int argc, char** argv) {
    using kiln::Tensor;
    const std::string method = argc > 1 ? argv[1] : "compiled", dts = argc > 2 ? argv[2] : "bf16", shape = argc > 3 ? argv[3] : "b1";
    void* cu = dlopen("libcuda.so.1", RTLD_NOW);
    auto start = reinterpret_cast<int (*)()>(dlsym(cu, "cuProfilerStart"));
    auto stop = reinterpret_cast<int (*)()>(dlsym(cu, "cuProfilerStop"));
    const kiln::Device dev = kiln::Device::cuda();
    kiln::manual_seed(11);
    auto model = std::make_shared<kiln::nn::BertModel>(kiln::nn::BertConfig{}, false);
    kiln::nn::to(*model, dts == "bf16" ? kiln::DType::bf16 : kiln::DType::f32);
    kiln::nn::to(*model, dev);
    model->pack();
    kiln::nn::BatchEncoding in;
    if (shape == "b1") in = kiln::nn::BertTokenizer::from_file(KILN_VOCAB)({"Here is some text to encode"});
    else {
        kiln::manual_seed(12);
        const Tensor ids = Tensor(kiln::floor(kiln::rand({8, 128}) * 29000.0) + 1000.0).to(kiln::DType::i64);
        in = {ids, kiln::ones({8, 128}, kiln::DType::i64), kiln::zeros({8, 128}, kiln::DType::i64)};
    }
    const Tensor ids = in.input_ids.to(dev), mask = in.attention_mask.to(dev);
    using F = std::function<Tensor(const Tensor&, const Tensor&)>;
    F fn = [model](const Tensor& i, const Tensor& m) { return (*model)(i, m).last_hidden_state; };
    kiln::Options o;
    if (method == "reduce_overhead") o.mode = kiln::Mode::reduce_overhead;
    auto c = kiln::compile(fn, o);
    const auto c0 = std::chrono::steady_clock::now();
    c(ids, mask).cpu();
    std::printf("%s %s %s: first call %.1f ms\n", method.c_str(), dts.c_str(), shape.c_str(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
    for (int i = 0; i < 5; ++i) c(ids, mask).cpu();
    for (int r = 0; r < 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        Tensor y;
        for (int i = 0; i < 50; ++i) y = c(ids, mask);
        y.cpu();
        std::printf("%s %s %s: %.1f us per call (50 back to back)\n", method.c_str(), dts.c_str(), shape.c_str(),
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50);
    }
    start();
    c(ids, mask).cpu();
    stop();
    std::printf("kernels per call: %d\n", c.kernels());
}
