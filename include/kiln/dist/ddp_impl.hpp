// DataParallel's reducer (compiled once in separate compilation). Included at the end of
// kiln/dist/ddp.hpp (header-only mode, or by kiln/src.hpp), never on its own.
#pragma once

#include <cstdlib>
#include <string_view>

#include "kiln/core/factories.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/ops/copy.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::dist::detail {

/// A library call run now, or recorded into the traced step (every call; two never merge).
inline Tensor ddp_call(std::string key, std::function<Tensor(const std::vector<Tensor>&)> run, const Shape& out,
                       const std::vector<Tensor>& operands, DType dt, const Loc& loc, bool waits = false) {
    return recorded_call(std::move(key), std::move(run), out, operands, dt, loc, waits);
}

KILN_DECL Reducer::Reducer(std::vector<Tensor> params, std::vector<Tensor> buffers, DDPOptions o, const Loc& loc)
    : params_(std::move(params)), buffers_(std::move(buffers)), opt_(o) {
    Group& g = group("DataParallel", loc);
    if (trace::Tracer::active())
        kiln::detail::fail<DistError>("DataParallel", "construct it outside kiln::compile (it broadcasts rank 0's parameters once)", loc);
    for (const Tensor& p : params_) check_tensor(g, "DataParallel", p, loc);
    for (const Tensor& b : buffers_) check_tensor(g, "DataParallel", b, loc);
    // every rank starts from rank 0's parameters and buffers
    {
        const no_grad off;
        std::vector<Tensor> all = params_;
        all.insert(all.end(), buffers_.begin(), buffers_.end());
        broadcast_coalesced(all, 0, loc);
    }
    // buckets: parameters in reverse order (backward makes the last layers' gradients first), one
    // dtype per bucket; the first closes at first_bucket_mb, the others at bucket_cap_mb. The
    // leading parameters' gradients come last, and their all-reduce and update overlap nothing:
    // they form the last bucket on their own, as small as the first (up to first_bucket_mb, with
    // the small parameters that follow them, such as the first layer's bias)
    const double tail_cap = opt_.first_bucket_mb * 1024 * 1024;
    const auto bytes = [](const Tensor& t) { return static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype())); };
    int tail = 0;  // parameters [0, tail) form the last bucket
    for (double b = 0; tail < static_cast<int>(params_.size()); ++tail) {
        const Tensor& p = params_[static_cast<std::size_t>(tail)];
        if (p.dtype() != params_[0].dtype() || (b >= tail_cap && bytes(p) >= tail_cap / 16)) break;
        b += bytes(p);
    }
    bucket_of_.assign(params_.size(), -1);
    std::vector<std::pair<DType, int>> open;  // per dtype: its open bucket (-1: none)
    for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
        if (i == tail - 1)  // the tail's own bucket: close every open one first
            for (auto& [dt, b] : open) b = -1;
        const Tensor& p = params_[static_cast<std::size_t>(i)];
        int* slot = nullptr;
        for (auto& [dt, b] : open)
            if (dt == p.dtype()) slot = &b;
        if (slot == nullptr) {
            open.emplace_back(p.dtype(), -1);
            slot = &open.back().second;
        }
        if (*slot < 0) {
            buckets_.push_back({});
            buckets_.back().dtype = p.dtype();
            *slot = static_cast<int>(buckets_.size()) - 1;
        }
        Bucket& b = buckets_[static_cast<std::size_t>(*slot)];
        b.params.push_back(i);
        b.numel += p.numel();
        bucket_of_[static_cast<std::size_t>(i)] = *slot;
        const double cap = (buckets_.size() == 1 ? opt_.first_bucket_mb : opt_.bucket_cap_mb) * 1024 * 1024;
        if (i >= tail && static_cast<double>(b.numel) * static_cast<double>(dtype_size(b.dtype)) >= cap) *slot = -1;
    }
    const int first = reserve_buckets(static_cast<int>(buckets_.size()));
    bool symmetric = opt_.symmetric_memory;
    if (const char* e = std::getenv("KILN_DDP_WINDOWS"); e && *e) symmetric = std::string_view(e) != "0";
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
        Bucket& b = buckets_[k];
        b.id = first + static_cast<int>(k);
        // the bucket's memory; each parameter's gradient is written into its view of it
        const bool window = symmetric && static_cast<double>(b.numel) * static_cast<double>(dtype_size(b.dtype)) >= opt_.symmetric_min_mb * 1024 * 1024;
        b.memory = bucket_memory(b.numel, b.dtype, params_[static_cast<std::size_t>(b.params.at(0))].device(), window, loc);
        std::int64_t o = 0;
        for (int p : b.params) {
            Tensor& param = params_[static_cast<std::size_t>(p)];
            // laid out as the parameter is (a convolution's weight channels-last): what backward writes
            Tensor v = view_in_order(b.memory.slice(0, o, o + param.numel()), param.shape(), memory_order(param));
            o += param.numel();
            autograd::set_grad_buffer(param, v, loc);  // a gradient from before moves in at its bucket's start (launch)
            b.views.push_back(v);
        }
    }
    marked_.assign(params_.size(), 0);
    for (std::size_t i = 0; i < params_.size(); ++i)
        hooks_.push_back(autograd::register_post_accumulate_grad_hook(
            params_[i],
            [this, i, loc](const Tensor&) {
                // errors of the bucket's collectives name the user's backward() (or else the construction)
                const Loc* b = autograd::detail::backward_location();
                on_ready(static_cast<int>(i), b ? *b : loc);
            },
            loc));
    if (debug::log_on("dist")) {
        std::string s;
        for (const Bucket& b : buckets_) s += " " + std::to_string(b.params.size()) + " (" + std::to_string(b.numel) + " elements)";
        debug::log("dist", "DataParallel: " + std::to_string(params_.size()) + " parameters in " + std::to_string(buckets_.size()) +
                               " buckets:" + s);
    }
}

KILN_DECL Reducer::~Reducer() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
        autograd::remove_post_accumulate_grad_hook(params_[i], hooks_[i]);
        autograd::set_grad_buffer(params_[i], Tensor());  // the gradients stay views of their bucket
    }
}

KILN_DECL std::vector<std::vector<int>> Reducer::bucket_params() const {
    std::vector<std::vector<int>> out;
    for (const Bucket& b : buckets_) out.push_back(b.params);
    return out;
}

KILN_DECL int Reducer::window_buckets() const {
    int n = 0;
    for (const Bucket& b : buckets_) n += in_window(b.memory) ? 1 : 0;
    return n;
}

KILN_DECL void Reducer::before_forward(const Loc& loc) {
    if (!opt_.broadcast_buffers || buffers_.empty()) return;
    Group& g = group("DataParallel", loc);
    if (g.world == 1) return;
    const no_grad off;
    // one broadcast for all buffers of one dtype: they travel as one flat tensor
    for (std::size_t i = 0; i < buffers_.size();) {
        std::vector<Tensor> same;
        std::int64_t n = 0;
        const DType dt = buffers_[i].dtype();
        std::size_t j = i;
        for (; j < buffers_.size() && buffers_[j].dtype() == dt; ++j) {
            same.push_back(buffers_[j]);
            n += buffers_[j].numel();
        }
        const Tensor flat = ddp_call(
            "dist.broadcast_buffers", [n, dt, loc](const std::vector<Tensor>& in) {
                Tensor f(Shape{n}, dt, in[0].device(), loc);
                std::int64_t o = 0;
                for (const Tensor& t : in) {
                    f.slice(0, o, o + t.numel()).view(t.shape()).copy_(t);
                    o += t.numel();
                }
                std::vector<Tensor> one{f};
                broadcast_coalesced(one, 0, loc);
                return f;
            },
            Shape{n}, same, dt, loc);
        std::int64_t o = 0;
        for (Tensor& t : same) {
            t.copy_(flat.slice(0, o, o + t.numel()).view(t.shape()), loc);
            o += t.numel();
        }
        i = j;
    }
}

KILN_DECL void Reducer::on_ready(int p, const Loc& loc) {
    if (!sync) return;
    if (!queued_) {
        autograd::queue_callback([this, loc] { finish(loc); }, loc);
        queued_ = true;
    }
    if (marked_[static_cast<std::size_t>(p)]) return;
    marked_[static_cast<std::size_t>(p)] = 1;
    ++buckets_[static_cast<std::size_t>(bucket_of_[static_cast<std::size_t>(p)])].ready;
    // buckets go out in order on every rank (NCCL needs one order), each once all its gradients are ready
    while (next_ < buckets_.size() && buckets_[next_].ready == static_cast<int>(buckets_[next_].params.size()))
        launch(buckets_[next_++], loc);
}

KILN_DECL void Reducer::launch(Bucket& b, const Loc& loc) {
    // every gradient in its view of the bucket: backward wrote it there (set_grad_buffer) unless
    // the parameter had another gradient tensor (set by hand), which is copied in; a parameter this
    // backward did not reach sends zeros
    for (std::size_t k = 0; k < b.params.size(); ++k) {
        Tensor& param = params_[static_cast<std::size_t>(b.params[k])];
        Tensor& v = b.views[k];
        const Tensor gr = param.grad();
        if (gr.defined() && gr.is_same(v)) continue;
        if (gr.defined()) v.copy_(gr, loc);
        else v.fill_(0);
        param.set_grad(v);
    }
    const int id = b.id;
    b.reduced = ddp_call("dist.ddp_bucket_start(" + std::to_string(id) + ")",
                         [id, loc](const std::vector<Tensor>& in) { return bucket_start(in[0], id, loc); }, Shape{b.numel}, {b.memory}, b.dtype,
                         loc);
}

KILN_DECL void Reducer::finish(const Loc& loc) {
    queued_ = false;
    while (next_ < buckets_.size()) launch(buckets_[next_++], loc);  // parameters backward never reached
    for (Bucket& b : buckets_) {
        const int id = b.id;
        const Tensor reduced = ddp_call(
            "dist.ddp_bucket_wait(" + std::to_string(id) + ")", [id, loc](const std::vector<Tensor>& in) { return bucket_wait(in[0], id, loc); },
            Shape{b.numel}, {b.reduced}, b.dtype, loc, /*waits=*/true);
        // run now, the bucket's memory holds the averages already; traced, this makes them the
        // memory's value from here on (a write of the whole memory: no copy, the program's
        // write-back finds the value in place)
        if (!reduced.is_same(b.memory)) b.memory.copy_(reduced, loc);
        b.reduced = Tensor();
        b.ready = 0;
    }
    std::fill(marked_.begin(), marked_.end(), 0);
    next_ = 0;
}

}  // namespace kiln::dist::detail
