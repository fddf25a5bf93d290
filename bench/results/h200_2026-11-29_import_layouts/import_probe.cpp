// session 17 probe: ResNet-18 / BERT layer traced from C++ vs imported ONNX (kiln's own file and
// PyTorch's), throughput and one profiled call (KILN_LOGS=profile) of each, on CUDA.
//   import_probe resnet18|bert_layer_f32 [TORCH.onnx] [--profile]
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/export.hpp>
#include <kiln/export/onnx.hpp>
#include <kiln/export/onnx_import.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
using kiln::Tensor;

static double thru_us(const std::function<void()>& f) {
    for (int i = 0; i < 5; ++i) f();
    kiln::cuda::synchronize(0);
    std::vector<double> per, host;
    for (int r = 0; r < 5; ++r) {
        const int n = 100;
        const auto a = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) f();
        const auto b = std::chrono::steady_clock::now();
        kiln::cuda::synchronize(0);
        per.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count() / n);
        host.push_back(std::chrono::duration<double, std::micro>(b - a).count() / n);
    }
    std::sort(per.begin(), per.end());
    std::sort(host.begin(), host.end());
    std::printf("  [host %.1f us per call] ", host[2]);
    return per[2];
}

static void profiled(const char* what, const std::function<void()>& f) {
    std::printf("---- profile %s\n", what);
    std::fflush(stdout);
    kiln::debug::Logs::instance().set("profile");
    f();
    kiln::cuda::synchronize(0);
    kiln::debug::Logs::instance().set("");
    std::fflush(stderr);
}

int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "resnet18";
    const std::string torch_file = argc > 2 && std::string(argv[2]).ends_with(".onnx") ? argv[2] : "";
    bool prof = false;
    for (int i = 1; i < argc; ++i) prof |= std::string(argv[i]) == "--profile";
    const kiln::Device dev = kiln::Device::cuda();
    kiln::manual_seed(7);
    const kiln::nn::Init init{kiln::DType::f32, dev};
    std::function<Tensor(const Tensor&)> fn;
    Tensor x;
    if (name == "resnet18") {
        kiln::cuda::set_allow_tf32(true);
        auto mod = std::make_shared<kiln::nn::ResNet18>(1000, init);
        mod->fold();
        x = kiln::randn({16, 3, 224, 224}).to(dev);
        fn = [mod](const Tensor& t) { return (*mod)(t); };
    } else {
        auto mod = std::make_shared<kiln::nn::BertLayer>(768, 12, 3072, 1e-5, init);
        x = kiln::randn({8, 128, 768}).to(dev);
        fn = [mod](const Tensor& t) { return (*mod)(t); };
    }
    auto compiled = kiln::compile(fn);
    Tensor y = compiled(x);
    std::printf("%s traced compiled: %.1f us\n", name.c_str(), thru_us([&] { y = compiled(x); }));
    const kiln::DynamicShapes dyn{{{0, kiln::Dim("batch", 1, 4096)}}};
    kiln::ExportedProgram ep = kiln::export_program(fn, std::make_tuple(x), dyn);
    std::vector<Tensor> out = ep.run({x});
    std::printf("%s exported (loaded form): %.1f us, %d kernels\n", name.c_str(), thru_us([&] { out = ep.run({x}); }), ep.kernels());
    const std::string own = "/tmp/own_" + name + ".onnx";
    kiln::onnx::export_model(ep, own);
    kiln::ExportedProgram imp = kiln::onnx::load(own);
    out = imp.run({x});
    std::printf("%s own onnx imported: %.1f us, %d kernels, max diff %.3g\n", name.c_str(), thru_us([&] { out = imp.run({x}); }), imp.kernels(),
                kiln::max(kiln::abs(out[0] - y)).item<float>());
    std::optional<kiln::ExportedProgram> tim_;
    if (!torch_file.empty()) {
        tim_.emplace(kiln::onnx::load(torch_file));
        kiln::ExportedProgram& tim = *tim_;
        out = tim.run({x});
        std::printf("%s torch onnx imported: %.1f us, %d kernels\n", name.c_str(), thru_us([&] { out = tim.run({x}); }), tim.kernels());
    }
    if (prof) {
        profiled("traced compiled", [&] { y = compiled(x); });
        profiled("own onnx imported", [&] { out = imp.run({x}); });
        if (tim_) profiled("torch onnx imported", [&] { out = tim_->run({x}); });
    }
    return 0;
}
