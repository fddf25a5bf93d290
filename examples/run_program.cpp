// Runs programs saved by ExportedProgram::save: no C++ source of the model is needed, only the file.
//   example_run_program PROGRAM.kiln [CHECK.safetensors] [PROGRAM2.kiln CHECK2.safetensors ...] [--cuda]
// With a check file (tensors "x" and "y", as example_export_deploy writes them) it runs x and
// compares with y; without one it prints the program and runs it on random inputs of the
// example's shapes.
#include "example_util.hpp"

#include <kiln/export.hpp>

#include <string>
#include <vector>

int main(int argc, char** argv) {
    using namespace kiln;
    std::vector<std::string> files;
    std::vector<char*> rest{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (argv[i][0] != '-') files.push_back(argv[i]);
        else rest.push_back(argv[i]);
    }
    const Device dev = example::device_from(static_cast<int>(rest.size()), rest.data());
    if (files.empty()) {
        std::fprintf(stderr, "usage: %s PROGRAM.kiln [CHECK.safetensors] ... [--cuda]\n", argv[0]);
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
