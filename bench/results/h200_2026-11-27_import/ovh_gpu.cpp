// compiled vs loaded on CUDA, bert_layer_bf16 of kiln_bench (batch 8, seq 128): host time per call,
// and with KILN_LOGS=profile one call of each (groups, synchronized)
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/export.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
    using namespace kiln;
    manual_seed(7);
    const Device dev = Device::cuda();
    auto mod = std::make_shared<nn::BertLayer>(768, 12, 3072, 1e-5, nn::Init{DType::bf16, dev});
    Tensor x = randn({8, 128, 768}).to(DType::bf16).to(dev);
    std::function<Tensor(const Tensor&)> fn = [mod](const Tensor& t) { return (*mod)(t); };
    auto c = compile(fn);
    ExportedProgram ep = export_program(fn, std::make_tuple(x), {{{0, Dim("batch", 1, 4096)}}});
    ep.save("/tmp/ovh.kiln");
    ExportedProgram l = load_program("/tmp/ovh.kiln");
    const bool prof = argc > 1;
    auto time = [&](const char* what, auto&& f) {
        for (int i = 0; i < 50; ++i) (void)f();
        cuda::synchronize(0);
        if (prof) {
            std::printf("---- %s, one call, KILN_LOGS=profile\n", what);
            set_logs("profile");
            (void)f();
            cuda::synchronize(0);
            set_logs("");
            return;
        }
        for (int r = 0; r < 3; ++r) {
            const int n = 500;
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) (void)f();
            const double host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
            cuda::synchronize(0);
            const double all = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
            std::printf("%s: host %.1f us/call, back to back %.1f us/call\n", what, host, all);
        }
    };
    time("compiled", [&] { return c(x); });
    time("loaded", [&] { return l(x)[0]; });
}
