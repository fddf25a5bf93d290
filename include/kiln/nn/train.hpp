// Training: parameters of a module, losses, and optimizers (SGD, Adam, AdamW, clip_grad_norm) with
// torch's formulas. Everything is written with kiln ops, so a whole training step (forward, loss,
// backward, optimizer step) traces into one kiln::compile program.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/autograd/autograd.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/ops/composites.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/reductions.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::nn {

// ------------------------------------------------------------------ parameters
namespace detail {
/// Hands each parameter (not buffers) of a module to f, marked to require grad.
template <class F> struct ParameterVisitor {
    F f;
    void operator()(const std::string& name, Tensor& t) {
        if (!t.autograd_meta()) t.set_autograd_meta(std::make_shared<autograd::detail::Meta>());  // shared by the copies
        if (is_floating(t.dtype()) && t.is_leaf()) t.requires_grad_();
        f(name, t);
    }
    void operator()(const std::string&, Tensor&, Buffer) {}
};
}  // namespace detail

/// The module's parameters in its order (buffers such as BatchNorm's running statistics are not
/// parameters), as handles that share its tensors and their gradients. Floating parameters are
/// marked to require grad, as torch's nn.Parameter is.
template <class M> std::vector<Tensor> parameters(M& m) {
    std::vector<Tensor> out;
    auto add = [&](const std::string&, Tensor& t) { out.push_back(t); };
    m.visit("", detail::ParameterVisitor<decltype(add)&>{add});
    return out;
}
/// name -> parameter, as parameters() marks them.
template <class M> std::map<std::string, Tensor> named_parameters(M& m) {
    std::map<std::string, Tensor> out;
    auto add = [&](const std::string& name, Tensor& t) { out.emplace(name, t); };
    m.visit("", detail::ParameterVisitor<decltype(add)&>{add});
    return out;
}

namespace detail {
/// Rebinds each floating parameter of a module copy to a cast of it (buffers stay as they are).
struct CastParameters {
    DType dtype;
    Loc loc;
    void operator()(const std::string&, Tensor& t) const {
        if (is_floating(t.dtype()) && t.dtype() != dtype) t = laid_out_like(t.to(dtype, loc), t, loc);
    }
    void operator()(const std::string&, Tensor&, Buffer) const {}
};
}  // namespace detail

/// Mixed precision with f32 master weights (what torch.autocast gives a training step): a copy of
/// module m whose floating parameters are casts of m's to `dtype` (bf16, f16), made while recording,
/// so the copy computes in `dtype` and the gradients reach m's parameters in their own dtype, where
/// the optimizer keeps its state. Call it inside the step (each call casts the current weights;
/// under kiln::compile the casts fuse into the program). Buffers are shared, not cast.
template <class M> M autocast(const M& m, DType dtype, Loc loc = Loc::current()) {
    M copy = m;
    copy.visit("", detail::CastParameters{dtype, loc});
    return copy;
}

/// Zeroes every gradient in place (kept allocated, unlike torch's default set_to_none: a compiled
/// training step keeps writing into the same buffers).
inline void zero_grad(const std::vector<Tensor>& params) {
    const no_grad off;
    for (const Tensor& p : params)
        if (Tensor g = p.grad(); g.defined()) g.fill_(0);
}

// ------------------------------------------------------------------ losses
/// How a loss reduces its per-element values (torch's reduction=).
enum class Reduction : std::uint8_t { none, mean, sum };

namespace detail {
inline Tensor reduce_loss(const Tensor& l, Reduction r, const std::source_location& loc) {
    if (r == Reduction::none) return l;
    return r == Reduction::sum ? sum(l, {}, false, loc) : mean(l, {}, false, loc);
}
}  // namespace detail

/// mean((input - target)^2) (torch.nn.functional.mse_loss).
inline Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r = Reduction::mean, Loc loc = Loc::current()) {
    const kiln::detail::UserOpScope scope("mse_loss", loc);
    if (!(input.shape() == target.shape()))
        kiln::detail::fail<ShapeError>("mse_loss", "input " + input.shape().str() + " and target " + target.shape().str() +
                                                       " must have one shape", loc);
    return detail::reduce_loss(Tensor(square(input - target), loc), r, loc);
}

/// Options of cross_entropy / nll_loss (torch's defaults).
struct LossOptions {
    Reduction reduction = Reduction::mean;
    std::int64_t ignore_index = -100;  ///< targets equal to it add nothing (and are not counted by mean)
    double label_smoothing = 0.0;      ///< cross_entropy only: the target mixes in the uniform distribution
};

namespace detail {
/// Class dim 1 of (N, C) scores and (N) int targets, checked.
inline void check_class_scores(std::string_view op, const Tensor& scores, const Tensor& target, const std::source_location& loc) {
    if (scores.rank() != 2)
        kiln::detail::fail<ShapeError>(op, "expects scores of shape (N, C), got " + scores.shape().str(), loc);
    if (target.dtype() != DType::i64 && target.dtype() != DType::i32)
        kiln::detail::fail<DTypeError>(op, "expects int64 class targets, got " + std::string(dtype_name(target.dtype())), loc);
    if (target.rank() != 1 || target.size(0) != scores.size(0))
        kiln::detail::fail<ShapeError>(op, "targets of shape " + target.shape().str() + " do not match scores " +
                                               scores.shape().str(), loc);
}
/// -log_probs[i, target_i] per row, 0 where `valid` is false (an ignored target).
inline Tensor picked_nll(const Tensor& log_probs, const Tensor& target, const Tensor& valid, const std::source_location& loc) {
    const Tensor safe = Tensor(where(valid, target, 0), loc).to(DType::i64, loc);
    const Tensor picked = gather(log_probs, 1, safe.unsqueeze(1, loc), loc).squeeze(1, loc);
    return Tensor(where(valid, -picked, 0.0), loc);
}
inline Tensor reduce_rows(const Tensor& per_row, const Tensor& valid, Reduction r, const std::source_location& loc) {
    if (r == Reduction::none) return per_row;
    const Tensor total = sum(per_row, {}, false, loc);
    if (r == Reduction::sum) return total;
    return Tensor(total / sum(cast(valid, per_row.dtype()), {}, false, loc), loc);  // mean over the counted rows
}
}  // namespace detail

/// The negative log-likelihood of int64 class targets under (N, C) log-probabilities
/// (torch.nn.functional.nll_loss).
inline Tensor nll_loss(const Tensor& log_probs, const Tensor& target, LossOptions o = {}, Loc loc = Loc::current()) {
    const kiln::detail::UserOpScope scope("nll_loss", loc);
    detail::check_class_scores("nll_loss", log_probs, target, loc);
    const Tensor valid = Tensor(target != o.ignore_index, loc);
    return detail::reduce_rows(detail::picked_nll(log_probs, target, valid, loc), valid, o.reduction, loc);
}

/// Cross entropy of (N, C) logits and int64 class targets (torch.nn.functional.cross_entropy):
/// log_softmax then nll_loss, with ignore_index and label smoothing as torch defines them.
inline Tensor cross_entropy(const Tensor& logits, const Tensor& target, LossOptions o = {}, Loc loc = Loc::current()) {
    const kiln::detail::UserOpScope scope("cross_entropy", loc);
    detail::check_class_scores("cross_entropy", logits, target, loc);
    if (o.label_smoothing < 0 || o.label_smoothing > 1)
        kiln::detail::fail<ValueError>("cross_entropy", "label_smoothing must lie in [0, 1], got " + std::to_string(o.label_smoothing), loc);
    const Tensor lsm = log_softmax(logits, 1, loc);
    const Tensor valid = Tensor(target != o.ignore_index, loc);
    Tensor per_row = detail::picked_nll(lsm, target, valid, loc);
    if (o.label_smoothing > 0) {
        const double eps = o.label_smoothing, c = static_cast<double>(logits.size(1));
        const Tensor smooth = Tensor(where(valid, -sum(lsm, 1, false, loc) / c, 0.0), loc);
        per_row = Tensor(per_row * (1 - eps) + smooth * eps, loc);
    }
    return detail::reduce_rows(per_row, valid, o.reduction, loc);
}

/// Binary cross entropy of logits x against targets y in [0, 1], computed stably
/// (torch.nn.functional.binary_cross_entropy_with_logits): max(x, 0) - x y + log(1 + e^-|x|).
inline Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& y, Reduction r = Reduction::mean,
                                               Loc loc = Loc::current()) {
    const kiln::detail::UserOpScope scope("binary_cross_entropy_with_logits", loc);
    if (!(x.shape() == y.shape()))
        kiln::detail::fail<ShapeError>("binary_cross_entropy_with_logits", "logits " + x.shape().str() + " and targets " +
                                                                              y.shape().str() + " must have one shape", loc);
    return detail::reduce_loss(Tensor(relu(x) - x * y + log1p(exp(-abs(x))), loc), r, loc);
}

// ------------------------------------------------------------------ optimizers
/// Scales the gradients so that their joint 2-norm is at most max_norm (torch's
/// clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1, applied without reading
/// the norm on the host). Returns the norm before clipping.
inline Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, Loc loc = Loc::current()) {
    const no_grad off;
    Tensor total;
    for (const Tensor& p : params) {
        const Tensor g = p.grad();
        if (!g.defined()) continue;
        const Tensor s = sum(square(cast(g, DType::f32)), {}, false, loc);
        total = total.defined() ? Tensor(total + s, loc) : s;
    }
    if (!total.defined()) return zeros(Shape{});
    const Tensor norm = Tensor(sqrt(total), loc);
    const Tensor coef = Tensor(minimum(max_norm / (norm + 1e-6), 1.0), loc);
    for (const Tensor& p : params)
        if (Tensor g = p.grad(); g.defined()) g.assign(g * coef, loc);
    return norm;
}

/// What every optimizer shares: the parameters (marked to require grad), zero_grad, and its
/// state as named tensors (for saving with the model: state_dict / load_state_dict).
class Optimizer {
public:
    explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
        for (Tensor& p : params_)
            if (!p.requires_grad()) p.requires_grad_();
    }
    virtual ~Optimizer() = default;
    virtual void step() = 0;
    void zero_grad() const { nn::zero_grad(params_); }
    const std::vector<Tensor>& params() const { return params_; }

    /// The state ("<i>.<name>" per parameter i, "step"), as handles of the live tensors.
    std::map<std::string, Tensor> state_dict() const {
        std::map<std::string, Tensor> out;
        for (const auto& [k, t] : state_) out.emplace(k, t);
        return out;
    }
    /// Copies saved state into the live tensors (same names and shapes; ValueError otherwise).
    void load_state_dict(const std::map<std::string, Tensor>& saved, Loc loc = Loc::current()) {
        const no_grad off;
        for (auto& [k, t] : state_) {
            const auto it = saved.find(k);
            if (it == saved.end()) kiln::detail::fail<ValueError>("load_state_dict", "optimizer state '" + k + "' is missing", loc);
            if (!(it->second.shape() == t.shape()))
                kiln::detail::fail<ShapeError>("load_state_dict", "optimizer state '" + k + "' has shape " + it->second.shape().str() +
                                                                      ", expected " + t.shape().str(), loc);
            t.copy_(it->second, loc);
        }
    }

protected:
    /// A state tensor made now, outside any traced call, so that a compiled step updates it in
    /// place (a handle: the map and the optimizer's member share its memory).
    Tensor state(const std::string& name, const Tensor& like, double value = 0) {
        Tensor s = empty_like(like, DType::f32, like.device());  // the parameter's memory order: one layout per update
        s.fill_(value);
        return state_[name] = s;
    }
    std::vector<Tensor> params_;
    std::map<std::string, Tensor> state_;
};

/// torch.optim.SGD: momentum, dampening, nesterov, weight decay.
class SGD final : public Optimizer {
public:
    struct Options {
        double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
        bool nesterov = false;
    };
    SGD(std::vector<Tensor> params, Options o) : Optimizer(std::move(params)), o_(o) {
        if (o_.momentum != 0)
            for (std::size_t i = 0; i < params_.size(); ++i) buf_.push_back(state(std::to_string(i) + ".momentum_buffer", params_[i]));
        started_ = state("step", zeros(Shape{}, DType::f32, params_.empty() ? Device::cpu() : params_[0].device()));
    }
    void step() override {
        const no_grad off;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            Tensor& p = params_[i];
            const Tensor g0 = p.grad();
            if (!g0.defined()) continue;
            const Tensor g = o_.weight_decay != 0 ? Tensor(g0 + o_.weight_decay * p) : g0;
            if (o_.momentum == 0) {
                p.assign(p - o_.lr * g);
                continue;
            }
            // the first step takes the gradient itself (torch), later ones the running buffer. The
            // parameter is written before the buffer, from the new buffer's expression (evaluated
            // twice eagerly, fused; one value when traced), so that a compiled step computes both
            // in one kernel: no group reads the buffer back in between
            Tensor& b = buf_[i];
            const auto nb = where(started_ > 0, o_.momentum * b + (1 - o_.dampening) * g, g);
            if (o_.nesterov) p.assign(p - o_.lr * (g + o_.momentum * nb));
            else p.assign(p - o_.lr * nb);
            b.assign(nb);
        }
        started_.assign(started_ + 1);
    }

private:
    Options o_;
    std::vector<Tensor> buf_;
    Tensor started_;  ///< steps taken (the first momentum step takes the gradient itself)
};

/// torch.optim.Adam and AdamW (decoupled weight decay): bias-corrected moments, the step count a
/// device tensor (as torch's capturable=True), so a compiled or graph-replayed step stays exact.
class Adam : public Optimizer {
public:
    struct Options {
        double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
    };
    Adam(std::vector<Tensor> params, Options o, bool decoupled = false)
        : Optimizer(std::move(params)), o_(o), decoupled_(decoupled) {
        for (std::size_t i = 0; i < params_.size(); ++i) {
            m_.push_back(state(std::to_string(i) + ".exp_avg", params_[i]));
            v_.push_back(state(std::to_string(i) + ".exp_avg_sq", params_[i]));
        }
        step_ = state("step", params_.empty() ? zeros(Shape{}) : zeros(Shape{}, DType::f32, params_[0].device()));
    }
    void step() override {
        const no_grad off;
        step_.assign(step_ + 1);
        const Tensor bc1 = Tensor(1 - pow(o_.beta1, step_)), bc2 = Tensor(1 - pow(o_.beta2, step_));
        for (std::size_t i = 0; i < params_.size(); ++i) {
            Tensor& p = params_[i];
            const Tensor g0 = p.grad();
            if (!g0.defined()) continue;
            Tensor &m = m_[i], &v = v_[i];
            const Tensor g = (!decoupled_ && o_.weight_decay != 0) ? Tensor(cast(g0, DType::f32) + o_.weight_decay * p) : cast(g0, DType::f32);
            // the parameter first, from the moments' new expressions, then the moments: one kernel
            // per parameter in a compiled step (as in SGD)
            const auto nm = o_.beta1 * m + (1 - o_.beta1) * g;
            const auto nv = o_.beta2 * v + (1 - o_.beta2) * g * g;
            const double decay = decoupled_ ? 1 - o_.lr * o_.weight_decay : 1.0;
            p.assign(p * decay - o_.lr * (nm / bc1) / (sqrt(nv / bc2) + o_.eps));
            m.assign(nm);
            v.assign(nv);
        }
    }

protected:
    Options o_;
    bool decoupled_;
    std::vector<Tensor> m_, v_;
    Tensor step_;
};

/// torch.optim.AdamW: Adam with decoupled weight decay (default 0.01).
class AdamW final : public Adam {
public:
    struct Options {
        double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
    };
    AdamW(std::vector<Tensor> params, Options o) : Adam(std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, true) {}
};

}  // namespace kiln::nn
