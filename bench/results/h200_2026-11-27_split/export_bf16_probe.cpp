#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/export.hpp>
#include <cstdio>
// kiln_bench's mlp_bf16 sequence: eager, compile, reduce_overhead-free; then export with a dynamic batch
int main(int argc, char** argv) {
    using namespace kiln;
    const int variant = argc > 1 ? std::atoi(argv[1]) : 0;
    const Device dev = Device::cuda();
    manual_seed(7);
    const nn::Init init{DType::bf16, dev};
    auto mod = std::make_shared<nn::Mlp>(1024, 4096, 1024, init);
    Tensor x = randn({64, 1024}).to(DType::bf16).to(dev);
    std::function<Tensor(const Tensor&)> fn = [mod](const Tensor& t) { return (*mod)(t); };
    if (variant >= 1) { Tensor y = fn(x); (void)y.cpu(); }
    if (variant >= 2) { auto c = compile(fn); Tensor y = c(x); (void)y.cpu(); }
    if (variant == 3) { auto e = compile(fn, {.backend = Backend::eager}); Tensor y = e(x); (void)y.cpu(); }
    if (variant == 4) {  // an f32 model of the same shapes exported first, as kiln_bench's mlp_f32 rows do
        manual_seed(7);
        auto m32 = std::make_shared<nn::Mlp>(1024, 4096, 1024, nn::Init{DType::f32, dev});
        std::function<Tensor(const Tensor&)> f32fn = [m32](const Tensor& t) { return (*m32)(t); };
        const DynamicShapes d32{{{0, Dim("batch", 1, 4096)}}};
        ExportedProgram e32 = export_program(f32fn, std::make_tuple(randn({64, 1024}).to(dev)), d32);
        std::printf("f32 export ok\n");
    }
    if (variant == 5) {  // ... and saved, loaded back and run, as the "loaded" rows do
        manual_seed(7);
        auto m32 = std::make_shared<nn::Mlp>(1024, 4096, 1024, nn::Init{DType::f32, dev});
        std::function<Tensor(const Tensor&)> f32fn = [m32](const Tensor& t) { return (*m32)(t); };
        const DynamicShapes d32{{{0, Dim("batch", 1, 4096)}}};
        const Tensor x32 = randn({64, 1024}).to(dev);
        ExportedProgram e32 = export_program(f32fn, std::make_tuple(x32), d32);
        e32.save("/tmp/m32.kiln");
        const ExportedProgram l = load_program("/tmp/m32.kiln");
        Tensor y = l(x32)[0];
        (void)y.cpu();
        auto ro = compile(f32fn, {.mode = Mode::reduce_overhead});
        for (int i = 0; i < 3; ++i) y = ro(x32);
        (void)y.cpu();
        std::printf("f32 export, load, run, reduce_overhead ok\n");
    }
    const DynamicShapes dyn{{{0, Dim("batch", 1, 4096)}}};
    try {
        ExportedProgram ep = export_program(fn, std::make_tuple(x), dyn);
        std::printf("variant %d: ok\n", variant);
    } catch (const std::exception& e) { std::printf("variant %d: ERR %s\n", variant, e.what()); }
}
