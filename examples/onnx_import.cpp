// ONNX import: an ONNX model file (from torch.onnx.export, kiln::onnx::export_model or anywhere)
// run through kiln with kiln::onnx::load, on the CPU or CUDA, checked against expected outputs.
//   example_onnx_import MODEL.onnx [--input X.npy|X.pb]... [--expect Y.npy|Y.pb]... [--tol T] [--cuda] [--tf32] [--time] [--print]
// (--tf32: TF32 GEMMs and convolutions on CUDA, as torch's default for convolutions. .pb: a serialized ONNX TensorProto, as ONNX's test data sets hold). Exit 77 when MODEL is missing.
// Without --input, each input is random at the shape the model was traced at (named dims at 8).
// --expect compares each output's largest difference relative to the expected output's largest
// value with T (default 1e-3); exit 1 when one is off. --time prints the median latency (each call
// synchronized) and throughput (calls back to back for at least 0.1 s, one synchronize; median of
// 5), as kiln_bench times its rows.
#include "example_util.hpp"

#include <kiln/export.hpp>
#include <kiln/export/onnx_import.hpp>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>

int run(int argc, char** argv) {
    using namespace kiln;
    if (argc < 2) {
        std::fprintf(stderr, "usage: example_onnx_import MODEL.onnx [--input X.npy]... [--expect Y.npy]... [--tol T] [--cuda] [--time] [--print]\n");
        return 2;
    }
    std::vector<std::string> inputs, expects;
    double tol = 1e-3;
    bool cuda = false, timed = false, print = false, tf32 = false;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--input" && i + 1 < argc) inputs.push_back(argv[++i]);
        else if (a == "--expect" && i + 1 < argc) expects.push_back(argv[++i]);
        else if (a == "--tol" && i + 1 < argc) tol = std::stod(argv[++i]);
        else if (a == "--cuda") cuda = true;
        else if (a == "--tf32") tf32 = true;
        else if (a == "--time") timed = true;
        else if (a == "--print") print = true;
        else {
            std::fprintf(stderr, "unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    if (cuda && !cuda::is_available()) {
        std::printf("--cuda: no CUDA device: skipped\n");
        return 77;
    }
    const Device dev = cuda ? Device::cuda(0) : Device::cpu();
    if (tf32 && cuda) cuda::set_allow_tf32(true);
    if (!std::filesystem::exists(argv[1])) {
        std::printf("%s does not exist: skipped\n", argv[1]);
        return 77;
    }
    auto read = [](const std::string& path) { return path.ends_with(".pb") ? kiln::onnx::read_tensor_file(path) : nn::load_npy(path); };
    const auto t0 = std::chrono::steady_clock::now();
    const ExportedProgram ep = kiln::onnx::load(argv[1]);  // (kiln::onnx: ONNX's own namespace is ::onnx)
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (print) std::printf("%s\n", ep.str().c_str());
    std::vector<Tensor> in;
    for (std::size_t k = 0; k < static_cast<std::size_t>(ep.num_user_inputs()); ++k) {
        const TensorSpec& s = ep.input_specs()[k];
        Tensor t = k < inputs.size() ? read(inputs[k]) : (is_floating(s.dtype) ? randn(s.shape).to(s.dtype) : zeros(s.shape, s.dtype));
        std::printf("input %zu '%s': %s%s\n", k, s.name.c_str(), s.type_str().c_str(), k < inputs.size() ? (" <- " + inputs[k]).c_str() : " (random)");
        in.push_back(t.to(dev));
    }
    std::vector<Tensor> out = ep.run(in);
    std::printf("%s: loaded in %.1f ms (onnx::load: parse, trace, passes), %d kernels on %s\n", argv[1], load_ms, ep.kernels(),
                cuda ? "CUDA" : "the CPU");
    int bad = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
        std::printf("output %zu '%s': %s%s", k, ep.output_specs()[k].name.c_str(), std::string(dtype_name(out[k].dtype())).c_str(),
                    out[k].shape().str().c_str());
        if (k < expects.size()) {
            const Tensor want = read(expects[k]);
            const bool same_shape = want.shape() == out[k].shape();
            const double d = same_shape ? example::max_rel_diff(out[k], want) : 1e30;
            std::printf("  vs %s: max |diff| / max |expected| = %.3g (tol %.g)%s", expects[k].c_str(), d, tol,
                        same_shape ? (d <= tol ? "  ok" : "  FAIL") : "  FAIL: shape differs");
            bad += !(d <= tol);
        }
        std::printf("\n");
    }
    if (timed) {
        const double lat = example::median_ms([&] { out = ep.run(in); }, dev, 20);
        // throughput: back to back for >= 0.1 s, one synchronize, median of 5
        std::vector<double> per;
        for (int r = 0; r < 5; ++r) {
            int n = std::max(1, static_cast<int>(100.0 / std::max(lat, 1e-3)));
            const auto a = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) out = ep.run(in);
            if (cuda) cuda::synchronize(0);
            per.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count() / n);
        }
        std::sort(per.begin(), per.end());
        std::printf("time: latency %.1f us, throughput %.1f us per call\n", lat * 1e3, per[2] * 1e3);
    }
    return bad ? 1 : 0;
}

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {  // kiln's errors name the op, the node and what is wrong
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
