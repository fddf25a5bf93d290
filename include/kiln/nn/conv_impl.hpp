// nn/conv.hpp's definitions (compiled once in separate compilation), included by nn/conv.hpp: the
// im2col and pooling kernels, cuDNN's path, the library ops and their gradients, the modules' bodies.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/thread_pool.hpp"
#include "kiln/backends/cuda/cudnn.hpp"
#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/backends/cuda/library_kernels.hpp"
#include "kiln/ir/library_ops.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/conv_cpu.hpp"
#include "kiln/nn/conv_winograd.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::nn {

namespace detail {

/// The bits of the lowest value of a dtype (pooling's padding): -inf for floats, the minimum for
/// integers, false for bool.
inline std::uint64_t neg_inf_bits(DType d) {
    switch (d) {
        case DType::i32: return 0x80000000u;
        case DType::i64: return 0x8000000000000000ull;
        case DType::f32: return 0xff800000u;
        case DType::f64: return 0xfff0000000000000ull;
        case DType::f16: return 0xfc00u;
        case DType::bf16: return 0xff80u;
        default: return 0;
    }
}

template <class W>
void im2col_cpu(const Tensor& x, const Window& win, std::int64_t OH, std::int64_t OW, std::uint64_t pad_bits, Tensor& cols) {
    const std::int64_t C = x.size(1), H = x.size(2), Wd = x.size(3);
    const std::int64_t sN = x.stride(0), sC = x.stride(1), sH = x.stride(2), sW = x.stride(3);
    const W* src = static_cast<const W*>(x.data_ptr());
    W* dst = static_cast<W*>(cols.data_ptr());
    const W pad = static_cast<W>(pad_bits);
    const std::int64_t K = C * win.kh * win.kw, rows = x.size(0) * OH * OW;
    kiln::detail::parallel_for(rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(K, 1)), [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
            const std::int64_t n = r / (OH * OW), oh = (r / OW) % OH, ow = r % OW;
            W* out = dst + r * K;
            for (std::int64_t i = 0; i < win.kh; ++i) {
                const std::int64_t h = oh * win.sh - win.ph + i * win.dh;
                for (std::int64_t j = 0; j < win.kw; ++j) {
                    const std::int64_t w = ow * win.sw - win.pw + j * win.dw;
                    const bool inside = h >= 0 && h < H && w >= 0 && w < Wd;
                    const W* in = src + n * sN + h * sH + w * sW;
                    for (std::int64_t c = 0; c < C; ++c) *out++ = inside ? in[c * sC] : pad;
                }
            }
        }
    });
}

/// Whether a kernel over the 4-D x writing n elements needs 64-bit index math (32-bit divisions
/// are much cheaper): an element count or an offset into x reaches 2^31.
inline bool needs_i64(const Tensor& x, std::int64_t n) {
    std::int64_t span = 1;
    for (int d = 0; d < 4; ++d) span += (x.size(d) - 1) * x.stride(d);
    return n >= (std::int64_t{1} << 31) || span >= (std::int64_t{1} << 31);
}

inline void im2col_cuda(const Tensor& x, const Window& win, std::int64_t OH, std::int64_t OW, std::uint64_t pad_bits, Tensor& cols) {
    const int device = x.device().index;
    const std::size_t es = x.element_size();
    const bool i64 = needs_i64(x, cols.numel());
    const cuda::detail::KernelText k = cuda::detail::im2col_kernel(es, i64);
    const cuda::CUfunction f = cuda::detail::kernel_function(k, device);
    const std::int64_t segs = cols.size(0) * win.kh * win.kw;
    cuda::detail::Args a;
    a.add_ptr(x.data_ptr());
    a.add_ptr(cols.data_ptr());
    for (std::int64_t v : {segs, x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2), x.stride(3), OH, OW,
                           win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw})
        a.add(v);
    a.add(static_cast<std::int64_t>(pad_bits));
    std::int64_t lanes = 1;
    while (lanes < 32 && lanes < x.size(1)) lanes *= 2;
    a.add(lanes);
    const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>((segs * lanes + 255) / 256, 1 << 20));
    cuda::detail::launch(f, grid, 256, 0, cuda::current_stream(device), a.finish());
}

/// A max-pool launch's geometry, baked into its kernels (one compile per geometry).
inline cuda::detail::PoolGeometry pool_geometry(std::int64_t C, std::int64_t H, std::int64_t W, std::int64_t OH, std::int64_t OW, const Window& win) {
    return {C, H, W, OH, OW, win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw};
}

/// max_pool2d of x (N, H, W, C; any strides) into y (N, OH, OW, C; contiguous) with one thread per
/// output element: channels fastest, so a warp reads 32 neighbouring channels of each window
/// position. NaN wins (as in torch); padding never does (the window holds at least one input).
inline void max_pool_cuda(const Tensor& x, const Window& win, Tensor& y) {
    const int device = x.device().index;
    const bool i64 = needs_i64(x, y.numel());
    const cuda::detail::KernelText k = cuda::detail::max_pool_kernel(x.dtype(), i64, false, pool_geometry(x.size(3), x.size(1), x.size(2), y.size(1), y.size(2), win));
    const cuda::CUfunction f = cuda::detail::kernel_function(k, device);
    cuda::detail::Args a;
    a.add_ptr(x.data_ptr());
    a.add_ptr(y.data_ptr());
    for (std::int64_t v : {y.numel(), x.size(3), x.size(1), x.size(2), x.stride(0), x.stride(1), x.stride(2), x.stride(3), y.size(1),
                           y.size(2), win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw})
        a.add(v);
    const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>((y.numel() + 255) / 256, 1 << 20));
    cuda::detail::launch(f, grid, 256, 0, cuda::current_stream(device), a.finish());
}

/// The (N*OH*OW, KH*KW*C) patch matrix of x (N, C, H, W; any strides), columns in (kh, kw, c)
/// order; padding reads pad_bits.
inline Tensor im2col(const Tensor& x, const Window& win, std::uint64_t pad_bits) {
    const std::int64_t OH = win.out_h(x.size(2)), OW = win.out_w(x.size(3));
    Tensor cols(Shape{x.size(0) * OH * OW, x.size(1) * win.kh * win.kw}, x.dtype(), x.device());
    if (cols.numel() == 0) return cols;
    if (x.device().is_cuda()) {
        im2col_cuda(x, win, OH, OW, pad_bits, cols);
        return cols;
    }
    switch (x.element_size()) {
        case 1: im2col_cpu<std::uint8_t>(x, win, OH, OW, pad_bits, cols); break;
        case 2: im2col_cpu<std::uint16_t>(x, win, OH, OW, pad_bits, cols); break;
        case 4: im2col_cpu<std::uint32_t>(x, win, OH, OW, pad_bits, cols); break;
        default: im2col_cpu<std::uint64_t>(x, win, OH, OW, pad_bits, cols); break;
    }
    return cols;
}

inline void check_window(const char* op, const Shape& x, const Window& win, const Loc& loc) {
    if (x.rank() != 4)
        kiln::detail::fail<ShapeError>(op, "input must be 4-D (N, C, H, W), got " + x.str(), loc);
    if (win.kh < 1 || win.kw < 1 || win.sh < 1 || win.sw < 1 || win.ph < 0 || win.pw < 0 || win.dh < 1 || win.dw < 1)
        kiln::detail::fail<ValueError>(op, "invalid window (" + win.str() + ")", loc);
    if (win.out_h(x[2]) < 1 || win.out_w(x[3]) < 1)
        kiln::detail::fail<ShapeError>(op, "the window (" + win.str() + ") does not fit an input of " + x.str(), loc);
}



}  // namespace detail

namespace detail {


/// The window's geometry as cuDNN takes it.
inline cuda::cudnn::ConvParams conv_params(const Window& win) { return {win.ph, win.pw, win.sh, win.sw, win.dh, win.dw}; }

/// act(y + b + z), b and z each left out when undefined, as one statement.
inline Tensor bias_residual_act(const Tensor& y, const Tensor& b, const Tensor& z, Act act, const Loc& loc) {
    if (b.defined() && z.defined()) return apply_act(act, y + b + z, loc);
    if (b.defined()) return apply_act(act, y + b, loc);
    if (z.defined()) return apply_act(act, y + z, loc);
    return apply_act(act, y, loc);
}

template <class T>
void col2im_cpu(const Tensor& cols, Tensor& x, std::int64_t OH, std::int64_t OW, const Window& win) {
    const std::int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3), K = win.kh * win.kw * C;
    const T* src = static_cast<const T*>(cols.data_ptr());
    T* dst = static_cast<T*>(x.data_ptr());
    kiln::detail::parallel_for(N * H * W, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(C, 1)), [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
            const std::int64_t n = r / (H * W), h = (r / W) % H, w = r % W;
            T* out = dst + r * C;
            std::fill(out, out + C, T(0));
            for (std::int64_t a = 0; a < win.kh; ++a) {
                const std::int64_t t = h + win.ph - a * win.dh;
                if (t < 0 || t % win.sh != 0 || t / win.sh >= OH) continue;
                for (std::int64_t b = 0; b < win.kw; ++b) {
                    const std::int64_t u = w + win.pw - b * win.dw;
                    if (u < 0 || u % win.sw != 0 || u / win.sw >= OW) continue;
                    const T* in = src + ((n * OH + t / win.sh) * OW + u / win.sw) * K + (a * win.kw + b) * C;
                    for (std::int64_t c = 0; c < C; ++c) out[c] += in[c];
                }
            }
        }
    });
}

/// The gradient of im2col: (N, H, W, C) (xs, channels-last) whose every element sums the entries of
/// cols (N*OH*OW, KH*KW*C) that im2col copied from it. Summed in f32 (f64 for f64), no atomics.
inline Tensor col2im_now(const Tensor& cols_in, const Shape& xs, const Window& win, const Loc& loc) {
    const DType work = cols_in.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const Tensor cols = cols_in.to(work, loc).contiguous();
    Tensor x(xs, work, cols.device(), loc);
    if (x.numel() == 0) return x.to(cols_in.dtype(), loc);
    const std::int64_t OH = win.out_h(xs[1]), OW = win.out_w(xs[2]);
    if (x.device().is_cuda()) {
        const int device = x.device().index;
        const std::int64_t total = x.numel();
        cuda::detail::Args a;
        a.add_ptr(cols.data_ptr());
        a.add_ptr(x.data_ptr());
        for (std::int64_t v : {total, xs[3], xs[1], xs[2], OH, OW, win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw}) a.add(v);
        const bool i64 = cols.numel() >= (std::int64_t{1} << 31);
        cuda::detail::launch(cuda::detail::kernel_function(cuda::detail::col2im_kernel(work, i64), device),
                             cuda::detail::grid_for(total, 256, device), 256, 0, cuda::current_stream(device), a.finish());
    } else if (work == DType::f64) {
        col2im_cpu<double>(cols, x, OH, OW, win);
    } else {
        col2im_cpu<float>(cols, x, OH, OW, win);
    }
    return x.to(cols_in.dtype(), loc);
}

/// col2im as a library op (a Kind::call node under kiln::compile; the batch follows the rows).
inline Tensor col2im(const Tensor& cols, const Shape& xs, const Window& win, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "col2im(" + win.str() + ", " + xs.str() + ")";
    op->shape = [xs, win](const std::vector<Shape>& s) {
        return Shape{s[0][0] / (win.out_h(xs[1]) * win.out_w(xs[2])), xs[1], xs[2], xs[3]};
    };
    op->run = [xs, win, loc](const std::vector<Tensor>& in) {
        Shape x = xs;
        x[0] = in[0].size(0) / (win.out_h(xs[1]) * win.out_w(xs[2]));
        return col2im_now(in[0], x, win, loc);
    };
    return trace::call_op(std::move(op), {cols}, cols.dtype(), loc);
}

/// im2col of channels-last x (N, H, W, C) as a library op, recorded for backward (its gradient is
/// col2im): the patch matrix (N*OH*OW, KH*KW*C) that conv2d's GEMM and max_pool2d's backward read.
inline Tensor im2col_nhwc(const Tensor& x, const Window& win, std::uint64_t pad_bits, const Loc& loc) {
    const auto forward = [&] {
        auto op = std::make_shared<ir::CallOp>();
        op->key = "im2col(" + win.str() + ", pad=" + std::to_string(pad_bits) + ")";
        op->shape = [win](const std::vector<Shape>& s) {
            return Shape{s[0][0] * win.out_h(s[0][1]) * win.out_w(s[0][2]), win.kh * win.kw * s[0][3]};
        };
        op->run = [win, pad_bits](const std::vector<Tensor>& in) { return im2col(channels_last(in[0].permute({0, 3, 1, 2})), win, pad_bits); };
        return trace::call_op(std::move(op), {x}, x.dtype(), loc);
    };
    if (!autograd::detail::needs_grad({&x})) return forward();
    return autograd::detail::library(
        "im2col", {&x}, forward, [xs = x.shape(), win, loc](const Tensor& g) { return std::vector<Tensor>{col2im(g, xs, win, loc)}; }, loc);
}

KILN_DECL Tensor conv2d_nhwc(const Tensor& x, const Tensor& weight, const Tensor& bias, Window win, Act act, const Loc& loc,
                             const Tensor& residual);

/// conv2d's input gradient (N, H, W, C) from g (N, OH, OW, OC) and the weight (OC, C, KH, KW), as a
/// library op: cuDNN's backward data on CUDA where it runs, else g @ w as columns and col2im.
inline Tensor conv2d_input_grad(const Tensor& g, const Tensor& w, const Shape& xs, const Window& win, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "conv2d_input_grad(" + win.str() + ", " + xs.str() + ")";
    op->shape = [xs](const std::vector<Shape>& s) { return Shape{s[0][0], xs[1], xs[2], xs[3]}; };
    op->run = [xs, win, loc](const std::vector<Tensor>& in) {
        const Tensor gc = in[0].contiguous(), wl = in[1].permute({0, 2, 3, 1}).contiguous();
        const Shape x{gc.size(0), xs[1], xs[2], xs[3]};
        if (gc.device().is_cuda()) {
            Tensor dx(x, gc.dtype(), gc.device(), loc);
            if (cuda::cudnn::conv2d_backward(cuda::cudnn::ConvPass::backward_data, dx, wl, gc, conv_params(win), dx)) return dx;
        }
        const std::int64_t oc = wl.size(0);
        return col2im_now(kiln::matmul(gc.view({-1, oc}), wl.view({oc, -1}), loc), x, win, loc);
    };
    return trace::call_op(std::move(op), {g, w}, g.dtype(), loc);
}

/// conv2d's weight gradient as (OC, KH, KW, C) from x (N, H, W, C; any strides) and g (N, OH, OW,
/// OC), as a library op: cuDNN's backward filter on CUDA where it runs, else g^T @ im2col(x).
inline Tensor conv2d_weight_grad(const Tensor& x, const Tensor& g, const Shape& ws, const Window& win, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "conv2d_weight_grad(" + win.str() + ", " + ws.str() + ")";
    const Shape wl{ws[0], ws[2], ws[3], ws[1]};
    op->shape = [wl](const std::vector<Shape>&) { return wl; };
    op->run = [wl, win, loc](const std::vector<Tensor>& in) {
        const Tensor xc = channels_last(in[0].permute({0, 3, 1, 2}));  // NCHW view of channels-last memory
        const Tensor gc = in[1].contiguous();
        if (gc.device().is_cuda()) {
            Tensor dw(wl, gc.dtype(), gc.device(), loc);
            if (cuda::cudnn::conv2d_backward(cuda::cudnn::ConvPass::backward_filter, xc.permute({0, 2, 3, 1}), dw, gc, conv_params(win), dw))
                return dw;
        }
        return kiln::matmul(gc.view({-1, wl[0]}).t(), im2col(xc, win, 0), loc).view(wl);
    };
    return trace::call_op(std::move(op), {x, g}, g.dtype(), loc);
}

/// conv2d while recording for backward. On CUDA with cuDNN: the convolution is one library op
/// (cuDNN forward) whose gradients are cuDNN's backward data and backward filter; bias, residual
/// and relu follow as recorded elementwise ops. Otherwise im2col (whose gradient is col2im) and one
/// GEMM through nn::linear (whose gradients are GEMMs). Either way every operand's gradient comes
/// from recorded ops.
inline Tensor conv2d_recorded(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window& win, Act act,
                              const Tensor& residual, const Shape& out, const Loc& loc) {
    const Tensor b = bias.defined() && bias.dtype() != x.dtype() ? bias.to(x.dtype(), loc) : bias;
    if (x.device().is_cuda() && cuda::cudnn::available() && x.dtype() != DType::f64 && weight.dtype() == x.dtype()) {
        // cuDNN's forward and backward data both read the weight as (OC, KH, KW, C) rows: the
        // weight itself where it is stored so (nn::Conv2d's are), else one copy for both (they take
        // it as a view in the weight's shape), made outside autograd (the library op's rule gives
        // the weight's gradient)
        const Tensor wl = [&] {
            const no_grad off;
            return channels_last(weight.detach());
        }();
        const Tensor c = autograd::detail::library(
            "conv2d", {&x, &weight}, [&] { return conv2d_nhwc(x, wl, Tensor{}, win, Act::none, loc, Tensor{}); },
            [xd = x.detach(), wl, win, loc](const Tensor& g) {
                return std::vector<Tensor>{conv2d_input_grad(g, wl, xd.shape(), win, loc),
                                           conv2d_weight_grad(xd, g, wl.shape(), win, loc).permute({0, 3, 1, 2}, loc)};
            },
            loc);
        return bias_residual_act(c, b, residual, act, loc);
    }
    const Tensor cols = im2col_nhwc(x, win, 0, loc);
    const Tensor w2 = weight.permute({0, 2, 3, 1}, loc).reshape({weight.size(0), -1}, loc);
    if (!residual.defined()) return linear(cols, w2, b, act, loc).reshape(out, loc);
    return add_act(linear(cols, w2, b, Act::none, loc).reshape(out, loc), residual, act, loc);
}

/// max_pool2d's gradient: each window's gradient goes to its first maximum (torch's argmax
/// convention: ties and runs of equal values give it to the earliest position): two kernels on
/// CUDA (f32, f64), elsewhere im2col, the selections and col2im.
inline Tensor max_pool2d_backward(const Tensor& x, const Tensor& g, const Window& win, const Loc& loc);
inline std::shared_ptr<ir::CallOp> max_pool2d_backward_op(const Window& win, const Loc& loc);

/// w * scale and (bias - mean) * scale + shift per output channel (weight (OC, C, KH, KW); bias and
/// mean (OC) or undefined, read as 0), computed in float64 and stored in the weight's dtype and
/// device, the weight channels-last (conv2d reads (OC, KH, KW, C) rows).
inline std::pair<Tensor, Tensor> fold_scale_shift(const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& scale,
                                                  const Tensor& shift) {
    const DType dt = weight.dtype();
    const Device dev = weight.device();
    const std::int64_t oc = weight.size(0);
    auto f64 = [](const Tensor& t) { return t.cpu().to(DType::f64); };
    const Tensor s = f64(scale);
    const Tensor w = Tensor(f64(weight) * s.view({oc, 1, 1, 1}));
    const Tensor b0 = bias.defined() ? f64(bias) : zeros({oc}, DType::f64);
    const Tensor b = mean.defined() ? Tensor((b0 - f64(mean)) * s + f64(shift)) : Tensor(b0 * s + f64(shift));
    return {channels_last(w.to(dt).to(dev)), b.to(dt).to(dev)};
}

/// conv2d on cuDNN (see conv2d_op's run for the operands): act(conv + b + z) as (N, OH, OW, OC),
/// or an undefined tensor when cuDNN is missing or takes no algorithm for it. Under graph capture
/// bias, residual and relu ride in cuDNN's fused call (cuda::cudnn::FusedEpilogues); otherwise the
/// plain convolution runs and one kiln kernel applies them.
inline Tensor conv2d_cudnn(const Tensor& xx, const Tensor& wl, const Tensor& b, const Tensor& z, const Window& win, Act act,
                           const Shape& ys, const Loc& loc) {
    const bool one_dtype = wl.dtype() == xx.dtype() && (!z.defined() || z.dtype() == xx.dtype());
    if (!one_dtype || !act_info(act).conv_epilogue || !cuda::cudnn::available()) return {};
    Tensor y(ys, xx.dtype(), xx.device());
    const Tensor xc = channels_last(xx).permute({0, 2, 3, 1}), bc = b.defined() ? b.contiguous() : b;
    const Tensor zc = z.defined() ? z.contiguous() : z;
    const cuda::cudnn::ConvParams cp = conv_params(win);
    const Tensor* bp = b.defined() ? &bc : nullptr;
    const Tensor* zp = z.defined() ? &zc : nullptr;
    const bool is_relu = act == Act::relu, epilogue = bp || zp || is_relu;
    using cuda::cudnn::FusedEpilogues;
    const FusedEpilogues mode = cuda::cudnn::fused_epilogues();
    const bool capturing = cuda::capturing(cuda::current_stream(xx.device().index));
    if (epilogue && (mode == FusedEpilogues::always || (mode == FusedEpilogues::capture && capturing)) &&
        cuda::cudnn::conv2d_forward(xc, wl, bp, zp, is_relu, cp, y))
        return y;
    // outside a capture, choose the fused call's algorithm now, so a later capture finds it
    if (epilogue && mode == FusedEpilogues::capture && !capturing && !cuda::cudnn::conv2d_planned(xc, wl, bp, zp, is_relu, cp)) {
        Tensor scratch(ys, xx.dtype(), xx.device());
        cuda::cudnn::conv2d_forward(xc, wl, bp, zp, is_relu, cp, scratch);
    }
    // the convolution alone on cuDNN, then bias, residual and act as one kiln kernel
    if (!cuda::cudnn::conv2d_forward(xc, wl, nullptr, nullptr, false, cp, y)) return {};
    return bias_residual_act(y, b, z, act, loc);
}

/// A window as a saved library op's attributes (ir::CallOp::attrs), and back (ValueError for
/// values no window has).
inline ir::CallAttrs window_attrs(const Window& w) {
    return {{"kh", static_cast<double>(w.kh)}, {"kw", static_cast<double>(w.kw)}, {"sh", static_cast<double>(w.sh)},
            {"sw", static_cast<double>(w.sw)}, {"ph", static_cast<double>(w.ph)}, {"pw", static_cast<double>(w.pw)},
            {"dh", static_cast<double>(w.dh)}, {"dw", static_cast<double>(w.dw)}};
}
inline Window window_of(const ir::CallAttrs& a, const std::string& op) {
    constexpr std::int64_t big = std::int64_t{1} << 30;
    Window w;
    w.kh = ir::int_attr(a, op, "kh", 1, big);
    w.kw = ir::int_attr(a, op, "kw", 1, big);
    w.sh = ir::int_attr(a, op, "sh", 1, big);
    w.sw = ir::int_attr(a, op, "sw", 1, big);
    w.ph = ir::int_attr(a, op, "ph", 0, big);
    w.pw = ir::int_attr(a, op, "pw", 0, big);
    w.dh = ir::int_attr(a, op, "dh", 1, big);
    w.dw = ir::int_attr(a, op, "dw", 1, big);
    return w;
}

/// The library op of conv2d_nhwc (operands {x, weight, bias?, residual?}), with the hooks through
/// which passes fold a following per-channel affine map (BatchNorm) and relu into it.
inline std::shared_ptr<ir::CallOp> conv2d_op(Window win, Act act, bool has_bias, bool has_res, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "conv2d(" + win.str() + (has_bias ? ", bias" : "") + (has_res ? ", residual" : "") +
              (act == Act::none ? "" : ", " + std::string(act_name(act))) + ")";
    op->shape = [win](const std::vector<Shape>& s) { return Shape{s[0][0], win.out_h(s[0][1]), win.out_w(s[0][2]), s[1][0]}; };
    auto wino = std::make_shared<WinogradCache>();  // this op's weight transformed, while it stays the same
    op->run = [win, act, has_bias, has_res, loc, wino](const std::vector<Tensor>& in) {
        const Tensor& w = in[1];
        const Tensor b = has_bias ? in[2].to(in[0].dtype(), loc) : Tensor{};
        const Tensor z = has_res ? in[has_bias ? 3 : 2] : Tensor{};
        const Tensor xx = in[0].permute({0, 3, 1, 2});  // NCHW view
        const Shape ys{xx.size(0), win.out_h(xx.size(2)), win.out_w(xx.size(3)), w.size(0)};
        // the weight as (OC, KH, KW, C): free when it is stored channels-last (fold_batchnorm does)
        const Tensor wl = w.permute({0, 2, 3, 1}).contiguous();
        if (xx.device().is_cuda()) {
            if (Tensor y = conv2d_cudnn(xx, wl, b, z, win, act, ys, loc); y.defined()) return y;
        } else if (winograd_on() && cpu_conv_operands_ok(in[0], wl, b, z, act, ys) && winograd_applies(in[0], ys[3], win)) {
            return conv2d_cpu_winograd(in[0], wino->get(w, wl), ys[3], b, z, win, act == Act::relu);
        } else if (Tensor y = conv2d_cpu_implicit(in[0], wl, b, z, win, act, ys); y.defined()) {
            return y;
        }
        const Tensor cols = im2col(channels_last(xx), win, 0);
        const Tensor w2 = wl.view({w.size(0), w.size(1) * w.size(2) * w.size(3)});
        if (!has_res) return linear(cols, w2, b, act, loc).view(ys);
        return add_act(linear(cols, w2, b, Act::none, loc).view(ys), z, act, loc);
    };
    if (act == Act::none && !has_res)
        op->fold_affine = [win, has_bias, loc](const std::vector<Tensor>& in, const Tensor& scale,
                                               const Tensor& shift) -> std::optional<ir::CallOp::Rewrite> {
            if (!in[1].defined() || (has_bias && !in[2].defined())) return std::nullopt;  // not captured tensors
            auto [w, b] = fold_scale_shift(in[1], has_bias ? in[2] : Tensor{}, Tensor{}, scale, shift);
            return ir::CallOp::Rewrite{conv2d_op(win, Act::none, true, false, loc), {Tensor{}, std::move(w), std::move(b)}};
        };
    if (act == Act::none) op->with_relu = [=] { return conv2d_op(win, Act::relu, has_bias, has_res, loc); };
    if (act == Act::none && !has_res) op->with_residual = [=] { return conv2d_op(win, Act::none, has_bias, true, loc); };
    // run() reads the weight as (OC, KH, KW, C) rows: a constant weight stored so is read in place
    op->constant_layout = [](std::size_t i, const Tensor& t) { return i == 1 && t.rank() == 4 ? channels_last(t) : t; };
    op->name = "conv2d";
    op->attrs = window_attrs(win);
    op->attrs.insert(op->attrs.end(), {{"act", static_cast<double>(act)}, {"bias", has_bias ? 1.0 : 0.0}, {"residual", has_res ? 1.0 : 0.0}});
    return op;
}
/// Registers conv2d's library-op factory (called by export/program_file.hpp; see
/// register_index_ops for why not at static initialization).
KILN_DECL void register_conv2d() {
    ir::register_library_op("conv2d", [](const ir::CallAttrs& a) -> std::shared_ptr<const ir::CallOp> {
        const auto act = static_cast<Act>(ir::int_attr(a, "conv2d", "act", 0, static_cast<std::int64_t>(act_table.size()) - 1));
        return conv2d_op(window_of(a, "conv2d"), act, ir::int_attr(a, "conv2d", "bias", 0, 1) != 0,
                         ir::int_attr(a, "conv2d", "residual", 0, 1) != 0, Loc::current());
    });
}

/// conv2d over a channels-last (N, H, W, C) tensor, giving (N, OH, OW, OC): the GEMM's rows as they
/// are, so the elementwise work after it reads and writes contiguous memory.
/// With a residual z (N, OH, OW, OC): act(conv + bias + z), one cuDNN call where cuDNN runs it.
KILN_DECL Tensor conv2d_nhwc(const Tensor& x, const Tensor& weight, const Tensor& bias, Window win, Act act, const Loc& loc,
                             const Tensor& residual) {
    if (weight.rank() != 4)
        kiln::detail::fail<ShapeError>("conv2d", "weight must be 4-D (out, in, kh, kw), got " + weight.shape().str(), loc);
    win.kh = weight.size(2);
    win.kw = weight.size(3);
    const Shape xs = nchw_of(x.shape());
    check_window("conv2d", xs, win, loc);
    if (xs[1] != weight.size(1))
        kiln::detail::fail<ShapeError>("conv2d", "input " + xs.str() + " has " + std::to_string(xs[1]) + " channels but the weight " +
                                                     weight.shape().str() + " expects " + std::to_string(weight.size(1)), loc);
    if (bias.defined() && (bias.rank() != 1 || bias.size(0) != weight.size(0)))
        kiln::detail::fail<ShapeError>("conv2d", "bias " + bias.shape().str() + " does not match " + std::to_string(weight.size(0)) +
                                                     " output channels", loc);
    const Shape out{xs[0], win.out_h(xs[2]), win.out_w(xs[3]), weight.size(0)};
    if (residual.defined() && residual.shape() != out)
        kiln::detail::fail<ShapeError>("conv2d", "residual " + residual.shape().str() + " does not match the output " + out.str(), loc);
    if (autograd::detail::needs_grad({&x, &weight, &bias, &residual})) return conv2d_recorded(x, weight, bias, win, act, residual, out, loc);
    const bool has_bias = bias.defined(), has_res = residual.defined();
    std::shared_ptr<ir::CallOp> op = conv2d_op(win, act, has_bias, has_res, loc);
    std::vector<Tensor> operands{x, weight};
    if (has_bias) operands.push_back(bias);
    if (has_res) operands.push_back(residual);
    return trace::call_op(std::move(op), operands, x.dtype(), loc);
}

/// The library op of max_pool2d_nhwc (operand x, channels-last).
inline std::shared_ptr<ir::CallOp> max_pool2d_op(const Window& win, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "max_pool2d(" + win.str() + ")";
    op->shape = [win](const std::vector<Shape>& s) { return Shape{s[0][0], win.out_h(s[0][1]), win.out_w(s[0][2]), s[0][3]}; };
    op->run = [win, loc](const std::vector<Tensor>& in) {
        const Tensor xx = in[0].permute({0, 3, 1, 2});
        const std::int64_t N = xx.size(0), C = xx.size(1), OH = win.out_h(xx.size(2)), OW = win.out_w(xx.size(3));
        if (xx.device().is_cuda() && cuda::detail::pool_ctype(xx.dtype())) {
            Tensor y(Shape{N, OH, OW, C}, xx.dtype(), xx.device());
            if (y.numel() > 0) max_pool_cuda(in[0], win, y);
            return y;
        }
        if ((xx.dtype() == DType::f32 || xx.dtype() == DType::f64) && in[0].stride(3) == 1) {
            Tensor y(Shape{N, OH, OW, C}, xx.dtype());
            if (xx.dtype() == DType::f32) max_pool_cpu<float>(in[0], win, y);
            else max_pool_cpu<double>(in[0], win, y);
            return y;
        }
        const Tensor cols = im2col(channels_last(xx), win, neg_inf_bits(xx.dtype()));
        // the window's maximum as a running elementwise maximum over its positions: each pass reads
        // one contiguous (rows, C) slice (a reduction over the 9-element middle axis would give
        // each tiny row a block of its own)
        const Tensor v = cols.view({N * OH * OW, win.kh * win.kw, C});
        Tensor m = v.select(1, 0);
        for (std::int64_t k = 1; k < win.kh * win.kw; ++k) m = Tensor(maximum(m, v.select(1, k)), loc);
        return m.contiguous().view({N, OH, OW, C});
    };
    op->name = "max_pool2d";
    op->attrs = window_attrs(win);
    return op;
}
/// Registers max_pool2d's library-op factory (called by export/program_file.hpp).
KILN_DECL void register_max_pool2d() {
    ir::register_library_op("max_pool2d", [](const ir::CallAttrs& a) -> std::shared_ptr<const ir::CallOp> {
        return max_pool2d_op(window_of(a, "max_pool2d"), Loc::current());
    });
    ir::register_library_op("max_pool2d_backward", [](const ir::CallAttrs& a) -> std::shared_ptr<const ir::CallOp> {
        return max_pool2d_backward_op(window_of(a, "max_pool2d_backward"), Loc::current());
    });
}

/// max_pool2d over a channels-last (N, H, W, C) tensor, giving (N, OH, OW, C).
KILN_DECL Tensor max_pool2d_nhwc(const Tensor& x, Window win, const Loc& loc) {
    check_window("max_pool2d", nchw_of(x.shape()), win, loc);
    if (win.ph * 2 > win.kh || win.pw * 2 > win.kw)
        kiln::detail::fail<ValueError>("max_pool2d", "padding must be at most half the window (" + win.str() + ")", loc);
    if (autograd::detail::needs_grad({&x}))
        return autograd::detail::library(
            "max_pool2d", {&x}, [&] { return max_pool2d_nhwc(x, win, loc); },
            [xd = x.detach(), win, loc](const Tensor& g) { return std::vector<Tensor>{max_pool2d_backward(xd, g, win, loc)}; }, loc);
    return trace::call_op(max_pool2d_op(win, loc), {x}, x.dtype(), loc);
}

/// max_pool2d's gradient from kiln ops (any device and float dtype): each window's maximum again,
/// one gradient slice per window position, col2im.
inline Tensor max_pool2d_backward_decomposed(const Tensor& x, const Tensor& g, const Window& win, const Loc& loc) {
    const std::int64_t C = x.size(3), KK = win.kh * win.kw;
    const Tensor v = im2col_nhwc(x, win, neg_inf_bits(x.dtype()), loc);
    const std::int64_t rows = v.size(0);
    const Tensor cols = v.view({rows, KK, C});
    const Tensor m = max(cols, {1}, false, loc);
    const Tensor g2 = g.reshape({rows, C}, loc);
    std::vector<Tensor> parts;
    Tensor taken;
    for (std::int64_t k = 0; k < KK; ++k) {
        const Tensor vk = cols.select(1, k);
        const Tensor sel = k == 0 ? Tensor(vk == m, loc) : Tensor((vk == m) & !taken, loc);
        taken = k == 0 ? sel : Tensor(taken | sel, loc);
        parts.push_back(Tensor(where(sel, g2, 0.0), loc));
    }
    return col2im(stack(parts, 1, loc).view({rows, KK * C}), x.shape(), win, loc);
}

/// Whether max_pool2d's gradient g of x runs as the two CUDA kernels (f32 and f64 on CUDA).
inline bool max_pool_backward_direct(const Tensor& x, const Tensor& g) {
    return x.device().is_cuda() && (x.dtype() == DType::f32 || x.dtype() == DType::f64) && g.dtype() == x.dtype();
}

/// max_pool2d's gradient on CUDA: the position each window of x (N, H, W, C; any strides) took,
/// as int32 (N, OH, OW, C), then dx (N, H, W, C) whose elements sum the gradients g of the
/// windows that took them. Two launches, no atomics, nothing as large as im2col's columns.
inline Tensor max_pool_backward_cuda(const Tensor& x, const Tensor& g_in, const Window& win) {
    const int device = x.device().index;
    const Tensor g = g_in.contiguous();
    const std::int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3), OH = g.size(1), OW = g.size(2);
    Tensor dx(Shape{N, H, W, C}, x.dtype(), x.device());
    if (dx.numel() == 0) return dx;
    Tensor at(Shape{N, OH, OW, C}, DType::i32, x.device());
    const bool i64 = needs_i64(x, std::max(dx.numel(), at.numel()));
    const cuda::CUstream stream = cuda::current_stream(device);
    const cuda::detail::PoolGeometry geom = pool_geometry(C, H, W, OH, OW, win);
    const auto grid = [](std::int64_t n) { return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 1 << 20)); };
    if (at.numel() > 0) {
        const cuda::CUfunction f = cuda::detail::kernel_function(cuda::detail::max_pool_kernel(x.dtype(), i64, true, geom), device);
        cuda::detail::Args a;
        a.add_ptr(x.data_ptr());
        a.add_ptr(at.data_ptr());
        for (std::int64_t v : {at.numel(), C, H, W, x.stride(0), x.stride(1), x.stride(2), x.stride(3), OH, OW, win.kh, win.kw, win.sh,
                               win.sw, win.ph, win.pw, win.dh, win.dw})
            a.add(v);
        cuda::detail::launch(f, grid(at.numel()), 256, 0, stream, a.finish());
    }
    const cuda::CUfunction f = cuda::detail::kernel_function(cuda::detail::max_pool_backward_kernel(x.dtype(), i64, geom), device);
    cuda::detail::Args a;
    a.add_ptr(g.data_ptr());
    a.add_ptr(at.data_ptr());
    a.add_ptr(dx.data_ptr());
    for (std::int64_t v : {dx.numel(), C, H, W, OH, OW, win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw}) a.add(v);
    cuda::detail::launch(f, grid(dx.numel()), 256, 0, stream, a.finish());
    return dx;
}

/// The library op of max_pool2d's gradient (operands x and g, channels-last): the CUDA kernels
/// where they apply, else the decomposition run eagerly (a program traced on CUDA and loaded on the
/// CPU).
inline std::shared_ptr<ir::CallOp> max_pool2d_backward_op(const Window& win, const Loc& loc) {
    auto op = std::make_shared<ir::CallOp>();
    op->key = "max_pool2d_backward(" + win.str() + ")";
    op->shape = [](const std::vector<Shape>& s) { return s[0]; };
    op->run = [win, loc](const std::vector<Tensor>& in) {
        if (max_pool_backward_direct(in[0], in[1])) return max_pool_backward_cuda(in[0], in[1], win);
        return max_pool2d_backward_decomposed(in[0], in[1], win, loc);
    };
    op->name = "max_pool2d_backward";
    op->attrs = window_attrs(win);
    return op;
}

inline Tensor max_pool2d_backward(const Tensor& x, const Tensor& g, const Window& win, const Loc& loc) {
    if (max_pool_backward_direct(x, g)) return trace::call_op(max_pool2d_backward_op(win, loc), {x, g}, x.dtype(), loc);
    return max_pool2d_backward_decomposed(x, g, win, loc);
}

}  // namespace detail

KILN_DECL Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Window win, Act act, Loc loc) {
    if (x.rank() != 4) kiln::detail::fail<ShapeError>("conv2d", "input must be 4-D (N, C, H, W), got " + x.shape().str(), loc);
    return detail::conv2d_nhwc(x.permute({0, 2, 3, 1}, loc), weight, bias, win, act, loc).permute({0, 3, 1, 2}, loc);
}

KILN_DECL Tensor max_pool2d(const Tensor& x, Window win, Loc loc) {
    if (x.rank() != 4) kiln::detail::fail<ShapeError>("max_pool2d", "input must be 4-D (N, C, H, W), got " + x.shape().str(), loc);
    return detail::max_pool2d_nhwc(x.permute({0, 2, 3, 1}, loc), win, loc).permute({0, 3, 1, 2}, loc);
}

KILN_DECL Tensor adaptive_avg_pool2d(const Tensor& x, std::int64_t oh, std::int64_t ow, Loc loc) {
    if (x.rank() != 4) kiln::detail::fail<ShapeError>("adaptive_avg_pool2d", "input must be 4-D (N, C, H, W), got " + x.shape().str(), loc);
    if (oh < 1 || ow < 1 || x.size(2) % oh != 0 || x.size(3) % ow != 0)
        kiln::detail::fail<ShapeError>("adaptive_avg_pool2d", "output (" + std::to_string(oh) + ", " + std::to_string(ow) +
                                                                 ") must divide the input's (H, W) of " + x.shape().str(), loc);
    if (oh == 1 && ow == 1) return mean(x, {2, 3}, true, loc);
    const Tensor cells = x.reshape({x.size(0), x.size(1), oh, x.size(2) / oh, ow, x.size(3) / ow}, loc);
    return mean(cells, {3, 5}, false, loc);
}

KILN_DECL Conv2d::Conv2d(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t padding, bool with_bias, Init o) {
    win.kh = win.kw = k;
    win.sh = win.sw = stride;
    win.ph = win.pw = padding;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * k * k));
    // stored channels-last, (OC, KH, KW, C) in memory, seen as (OC, C, KH, KW): the layout every
    // convolution path reads (cuDNN, the CPU kernels, im2col's GEMM), so neither inference nor a
    // training step copies the weight into it (the gradient, from cuDNN or the GEMM, comes in it too)
    weight = detail::channels_last(nn::detail::uniform({out, in, k, k}, bound, o));
    if (with_bias) bias = nn::detail::uniform({out}, bound, o);
}

KILN_DECL Tensor Conv2d::nhwc(const Tensor& x, Loc loc) const { return detail::conv2d_nhwc(x, weight, bias, win, act, loc); }

namespace detail {
KILN_DECL Tensor batch_norm_train(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mu, const Tensor& var,
                                  double eps, const Loc& loc) {
    const auto forward = [&] { return Tensor((x - mu) * (rsqrt(var + eps) * weight) + bias, loc); };
    if (!autograd::detail::needs_grad({&x, &weight, &bias})) return forward();
    const double n = static_cast<double>(x.numel() / std::max<std::int64_t>(1, x.size(3)));
    return autograd::detail::library(
        "batch_norm", {&x, &weight, &bias}, forward,
        [xd = x.detach(), wd = weight.detach(), mu, var, eps, n, loc](const Tensor& g) {
            const Tensor db = sum(g, {0, 1, 2}, false, loc);
            const Tensor dw = sum(Tensor(g * ((xd - mu) * rsqrt(var + eps))), {0, 1, 2}, false, loc);
            const Tensor dx((g - db / n - (xd - mu) * rsqrt(var + eps) * (dw / n)) * (rsqrt(var + eps) * wd), loc);
            return std::vector<Tensor>{dx, dw, db};
        },
        loc);
}
}  // namespace detail

KILN_DECL BatchNorm2d::BatchNorm2d(std::int64_t c, Init o) {
    weight = ones({c}, o.dtype, o.device);
    bias = zeros({c}, o.dtype, o.device);
    running_mean = zeros({c}, o.dtype, o.device);
    running_var = ones({c}, o.dtype, o.device);
}

KILN_DECL void fold_batchnorm(Conv2d& conv, BatchNorm2d& bn) {
    if (!bn.defined()) return;
    const Tensor s = Tensor(bn.weight.cpu().to(DType::f64) * rsqrt(bn.running_var.cpu().to(DType::f64) + bn.eps));
    auto [w, b] = detail::fold_scale_shift(conv.weight, conv.bias, bn.running_mean, s, bn.bias);
    conv.weight = std::move(w);
    conv.bias = std::move(b);
    bn = BatchNorm2d{};
}

KILN_DECL BasicBlock::BasicBlock(std::int64_t in, std::int64_t out, std::int64_t stride, Init o)
    : conv1(in, out, 3, stride, 1, false, o), conv2(out, out, 3, 1, 1, false, o), bn1(out, o), bn2(out, o) {
    if (stride != 1 || in != out) {
        down = Conv2d(in, out, 1, stride, 0, false, o);
        down_bn = BatchNorm2d(out, o);
    }
}
KILN_DECL Tensor BasicBlock::operator()(const Tensor& x, Loc loc) const {
    return nhwc(x.permute({0, 2, 3, 1}, loc), loc).permute({0, 3, 1, 2}, loc);
}
KILN_DECL Tensor BasicBlock::nhwc(const Tensor& x, Loc loc) const {
    Tensor h = conv1.nhwc(x, loc);
    if (bn1.defined()) h = Tensor(relu(bn1.nhwc(h, loc)), loc);
    Tensor s = x;
    if (down.weight.defined()) {
        s = down.nhwc(x, loc);
        if (down_bn.defined()) s = down_bn.nhwc(s, loc);
    }
    // folded: relu(conv2(h) + bias + s) is one call (one cuDNN kernel on CUDA)
    if (!bn2.defined()) return detail::conv2d_nhwc(h, conv2.weight, conv2.bias, conv2.win, Act::relu, loc, s);
    return Tensor(relu(bn2.nhwc(conv2.nhwc(h, loc), loc) + s), loc);
}
KILN_DECL void BasicBlock::fold() {
    fold_batchnorm(conv1, bn1);
    conv1.act = Act::relu;
    fold_batchnorm(conv2, bn2);
    if (down.weight.defined()) fold_batchnorm(down, down_bn);
}

KILN_DECL ResNet18::ResNet18(std::int64_t classes, Init o) : conv1(3, 64, 7, 2, 3, false, o), bn1(64, o), fc(512, classes, true, Act::none, o) {
    std::int64_t in = 64;
    for (std::int64_t stage = 0; stage < 4; ++stage) {
        const std::int64_t out = 64 << stage;
        blocks.emplace_back(in, out, stage == 0 ? 1 : 2, o);
        blocks.emplace_back(out, out, 1, o);
        in = out;
    }
}
KILN_DECL Tensor ResNet18::operator()(const Tensor& x, Loc loc) const {
    if (x.rank() != 4) kiln::detail::fail<ShapeError>("ResNet18", "input must be (N, 3, H, W), got " + x.shape().str(), loc);
    Tensor h = conv1.nhwc(x.permute({0, 2, 3, 1}, loc), loc);
    if (bn1.defined()) h = Tensor(relu(bn1.nhwc(h, loc)), loc);
    Window pool;
    pool.kh = pool.kw = 3;
    pool.sh = pool.sw = 2;
    pool.ph = pool.pw = 1;
    h = detail::max_pool2d_nhwc(h, pool, loc);
    for (const BasicBlock& b : blocks) h = b.nhwc(h, loc);
    return fc(mean(h, {1, 2}, false, loc), loc);  // global average pool over (H, W)
}
KILN_DECL void ResNet18::fold() {
    fold_batchnorm(conv1, bn1);
    conv1.act = Act::relu;
    for (BasicBlock& b : blocks) b.fold();
}

}  // namespace kiln::nn
