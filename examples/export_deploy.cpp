// Export and deploy: an MLP, a BERT encoder layer and ResNet-18 captured with kiln::export_program
// (a dynamic batch, Dim("batch", 1, 64)), saved to one file each, loaded back and run at other
// batch sizes against eager. Each file comes with <name>.check.safetensors (an input at batch 3 and
// the eager output), which `--run` loads and checks in another process.
//   example_export_deploy [DIR] [--cuda]        (DIR: where the files go; default: a temp directory)
//   example_export_deploy --run PROGRAM.kiln [CHECK.safetensors] [PROGRAM2.kiln CHECK2.safetensors ...] [--cuda]
// With a check file (tensors "x" and "y") --run runs x and compares with y; without one it prints
// the program and runs it on random inputs of the example's shapes.
#include "example_util.hpp"

#include <kiln/export.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace {

int failures = 0;

/// Exports fn over an input of `shape` with a dynamic batch, saves, loads, checks batches 1, 4, 64.
template <class F>
void deploy(const std::string& name, F fn, kiln::Shape shape, std::map<std::string, kiln::Tensor> params, const std::filesystem::path& dir,
            kiln::Device dev, bool print) {
    using namespace kiln;
    shape[0] = 8;
    const Tensor example = randn(shape).to(dev);
    const DynamicShapes dynamic{{{0, Dim("batch", 1, 64)}}};
    const ExportOptions opt{.parameters = params, .input_names = {"x"}};
    ExportedProgram ep = export_program(fn, std::make_tuple(example), dynamic, opt);  // warm-up (first use of every op)
    const double export_ms = example::median_ms([&] { ep = export_program(fn, std::make_tuple(example), dynamic, opt); }, Device::cpu(), 3);
    if (print) std::printf("%s\n", ep.str().c_str());
    const std::string file = (dir / (name + ".kiln")).string();
    ep.save(file);
    const ExportedProgram back = load_program(file);
    shape[0] = 3;
    const Tensor x3 = randn(shape).to(dev);
    nn::save_safetensors(dir / (name + ".check.safetensors"), {{"x", x3}, {"y", fn(x3)}});
    double worst = 0;
    for (std::int64_t b : {1, 4, 64}) {
        shape[0] = b;
        const Tensor xb = randn(shape).to(dev);
        worst = std::max(worst, example::max_rel_diff(back(xb)[0], fn(xb)));
    }
    const bool ok = worst <= 1e-4;
    failures += !ok;
    std::printf("%-10s export %.1f ms, %s %.1f MB; loaded program vs eager at batch 1, 4, 64: max relative difference %.2e: %s\n",
                name.c_str(), export_ms, file.c_str(), static_cast<double>(std::filesystem::file_size(file)) / 1e6, worst,
                ok ? "agree" : "DIFFER");
}

}  // namespace

/// --run mode: loads each program (no C++ source of the model needed, only the file) and checks it.
int run_programs(int argc, char** argv) {
    using namespace kiln;
    std::vector<std::string> files;
    std::vector<char*> rest{argv[0]};
    for (int i = 2; i < argc; ++i) {
        if (argv[i][0] != '-') files.push_back(argv[i]);
        else rest.push_back(argv[i]);
    }
    const Device dev = example::device_from(static_cast<int>(rest.size()), rest.data());
    if (files.empty()) {
        std::fprintf(stderr, "usage: %s --run PROGRAM.kiln [CHECK.safetensors] ... [--cuda]\n", argv[0]);
        return 2;
    }
    int failures = 0;
    for (std::size_t i = 0; i < files.size(); ++i) {
        const ExportedProgram ep = load_program(files[i]);
        const bool check = i + 1 < files.size() && files[i + 1].ends_with(".safetensors");
        if (!check) {
            std::printf("%s\n", ep.str().c_str());
            std::vector<Tensor> in;
            for (int k = 0; k < ep.num_user_inputs(); ++k) in.push_back(randn(ep.input_specs()[static_cast<std::size_t>(k)].shape).to(ep.input_specs()[static_cast<std::size_t>(k)].dtype).to(dev));
            for (const Tensor& y : ep.run(in)) std::printf("output %s\n", y.shape().str().c_str());
            continue;
        }
        const auto io = nn::load_safetensors(files[i + 1]);
        const Tensor y = ep(io.at("x").to(dev))[0];
        const double diff = example::max_rel_diff(y, io.at("y"));
        const bool ok = diff <= 1e-4;
        failures += !ok;
        std::printf("%s on %s: input %s, max relative difference to the exporter's eager output %.2e: %s\n", files[i].c_str(), dev.str().c_str(),
                    io.at("x").shape().str().c_str(), diff, ok ? "agree" : "DIFFER");
        ++i;
    }
    return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
    using namespace kiln;
    if (argc > 1 && std::string(argv[1]) == "--run") return run_programs(argc, argv);
    std::filesystem::path dir;
    std::vector<char*> rest{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (argv[i][0] != '-' && dir.empty()) dir = argv[i];
        else rest.push_back(argv[i]);
    }
    const Device dev = example::device_from(static_cast<int>(rest.size()), rest.data());
    if (dir.empty()) dir = std::filesystem::temp_directory_path() / "kiln-export-deploy";
    std::filesystem::create_directories(dir);
    manual_seed(0);
    nn::Mlp mlp(256, 1024, 256, {DType::f32, dev});
    nn::BertLayer layer(256, 4, 1024, 1e-5, {DType::f32, dev});
    nn::ResNet18 net(10);
    nn::to(net, dev);
    nn::eval(net);
    deploy("mlp", [&](const Tensor& x) { return mlp(x); }, {0, 256}, nn::named_parameters(mlp), dir, dev, true);
    deploy("bert_layer", [&](const Tensor& x) { return layer(x); }, {0, 32, 256}, nn::named_parameters(layer), dir, dev, false);
    deploy("resnet18", [&](const Tensor& x) { return net(x); }, {0, 3, 64, 64}, nn::state_dict(net), dir, dev, false);
    return failures == 0 ? 0 : 1;
}
