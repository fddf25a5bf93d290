// The training workloads of the bench: kiln_bench's training rows and kiln_ddp_bench's
// data-parallel rows train the same models the same way (bench/anchors/torch_train_anchor.py and
// torch_ddp_anchor.py are PyTorch's side).
//   mlp_train        the bench's MLP (batch 64, 1024 -> 4096 GELU(tanh) -> 1024), f32 without TF32, MSE
//                    loss against a fixed target, AdamW (lr 1e-4)
//   bert_layer_train the bench's BERT layer (batch 8, seq 128, hidden 768, 12 heads, FFN 3072) with f32
//                    master weights computing in bf16 (nn::autocast: the weights cast each step, as
//                    torch.autocast does), MSE loss in f32 against a fixed target, AdamW (lr 1e-4)
//   resnet18_train   ResNet-18 in training mode (BatchNorm on batch statistics), batch 16 at 224x224, f32
//                    (TF32 GEMMs on the GPU, as torch's default TF32 convolutions), cross-entropy over
//                    1000 classes, SGD (lr 0.01, momentum 0.9)
// The batch sizes are per process: a data-parallel step on N GPUs trains N times as many samples.
// make_trainer's `batch` replaces a workload's batch (kiln_ddp_bench --batch; 0 keeps it).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>

namespace kiln_bench {

using kiln::Tensor;

struct Trainer {
    std::shared_ptr<void> model;  // the module (kept alive)
    std::shared_ptr<void> ddp;    // its data-parallel wrapper, where there is one
    std::shared_ptr<kiln::nn::Optimizer> opt;
    std::function<Tensor(const Tensor&, const Tensor&)> loss;  // forward and loss
    Tensor x, y;
    double flops = 0;
    std::string math;
    double tol = 1e-4;  // first losses of the methods agree to this (relative)
    Tensor step(const Tensor& in, const Tensor& target) {
        opt->zero_grad();
        Tensor l = loss(in, target);
        l.backward();
        opt->step();
        return l.detach();
    }
};

/// How a trainer's forward reaches its module: the module itself. kiln_ddp_bench passes one that
/// puts a DataParallel in between.
struct Plain {
    template <class M, class F>
    std::function<Tensor(const Tensor&)> operator()(const std::shared_ptr<M>& m, F forward, std::shared_ptr<void>&) const {
        return [m, forward](const Tensor& x) { return forward(*m, x); };
    }
};

/// The workload `name` on dev, its weights and data from seed 7; `wrap(module, forward, keep)`
/// makes the forward the loss calls (keep holds what it needs alive); `batch` > 0 replaces the
/// workload's batch (sequences for the BERT layer, images for ResNet-18).
template <class Wrap = Plain>
Trainer make_trainer(const std::string& name, kiln::Device dev, Wrap wrap = {}, std::int64_t batch = 0) {
    const auto pick = [batch](std::int64_t d) { return batch > 0 ? batch : d; };
    kiln::manual_seed(7);
    Trainer t;
    const kiln::nn::Init f32{kiln::DType::f32, dev};
    if (name == "mlp_train") {
        auto m = std::make_shared<kiln::nn::Mlp>(1024, 4096, 1024, f32);
        t.model = m;
        auto fwd = wrap(m, [](kiln::nn::Mlp& mod, const Tensor& x) { return mod(x); }, t.ddp);
        t.opt = std::make_shared<kiln::nn::AdamW>(kiln::nn::parameters(*m), kiln::nn::AdamW::Options{.lr = 1e-4});
        t.loss = [fwd](const Tensor& x, const Tensor& y) { return kiln::nn::mse_loss(fwd(x), y); };
        const std::int64_t B = pick(64);
        t.x = kiln::randn({B, 1024}).to(dev);
        t.y = kiln::randn({B, 1024}).to(dev);
        t.flops = 3 * 2.0 * static_cast<double>(B) * (1024.0 * 4096 * 2);  // forward + backward (2x forward)
        t.math = "f32 (no TF32)";
    } else if (name == "bert_layer_train") {
        const std::int64_t B = pick(8), S = 128, E = 768, H = 12, F = 3072;
        auto m = std::make_shared<kiln::nn::BertLayer>(E, H, F, 1e-5, f32);
        t.model = m;
        auto fwd = wrap(m, [](kiln::nn::BertLayer& mod, const Tensor& x) {
            const kiln::nn::BertLayer low = kiln::nn::autocast(mod, kiln::DType::bf16);
            return low(x).to(kiln::DType::f32);
        }, t.ddp);
        t.opt = std::make_shared<kiln::nn::AdamW>(kiln::nn::parameters(*m), kiln::nn::AdamW::Options{.lr = 1e-4});
        t.loss = [fwd](const Tensor& x, const Tensor& y) { return kiln::nn::mse_loss(fwd(x), y); };
        t.x = kiln::randn({B, S, E}).to(kiln::DType::bf16).to(dev);
        t.y = kiln::randn({B, S, E}).to(dev);
        t.flops = 3 * (2.0 * B * S * (E * 3.0 * E + E * E + 2.0 * E * F) + 2.0 * 2 * B * H * S * S * (E / H));
        t.math = "bf16 compute, f32 master weights and AdamW state";
        t.tol = 1e-3;
    } else {  // resnet18_train
        auto m = std::make_shared<kiln::nn::ResNet18>(1000, f32);
        kiln::nn::train(*m);
        t.model = m;
        auto fwd = wrap(m, [](kiln::nn::ResNet18& mod, const Tensor& x) { return mod(x); }, t.ddp);
        t.opt = std::make_shared<kiln::nn::SGD>(kiln::nn::parameters(*m), kiln::nn::SGD::Options{.lr = 0.01, .momentum = 0.9});
        t.loss = [fwd](const Tensor& x, const Tensor& y) { return kiln::nn::cross_entropy(fwd(x), y); };
        const std::int64_t B = pick(16);
        t.x = kiln::randn({B, 3, 224, 224}).to(dev);
        t.y = kiln::randint(0, 1000, {B}).to(dev);
        t.flops = 3 * 2.0 * 1814073344.0 * static_cast<double>(B);  // 3x the forward's 2 * MACs (torch_anchor.py counts 1,814,073,344 per image)
        t.math = dev.is_cuda() ? "f32, TF32 GEMMs (as torch's default TF32 convolutions)" : "f32";
        t.tol = 1e-3;
    }
    return t;
}

}  // namespace kiln_bench
