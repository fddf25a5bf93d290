// Convolutions and pooling for NCHW tensors, and ResNet-18.
//
// On CUDA, conv2d runs on cuDNN where it is present (backends/cuda/cudnn.hpp: bias, relu and a
// residual add in the same call). On AVX-512 CPUs, inference convolutions run in nn/conv_cpu.hpp
// (an implicit GEMM reading the input in place) or, 3x3 stride 1 in f32, nn/conv_winograd.hpp.
// Otherwise conv2d is im2col + one GEMM: the (N*OH*OW, C*KH*KW) patch matrix (padding, stride and
// dilation handled while it is gathered: a loop over threads on the CPU, one generated kernel on
// CUDA) times the (OC, C*KH*KW) weight, through nn::linear, so bias and relu ride in the GEMM's
// epilogue on CUDA. The result is (N*OH*OW, OC), i.e. channels-last memory, returned as an NCHW view; later
// ops read it through its strides, the next im2col included. Inside kiln::compile a conv or pool
// is one Kind::call node (a library op like matmul): the elementwise work around it still fuses.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/backends/cuda/blas.hpp"  // cuda::set_allow_tf32: TF32 convolutions and GEMMs
#include "kiln/nn/layers.hpp"
#include "kiln/nn/window.hpp"

namespace kiln::nn {

namespace detail {

/// t (N, C, H, W) with channels-last memory (a copy unless it already has it), still seen as NCHW.
inline Tensor channels_last(const Tensor& t) {
    if (t.stride(1) == 1 && t.stride(3) == t.size(1) && t.stride(2) == t.size(3) * t.size(1)) return t;
    return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

/// x as (N, C, H, W) for messages, from its channels-last (N, H, W, C) logical shape.
inline Shape nchw_of(const Shape& nhwc) { return nhwc.rank() == 4 ? Shape{nhwc[0], nhwc[3], nhwc[1], nhwc[2]} : nhwc; }

/// conv2d over channels-last (N, H, W, C) values, giving (N, OH, OW, OC) (conv_impl.hpp); with a
/// residual z (N, OH, OW, OC): act(conv + bias + z), one cuDNN call where cuDNN runs it.
KILN_DECL Tensor conv2d_nhwc(const Tensor& x, const Tensor& weight, const Tensor& bias, Window win, Act act, const Loc& loc,
                             const Tensor& residual = {});
/// max_pool2d over a channels-last (N, H, W, C) tensor, giving (N, OH, OW, C).
KILN_DECL Tensor max_pool2d_nhwc(const Tensor& x, Window win, const Loc& loc);
/// Register conv2d's and max_pool2d's library-op factories (called by export/program_file.hpp).
KILN_DECL void register_conv2d();
KILN_DECL void register_max_pool2d();

}  // namespace detail

/// 2-D convolution of x (N, C, H, W) with weight (OC, C, KH, KW) and optional bias (OC), then act.
/// The result is (N, OC, OH, OW) over channels-last memory.
KILN_DECL Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Window win = {}, Act act = Act::none,
                         Loc loc = Loc::current());

/// Max over each window (padding never wins), NCHW.
KILN_DECL Tensor max_pool2d(const Tensor& x, Window win, Loc loc = Loc::current());

/// Average over (H, W) into (oh, ow) cells; H and W must be multiples of oh and ow (ResNet's (1, 1)).
KILN_DECL Tensor adaptive_avg_pool2d(const Tensor& x, std::int64_t oh, std::int64_t ow, Loc loc = Loc::current());

/// torch.nn.Conv2d (square or not), with an optional fused activation.
struct Conv2d {
    Tensor weight, bias;  ///< (OC, C, KH, KW), (OC) or undefined
    Window win{};
    Act act = Act::none;

    Conv2d() = default;
    Conv2d(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1, std::int64_t padding = 0, bool with_bias = true,
           Init o = {});
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const { return conv2d(x, weight, bias, win, act, loc); }
    /// The same convolution over channels-last (N, H, W, C) values, giving (N, OH, OW, OC).
    Tensor nhwc(const Tensor& x, Loc loc = Loc::current()) const;
    template <class F> void visit(const std::string& prefix, F&& f) {
        f(prefix + "weight", weight);
        if (bias.defined()) f(prefix + "bias", bias);
    }
};

namespace detail {
/// BatchNorm's training-mode map over channels-last x (N, H, W, C) given the batch's mean and
/// biased variance (computed without recording): (x - mu) * rsqrt(var + eps) * weight + bias, with
/// a hand-written backward (two column sums and one elementwise pass, instead of the
/// decomposition's three sums, a materialized centred copy and per-channel kernels): db = sum(g),
/// dw = sum(g * xhat), dx = weight * rsqrt(var + eps) * (g - db / n - xhat * dw / n).
KILN_DECL Tensor batch_norm_train(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mu, const Tensor& var,
                                  double eps, const Loc& loc);
}  // namespace detail

/// torch.nn.BatchNorm2d. In eval mode (the default; nn::eval): (x - running_mean) / sqrt(running_var
/// + eps) * weight + bias. In training mode (nn::train): the batch's mean and biased variance over
/// (N, H, W) normalize, and the running statistics move by `momentum` toward the batch mean and the
/// unbiased batch variance (in place, not recorded for backward), as torch's do.
struct BatchNorm2d {
    Tensor weight, bias, running_mean, running_var;
    double eps = 1e-5, momentum = 0.1;
    bool training = false;

    BatchNorm2d() = default;
    explicit BatchNorm2d(std::int64_t c, Init o = {});
    bool defined() const { return weight.defined(); }
    template <class X> Tensor operator()(const X& x, Loc loc = Loc::current()) const {
        const std::int64_t c = weight.size(0);
        if (!training) {
            const Tensor scale = Tensor(weight * rsqrt(running_var + eps), loc).view({c, 1, 1});
            return Tensor((x - running_mean.view({c, 1, 1})) * scale + bias.view({c, 1, 1}), loc);
        }
        const Tensor xt = kiln::eval(x, loc);
        if (xt.rank() != 4) kiln::detail::fail<ShapeError>("BatchNorm2d", "input must be 4-D (N, C, H, W), got " + xt.shape().str(), loc);
        return nhwc(xt.permute({0, 2, 3, 1}, loc), loc).permute({0, 3, 1, 2}, loc);
    }
    /// Over channels-last (N, H, W, C) values: the per-channel parameters broadcast along the last dim.
    template <class X> Tensor nhwc(const X& x, Loc loc = Loc::current()) const {
        if (!training) return Tensor((x - running_mean) * (weight * rsqrt(running_var + eps)) + bias, loc);
        const Tensor xt = kiln::eval(x, loc);
        if (xt.rank() != 4 || xt.size(3) != weight.size(0))
            kiln::detail::fail<ShapeError>("BatchNorm2d", "input " + detail::nchw_of(xt.shape()).str() + " does not have " +
                                                              std::to_string(weight.size(0)) + " channels", loc);
        const std::int64_t count = xt.numel() / xt.size(3);
        if (count < 2)
            kiln::detail::fail<ValueError>("BatchNorm2d", "training needs more than one value per channel, got input " +
                                                              detail::nchw_of(xt.shape()).str(), loc);
        Tensor mu, var;
        {
            const no_grad off;  // the statistics' share of the gradient is in batch_norm_train's backward
            // one pass over x (as torch inductor's Welford reduction): the mean and the mean square
            // of x - k, k each channel's first value, are sibling reductions (one kernel); shifted
            // by a value of the data, var = E[(x-k)^2] - E[x-k]^2 keeps its precision
            const Tensor k = xt.select(0, 0, loc).select(0, 0, loc).select(0, 0, loc);
            const Tensor s1 = mean(xt - k, {0, 1, 2}, false, loc), s2 = mean(square(xt - k), {0, 1, 2}, false, loc);
            mu = Tensor(k + s1, loc);
            var = Tensor(maximum(s2 - s1 * s1, 0.0), loc);
            Tensor rm = running_mean, rv = running_var;
            const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
            rm.copy_(Tensor(rm * (1 - momentum) + mu * momentum, loc), loc);
            rv.copy_(Tensor(rv * (1 - momentum) + var * (momentum * unbias), loc), loc);
        }
        return detail::batch_norm_train(xt, weight, bias, mu, var, eps, loc);
    }
    template <class F> void visit(const std::string& prefix, F&& f) {
        if (!defined()) return;  // folded into its convolution
        f(prefix + "weight", weight);
        f(prefix + "bias", bias);
        nn::detail::visit_buffer(f, prefix + "running_mean", running_mean);
        nn::detail::visit_buffer(f, prefix + "running_var", running_var);
        nn::detail::visit_mode(f, training);
    }
};

/// Folds an inference BatchNorm2d into the convolution before it (w' = w * s, b' = (b - mean) * s +
/// beta with s = gamma / sqrt(var + eps)), computed in float64; the norm becomes undefined (skipped).
KILN_DECL void fold_batchnorm(Conv2d& conv, BatchNorm2d& bn);

/// ResNet's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
struct BasicBlock {
    Conv2d conv1, conv2, down;  ///< down: the 1x1 stride-2 shortcut conv, or undefined
    BatchNorm2d bn1, bn2, down_bn;

    BasicBlock() = default;
    BasicBlock(std::int64_t in, std::int64_t out, std::int64_t stride, Init o = {});
    /// x (N, C, H, W) -> (N, OC, OH, OW).
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
    /// The block over channels-last (N, H, W, C) values (how ResNet18 runs it: every elementwise
    /// kernel between the convolutions reads and writes contiguous memory).
    Tensor nhwc(const Tensor& x, Loc loc = Loc::current()) const;
    void fold();
    template <class F> void visit(const std::string& prefix, F&& f) {
        conv1.visit(prefix + "conv1.", f);
        bn1.visit(prefix + "bn1.", f);
        conv2.visit(prefix + "conv2.", f);
        bn2.visit(prefix + "bn2.", f);
        if (down.weight.defined()) {
            down.visit(prefix + "downsample.0.", f);
            down_bn.visit(prefix + "downsample.1.", f);
        }
    }
};

/// ResNet-18 (torchvision's layout and parameter names) at inference: (N, 3, H, W) -> (N, classes).
/// fold() folds every BatchNorm into its convolution (relu into the first conv's GEMM epilogue).
struct ResNet18 {
    Conv2d conv1;
    BatchNorm2d bn1;
    std::vector<BasicBlock> blocks;  ///< layer1.0, layer1.1, ..., layer4.1
    Linear fc;

    ResNet18() = default;
    explicit ResNet18(std::int64_t classes = 1000, Init o = {});
    /// x (N, 3, H, W) -> (N, classes); inside, activations are channels-last (N, H, W, C).
    Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
    void fold();
    template <class F> void visit(const std::string& prefix, F&& f) {
        conv1.visit(prefix + "conv1.", f);
        bn1.visit(prefix + "bn1.", f);
        for (std::size_t i = 0; i < blocks.size(); ++i)
            blocks[i].visit(prefix + "layer" + std::to_string(i / 2 + 1) + "." + std::to_string(i % 2) + ".", f);
        fc.visit(prefix + "fc.", f);
    }
};

}  // namespace kiln::nn

#if KILN_HEADER_ONLY
#include "kiln/nn/conv_impl.hpp"
#endif
