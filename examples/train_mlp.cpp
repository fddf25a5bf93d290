// The seed's training example: a regression MLP (Linear(16, 64), ReLU, Linear(64, 1)) trained with
// AdamW (lr 1e-3) on MSELoss, batch 128, 20 steps; once eagerly (ops recorded, backward walked op by
// op) and once as one kiln::compile program (forward, backward and the optimizer step traced
// together), from the same initial weights on the same batches. Prints the loss per step for both
// and fails when they disagree.
//   example_train_mlp [--cuda] [--from DIR]
// --from DIR: the initial weights and the batches from DIR/weights.safetensors and
// DIR/batches.safetensors (written by bench/anchors/torch_train_agree.py, which compares these
// losses with PyTorch's), and the compiled model's final parameters to DIR/kiln_final.safetensors.
#include "example_util.hpp"

#include <kiln/nn.hpp>

#include <cstring>
#include <map>
#include <string>

struct Regressor {
    kiln::nn::Linear fc1, fc2;
    Regressor(kiln::Device dev) : fc1(16, 64, true, kiln::Act::relu, {kiln::DType::f32, dev}), fc2(64, 1, true, kiln::Act::none, {kiln::DType::f32, dev}) {}
    kiln::Tensor operator()(const kiln::Tensor& x) const { return fc2(fc1(x)); }
    template <class F> void visit(const std::string& p, F&& f) {
        fc1.visit(p + "fc1.", f);
        fc2.visit(p + "fc2.", f);
    }
};

int main(int argc, char** argv) {
    kiln::Device dev = kiln::Device::cpu();
    std::string from;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--cuda") == 0) dev = kiln::Device::cuda(0);
        else if (std::strcmp(argv[i], "--from") == 0 && i + 1 < argc) from = argv[++i];
        else {
            std::fprintf(stderr, "%s: unknown option '%s' (options: --cuda, --from DIR)\n", argv[0], argv[i]);
            return 2;
        }
    }
    kiln::manual_seed(0);
    Regressor eager_model(dev), compiled_model(dev);
    {  // the same initial weights (copies, not shared memory)
        std::map<std::string, kiln::Tensor> w;
        if (!from.empty()) w = kiln::nn::load_safetensors(from + "/weights.safetensors");
        else
            for (const auto& [k, t] : kiln::nn::state_dict(eager_model)) w.emplace(k, t.clone());
        kiln::nn::load_state(eager_model, w);
        for (auto& [k, t] : w) t = t.clone();
        kiln::nn::load_state(compiled_model, w);
    }
    const std::map<std::string, kiln::Tensor> batches =
        from.empty() ? std::map<std::string, kiln::Tensor>{} : kiln::nn::load_safetensors(from + "/batches.safetensors");
    const int steps = from.empty() ? 20 : static_cast<int>(batches.size() / 2);
    kiln::nn::AdamW eager_opt(kiln::nn::parameters(eager_model), {.lr = 1e-3});
    kiln::nn::AdamW compiled_opt(kiln::nn::parameters(compiled_model), {.lr = 1e-3});
    auto train_step = [](Regressor& m, kiln::nn::Optimizer& opt, const kiln::Tensor& x, const kiln::Tensor& y) {
        opt.zero_grad();
        kiln::Tensor loss = kiln::nn::mse_loss(m(x), y);
        loss.backward();
        opt.step();
        return loss.detach();
    };
    auto compiled_step = kiln::compile(
        [&](const kiln::Tensor& x, const kiln::Tensor& y) { return train_step(compiled_model, compiled_opt, x, y); }, {.fullgraph = true});

    const kiln::Tensor w_true = kiln::randn({16, 1}).to(dev);
    double worst = 0;
    for (int step = 0; step < steps; ++step) {
        kiln::Tensor x, y;
        if (from.empty()) {
            x = kiln::randn({128, 16}).to(dev);
            y = kiln::Tensor(kiln::matmul(x, w_true) + 0.1 * kiln::randn({128, 1}).to(dev));
        } else {
            x = batches.at("x" + std::to_string(step)).to(dev);
            y = batches.at("y" + std::to_string(step)).to(dev);
        }
        const double le = train_step(eager_model, eager_opt, x, y).item<double>();
        const double lc = compiled_step(x, y).item<double>();
        worst = std::max(worst, std::abs(le - lc) / std::max(1.0, std::abs(le)));
        std::printf("step %2d  loss eager %.9g  compiled %.9g\n", step, le, lc);
    }
    if (!from.empty()) {
        std::map<std::string, kiln::Tensor> final_params;
        for (const auto& [k, t] : kiln::nn::state_dict(compiled_model)) final_params.emplace(k, t.cpu());
        kiln::nn::save_safetensors(from + "/kiln_final.safetensors", final_params);
    }
    std::printf("compiled step: %d kernels, %d compile(s); largest relative loss difference %.2e\n", compiled_step.kernels(),
                compiled_step.compiles(), worst);
    if (worst > 1e-4) {
        std::fprintf(stderr, "train_mlp: eager and compiled losses differ by %.2e (> 1e-4)\n", worst);
        return 1;
    }
    return 0;
}
