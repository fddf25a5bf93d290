// The CUDA backend for graphs: runs a fused plan group by group, each kernel group as one
// generated kernel (compiled by NVRTC, cached by source), matmuls through cuBLASLt.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cuda/codegen.hpp"
#include "kiln/backends/cuda/graphs.hpp"
#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/blas.hpp"
#include "kiln/backends/cuda/kernel_cache.hpp"
#include "kiln/cache/files.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/fuse/execute.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/fuse/memory_plan.hpp"
#include "kiln/version.hpp"

namespace kiln::cuda {
// Defined in backends/cuda/matmul.hpp (which needs the copy ops that include this file).
Tensor matmul(const Tensor& a, const Tensor& b, Epilogue epi, const Tensor* bias, std::source_location loc);
Tensor& matmul_out(Tensor& out, const Tensor& a, const Tensor& b, Epilogue epi, const Tensor* bias, std::source_location loc);
}  // namespace kiln::cuda

namespace kiln::cuda::detail {

/// The loaded function of a generated kernel on a device (kernel_cache.hpp's kernel_function).
inline CUfunction kernel_function(const KernelText& k, int device) { return kernel_function(k.name, k.source, device); }

/// Whether nothing in the program reads group G's results but the writes that G's kernel stores
/// (Group::stored): an optimizer's update of a parameter, which the Launcher may hold back for a
/// combo launch without delaying anything that waits for it. (Other launches go out at once.)
inline bool group_is_sink(const ir::Graph& g, const fuse::Plan& p, const fuse::Group& G) {
    for (int o : G.outputs)
        for (int i = o + 1; i < g.size(); ++i)
            for (int j : g[i].in) {
                if (j != o || std::find(G.nodes.begin(), G.nodes.end(), i) != G.nodes.end()) continue;
                const int gi = p.group_of[static_cast<std::size_t>(i)];
                if (!(g[i].kind == ir::Kind::view_write && g[i].in[1] == o && gi >= 0 && p.groups[static_cast<std::size_t>(gi)].stored))
                    return false;
            }
    return true;
}

/// Kernel parameters: each one 8 bytes, kept alive until the launch.
struct Args {
    std::vector<std::uint64_t> slots;
    std::vector<void*> ptrs;
    void add(std::int64_t v) { slots.push_back(static_cast<std::uint64_t>(v)); }
    void add_ptr(const void* p) { slots.push_back(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p))); }
    void** finish() {
        ptrs.clear();
        for (auto& s : slots) ptrs.push_back(&s);
        return ptrs.data();
    }
    /// The slots as one parameter (a combo launch's block).
    void** finish_block() {
        ptrs.assign(1, slots.data());
        return ptrs.data();
    }
};

/// What an elementwise launch that may run as a segment of a combo launch carries: how to make
/// the multi form of its kernel, and the bytes each pointer parameter (leaves, then outputs)
/// reaches from its address (for the hazard checks between segments).
struct ComboKernel {
    std::function<KernelText()> make_multi;
    std::vector<std::int64_t> bytes;
    int outputs = 1;  ///< the last `outputs` pointers are written, the others read
};

/// Blocks for a grid-stride loop over `work` items of `threads` threads on a device: enough for
/// `waves` full waves of resident blocks, fewer when the work is smaller.
inline unsigned grid_for(std::int64_t work, int threads, int device, int waves = 4) {
    const std::int64_t want = (work + threads - 1) / threads;
    const std::int64_t resident = static_cast<std::int64_t>(properties(device).sm_count) * std::max(1, 2048 / threads);
    return static_cast<unsigned>(std::clamp<std::int64_t>(std::min(want, resident * waves), 1, (1ll << 31) - 1));
}

/// Launch shapes, overridable for tuning: KILN_CUDA_EW_UNROLL (vectors per thread per step of an
/// elementwise kernel), KILN_CUDA_EW_WAVES (its grid, in waves of resident blocks) and
/// KILN_CUDA_ROW_ELEMS (row elements each thread of a row kernel holds) and KILN_CUDA_ROW_LANES
/// (threads per short row: 0 = a block per row always; 1, 2, ..., 32 = that many; unset = the
/// heuristic, short_row_lanes); KILN_CUDA_SPLIT_FINISH=0 finishes split reductions with a second
/// launch instead of in their own (ReduceSignature::finish); KILN_CUDA_COMBO=0 launches every
/// elementwise group alone (no combo launches, Launcher); KILN_CUDA_MERGE_REDUCTIONS=0 and
/// KILN_CUDA_RECOMPUTE=0 turn off the fuser's sibling-reduction joining and recomputation.
struct Tuning {
    int ew_unroll = 1;    // measured on the H100: 1, 2 and 4 within noise of each other (chain64M)
    int ew_waves = 1 << 20;  // grid cap in waves of resident blocks: none (one vector per thread) measured
                             // 96% of copy on chain64M (H100) against 91% with 4 waves and 81% with 1
    int row_elems = 16;   // with exact rows (no bounds checks) 16 f32 per thread keep ~40 registers
    int row_lanes = -1;   // -1: short_row_lanes decides
    bool split_finish = true;
    bool combo = true;
    bool merge_reductions = true;  // fuse::Limits::merge_reductions
    bool recompute = true;         // fuse::Limits::recompute
    int attn_q_warps = 0;          // tensor-core attention's query warps per block: 0 lets attention.hpp decide
    static const Tuning& get() {
        static const Tuning t = [] {
            Tuning r;
            if (const char* e = std::getenv("KILN_CUDA_EW_UNROLL")) r.ew_unroll = std::clamp(std::atoi(e), 1, 8);
            if (const char* e = std::getenv("KILN_CUDA_ROW_ELEMS")) r.row_elems = std::clamp(std::atoi(e), 1, 64);
            if (const char* e = std::getenv("KILN_CUDA_EW_WAVES")) r.ew_waves = std::clamp(std::atoi(e), 1, 1 << 20);
            if (const char* e = std::getenv("KILN_CUDA_SPLIT_FINISH")) r.split_finish = std::atoi(e) != 0;
            if (const char* e = std::getenv("KILN_CUDA_COMBO")) r.combo = std::atoi(e) != 0;
            if (const char* e = std::getenv("KILN_CUDA_MERGE_REDUCTIONS")) r.merge_reductions = std::atoi(e) != 0;
            if (const char* e = std::getenv("KILN_CUDA_RECOMPUTE")) r.recompute = std::atoi(e) != 0;
            if (const char* e = std::getenv("KILN_CUDA_ATTN_QWARPS")) r.attn_q_warps = std::clamp(std::atoi(e), 0, 4);
            if (const char* e = std::getenv("KILN_CUDA_ROW_LANES")) {
                const int v = std::atoi(e);
                r.row_lanes = v <= 0 ? 0 : static_cast<int>(std::bit_floor(static_cast<unsigned>(std::min(v, 32))));
            }
            return r;
        }();
        return t;
    }
};

/// Threads per row for rows of `units` loads each (vectors of a row kernel, elements of a reduce
/// kernel) that one warp can hold (units <= max_units): about 4 loads per thread, a power of two
/// up to 32, so a block of 256 threads takes 8 to 256 rows and reduces them by shuffles alone. 0
/// (a block per row) for longer rows, or as KILN_CUDA_ROW_LANES says.
inline int short_row_lanes(std::int64_t units, std::int64_t max_units) {
    const int forced = Tuning::get().row_lanes;
    if (forced == 0 || units > max_units) return 0;
    if (forced > 0) return forced;
    int lanes = 1;
    while (lanes < 32 && lanes * 4 < units) lanes *= 2;
    return lanes;
}

/// Whether every offset an operand reaches fits a 32-bit index.
inline bool fits32(const std::vector<std::int64_t>& sz, const std::vector<std::int64_t>& st) {
    std::int64_t far = 0;
    for (std::size_t d = 0; d < sz.size(); ++d) far += (sz[d] - 1) * std::abs(st[d]);
    return far < (std::int64_t{1} << 30);
}

inline Strides strides_over(const Tensor& t, const Shape& space) {
    return kiln::detail::broadcast_strides(t.shape(), t.strides(), space);
}

/// Kernels made for one group, by launch signature (shapes and layouts can vary between calls).
struct KernelMemo {
    std::mutex mu;
    std::unordered_map<std::string, CUfunction> by_sig;
    /// max_autotune's launch-shape choices: (the heuristic's signature key, rows) -> the chosen one
    std::unordered_map<std::string, RowSignature> tuned;
    /// Whether the group's results go only into captured memory its kernel stores them in (an
    /// optimizer's update): -1 not known yet, else 0 or 1 (group_is_sink)
    std::atomic<int> sink{-1};
    // a memo belongs to one program, which runs on one device: the signature is the whole key
    CUfunction find(const std::string& sig) {
        std::lock_guard lock(mu);
        auto it = by_sig.find(sig);
        return it == by_sig.end() ? nullptr : it->second;
    }
    void insert(const std::string& sig, CUfunction f) {
        std::lock_guard lock(mu);
        by_sig.emplace(sig, f);
    }

    /// The last elementwise launch of the group: what its operands looked like (dtype, shape,
    /// strides, address modulo 64 of each leaf and of the output) and what that decided (kernel,
    /// parameters after the pointers, grid). A call whose operands look the same reuses it.
    struct Last {
        std::vector<DType> dtypes;
        std::vector<Shape> shapes;
        std::vector<Strides> strides;
        std::vector<unsigned> align;
        std::vector<unsigned> out_align;  ///< per output
        Shape out_shape;
        Strides out_strides;
        CUfunction fn = nullptr;
        std::vector<std::int64_t> tail;
        unsigned grid = 0, block = 256;
        std::shared_ptr<const ComboKernel> combo;  ///< set when the launch may join a combo launch
    } last;
};

inline unsigned align64(const void* p) { return static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(p) % 64); }

/// Remembers this launch of G (kernel f, parameters after the pointers `tail`, grid and block) in
/// memo.last, for relaunch_last.
inline void remember_launch(KernelMemo& memo, const fuse::Group& G, const std::vector<Tensor>& vals, const std::vector<Tensor>& outs,
                            const Shape& S, const Strides& out_strides, CUfunction f, std::vector<std::int64_t> tail, unsigned grid,
                            unsigned block, std::shared_ptr<const ComboKernel> combo = {}) {
    KernelMemo::Last l;
    l.combo = std::move(combo);
    for (int leaf : G.leaves) {
        const Tensor& t = vals[static_cast<std::size_t>(leaf)];
        l.dtypes.push_back(t.dtype());
        l.shapes.push_back(t.shape());
        l.strides.push_back(t.strides());
        l.align.push_back(align64(t.data_ptr()));
    }
    l.out_shape = S;
    l.out_strides = out_strides;
    for (const Tensor& t : outs) l.out_align.push_back(align64(t.data_ptr()));
    l.fn = f;
    l.tail = std::move(tail);
    l.grid = grid;
    l.block = block;
    std::lock_guard lock(memo.mu);
    memo.last = std::move(l);
}

/// Loaded functions for several kernels: the ones not loaded yet are compiled together, in
/// parallel (memory and disk caches first), then loaded.
inline std::vector<CUfunction> kernel_functions(const std::vector<KernelText>& ks, int device) {
    std::vector<CUfunction> out(ks.size(), nullptr);
    std::vector<cache::KernelSource> missing;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < ks.size(); ++i) {
        bool dup = false;
        for (const auto& m : missing) dup = dup || m.name == ks[i].name;
        if (!dup) {
            // the text kernel_function compiles (with the PDL entry where the device takes it):
            // warming any other text compiles each kernel twice, the second time one by one
            missing.push_back({device_kernel_text(ks[i].source, device), ks[i].name, {}});
            where.push_back(i);
        }
    }
    if (missing.size() > 1) (void)cache::cubins_for(missing, properties(device).arch());  // warm the caches in parallel
    for (std::size_t i = 0; i < ks.size(); ++i) out[i] = kernel_function(ks[i], device);
    return out;
}

/// One kernel launch of a program run.
struct Launch {
    KernelMemo* memo;  ///< null: `fn` is already known
    CUfunction fn;
    std::string key;
    std::function<KernelText()> make;
    Args args;
    unsigned grid, block;
    std::shared_ptr<const ComboKernel> combo;  ///< set: it may run as a segment of a combo launch
    std::vector<Tensor> keep;  ///< a combo launch's operands, alive until it is launched (their memory
                               ///< is not handed out again before then)
};

/// The launches of a program run, in order. A launch whose kernel is known goes out at once;
/// once one is unknown, it and every later launch wait for flush(), which compiles all the
/// unknown kernels together (in parallel) and then launches everything in order.
///
/// Combo launches (horizontal fusion, as torch's multi-tensor foreach kernels): elementwise
/// launches that may be segments of a combo launch (EwSignature::combinable, and a group whose
/// results nothing waits for: group_is_sink) are held back while
/// none of them writes memory another one reads or writes (checked on the pointers' byte ranges),
/// so they may run in any order; then the held launches of each kernel text (one optimizer update
/// per parameter: the same text, other sizes and pointers) go out as one launch of the kernel's
/// multi form, each a segment of its grid, as many as fit one parameter block (combo_slots). A
/// launch that cannot join sends the held ones out first, so every dependence keeps its order.
/// Held launches keep their operands alive (Launch::keep).
class Launcher {
public:
    explicit Launcher(int device) : device_(device) {}
    Launcher(const Launcher&) = delete;
    Launcher& operator=(const Launcher&) = delete;
    ~Launcher() noexcept(false) {
        if (!pending_.empty() && std::uncaught_exceptions() == 0) flush();
    }

    void add(KernelMemo& memo, std::string key, std::function<KernelText()> make, Args args, unsigned grid, unsigned block,
             std::shared_ptr<const ComboKernel> combo = {}, std::vector<Tensor> keep = {}) {
        if (const CUfunction f = waiting_ ? nullptr : memo.find(key)) {
            add(f, std::move(args), grid, block, std::move(combo), std::move(keep));
            return;
        }
        waiting_ = true;
        pending_.push_back({&memo, nullptr, std::move(key), std::move(make), std::move(args), grid, block, nullptr, {}});
        if (Tuning::get().combo && combo) {
            pending_.back().combo = std::move(combo);
            pending_.back().keep = std::move(keep);
        }
    }
    /// A launch of a kernel already loaded (`keep`: a combo launch's operands).
    void add(CUfunction f, Args args, unsigned grid, unsigned block, std::shared_ptr<const ComboKernel> combo = {},
             std::vector<Tensor> keep = {}) {
        Launch l{nullptr, f, {}, {}, std::move(args), grid, block, nullptr, {}};
        if (Tuning::get().combo && combo) {
            l.combo = std::move(combo);
            l.keep = std::move(keep);
        }
        if (waiting_) {
            pending_.push_back(std::move(l));
            return;
        }
        // nothing waits for a compile: pending_ holds combo launches independent of each other
        if (l.combo && joins(l, 0, pending_.size())) {
            pending_.push_back(std::move(l));
            return;
        }
        flush();
        if (l.combo) pending_.push_back(std::move(l));
        else launch(f, l.grid, l.block, 0, current_stream(device_), l.args.finish());
    }

    /// Whether the memory of every launch added so far may be handed out again: each is queued on
    /// the stream, or is a combo launch holding its operands (nothing waits for a compile).
    bool idle() const { return !waiting_; }

    /// Compiles what the queued launches need, then launches them in order, runs of combo launches
    /// of one kernel as one launch.
    void flush() {
        if (pending_.empty()) return;
        std::vector<KernelText> texts;
        std::vector<std::size_t> which;
        for (std::size_t i = 0; i < pending_.size(); ++i)
            if (pending_[i].memo && !pending_[i].memo->find(pending_[i].key)) {
                texts.push_back(pending_[i].make());
                which.push_back(i);
            }
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<CUfunction> fs = kernel_functions(texts, device_);
        if (!texts.empty() && debug::log_on("compile_times"))
            debug::log("compile_times", "compile wave: " + std::to_string(texts.size()) + " kernel(s) not loaded yet (compiled, or read from the " +
                                            "disk cache) for " + std::to_string(pending_.size()) + " waiting launch(es), in " +
                                            std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()) +
                                            " ms");
        for (std::size_t j = 0; j < which.size(); ++j) pending_[which[j]].memo->insert(pending_[which[j]].key, fs[j]);
        for (Launch& l : pending_)
            if (l.memo) {
                l.fn = l.memo->find(l.key);
                l.memo = nullptr;
            }
        // stretches of combo launches that touch nothing another one writes go out as one launch per
        // kernel (in order of first appearance), at most max_segments segments each
        std::vector<std::vector<std::size_t>> out;  // each: one launch, of one kernel (combo when > 1)
        for (std::size_t i = 0; i < pending_.size();) {
            std::size_t j = i + 1;
            if (pending_[i].combo)
                while (j < pending_.size() && joins(pending_[j], i, j)) ++j;
            std::vector<std::vector<std::size_t>> by_kernel;
            for (std::size_t k = i; k < j; ++k) {
                std::vector<std::size_t>* to = nullptr;
                for (auto& v : by_kernel)
                    if (pending_[v[0]].fn == pending_[k].fn && v.size() < max_segments(pending_[k])) to = &v;
                if (to) to->push_back(k);
                else by_kernel.push_back({k});
            }
            out.insert(out.end(), by_kernel.begin(), by_kernel.end());
            i = j;
        }
        std::vector<KernelText> multi_texts;
        std::vector<CUfunction> singles;
        for (const auto& v : out)
            if (v.size() > 1 && !known_multi(pending_[v[0]].fn) &&
                std::find(singles.begin(), singles.end(), pending_[v[0]].fn) == singles.end()) {
                multi_texts.push_back(pending_[v[0]].combo->make_multi());
                singles.push_back(pending_[v[0]].fn);
            }
        if (!multi_texts.empty()) {
            const std::vector<CUfunction> ms = kernel_functions(multi_texts, device_);
            for (std::size_t j = 0; j < ms.size(); ++j) remember_multi(singles[j], ms[j]);
        }
        const CUstream st = current_stream(device_);
        for (const auto& v : out) {
            if (v.size() == 1) {
                Launch& l = pending_[v[0]];
                launch(l.fn, l.grid, l.block, 0, st, l.args.finish());
                continue;
            }
            // each segment takes a quarter of the blocks its own launch would (one vector per
            // thread): four per thread, so each block's search for its segment is paid less often
            Args a;
            a.slots.assign(combo_slots, 0);
            a.slots[0] = v.size();
            std::size_t at = 1 + v.size();
            unsigned grid = 0;
            for (std::size_t s = 0; s < v.size(); ++s) {
                const Launch& l = pending_[v[s]];
                const std::size_t np = l.combo->bytes.size();
                a.slots[1 + s] = grid;
                a.slots[at] = l.args.slots[np];  // n
                for (std::size_t k = 0; k < np; ++k) a.slots[at + 1 + k] = l.args.slots[k];
                at += np + 1;
                grid += (l.grid + 3) / 4;
            }
            launch(known_multi(pending_[v[0]].fn), grid, pending_[v[0]].block, 0, st, a.finish_block());
            if (debug::log_on("combo"))
                debug::log("combo", "one launch for " + std::to_string(v.size()) + " elementwise groups, " + std::to_string(grid) + " blocks");
        }
        pending_.clear();
        waiting_ = false;
    }

private:
    /// Whether launch l may join the pending launches [first, end): all combo launches (of any
    /// kernel), none writing memory another reads or writes, so they may run in any order.
    bool joins(const Launch& l, std::size_t first, std::size_t end) const {
        if (!l.combo || l.fn == nullptr) return false;
        const std::size_t nl = l.combo->bytes.size() - outputs(l);
        auto range = [](const Launch& x, std::size_t k) {
            const std::uint64_t lo = x.args.slots[k];
            return std::pair<std::uint64_t, std::uint64_t>(lo, lo + static_cast<std::uint64_t>(x.combo->bytes[k]));
        };
        auto meet = [](std::pair<std::uint64_t, std::uint64_t> a, std::pair<std::uint64_t, std::uint64_t> b) {
            return a.first < b.second && b.first < a.second;
        };
        for (std::size_t i = first; i < end; ++i) {
            const Launch& m = pending_[i];
            if (!m.combo || m.fn == nullptr) return false;
            const std::size_t mn = m.combo->bytes.size(), ml = mn - outputs(m);
            for (std::size_t k = 0; k < l.combo->bytes.size(); ++k)
                for (std::size_t j = 0; j < mn; ++j) {
                    const bool lw = k >= nl, mw = j >= ml;
                    if ((lw || mw) && meet(range(l, k), range(m, j))) return false;
                }
        }
        return true;
    }
    /// Segments of launch l's kernel one combo launch holds.
    static std::size_t max_segments(const Launch& l) {
        return static_cast<std::size_t>((combo_slots - 1) / combo_segment_slots(static_cast<int>(l.combo->bytes.size())));
    }
    /// How many of a combo launch's pointers are outputs (the last ones).
    static std::size_t outputs(const Launch& l) { return static_cast<std::size_t>(l.combo->outputs); }

    static std::mutex& multi_mu() {
        static std::mutex m;
        return m;
    }
    static std::unordered_map<CUfunction, CUfunction>& multi_map() {
        static std::unordered_map<CUfunction, CUfunction> m;
        return m;
    }
    static CUfunction known_multi(CUfunction single) {
        std::lock_guard lock(multi_mu());
        auto it = multi_map().find(single);
        return it == multi_map().end() ? nullptr : it->second;
    }
    static void remember_multi(CUfunction single, CUfunction multi) {
        std::lock_guard lock(multi_mu());
        multi_map().emplace(single, multi);
    }

    int device_;
    bool waiting_ = false;  ///< a pending launch's kernel is not compiled yet
    std::vector<Launch> pending_;
};

/// A combo launch's operands (G's leaves in vals, then its outputs): the Launcher keeps them alive
/// while it holds the launch (Launch::keep).
inline std::vector<Tensor> launch_operands(const fuse::Group& G, const std::vector<Tensor>& vals, const std::vector<Tensor>& outs) {
    std::vector<Tensor> keep;
    keep.reserve(G.leaves.size() + outs.size());
    for (int leaf : G.leaves) keep.push_back(vals[static_cast<std::size_t>(leaf)]);
    keep.insert(keep.end(), outs.begin(), outs.end());
    return keep;
}

/// Launches group G's kernel as memo.last did, with this call's pointers (its leaves in vals, then
/// outs), when the operands look as they did then (dtypes, shapes, strides, addresses modulo 64,
/// the space S, the first output's strides out_strides): returns false, launching nothing, otherwise.
inline bool relaunch_last(KernelMemo& memo, const fuse::Group& G, const std::vector<Tensor>& vals, const std::vector<Tensor>& outs,
                          const Shape& S, const Strides& out_strides, Launcher& L, bool may_hold = false) {
    const std::size_t nl = G.leaves.size(), no = outs.size();
    std::unique_lock lock(memo.mu);
    const KernelMemo::Last& l = memo.last;
    bool same = l.fn && l.dtypes.size() == nl && l.out_shape == S && l.out_strides == out_strides && l.out_align.size() == no;
    for (std::size_t m = 0; same && m < no; ++m) same = l.out_align[m] == align64(outs[m].data_ptr());
    for (std::size_t k = 0; same && k < nl; ++k) {
        const Tensor& t = vals[static_cast<std::size_t>(G.leaves[k])];
        same = t.dtype() == l.dtypes[k] && t.shape() == l.shapes[k] && t.strides() == l.strides[k] && align64(t.data_ptr()) == l.align[k];
    }
    if (!same) return false;
    Args a;
    a.slots.reserve(nl + no + l.tail.size());
    for (std::size_t k = 0; k < nl; ++k) a.add_ptr(vals[static_cast<std::size_t>(G.leaves[k])].data_ptr());
    for (const Tensor& t : outs) a.add_ptr(t.data_ptr());
    for (auto v : l.tail) a.add(v);
    const CUfunction f = l.fn;
    const unsigned grid = l.grid, block = l.block;
    std::shared_ptr<const ComboKernel> combo = may_hold ? l.combo : nullptr;
    lock.unlock();
    std::vector<Tensor> keep = combo ? launch_operands(G, vals, outs) : std::vector<Tensor>{};
    L.add(f, std::move(a), grid, block, std::move(combo), std::move(keep));
    return true;
}

inline Tensor new_on(const Shape& s, DType d, int device) { return Tensor(s, d, Device::cuda(device)); }

/// The tensor a group writes node id into: a destination placed in vals beforehand (contiguous,
/// same shape and dtype: a statement assigned into an existing tensor), or a new one.
inline Tensor out_for(std::vector<Tensor>& vals, int id, const Shape& s, DType d, int device) {
    Tensor& v = vals[static_cast<std::size_t>(id)];
    if (!(v.defined() && v.shape() == s && v.dtype() == d && v.is_contiguous() && v.device() == Device::cuda(device)))
        v = new_on(s, d, device);
    return v;
}

// ------------------------------------------------------------------ elementwise groups
/// `may_hold`: the launch may wait in the Launcher for a combo launch (group_is_sink).
inline void run_elementwise(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, int device, KernelMemo& memo,
                            Launcher& L, bool may_hold = false) {
    const std::size_t no = G.outputs.size();
    const Shape& S = g[G.outputs[0]].shape;  // every output has the group's shape
    // destinations placed beforehand may be strided views (a statement written into a slice;
    // updates stored straight into channels-last parameters and their state): taken when every
    // output has one, all with the same strides (the kernel walks one set of output strides)
    bool view_out = true;
    for (int o : G.outputs) {
        const ir::Node& on = g[o];
        const Tensor& pre = vals[static_cast<std::size_t>(o)];
        view_out = view_out && pre.defined() && pre.shape() == on.shape && pre.dtype() == on.dtype && pre.device() == Device::cuda(device) &&
                   !pre.is_contiguous() && pre.strides() == vals[static_cast<std::size_t>(G.outputs[0])].strides();
    }
    std::vector<Tensor> outs;
    for (int o : G.outputs) outs.push_back(view_out ? vals[static_cast<std::size_t>(o)] : out_for(vals, o, g[o].shape, g[o].dtype, device));
    const std::int64_t n = S.numel();
    if (n == 0) return;
    const std::size_t nl = G.leaves.size();
    if (relaunch_last(memo, G, vals, outs, S, outs[0].strides(), L, may_hold)) return;  // the operands look as they did last time
    std::vector<std::int64_t> ost(outs[0].strides().begin(), outs[0].strides().end());
    std::vector<Operand> ops(G.leaves.size());
    std::vector<std::vector<std::int64_t>*> all{&ost};
    for (std::size_t k = 0; k < G.leaves.size(); ++k) {
        const Tensor& t = vals[static_cast<std::size_t>(G.leaves[k])];
        const Strides st = strides_over(t, S);
        ops[k].dtype = t.dtype();
        ops[k].address = reinterpret_cast<std::uintptr_t>(t.data_ptr());
        ops[k].strides.assign(st.begin(), st.end());
        all.push_back(&ops[k].strides);
    }
    // outputs in channels-last memory: the dims walked in that order, so operands laid out alike
    // merge into contiguous runs (coalesced, vectorized)
    Shape walk = S;
    if (std::vector<std::int64_t> order; walk_in_memory_order(S, outs[0].strides(), order)) {
        walk = permuted(S, order);
        for (std::vector<std::int64_t>* v : all) *v = permuted(*v, order);
    }
    const std::vector<std::int64_t> sz = collapse_dims(walk, all);
    EwSignature sig;
    sig.rank = static_cast<int>(sz.size());
    {
        std::int64_t expect = 1;
        for (std::size_t d = sz.size(); d-- > 0;) {
            sig.out_strided = sig.out_strided || ost[d] != expect;
            expect *= sz[d];
        }
    }
    int vec = sig.out_strided ? 1 : 4;
    if (n % vec != 0) vec = 1;
    for (const Tensor& t : outs)
        if (reinterpret_cast<std::uintptr_t>(t.data_ptr()) % (static_cast<std::uintptr_t>(vec) * dtype_size(t.dtype())) != 0) vec = 1;
    for (auto& o : ops)
        if (classify(o, sz, vec) == Access::contig && o.address % (static_cast<std::uintptr_t>(vec) * dtype_size(o.dtype)) != 0) vec = 1;
    sig.vec = vec;
    bool small = n < (std::int64_t{1} << 30);  // headroom: t + gridDim * blockDim stays under 2^31
    for (auto& o : ops) {
        o.access = classify(o, sz, vec);
        sig.leaves.push_back(o.access);
        sig.leaf_dtypes.push_back(o.dtype);
        small = small && fits32(sz, o.strides);
    }
    small = small && fits32(sz, ost);
    sig.idx64 = !small;
    sig.unroll = n / vec >= 4096 ? Tuning::get().ew_unroll : 1;
    Args a;
    for (auto& o : ops) a.add_ptr(reinterpret_cast<const void*>(o.address));
    for (const Tensor& t : outs) a.add_ptr(t.data_ptr());
    a.add(n);
    for (auto z : sz) a.add(z);
    for (auto& o : ops)
        if (o.access == Access::strided || o.access == Access::inner)
            for (auto s : o.strides) a.add(s);
    if (sig.out_strided)
        for (auto s : ost) a.add(s);
    const unsigned grid = grid_for((n / vec + sig.unroll - 1) / sig.unroll, 256, device, Tuning::get().ew_waves);
    const std::string key = sig.key();
    const std::vector<std::int64_t> tail(a.slots.begin() + static_cast<std::ptrdiff_t>(nl + no), a.slots.end());
    std::shared_ptr<const ComboKernel> combo;
    if (may_hold && sig.combinable()) {  // it may run as a segment of a combo launch (Launcher)
        auto c = std::make_shared<ComboKernel>();
        EwSignature ms = sig;
        ms.multi = true;
        c->make_multi = [&g, &G, ms] { return elementwise_kernel(g, G, ms); };
        for (const Operand& o : ops) c->bytes.push_back((o.access == Access::scalar ? 1 : n) * static_cast<std::int64_t>(dtype_size(o.dtype)));
        for (const Tensor& t : outs) c->bytes.push_back(n * static_cast<std::int64_t>(dtype_size(t.dtype())));
        c->outputs = static_cast<int>(no);
        combo = std::move(c);
    }
    std::vector<Tensor> keep = combo ? launch_operands(G, vals, outs) : std::vector<Tensor>{};
    L.add(memo, key, [&g, &G, sig] { return elementwise_kernel(g, G, sig); }, std::move(a), grid, 256, combo, std::move(keep));
    if (const CUfunction f = memo.find(key))  // known (not waiting for a flush): remember the launch
        remember_launch(memo, G, vals, outs, S, outs[0].strides(), f, tail, grid, 256, std::move(combo));
}

// ------------------------------------------------------------------ row and reduce groups
/// Operands of a row-wise launch over `space` with reduced axes `mask`: each operand's strides
/// split into outer (kept) and inner (reduced) dims, both collapsed.
struct RowLayout {
    std::vector<std::int64_t> outer, inner;  ///< collapsed sizes
    std::vector<std::vector<std::int64_t>> so, si;
    std::int64_t rows = 1, L = 1;
};
inline RowLayout row_layout(const Shape& S, unsigned mask, const std::vector<Strides>& strides) {
    RowLayout r;
    Shape os, is;
    std::vector<std::vector<std::int64_t>> so(strides.size()), si(strides.size());
    for (int d = 0; d < S.rank(); ++d) {
        const bool red = (mask & (1u << d)) != 0;
        (red ? is : os).push_back(S[d]);
        for (std::size_t k = 0; k < strides.size(); ++k) (red ? si : so)[k].push_back(strides[k][d]);
    }
    std::vector<std::vector<std::int64_t>*> po, pi;
    for (std::size_t k = 0; k < strides.size(); ++k) {
        po.push_back(&so[k]);
        pi.push_back(&si[k]);
    }
    r.outer = collapse_dims(os, po);
    r.inner = collapse_dims(is, pi);
    r.so = std::move(so);
    r.si = std::move(si);
    r.rows = os.numel();
    r.L = is.numel();
    return r;
}
inline Access inner_access(const std::vector<std::int64_t>& si) {
    bool zero = true;
    for (auto s : si) zero = zero && s == 0;
    if (zero) return Access::scalar;
    if (si.size() == 1 && si[0] == 1) return Access::contig;
    return Access::strided;
}

/// Sizes a row signature for rows of `nv` vectors (L elements): `lanes` threads per row and 256
/// threads a block (lanes > 0), or a block per row of up to 1024 threads holding about
/// `per_thread` vectors each.
inline void shape_row_signature(RowSignature& sig, std::int64_t nv, std::int64_t L, int lanes, std::int64_t per_thread) {
    int threads = 32;
    while (threads < 1024 && threads * per_thread < nv) threads *= 2;
    sig.lanes = lanes;
    if (lanes > 0) threads = 256;
    const int per_row = lanes > 0 ? lanes : threads;
    sig.threads = threads;
    sig.items = static_cast<int>((nv + per_row - 1) / per_row);
    sig.exact = L == static_cast<std::int64_t>(per_row) * sig.items * sig.vec;
}

/// The grid of a row launch: one block per row, or per threads / lanes short rows (a grid-stride
/// loop over rows kept fewer rows in flight: like the elementwise grid cap, it measured slower).
inline unsigned row_blocks(const RowSignature& sig, std::int64_t rows) {
    const std::int64_t per_block = sig.lanes > 0 ? sig.threads / sig.lanes : 1;
    return static_cast<unsigned>(std::min<std::int64_t>((rows + per_block - 1) / per_block, (std::int64_t{1} << 31) - 1));
}

/// The largest rows x row length of a row group max_autotune leaves untimed where its rows are
/// fewer than the multiprocessors (run_row).
inline constexpr std::int64_t row_untimed_values = std::int64_t{1} << 16;

/// The launch shapes max_autotune tries for a row group: the heuristic's first, then half and
/// twice its lanes per short row and a block per row, or half and twice the vectors per thread of
/// a block per row (at most 64 values per thread and row-varying node: registers).
inline std::vector<RowSignature> row_candidates(const RowSignature& base, std::int64_t nv, std::int64_t L, std::int64_t per_thread) {
    std::vector<RowSignature> cands{base};
    auto with = [&](int lanes, std::int64_t pt) {
        if (lanes > 32 || pt < 1) return;
        RowSignature c = base;
        shape_row_signature(c, nv, L, lanes, pt);
        if (c.items * c.vec > 64) return;
        for (const RowSignature& d : cands)
            if (d.key() == c.key()) return;
        cands.push_back(c);
    };
    if (base.lanes > 0) {
        if (base.lanes > 1) with(base.lanes / 2, per_thread);
        with(base.lanes * 2, per_thread);
        with(0, per_thread);
    } else {
        with(0, per_thread / 2);
        with(0, per_thread * 2);
    }
    return cands;
}

/// max_autotune's launch shape for a row group (Autotune on, not capturing; `untimed`: the
/// heuristic's `base`, logged once): row_candidates
/// compiled together, each timed on the call's operands (the best of 3 rounds of 5 launches back
/// to back; the output is written, so the caller checks that it reads none of it), the fastest
/// kept unless the heuristic's is within 3%.
/// The choice is remembered in the program's memo per (signature, rows), and on disk
/// (<cache dir>/autotune/row-<hash>.txt, keyed by the kernel's text, the row count, the GPU and
/// kiln's version; used only where the key text matches). Queued launches are flushed first: the
/// timed runs read what they write.
inline RowSignature tune_row_signature(const ir::Graph& g, const fuse::Group& G, const std::vector<int>& stored, const RowSignature& base,
                                       std::int64_t nv, const RowLayout& lay, std::int64_t per_thread, bool untimed, Args& args,
                                       int device, KernelMemo& memo, Launcher& L) {
    const std::string choice_key = base.key() + "/" + std::to_string(lay.rows);
    {
        std::lock_guard lock(memo.mu);
        if (auto it = memo.tuned.find(choice_key); it != memo.tuned.end()) return it->second;
    }
    auto remember = [&](const RowSignature& c) {
        std::lock_guard lock(memo.mu);
        memo.tuned.emplace(choice_key, c);
        return c;
    };
    if (untimed) {  // (run_row: a latency-bound kernel)
        if (debug::log_on("autotune"))
            debug::log("autotune", "row kernel " + base.key() + ", " + std::to_string(lay.rows) + " rows of " + std::to_string(lay.L) +
                                       ": not timed (fewer rows than multiprocessors and few values: its latency, which launches"
                                       " back to back do not measure), the heuristic's shape");
        return remember(base);
    }
    const std::vector<RowSignature> cands = row_candidates(base, nv, lay.L, per_thread);
    // the disk entry of another process that tuned this kernel for this GPU and row count
    const DeviceProperties& props = properties(device);
    const std::string text = "kiln row autotune v1; " + props.name + " sm_" + std::to_string(props.arch()) + "; kiln " + kiln::version +
                             "; " + base.key() + "; rows " + std::to_string(lay.rows) + " of " + std::to_string(lay.L) + "; kernel " +
                             cache::to_hex(cache::hash64(row_kernel(g, G, stored, base).source));
    const std::filesystem::path file = std::filesystem::path(cache::cache_dir()) / "autotune" / ("row-" + cache::to_hex(cache::hash64(text)) + ".txt");
    if (std::ifstream in(file); in) {
        std::string line, chosen;
        if (std::getline(in, line) && line == text && std::getline(in, chosen))
            for (const RowSignature& c : cands)
                if (chosen == "lanes " + std::to_string(c.lanes) + " threads " + std::to_string(c.threads) + " items " + std::to_string(c.items)) {
                    if (debug::log_on("autotune")) debug::log("autotune", "row kernel " + base.key() + ": " + chosen + " (from " + file.string() + ")");
                    return remember(c);
                }
    }
    const CUstream st = current_stream(device);
    L.flush();
    if (capturing(st)) return base;
    // the candidates' kernels, compiled together
    std::vector<KernelText> texts;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < cands.size(); ++i)
        if (!memo.find(cands[i].key())) {
            texts.push_back(row_kernel(g, G, stored, cands[i]));
            which.push_back(i);
        }
    const std::vector<CUfunction> fs = kernel_functions(texts, device);
    for (std::size_t j = 0; j < which.size(); ++j) memo.insert(cands[which[j]].key(), fs[j]);
    Event e0(device), e1(device);
    std::vector<double> us(cands.size(), 1e30);
    for (std::size_t i = 0; i < cands.size(); ++i) {
        const CUfunction f = memo.find(cands[i].key());
        const unsigned grid = row_blocks(cands[i], lay.rows), block = static_cast<unsigned>(cands[i].threads);
        launch(f, grid, block, 0, st, args.finish());  // warm-up
        for (int round = 0; round < 3; ++round) {
            e0.record(st);
            for (int r = 0; r < 5; ++r) launch(f, grid, block, 0, st, args.finish());
            e1.record(st);
            us[i] = std::min(us[i], 1e3 * static_cast<double>(e1.elapsed_ms(e0)) / 5);
        }
    }
    std::size_t pick = 0;
    for (std::size_t i = 1; i < cands.size(); ++i)
        if (us[i] < (pick == 0 ? 0.97 : 1.0) * us[pick]) pick = i;
    if (debug::log_on("autotune")) {
        std::string line = "row kernel " + base.key() + ", " + std::to_string(lay.rows) + " rows of " + std::to_string(lay.L) + ":";
        for (std::size_t i = 0; i < cands.size(); ++i) {
            char t[48];
            std::snprintf(t, sizeof t, "%.2f us", us[i]);
            line += "\n  " + std::string(i == pick ? "* " : "  ") + "lanes " + std::to_string(cands[i].lanes) + " threads " +
                    std::to_string(cands[i].threads) + " items " + std::to_string(cands[i].items) + ": " + t;
        }
        debug::log("autotune", line);
    }
    const RowSignature& c = cands[pick];
    std::string why;
    if (!cache::detail::write_file_atomically(file, text + "\nlanes " + std::to_string(c.lanes) + " threads " + std::to_string(c.threads) +
                                                        " items " + std::to_string(c.items) + "\n", why))
        debug::log("autotune", "row kernel choice not remembered: " + why);
    return remember(c);
}

inline void run_row(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, int device, KernelMemo& memo,
                    Launcher& L) {
    const Shape& S = G.space;
    const Shape keep = fuse::detail::keep_shape(S, G.mask);
    std::vector<Tensor> outs;
    std::vector<Strides> strides;
    std::vector<DType> dtypes;
    for (int leaf : G.leaves) {
        const Tensor& t = vals[static_cast<std::size_t>(leaf)];
        strides.push_back(strides_over(t, S));
        dtypes.push_back(t.dtype());
    }
    for (int o : G.outputs) {
        const ir::Node& n = g[o];
        Tensor t = out_for(vals, o, n.shape, n.dtype, device);
        const bool full = row_varies(g, o, S, G.mask);  // one value per row element, else one per row
        strides.push_back(full ? contiguous_strides(S) : kiln::detail::broadcast_strides(keep, contiguous_strides(keep), S));
        dtypes.push_back(n.dtype);
        outs.push_back(t);
    }
    if (S.numel() == 0) return;
    // the operands look as they did last time: the same kernel and parameters (max_autotune times
    // launch shapes instead)
    const bool tuning = kiln::detail::autotune_active() != kiln::detail::Autotune::off;
    if (!tuning && relaunch_last(memo, G, vals, outs, S, Strides{}, L)) return;
    RowLayout lay = row_layout(S, G.mask, strides);
    RowSignature sig;
    sig.outer_rank = static_cast<int>(lay.outer.size());
    sig.inner_rank = static_cast<int>(lay.inner.size());
    sig.dtypes = dtypes;
    const std::size_t nops = strides.size();
    std::vector<std::uintptr_t> addr;
    for (int leaf : G.leaves) addr.push_back(reinterpret_cast<std::uintptr_t>(vals[static_cast<std::size_t>(leaf)].data_ptr()));
    for (const Tensor& t : outs) addr.push_back(reinterpret_cast<std::uintptr_t>(t.data_ptr()));
    int vec = lay.L % 4 == 0 ? 4 : 1;
    bool small = true;
    for (std::size_t k = 0; k < nops; ++k) {
        const Access a = inner_access(lay.si[k]);
        sig.inner_access.push_back(a);
        bool oz = true;
        for (auto s : lay.so[k]) oz = oz && s == 0;
        sig.outer_zero.push_back(oz ? 1 : 0);
        if (a == Access::contig) {
            bool ok = addr[k] % (4 * dtype_size(dtypes[k])) == 0;
            for (auto s : lay.so[k]) ok = ok && s % 4 == 0;
            if (!ok) vec = 1;
        }
        small = small && fits32(lay.outer, lay.so[k]) && fits32(lay.inner, lay.si[k]);
    }
    sig.vec = vec;
    sig.idx64 = !small || lay.rows * lay.L >= (std::int64_t{1} << 30);
    const std::int64_t nv = (lay.L + vec - 1) / vec;
    // vectors per thread: half as many where the rows are fewer than the multiprocessors (a block
    // per row, each block's chain of loads is the kernel's time: bert-base's residual + LayerNorm
    // rows at batch 1, 9 rows of 768, measured 252.5-253.1 against 257.1-257.6 us a forward on the
    // H200; at 8 x 128, 1024 rows, halving measured 657 against 625 us, so many rows keep row_elems)
    const bool few_rows = lay.rows < properties(device).sm_count;
    const std::int64_t per_thread = std::max<std::int64_t>(1, Tuning::get().row_elems / vec / (few_rows ? 2 : 1));
    shape_row_signature(sig, nv, lay.L, short_row_lanes(nv, 32 * per_thread), per_thread);  // short rows: several per block
    std::vector<int> stored(G.outputs.begin(), G.outputs.end());
    Args a;
    for (std::size_t k = 0; k < nops; ++k) a.add_ptr(reinterpret_cast<const void*>(addr[k]));
    a.add(lay.rows);
    a.add(lay.L);
    for (auto z : lay.outer) a.add(z);
    for (auto z : lay.inner) a.add(z);
    for (std::size_t k = 0; k < nops; ++k) {
        for (auto s : lay.so[k]) a.add(s);
        if (sig.inner_access[k] == Access::strided || sig.inner_access[k] == Access::inner)
            for (auto s : lay.si[k]) a.add(s);
    }
    // max_autotune leaves a small kernel of few rows (fewer than the multiprocessors, at most
    // row_untimed_values values) to the heuristic: its time is its latency in the program's chain
    // of kernels, which launches of it back to back do not measure (bert-base at batch 1: the
    // candidates of its 9-row LayerNorm timed 3.0-3.5 us each, the pick changing from process to
    // process, and the picks ran the forward 5-30 us slower than the heuristic's shape)
    const bool untimed = few_rows && lay.rows * lay.L <= row_untimed_values;
    if (tuning) {
        bool aliased = false;  // timing runs the kernel several times: never where it writes what it reads
        for (const Tensor& o : outs)
            for (int leaf : G.leaves) aliased = aliased || o.storage() == vals[static_cast<std::size_t>(leaf)].storage();
        if (!aliased) sig = tune_row_signature(g, G, stored, sig, nv, lay, per_thread, untimed, a, device, memo, L);
    }
    const std::string key = sig.key();
    const unsigned grid = row_blocks(sig, lay.rows), block = static_cast<unsigned>(sig.threads);
    std::vector<std::int64_t> tail(a.slots.begin() + static_cast<std::ptrdiff_t>(nops), a.slots.end());
    L.add(memo, key, [&g, &G, stored, sig] { return row_kernel(g, G, stored, sig); }, std::move(a), grid, block);
    if (!tuning)
        if (const CUfunction f = memo.find(key)) remember_launch(memo, G, vals, outs, S, Strides{}, f, std::move(tail), grid, block);
}

/// Zeroed counters (at least n) for split reductions that finish in one launch
/// (ReduceSignature::finish), one set per device and stream: a launch counts its blocks per row
/// there and its last block sets each count back to 0, so the launches of a stream, which run one
/// after another, share them. Null when n is too large. A stream being captured (kiln captures in
/// relaxed mode, where allocating is allowed, as the caching allocator does) gets its set too,
/// zeroed on a stream of its own that is waited for (not a node of the graph: the set must be
/// zero even if the capture is abandoned). Without this, every split reduction of a CUDA graph
/// took a second, combining launch.
inline unsigned* reduce_counters(int device, CUstream s, std::int64_t n) {
    constexpr std::int64_t size = std::int64_t{1} << 14;
    if (n > size) return nullptr;
    static std::mutex mu;
    static std::map<std::pair<int, CUstream>, CUdeviceptr> sets;
    const std::lock_guard lock(mu);
    const auto it = sets.find({device, s});
    if (it != sets.end()) return reinterpret_cast<unsigned*>(it->second);
    CUdeviceptr p = 0;
    detail::check(detail::driver().mem_alloc(&p, static_cast<std::size_t>(size) * sizeof(unsigned)), "cuMemAlloc (reduction counters)");
    if (capturing(s)) {
        const Stream side(device);
        detail::check(detail::driver().memset_d32_async(p, 0, static_cast<std::size_t>(size), side.handle()), "cuMemsetD32Async (reduction counters)");
        side.synchronize();
    } else {
        detail::check(detail::driver().memset_d32_async(p, 0, static_cast<std::size_t>(size), s), "cuMemsetD32Async (reduction counters)");
    }
    sets.emplace(std::pair{device, s}, p);
    return reinterpret_cast<unsigned*>(p);
}

inline void run_reduce(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals, int device, KernelMemo& memo,
                       KernelMemo& combine_memo, Launcher& L) {
    // every output reduces values of one shape over the same axes (fuse::merge_reduce_groups)
    const ir::Node& rn = g[G.outputs[0]];
    const bool arg = rn.kind == ir::Kind::arg_reduce;
    const Shape& S = g[rn.in[0]].shape;
    std::vector<Tensor> outs;
    for (int r : G.outputs) outs.push_back(out_for(vals, r, g[r].shape, g[r].dtype, device));
    std::int64_t inner = 1;
    for (int d = 0; d < S.rank(); ++d)
        if (rn.mask & (1u << d)) inner *= S[d];
    if (outs[0].numel() == 0) return;
    if (inner == 0) {
        for (int r : G.outputs) {
            const ir::Node& n = g[r];
            if (arg || n.rkind == ir::ReduceKind::max || n.rkind == ir::ReduceKind::min)
                throw ValueError("kiln::" + std::string(arg ? "argmax" : ir::reduce_name(n.rkind)) +
                                 ": cannot reduce over an empty dimension of shape " + S.str());
            Tensor host(n.shape, n.dtype);
            host.fill_(Scalar(n.rkind == ir::ReduceKind::prod ? 1.0 : 0.0));
            vals[static_cast<std::size_t>(r)] = host.to(Device::cuda(device));
        }
        return;
    }
    std::vector<Strides> strides;
    ReduceSignature sig;
    for (int leaf : G.leaves) {
        const Tensor& t = vals[static_cast<std::size_t>(leaf)];
        strides.push_back(strides_over(t, S));
        sig.dtypes.push_back(t.dtype());
    }
    RowLayout lay = row_layout(S, rn.mask, strides);
    sig.outer_rank = static_cast<int>(lay.outer.size());
    sig.inner_rank = static_cast<int>(lay.inner.size());
    bool small = true;
    for (std::size_t k = 0; k < strides.size(); ++k) {
        sig.inner_access.push_back(inner_access(lay.si[k]));
        small = small && fits32(lay.outer, lay.so[k]) && fits32(lay.inner, lay.si[k]);
    }
    sig.idx64 = !small || lay.rows * lay.L >= (std::int64_t{1} << 30);
    const int sms = properties(device).sm_count;
    // column layout: every operand's rows sit next to each other (innermost kept stride 1, or 0
    // for a broadcast one) while a row's elements do not; neighbouring lanes then take
    // neighbouring rows (ReduceSignature::columns)
    bool cols = !arg && !lay.outer.empty() && lay.outer.back() > 1;
    bool unit = false;
    for (std::size_t k = 0; cols && k < strides.size(); ++k) {
        const std::int64_t so = lay.so[k].empty() ? 0 : lay.so[k].back();
        cols = so == 0 || so == 1;
        unit = unit || (so == 1 && sig.inner_access[k] != Access::contig);
    }
    sig.columns = cols && unit;
    std::int64_t chunks = 1;
    if (sig.columns) {
        // about two blocks per SM (8 warps each with kColumnUnroll loads in flight: ~32 KB per SM,
        // what HBM's latency needs), each chunk at least one round of loads long; fewer chunks
        // also keep the last block's combine short
        const std::int64_t groups = (lay.rows + 31) / 32;
        const std::int64_t round = 8 * kColumnUnroll;
        chunks = std::clamp<std::int64_t>((2 * sms + groups - 1) / groups, 1, std::max<std::int64_t>(1, (lay.L + round - 1) / round));
    } else if (!arg && lay.rows < 2 * sms && lay.L > 8192) {
        chunks = std::min<std::int64_t>((lay.L + 4095) / 4096, (4 * sms + lay.rows - 1) / lay.rows);
    }
    sig.partial = chunks > 1;
    if (!sig.partial && !sig.columns) sig.lanes = short_row_lanes(lay.L, 128);
    unsigned* counters = nullptr;
    if (sig.partial && !arg && Tuning::get().split_finish)
        counters = reduce_counters(device, current_stream(device), sig.columns ? (lay.rows + 31) / 32 : lay.rows);
    sig.finish = counters != nullptr;
    // each output's partials (accumulator type), when the rows are split
    const auto acc_of = [&](int r) { return arg ? compute_dtype(g[rn.in[0]].dtype) : compute_dtype(g[r].dtype); };
    std::vector<Tensor> partials;
    if (sig.partial)
        for (int r : G.outputs) {
            const DType acc = acc_of(r);
            partials.push_back(new_on(Shape{lay.rows * chunks}, acc == DType::boolean ? DType::f32 : acc, device));
        }
    Args a;
    for (int leaf : G.leaves) a.add_ptr(vals[static_cast<std::size_t>(leaf)].data_ptr());
    for (std::size_t j = 0; j < outs.size(); ++j) a.add_ptr(sig.partial ? partials[j].data_ptr() : outs[j].data_ptr());
    a.add(lay.rows);
    a.add(lay.L);
    a.add(chunks);
    for (auto z : lay.outer) a.add(z);
    for (auto z : lay.inner) a.add(z);
    for (std::size_t k = 0; k < strides.size(); ++k) {
        for (auto s : lay.so[k]) a.add(s);
        if (sig.inner_access[k] == Access::strided || sig.inner_access[k] == Access::inner)
            for (auto s : lay.si[k]) a.add(s);
    }
    if (sig.finish) {
        a.add_ptr(counters);
        for (const Tensor& o : outs) a.add_ptr(o.data_ptr());
    }
    const std::int64_t units = sig.columns   ? (lay.rows + 31) / 32 * chunks
                               : sig.lanes > 0 ? (lay.rows * sig.lanes + 255) / 256
                                               : lay.rows * chunks;  // blocks' worth of rows
    const std::int64_t blocks = std::min<std::int64_t>(units, static_cast<std::int64_t>(sms) * 32);
    L.add(memo, sig.key(), [&g, &G, sig] { return reduce_kernel(g, G, sig); }, std::move(a), static_cast<unsigned>(blocks), 256);
    if (!sig.partial || sig.finish) return;
    for (std::size_t j = 0; j < outs.size(); ++j) {  // a second launch per output combines its partials
        const ir::Node& n = g[G.outputs[j]];
        const DType acc = acc_of(G.outputs[j]);
        const std::string ckey = std::to_string(static_cast<int>(n.rkind)) + "/" + std::to_string(static_cast<int>(acc)) + "/" +
                                 std::to_string(static_cast<int>(n.dtype)) + "/" + std::to_string(n.correction);
        Args b;
        b.add_ptr(partials[j].data_ptr());
        b.add_ptr(outs[j].data_ptr());
        b.add(lay.rows);
        b.add(chunks);
        b.add(lay.L);
        const ir::ReduceKind rk = n.rkind;
        const DType od = n.dtype;
        const double corr = n.correction;
        L.add(combine_memo, ckey, [rk, acc, od, corr] { return combine_kernel(rk, acc, od, corr); }, std::move(b),
              static_cast<unsigned>(std::min<std::int64_t>(lay.rows, static_cast<std::int64_t>(sms) * 32)), 256);
    }
}

/// A matmul group: the GEMM with the epilogue the fuser gave it (bias, relu, gelu_tanh, gelu),
/// into the output's memory when the caller supplied it.
inline void run_matmul_group(const ir::Graph& g, const fuse::Group& G, std::vector<Tensor>& vals) {
    const ir::Node& mm = g[G.nodes[0]];
    const Epilogue epi{G.act_kind, G.bias >= 0};
    Tensor bias;
    if (G.bias >= 0) {
        const Tensor& b = vals[static_cast<std::size_t>(G.bias)];
        bias = b.contiguous().view({b.size(-1)});
    }
    const Tensor& a = vals[static_cast<std::size_t>(mm.in[0])];
    const Tensor& b = vals[static_cast<std::size_t>(mm.in[1])];
    Tensor& out = vals[static_cast<std::size_t>(G.outputs[0])];
    if (out.defined() && out.is_contiguous())
        kiln::cuda::matmul_out(out, a, b, epi, G.bias >= 0 ? &bias : nullptr, mm.loc);
    else
        out = kiln::cuda::matmul(a, b, epi, G.bias >= 0 ? &bias : nullptr, mm.loc);
}

/// CUDA's steps for the executor (fuse/execute.hpp): one generated kernel per kernel group,
/// launched through a Launcher (kernels not compiled yet are compiled together at the next
/// flush), matmuls through cuBLASLt.
class CudaSteps final : public fuse::Steps {
public:
    CudaSteps(const ir::Graph& g, const fuse::Plan& plan, int device, const std::vector<std::unique_ptr<KernelMemo>>& memos,
              Launcher& launcher)
        : g_(g), plan_(plan), device_(device), memos_(memos), L_(launcher) {}
    void kernel(std::size_t k, const fuse::Group& G, std::vector<Tensor>& vals) override {
        switch (G.kind) {
            case fuse::Group::Kind::elementwise: {
                KernelMemo& memo = *memos_[2 * k];
                int sink = memo.sink.load(std::memory_order_relaxed);
                if (sink < 0) memo.sink.store(sink = group_is_sink(g_, plan_, G) ? 1 : 0, std::memory_order_relaxed);
                run_elementwise(g_, G, vals, device_, memo, L_, sink == 1);
                break;
            }
            case fuse::Group::Kind::row: run_row(g_, G, vals, device_, *memos_[2 * k], L_); break;
            case fuse::Group::Kind::reduce: run_reduce(g_, G, vals, device_, *memos_[2 * k], *memos_[2 * k + 1], L_); break;
            case fuse::Group::Kind::matmul:
                L_.flush();  // cuBLASLt queues its kernels behind everything before it
                run_matmul_group(g_, G, vals);
                break;
            default: throw InternalError("kiln: the CUDA executor got a non-kernel step as a kernel");
        }
    }
    void flush() override { L_.flush(); }
    bool issued() const override { return L_.idle(); }
    bool asynchronous() const override { return true; }
    Tensor output(std::vector<Tensor>&, int, const Shape& shape, DType dtype) override { return new_on(shape, dtype, device_); }
    bool on_device(const Tensor& t) const override { return t.device() == Device::cuda(device_); }
    void wait() override { synchronize(device_); }
    std::string name() const override { return "cuda:" + std::to_string(device_); }

private:
    const ir::Graph& g_;
    const fuse::Plan& plan_;
    int device_;
    const std::vector<std::unique_ptr<KernelMemo>>& memos_;
    Launcher& L_;
};

/// A compiled graph on a CUDA device: the fused plan, one generated kernel per kernel group, run
/// by the executor over CudaSteps.
class CudaGraphProgram final : public fuse::GraphProgram, public std::enable_shared_from_this<CudaGraphProgram> {
public:
    CudaGraphProgram(ir::Graph g, fuse::Plan plan, int device)
        : g_(std::move(g)), plan_(std::move(plan)), device_(device), memos_(plan_.groups.size() * 2),
          memory_(fuse::plan_memory(g_, plan_, false)) {
        for (auto& m : memos_) m = std::make_unique<KernelMemo>();
    }

    const ir::Graph& graph() const override { return g_; }
    const fuse::Plan& plan() const override { return plan_; }
    int device() const { return device_; }

    std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override { return run_graph(g_, plan_, memory_, inputs); }
    /// Runs the program on inputs (on this program's device); returns the outputs.
    /// `into` (optional): a contiguous tensor of the first output's shape and dtype to write it into.
    std::vector<Tensor> run(const std::vector<Tensor>& inputs, const Tensor* into) const {
        return run_graph(g_, plan_, memory_, inputs, into);
    }

    /// Runs this program's kernels over g and plan (this program's, or those of a reshaped
    /// instance: the graph's shapes re-derived for other inputs, its plan grouping the same way),
    /// with mem the memory plan of that plan: the same kernels serve every size, since kernels
    /// take sizes as parameters.
    std::vector<Tensor> run_graph(const ir::Graph& g, const fuse::Plan& plan, const fuse::MemoryPlan& mem,
                                  const std::vector<Tensor>& inputs, const Tensor* into = nullptr) const {
        use_device(device_);
        std::vector<Tensor> vals(static_cast<std::size_t>(g.size()));
        if (into && !g.outputs.empty()) vals[static_cast<std::size_t>(g.outputs[0])] = *into;
        for (std::size_t k = 0; k < g.inputs.size(); ++k) vals[static_cast<std::size_t>(g.inputs[k])] = inputs[k];
        for (int i = 0; i < g.size(); ++i)
            if (g[i].kind == ir::Kind::constant) vals[static_cast<std::size_t>(i)] = g[i].tensor;
        for (int i = 0; i < g.size(); ++i) {
            const Tensor& t = vals[static_cast<std::size_t>(i)];
            if (t.defined() && !(t.device() == Device::cuda(device_)))
                throw DeviceError("kiln::compile: " + std::string(g[i].kind == ir::Kind::input ? "input " + std::to_string(g[i].index)
                                                                                               : "a captured tensor") +
                                  " is on " + t.device().str() + " but the program runs on cuda:" + std::to_string(device_) +
                                  " (move it with .to(device))");
        }
        // each intermediate is dropped after its last reader (fuse/memory_plan.hpp): the
        // stream-ordered allocator gives its block to a later value of this stream, so the call's
        // peak memory is its live set. Only once every launch so far is queued (Steps::issued): a
        // launch still waiting for its kernel's compile must not find its operand's block reused.
        Launcher L(device_);
        CudaSteps steps(g, plan, device_, memos_, L);
        return fuse::execute(g, plan, mem, vals, steps);
    }

    /// The kernels are shape-generic: a plan that groups the same way runs on this program's
    /// kernels (its graph and plan per call); one that groups differently gets kernels of its own.
    /// (Declared inline here: a virtual function defined inline only later would be this class's
    /// key function, and every translation unit would emit the vtable and the whole executor.)
    inline std::shared_ptr<const fuse::GraphProgram> reshaped(ir::Graph g, fuse::Plan p) const override;

private:
    ir::Graph g_;
    fuse::Plan plan_;
    int device_;
    std::vector<std::unique_ptr<KernelMemo>> memos_;  ///< two per group (main kernel, combine)
    fuse::MemoryPlan memory_;                         ///< liveness of plan_'s values
};

/// A CudaGraphProgram's kernels run over another shape's graph and plan (same grouping).
class ReshapedCudaProgram final : public fuse::GraphProgram {
public:
    ReshapedCudaProgram(std::shared_ptr<const CudaGraphProgram> base, ir::Graph g, fuse::Plan p)
        : base_(std::move(base)), g_(std::move(g)), plan_(std::move(p)), memory_(fuse::plan_memory(g_, plan_, false)) {}
    std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override { return base_->run_graph(g_, plan_, memory_, inputs); }
    const ir::Graph& graph() const override { return g_; }
    const fuse::Plan& plan() const override { return plan_; }
    std::shared_ptr<const fuse::GraphProgram> reshaped(ir::Graph g, fuse::Plan p) const override { return base_->reshaped(std::move(g), std::move(p)); }

private:
    std::shared_ptr<const CudaGraphProgram> base_;
    ir::Graph g_;
    fuse::Plan plan_;
    fuse::MemoryPlan memory_;  ///< liveness of plan_'s values, planned once (not per call)
};

inline std::shared_ptr<const fuse::GraphProgram> CudaGraphProgram::reshaped(ir::Graph g, fuse::Plan p) const {
    if (!fuse::same_grouping(p, plan_)) return std::make_shared<CudaGraphProgram>(std::move(g), std::move(p), device_);
    return std::make_shared<ReshapedCudaProgram>(shared_from_this(), std::move(g), std::move(p));  // holds this program (its kernels)
}

/// A CUDA device as a device for compile.
class CudaBackend final : public fuse::DeviceBackend {
public:
    explicit CudaBackend(int device) : device_(device) {}
    std::shared_ptr<const fuse::GraphProgram> program(ir::Graph g, fuse::Plan plan) const override {
        return std::make_shared<CudaGraphProgram>(std::move(g), std::move(plan), device_);
    }
    void adjust_plan(const ir::Graph& g, fuse::Plan& plan) const override {
        fuse::absorb_matmul_epilogues(g, plan);  // the GEMM applies bias, relu, gelu_tanh and gelu
    }
    void adjust_limits(fuse::Limits& lim) const override {
        lim.column_rows = false;
        lim.merge_reductions = Tuning::get().merge_reductions;  // reduce_kernel takes several outputs
        lim.recompute = Tuning::get().recompute;
    }
    fuse::Executable replayed(fuse::Executable e) const override {
        auto replay = std::make_shared<GraphReplay>(std::move(e), device_);
        return [replay](const std::vector<Tensor>& in) { return (*replay)(in); };
    }

private:
    int device_;
};

}  // namespace kiln::cuda::detail

// The definitions of the cuda::matmul and matmul_out declared above, which run_matmul_group (an
// inline function) calls: every translation unit that may run a CUDA program must see them.
#include "kiln/backends/cuda/matmul.hpp"
