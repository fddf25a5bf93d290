// The ONNX backend node tests (Debian: libonnx-testdata) through kiln::onnx::load: each test is a
// folder with model.onnx and test_data_set_*/{input,output}_*.pb. Every test is loaded and run on
// the CPU (or CUDA with --cuda) and its outputs compared with the expected ones (ONNX's tolerances:
// rtol 1e-3, atol 1e-7). Prints each unsupported and failing test with the reason, then
// "N of M node tests pass".
//
//   kiln_onnx_node_tests DIR [--expect FILE] [--write FILE] [--filter TEXT] [--cuda] [--quiet]
//
// --expect FILE: exit 1 if a test FILE lists (one name per line) does not pass (the ctest keeps the
// passing set passing). --write FILE: write the passing tests' names. Exit 77 when DIR is missing.
#include <kiln/export/onnx_import.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
    std::vector<fs::path> out;
    for (int i = 0;; ++i) {
        fs::path p = dir / (prefix + std::to_string(i) + ".pb");
        if (!fs::exists(p)) break;
        out.push_back(p);
    }
    return out;
}

/// "" when got matches want, else why not.
std::string compare(const kiln::Tensor& got0, const kiln::Tensor& want) {
    const kiln::Tensor got = got0.cpu();
    if (got.dtype() != want.dtype())
        return std::string("dtype ") + std::string(kiln::dtype_name(got.dtype())) + ", expected " + std::string(kiln::dtype_name(want.dtype()));
    if (!(got.shape() == want.shape())) return "shape " + got.shape().str() + ", expected " + want.shape().str();
    const kiln::Tensor g = got.to(kiln::DType::f64).contiguous(), w = want.to(kiln::DType::f64).contiguous();
    const double* gp = g.data<double>();
    const double* wp = w.data<double>();
    const bool exact = !kiln::is_floating(want.dtype());
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < g.numel(); ++i) {
        const double a = gp[i], b = wp[i];
        bool ok;
        if (std::isnan(b)) ok = std::isnan(a);
        else if (std::isinf(b)) ok = a == b;
        else ok = exact ? a == b : std::abs(a - b) <= 1e-7 + 1e-3 * std::abs(b);
        if (!ok && bad++ == 0) first = i;
    }
    if (bad == 0) return "";
    char msg[200];
    std::snprintf(msg, sizeof msg, "%lld of %lld values differ; first at flat index %lld: got %.9g, expected %.9g", static_cast<long long>(bad),
                  static_cast<long long>(g.numel()), static_cast<long long>(first), gp[first], wp[first]);
    return msg;
}

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (s.size() > 400) s = s.substr(0, 400) + "...";
    return s;
}

/// Runs one test folder; "" when every data set matches. `bind` 1: the model's integer inputs get
/// data set 0's values when it loads (LoadOptions::constants) and are not passed when it runs; 2:
/// its inputs of rank 0 or 1 after the first too.
std::string run_test(const fs::path& dir, bool cuda, int bind) {
    ::onnx::ModelProto m;
    {
        std::ifstream f(dir / "model.onnx", std::ios::binary);
        if (!m.ParseFromIstream(&f)) return "model.onnx does not parse";
    }
    std::set<std::string> inits;
    for (const auto& t : m.graph().initializer()) inits.insert(t.name());
    std::vector<std::string> inputs;
    for (const auto& i : m.graph().input())
        if (!inits.count(i.name())) inputs.push_back(i.name());
    auto is_int = [](const kiln::Tensor& t) { return t.dtype() == kiln::DType::i64 || t.dtype() == kiln::DType::i32; };
    kiln::onnx::LoadOptions opt;
    if (bind) {
        const std::vector<fs::path> in0 = numbered(dir / "test_data_set_0", "input_");
        for (std::size_t k = 0; k < in0.size() && k < inputs.size(); ++k) {
            const kiln::Tensor t = kiln::onnx::read_tensor_file(in0[k].string());
            if (is_int(t) || (bind > 1 && k > 0 && t.rank() <= 1)) opt.constants[inputs[k]] = t;
        }
    }
    const kiln::ExportedProgram ep = kiln::onnx::from_model(m, opt, dir.string());
    int sets = 0;
    for (int s = 0;; ++s) {
        const fs::path data = dir / ("test_data_set_" + std::to_string(s));
        if (!fs::is_directory(data)) break;
        ++sets;
        std::vector<kiln::Tensor> in;
        const std::vector<fs::path> files = numbered(data, "input_");
        for (std::size_t k = 0; k < files.size(); ++k) {
            const kiln::Tensor t = kiln::onnx::read_tensor_file(files[k].string());
            if (k < inputs.size() && opt.constants.count(inputs[k])) {
                if (!compare(t, opt.constants[inputs[k]]).empty()) return "binds input '" + inputs[k] + "', which differs between data sets";
                continue;
            }
            in.push_back(cuda ? t.cuda() : t);
        }
        const std::vector<fs::path> outs = numbered(data, "output_");
        const std::vector<kiln::Tensor> got = ep.run(in);
        if (got.size() != outs.size()) return "returns " + std::to_string(got.size()) + " outputs, expected " + std::to_string(outs.size());
        for (std::size_t k = 0; k < outs.size(); ++k) {
            const std::string d = compare(got[k], kiln::onnx::read_tensor_file(outs[k].string()));
            if (!d.empty()) return "output " + std::to_string(k) + ": " + d;
        }
    }
    return sets == 0 ? "has no test_data_set_0" : "";
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::cerr << "usage: kiln_onnx_node_tests DIR [--expect FILE] [--write FILE] [--filter TEXT] [--cuda] [--quiet]\n";
        return 2;
    }
    const fs::path root = argv[1];
    std::string expect_file, write_file, filter;
    bool cuda = false, quiet = false;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--expect" && i + 1 < argc) expect_file = argv[++i];
        else if (a == "--write" && i + 1 < argc) write_file = argv[++i];
        else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
        else if (a == "--cuda") cuda = true;
        else if (a == "--quiet") quiet = true;
        else {
            std::cerr << "unknown argument " << a << "\n";
            return 2;
        }
    }
    if (!fs::is_directory(root)) {
        std::cout << "no ONNX node tests at " << root << " (Debian: apt-get install libonnx-testdata): skipped\n";
        return 77;
    }
    // the generated-C++ CPU kernels would build hundreds of one-off programs: the interpreter runs them
    if (!std::getenv("KILN_CPU_CODEGEN")) kiln::set_cpu_codegen(kiln::CpuCodegen::off);
    if (cuda && !kiln::cuda::is_available()) {
        std::cout << "--cuda: no CUDA device: skipped\n";
        return 77;
    }

    std::vector<fs::path> tests;
    for (const auto& e : fs::directory_iterator(root))
        if (e.is_directory() && fs::exists(e.path() / "model.onnx") && e.path().filename().string().find(filter) != std::string::npos)
            tests.push_back(e.path());
    std::sort(tests.begin(), tests.end());

    std::vector<std::string> passed, bound_names;
    std::vector<std::pair<std::string, std::string>> unsupported, failed;
    for (const fs::path& dir : tests) {
        const std::string name = dir.filename().string();
        std::string why;
        bool unsup = false;
        int bound = 0;
        for (int attempt = 0; attempt < 3; ++attempt) {
            why.clear();
            unsup = false;
            try {
                why = run_test(dir, cuda, bound);
            } catch (const kiln::onnx::ImportError& e) {
                unsup = true;
                why = e.what();
            } catch (const std::exception& e) {
                why = std::string("threw: ") + e.what();
            }
            // a model that takes its shape, axes, scales or count as an input: bind its integer
            // inputs (LoadOptions::constants) and try again, then also its scalar and 1-D inputs
            // after the first (the data)
            if (unsup && bound < 2 && why.find("when the model loads") != std::string::npos) ++bound;
            else break;
        }
        if (why.empty() && bound > 0) bound_names.push_back(name);
        if (why.empty()) passed.push_back(name);
        else (unsup ? unsupported : failed).emplace_back(name, one_line(why));
    }

    if (!quiet)
        for (const auto& [n, w] : unsupported) std::cout << "unsupported " << n << ": " << w << "\n";
    for (const auto& [n, w] : failed) std::cout << "FAIL " << n << ": " << w << "\n";
    if (!quiet)
        for (const std::string& n : bound_names) std::cout << "bound " << n << ": passes with inputs bound when it loads (LoadOptions::constants)\n";
    std::cout << passed.size() << " of " << tests.size() << " node tests pass (" << bound_names.size()
              << " of them with shape-like inputs bound at load; " << unsupported.size() << " unsupported, " << failed.size() << " failing)\n";

    if (!write_file.empty()) {
        std::ofstream f(write_file);
        for (const std::string& n : passed) f << n << "\n";
    }
    int rc = 0;
    if (!expect_file.empty()) {
        std::ifstream f(expect_file);
        if (!f) {
            std::cerr << "cannot read " << expect_file << "\n";
            return 2;
        }
        const std::set<std::string> ok(passed.begin(), passed.end());
        std::string line;
        int listed = 0, missing = 0;
        while (std::getline(f, line)) {
            if (line.empty() || line[0] == '#') continue;
            ++listed;
            if (!ok.count(line) && (filter.empty() || line.find(filter) != std::string::npos)) {
                std::cout << "REGRESSION " << line << " passed before and does not now\n";
                ++missing;
            }
        }
        std::cout << listed - missing << " of the " << listed << " tests " << expect_file << " lists pass\n";
        rc = missing ? 1 : 0;
    }
    return rc;
}
