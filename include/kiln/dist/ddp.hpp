// Data parallelism: DataParallel (torch's DistributedDataParallel) and DistributedSampler.
//
//   kiln::dist::init_from_env();
//   kiln::nn::Mlp model(16, 64, 1, {kiln::DType::f32, kiln::dist::device()});
//   kiln::dist::DataParallel ddp(model);          // rank 0's parameters and buffers on every rank
//   kiln::nn::AdamW opt(kiln::nn::parameters(model), {.lr = 1e-3});
//   auto step = kiln::compile([&](const kiln::Tensor& x, const kiln::Tensor& y) {
//       opt.zero_grad();
//       kiln::Tensor loss = kiln::nn::mse_loss(ddp(x), y);   // x, y: this rank's part of the batch
//       loss.backward();      // gradients averaged over the ranks, bucket by bucket, during backward
//       opt.step();
//       return loss.detach();
//   });
//
// How: the parameters are split into buckets (in reverse order, as their gradients become ready
// in backward; the first bucket small, then bucket_cap_mb each, and the last, the leading
// parameters whose gradients backward makes last, small again: its all-reduce and the update after
// it are the part of the communication that nothing hides). Each bucket is one flat tensor
// and every gradient of the bucket a view of it (autograd::set_grad_buffer: backward writes the
// gradients there; torch's gradient_as_bucket_view), so a bucket travels as one in-place
// all-reduce, with no copy in or out (averaged by NCCL's avg; or, with DDPOptions::symmetric_memory,
// summed in an NCCL symmetric window and scaled by 1/world). Each parameter's post-accumulate hook
// marks it ready; a
// bucket whose gradients are all ready is all-reduced (averaged) at once, on NCCL's own stream
// while backward goes on, buckets in order on every rank. When backward ends, the current stream
// waits for the buckets, whose memory then holds the averaged gradients. Under kiln::compile the
// hooks run while the step is traced, so each bucket's all-reduce and wait are nodes of the
// program, placed where the bucket became ready: the overlap is planned once and replayed on every
// call (captured into the CUDA graph under reduce_overhead).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/autograd.hpp"
#include "kiln/core/random.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/nn/train.hpp"

namespace kiln::dist {

struct DDPOptions {
    double bucket_cap_mb = 25;      ///< a bucket's size (torch's default)
    double first_bucket_mb = 1;     ///< the first bucket's (the last layers' gradients, ready first): small, so communication starts early;
                                    ///< the last bucket's too (the leading parameters, and small ones right after them)
    bool broadcast_buffers = true;  ///< before each forward, every rank takes rank 0's buffers (BatchNorm's running statistics), as torch
    /// Buckets of at least symmetric_min_mb in NCCL symmetric windows (NCCL >= 2.27, more than one
    /// GPU): ncclMemAlloc'd memory registered once, summed by NCCL's symmetric kernels, then scaled
    /// by 1/world where the compute stream waits for the bucket. Measured on 2 H200s (NCCL 2.28.3),
    /// the BERT layer at 32 x 128 per GPU: a step of 1052 -> 1019 us. Off by default: a symmetric
    /// all-reduce in flight when a rank dies is not stopped by ncclCommAbort (NCCL 2.28.3 and 2.28.9:
    /// about half the runs of the die test), so instead of raising DistError the others end with
    /// status 70 and a message on stderr, 10 s after they saw the failure (the process cannot go on:
    /// every host wait behind that all-reduce would hang). KILN_DDP_WINDOWS=1 turns it on,
    /// KILN_DDP_WINDOWS=0 off, whatever the options say.
    bool symmetric_memory = false;
    double symmetric_min_mb = 2;  ///< smaller buckets stay ordinary (in the probe 1 MB gained ~1.5 us, less than the scale pass costs)
};

namespace detail {

/// The type-independent part of DataParallel: buckets, hooks, the end-of-backward step.
class Reducer {
public:
    KILN_DECL Reducer(std::vector<Tensor> params, std::vector<Tensor> buffers, DDPOptions o, const Loc& loc);
    KILN_DECL ~Reducer();
    Reducer(const Reducer&) = delete;
    Reducer& operator=(const Reducer&) = delete;

    /// Rank 0's buffers to every rank (DDPOptions::broadcast_buffers).
    KILN_DECL void before_forward(const Loc& loc);
    /// The parameters of each bucket, in the order they are all-reduced (for tests and logs).
    KILN_DECL std::vector<std::vector<int>> bucket_params() const;
    /// How many buckets live in an NCCL symmetric window (all-reduced by NCCL's symmetric kernels).
    KILN_DECL int window_buckets() const;
    bool sync = true;  ///< false inside no_sync(): gradients accumulate locally

private:
    struct Bucket {
        std::vector<int> params;  // indices into params_
        std::int64_t numel = 0;
        DType dtype = DType::f32;
        int id = 0;               // its events (reserve_buckets)
        int ready = 0;            // parameters whose gradient is final in this backward
        Tensor memory;            // every gradient of the bucket, each a view of it (set_grad_buffer)
        std::vector<Tensor> views;  // per parameter of `params`: its gradient's view of `memory`
        Tensor reduced;           // after launch: `memory` averaged in place (until finish)
    };
    KILN_DECL void on_ready(int p, const Loc& loc);
    KILN_DECL void launch(Bucket& b, const Loc& loc);
    KILN_DECL void finish(const Loc& loc);

    std::vector<Tensor> params_, buffers_;
    DDPOptions opt_;
    std::vector<Bucket> buckets_;
    std::vector<int> bucket_of_;  // parameter -> bucket
    std::vector<char> marked_;    // parameter -> ready in this backward
    std::vector<int> hooks_;
    std::size_t next_ = 0;        // the next bucket to launch (buckets go in order on every rank)
    bool queued_ = false;         // finish() is queued for the running backward
};

/// Every buffer (visit's f(name, t, Buffer{})) of a module.
struct BufferVisitor {
    std::vector<Tensor>* out;
    void operator()(const std::string&, Tensor&) const {}
    void operator()(const std::string&, Tensor& t, nn::Buffer) const { out->push_back(t); }
};

}  // namespace detail

/// torch.nn.parallel.DistributedDataParallel over a module (anything with visit()): call it as the
/// module. Construct it after kiln::dist::init, on every rank, with the model on dist::device().
template <class M>
class DataParallel {
public:
    explicit DataParallel(M& module, DDPOptions o = {}, Loc loc = Loc::current()) : module_(module) {
        std::vector<Tensor> buffers;
        module.visit("", detail::BufferVisitor{&buffers});
        reducer_ = std::make_unique<detail::Reducer>(nn::parameters(module), std::move(buffers), o, loc);
    }

    /// The module's forward (after rank 0's buffers reach this rank).
    template <class... A>
    decltype(auto) operator()(A&&... a) {
        reducer_->before_forward(Loc::current());
        return module_(std::forward<A>(a)...);
    }
    /// What operator() does before the forward: rank 0's buffers to this rank. Call it yourself
    /// where the forward runs through something else (nn::autocast's copy of the module, say).
    void before_forward(Loc loc = Loc::current()) { reducer_->before_forward(loc); }
    M& module() { return module_; }
    const detail::Reducer& reducer() const { return *reducer_; }

    /// In its scope backward only accumulates gradients locally (torch's no_sync): the next
    /// backward outside it all-reduces the sum (gradient accumulation over micro-batches).
    class NoSync {
    public:
        explicit NoSync(detail::Reducer& r) : r_(r), prev_(r.sync) { r.sync = false; }
        ~NoSync() { r_.sync = prev_; }
        NoSync(const NoSync&) = delete;
        NoSync& operator=(const NoSync&) = delete;

    private:
        detail::Reducer& r_;
        bool prev_;
    };
    [[nodiscard]] NoSync no_sync() { return NoSync(*reducer_); }

private:
    M& module_;
    std::unique_ptr<detail::Reducer> reducer_;
};

/// torch.utils.data.DistributedSampler: this rank's share of a data set of `size` samples. Every
/// rank gets num_samples() indices (ceil(size / replicas), padded by repeating the first indices;
/// floor with drop_last), rank r taking every replicas-th index from r of the epoch's order: a
/// permutation from (seed, epoch) when shuffling (the same on every rank), else 0..size-1.
class DistributedSampler {
public:
    explicit DistributedSampler(std::int64_t size, int replicas = world_size(), int rank = dist::rank(), bool shuffle = true,
                                std::uint64_t seed = 0, bool drop_last = false, Loc loc = Loc::current())
        : size_(size), replicas_(replicas), rank_(rank), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
        if (size < 0) kiln::detail::fail<ValueError>("DistributedSampler", "size must not be negative", loc);
        if (replicas < 1 || rank < 0 || rank >= replicas)
            kiln::detail::fail<ValueError>("DistributedSampler", "rank " + std::to_string(rank) + " is not one of " + std::to_string(replicas) +
                                                                     " replicas", loc);
    }
    /// The epoch, which reshuffles (call it at the start of each epoch, on every rank).
    void set_epoch(std::int64_t e) { epoch_ = e; }
    std::int64_t num_samples() const {
        return drop_last_ && size_ % replicas_ != 0 ? size_ / replicas_ : (size_ + replicas_ - 1) / replicas_;
    }
    std::vector<std::int64_t> indices() const {
        std::vector<std::int64_t> order(static_cast<std::size_t>(size_));
        std::iota(order.begin(), order.end(), std::int64_t{0});
        if (shuffle_) {  // Fisher-Yates over Philox words of (seed + epoch): the same order on every rank
            const std::uint64_t s = seed_ + static_cast<std::uint64_t>(epoch_);
            for (std::int64_t i = size_ - 1; i > 0; --i) {
                const std::uint64_t w = (static_cast<std::uint64_t>(philox_word(s, 2 * static_cast<std::uint64_t>(i))) << 32) |
                                        philox_word(s, 2 * static_cast<std::uint64_t>(i) + 1);
                std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(w % static_cast<std::uint64_t>(i + 1))]);
            }
        }
        const std::int64_t total = num_samples() * replicas_;
        for (std::size_t i = 0; static_cast<std::int64_t>(order.size()) < total && size_ > 0; ++i) order.push_back(order[i]);
        order.resize(static_cast<std::size_t>(total));
        std::vector<std::int64_t> mine;
        for (std::int64_t i = rank_; i < total; i += replicas_) mine.push_back(order[static_cast<std::size_t>(i)]);
        return mine;
    }

private:
    std::int64_t size_;
    int replicas_, rank_;
    bool shuffle_, drop_last_;
    std::uint64_t seed_;
    std::int64_t epoch_ = 0;
};

}  // namespace kiln::dist

#if KILN_HEADER_ONLY
#include "kiln/dist/ddp_impl.hpp"
#endif
