// The seed's training example: a regression MLP (Linear(16, 64), ReLU, Linear(64, 1)) trained with
// AdamW (lr 1e-3) on MSELoss, batch 128, 20 steps; once eagerly (ops recorded, backward walked op by
// op) and once as one kiln::compile program (forward, backward and the optimizer step traced
// together), from the same initial weights on the same batches. Prints the loss per step for both
// and fails when they disagree.
//   example_train_mlp [--cuda]
#include "example_util.hpp"

#include <kiln/nn.hpp>

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
    const kiln::Device dev = example::device_from(argc, argv);
    kiln::manual_seed(0);
    Regressor eager_model(dev), compiled_model(dev);
    {  // the same initial weights (copies, not shared memory)
        std::map<std::string, kiln::Tensor> w;
        for (const auto& [k, t] : kiln::nn::state_dict(eager_model)) w.emplace(k, t.clone());
        kiln::nn::load_state(compiled_model, w);
    }
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
    for (int step = 0; step < 20; ++step) {
        const kiln::Tensor x = kiln::randn({128, 16}).to(dev);
        const kiln::Tensor y = kiln::Tensor(kiln::matmul(x, w_true) + 0.1 * kiln::randn({128, 1}).to(dev));
        const double le = train_step(eager_model, eager_opt, x, y).item<double>();
        const double lc = compiled_step(x, y).item<double>();
        worst = std::max(worst, std::abs(le - lc) / std::max(1.0, std::abs(le)));
        std::printf("step %2d  loss eager %.6f  compiled %.6f\n", step, le, lc);
    }
    std::printf("compiled step: %d kernels, %d compile(s); largest relative loss difference %.2e\n", compiled_step.kernels(),
                compiled_step.compiles(), worst);
    if (worst > 1e-4) {
        std::fprintf(stderr, "train_mlp: eager and compiled losses differ by %.2e (> 1e-4)\n", worst);
        return 1;
    }
    return 0;
}
