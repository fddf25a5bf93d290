// kiln::onnx::export_model: every exported model passes ONNX's checker; the MLP, the BERT layer,
// ResNet-18 and a program of every op are written to KILN_ONNX_OUT with inputs and kiln's outputs
// (.npy), which tests/onnx/check_ort.py runs through ONNX Runtime (ctest: onnx.ort).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <kiln/export.hpp>
#include <kiln/export/onnx.hpp>

#include "../test_util.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::Dim;
using kiln::DType;
using kiln::ExportedProgram;
using kiln::ExportError;
using kiln::Tensor;
using kiln::export_program;
namespace nn = kiln::nn;

fs::path out_dir() {
    const char* d = std::getenv("KILN_ONNX_OUT");
    fs::path p = d && *d ? fs::path(d) : fs::temp_directory_path() / "kiln-onnx-test";
    fs::create_directories(p);
    return p;
}

/// Exports ep to <name>.onnx and, for each input set, writes <name>.b<k>.in<i>.npy and kiln's
/// outputs <name>.b<k>.out<j>.npy.
void write_case(const std::string& name, const ExportedProgram& ep, const std::vector<std::vector<Tensor>>& inputs) {
    const fs::path dir = out_dir();
    kiln::onnx::export_model(ep, (dir / (name + ".onnx")).string());
    const ::onnx::ModelProto m = kiln::onnx::to_model_proto(ep);
    CHECK(m.opset_import(0).version() >= 17);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
        const std::vector<Tensor> y = ep.run(inputs[k]);
        for (std::size_t i = 0; i < inputs[k].size(); ++i)
            nn::save_npy(dir / (name + ".b" + std::to_string(k) + ".in" + std::to_string(i) + ".npy"), inputs[k][i]);
        for (std::size_t j = 0; j < y.size(); ++j)
            nn::save_npy(dir / (name + ".b" + std::to_string(k) + ".out" + std::to_string(j) + ".npy"), y[j]);
    }
}

}  // namespace

TEST_CASE("onnx: the MLP, the BERT layer and ResNet-18 with a dynamic batch pass ONNX's checker") {
    kiln::manual_seed(11);
    const nn::Mlp mlp(32, 64, 16);
    const ExportedProgram mlp_ep = export_program([&](const Tensor& x) { return mlp(x); }, std::make_tuple(kiln::randn({4, 32})),
                                                  {{{0, Dim("batch", 1, 64)}}},
                                                  {.parameters = nn::named_parameters(const_cast<nn::Mlp&>(mlp)), .input_names = {"x"}});
    write_case("mlp", mlp_ep, {{kiln::randn({1, 32})}, {kiln::randn({4, 32})}, {kiln::randn({64, 32})}});
    const ::onnx::ModelProto m = kiln::onnx::to_model_proto(mlp_ep);
    CHECK(m.graph().input(0).name() == "x");
    CHECK(m.graph().input(0).type().tensor_type().shape().dim(0).dim_param() == "batch");
    CHECK(m.graph().initializer_size() >= 4);

    const nn::BertLayer layer(32, 4, 64);
    const ExportedProgram bert = export_program([&](const Tensor& x) { return layer(x); }, std::make_tuple(kiln::randn({2, 6, 32})),
                                                {{{0, Dim("batch", 1, 16)}, {1, Dim("seq", 1, 64)}}},
                                                {.parameters = nn::named_parameters(const_cast<nn::BertLayer&>(layer))});
    write_case("bert_layer", bert, {{kiln::randn({1, 6, 32})}, {kiln::randn({4, 9, 32})}, {kiln::randn({3, 1, 32})}});

    nn::ResNet18 net(10);
    nn::eval(net);
    const ExportedProgram resnet = export_program([&](const Tensor& x) { return net(x); }, std::make_tuple(kiln::randn({2, 3, 32, 32})),
                                                  {{{0, Dim("batch", 1, 8)}}}, {.parameters = nn::state_dict(net)});
    write_case("resnet18", resnet, {{kiln::randn({1, 3, 32, 32})}, {kiln::randn({3, 3, 32, 32})}});
}

TEST_CASE("onnx: every table op, casts, reductions, views and matmul") {
    kiln::manual_seed(12);
    auto f = [](const Tensor& x, const Tensor& y, const Tensor& n) {
        std::vector<Tensor> o;
        // unary float ops on x in (0.5, 2)
        o.push_back(Tensor(-x));
        o.push_back(Tensor(kiln::abs(x - 1.25)));
        o.push_back(Tensor(kiln::exp(x)));
        o.push_back(Tensor(kiln::expm1(x)));
        o.push_back(Tensor(kiln::log(x)));
        o.push_back(Tensor(kiln::log1p(x)));
        o.push_back(Tensor(kiln::sqrt(x)));
        o.push_back(Tensor(kiln::rsqrt(x)));
        o.push_back(Tensor(kiln::sin(x)));
        o.push_back(Tensor(kiln::cos(x)));
        o.push_back(Tensor(kiln::tan(x)));
        o.push_back(Tensor(kiln::tanh(x)));
        o.push_back(Tensor(kiln::erf(x)));
        o.push_back(Tensor(kiln::sigmoid(x - 1)));
        o.push_back(Tensor(kiln::gelu_tanh(x - 1)));
        o.push_back(Tensor(kiln::hardswish(x * 4 - 4)));
        o.push_back(Tensor(kiln::relu(x - 1)));
        o.push_back(Tensor(kiln::floor(x * 3)));
        o.push_back(Tensor(kiln::ceil(x * 3)));
        o.push_back(Tensor(kiln::round(x * 3)));
        o.push_back(Tensor(kiln::sign(x - 1)));
        o.push_back(Tensor(kiln::reciprocal(x)));
        // binary, comparisons, logic, where
        o.push_back(Tensor(x + y));
        o.push_back(Tensor(x - y));
        o.push_back(Tensor(x * y));
        o.push_back(Tensor(x / y));
        o.push_back(Tensor(kiln::pow(x, y)));
        o.push_back(Tensor(kiln::remainder(x * 5 - 4, y)));
        o.push_back(Tensor(kiln::fmod(x * 5 - 4, y)));
        o.push_back(Tensor(kiln::floor_divide(x * 5 - 4, y)));
        o.push_back(Tensor(kiln::maximum(x, y)));
        o.push_back(Tensor(kiln::minimum(x, y)));
        o.push_back(Tensor(kiln::cast(x > y, DType::f32)));
        o.push_back(Tensor(kiln::cast(x >= y, DType::f32)));
        o.push_back(Tensor(kiln::cast(x < y, DType::f32)));
        o.push_back(Tensor(kiln::cast(x <= y, DType::f32)));
        o.push_back(Tensor(kiln::cast(x == x, DType::f32)));
        o.push_back(Tensor(kiln::cast(x != y, DType::f32)));
        o.push_back(Tensor(kiln::cast(kiln::logical_and(x > 1, y > 1), DType::f32)));
        o.push_back(Tensor(kiln::cast(kiln::logical_or(x > 1, y > 1), DType::f32)));
        o.push_back(Tensor(kiln::cast(kiln::logical_not(x > 1), DType::f32)));
        o.push_back(Tensor(kiln::where(x > y, x, y * 2)));
        // integers: remainder and floor_divide of int64, a cast back
        o.push_back(Tensor(kiln::cast(kiln::remainder(n, 3) + kiln::floor_divide(n, 4), DType::f32)));
        // reductions, arg-reductions, var, softmax, log_softmax, layer_norm
        o.push_back(kiln::sum(x, {1}));
        o.push_back(kiln::mean(x, {0}, true));
        o.push_back(kiln::max(x, {1}));
        o.push_back(kiln::min(x, {0}));
        o.push_back(kiln::prod(x, {1}));
        o.push_back(kiln::cast(kiln::argmax(x, 1), DType::f32));
        o.push_back(kiln::var(x, {1}));
        o.push_back(kiln::softmax(x, 1));
        o.push_back(kiln::log_softmax(x, 0));
        o.push_back(kiln::layer_norm(x, 1));
        // views: transpose, strided slice, select, expand, reshape; matmul
        o.push_back(Tensor(x.t() * 2));
        o.push_back(Tensor(x.slice(1, 1, 7, 2) + 1));
        o.push_back(Tensor(x.select(0, 2) + 1));
        o.push_back(Tensor(x.slice(0, 0, 1).expand({3, 8}) + y.slice(0, 0, 3)));
        o.push_back(Tensor(x.reshape({2, 2, 8}).permute({2, 0, 1}) * 3));
        o.push_back(kiln::matmul(x, y.t()));
        o.push_back(Tensor(kiln::cast(x, DType::f64) * 2));
        return o;
    };
    const Tensor x = Tensor(kiln::rand({4, 8}) * 1.5 + 0.5), y = Tensor(kiln::rand({4, 8}) * 1.5 + 0.5);
    const Tensor n = kiln::cast(Tensor(kiln::rand({4, 8}) * 40 - 20), DType::i64);
    const ExportedProgram ep = export_program(f, std::make_tuple(x, y, n));
    const std::vector<Tensor> got = ep.run({x, y, n});
    const std::vector<Tensor> want = f(x, y, n);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < got.size(); ++k) CHECK_MESSAGE(kiln_test::maxdiff(got[k], want[k]) < 1e-5, "output " << k);
    write_case("ops", ep, {{x, y, n}});
}

TEST_CASE("onnx: what has no mapping is an ExportError naming it") {
    // a write into a view: functionalized into a view_write node
    auto f = [](const Tensor& x) {
        Tensor y = Tensor(x * 2);
        Tensor row = y.select(0, 1);
        row.fill_(0.0);
        return y;
    };
    const ExportedProgram ep = export_program(f, std::make_tuple(kiln::randn({3, 4})));
    try {
        kiln::onnx::export_model(ep, (out_dir() / "never.onnx").string());
        FAIL("exported");
    } catch (const ExportError& e) {
        CHECK(std::string(e.what()).find("write into a view") != std::string::npos);
    }
    CHECK(!fs::exists(out_dir() / "never.onnx"));
}
