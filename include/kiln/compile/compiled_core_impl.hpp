// detail::CompiledCore's implementation: the cache of programs under guards, recompiles and
// automatic dynamic dims, tracing through a callback, graph breaks and segments.
#pragma once
// Included at the end of kiln/compile/compiled_core.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/cache/guards.hpp"
#include "kiln/compile/program.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/hash.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/passes/pipeline.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::detail {

class CompileCache {
public:
    explicit CompileCache(Options opt) : opt_(std::move(opt)) {}
    CompileCache(const CompileCache&) = delete;
    CompileCache& operator=(const CompileCache&) = delete;

    const Options& options() const { return opt_; }

    /// One call with these flattened arguments: the cached program whose guards pass, or a trace
    /// (through `trace`) and compile. Returns the results, flattened, with the sizes of their
    /// vectors in `out_sizes`; nullopt when the function runs eagerly (the recompile limit).
    inline std::optional<std::vector<Tensor>> call(const Flat& flat, std::vector<std::size_t>& out_sizes, const TraceFn& trace);

    int compiles() const { return compiles_; }
    int kernels() const {
        std::shared_lock lock(mu_);
        return entries_.empty() ? 0 : entries_.back()->kernels;
    }
    std::string graph() const {
        std::shared_lock lock(mu_);
        return entries_.empty() ? std::string() : entries_.back()->graph_text;
    }
    std::vector<trace::Break> graph_breaks() const {
        std::shared_lock lock(mu_);
        return last_breaks_;
    }
    std::string dot() const {
        std::shared_lock lock(mu_);
        return entries_.empty() ? std::string() : entries_.back()->dot;
    }
    inline std::string report() const;
    bool fell_back_to_eager() const { return eager_fallback_; }

private:
    std::shared_ptr<Entry> lookup(const Flat& flat) const {
        for (const auto& e : entries_)
            if (e->matches(flat)) return e;
        return nullptr;
    }
    inline std::vector<Tensor> run_entry(const Entry& e, const Flat& flat, std::vector<std::size_t>& out_sizes, const TraceFn& trace);
    inline std::vector<char>& dynamic_dims(std::size_t arg, int rank);
    inline std::string mismatch_reason(const Entry& e, const Flat& flat);
    inline Executable segment_runner(const ir::Graph& raw, const std::vector<Tensor>& inputs, const std::vector<char>& own = {},
                                     const std::vector<const void*>& memory = {});
    inline std::function<void(const std::string&, const ir::Graph&)> graph_logger() const;
    inline std::vector<Tensor> trace_first(const Flat& flat, Entry& entry, bool& still_polymorphic, std::vector<trace::Break>& breaks,
                                           const TraceFn& trace);
    inline std::vector<Tensor> finish_segment(trace::Tracer& tr, const Flat& flat, const Flat& outs);
    trace::Tracer make_tracer() {
        return trace::Tracer([this](const ir::Graph& g, const std::vector<Tensor>& in) { return segment_runner(g, in)(in); },
                             opt_.fullgraph);
    }

    Options opt_;
    mutable std::shared_mutex mu_;
    std::condition_variable_any compiled_;  ///< notified when a compile finishes
    std::vector<std::shared_ptr<Entry>> entries_;
    std::vector<std::shared_ptr<Entry>> compiling_;  ///< compiles in flight (guards set, no program yet)
    bool polymorphic_ = true;  ///< no compile had to specialize a dim marked dynamic
    std::vector<std::vector<char>> dynamic_;  ///< per argument tensor, per dim
    std::mutex seg_mu_;
    std::vector<Segment> segments_;
    std::vector<trace::Break> last_breaks_;
    std::atomic<int> compiles_{0};
    bool eager_fallback_ = false;
};

inline std::optional<std::vector<Tensor>> CompileCache::call(const Flat& flat, std::vector<std::size_t>& out_sizes,
                                                             const TraceFn& trace) {
    // fast path: a cached program whose guards pass (run outside the lock)
    std::shared_ptr<Entry> hit;
    bool fallback = false;
    {
        std::shared_lock lock(mu_);
        hit = lookup(flat);
        fallback = eager_fallback_;
    }
    if (hit) return run_entry(*hit, flat, out_sizes, trace);
    if (fallback) return std::nullopt;
    std::unique_lock lock(mu_);
    // A compile runs outside the lock, so calls whose programs are cached never wait for it;
    // a call whose guards an in-flight compile will satisfy waits for that one instead of
    // compiling the same program again.
    for (;;) {
        if (auto again = lookup(flat)) {  // compiled by a concurrent call meanwhile
            lock.unlock();
            return run_entry(*again, flat, out_sizes, trace);
        }
        if (eager_fallback_) return std::nullopt;
        const bool in_flight = std::any_of(compiling_.begin(), compiling_.end(), [&](const auto& e) { return e->matches(flat); });
        if (!in_flight) break;
        compiled_.wait(lock);
    }
    // a recompile: why, and whether the limit allows it (a compile still in flight counts:
    // concurrent first calls with other shapes are recompiles too)
    const Entry* last = !entries_.empty() ? entries_.back().get() : !compiling_.empty() ? compiling_.back().get() : nullptr;
    if (last) {
        const std::string why = mismatch_reason(*last, flat);
        if (static_cast<int>(entries_.size() + compiling_.size()) >= opt_.recompile_limit) {
            const std::string msg =
                "kiln::compile: recompile limit (" + std::to_string(opt_.recompile_limit) + ") reached; last reason: " + why;
            if (opt_.stance == Stance::error) throw RecompileLimitError(msg);
            debug::Logs::instance().write("recompiles", msg + "; falling back to eager");
            std::fprintf(stderr, "kiln: warning: %s; running eagerly from now on\n", msg.c_str());
            eager_fallback_ = true;
            return std::nullopt;
        }
        debug::log("recompiles", "recompiling: " + why);
    }
    auto entry = std::make_shared<Entry>();
    entry->numbers = flat.numbers;
    entry->sizes = flat.sizes;
    // dims that already changed size become symbolic (automatic), or all of them (on)
    for (std::size_t i = 0; i < flat.tensors.size(); ++i) {
        std::vector<char>& dyn = dynamic_dims(i, flat.tensors[i].rank());
        entry->guards.push_back(cache::TensorGuard::of(flat.tensors[i], dyn));
    }
    compiles_++;
    compiling_.push_back(entry);
    // the entry leaves the in-flight list however this call ends, and the calls waiting on it
    // wake (to find it cached, or to compile themselves after a throw)
    struct InFlight {
        CompileCache& core;
        std::unique_lock<std::shared_mutex>& lock;
        std::shared_ptr<Entry> entry;
        ~InFlight() {
            if (!lock.owns_lock()) lock.lock();
            std::erase(core.compiling_, entry);
            core.compiled_.notify_all();
        }
    } in_flight{*this, lock, entry};
    lock.unlock();
    bool still_polymorphic = true;
    std::vector<trace::Break> breaks;
    std::vector<Tensor> result = trace_first(flat, *entry, still_polymorphic, breaks, trace);
    lock.lock();
    // waiters read an in-flight entry's guards under the lock, so they change only here: a
    // program that cannot follow its symbolic dims is guarded on every size
    if (!still_polymorphic)
        for (std::size_t i = 0; i < entry->guards.size(); ++i) entry->guards[i] = cache::TensorGuard::of(flat.tensors[i], {});
    if (debug::log_on("guards")) {
        std::string s = "guards:";
        for (std::size_t i = 0; i < entry->guards.size(); ++i) s += " arg" + std::to_string(i) + "=" + entry->guards[i].str();
        debug::log("guards", s);
    }
    polymorphic_ = polymorphic_ && still_polymorphic;
    last_breaks_ = std::move(breaks);
    entries_.push_back(entry);
    out_sizes = entry->out_sizes;
    return result;
}

inline std::string CompileCache::report() const {
    std::shared_lock lock(mu_);
    if (entries_.empty()) return "not compiled yet\n";
    const auto& e = *entries_.back();
    std::ostringstream s;
    s << "graphs: " << (e.lazy ? last_breaks_.size() + 1 : 1) << "\n";
    s << "graph breaks: " << last_breaks_.size() << "\n";
    for (const auto& b : last_breaks_) s << "  " << b.reason << " at " << kiln::detail::format_location(b.loc) << "\n";
    if (e.lazy) {
        s << "segments compiled: " << segments_.size() << "\n";
    } else {
        s << "kernels: " << e.kernels << "\n" << e.fusion_text << "graph:\n" << e.graph_text;
    }
    s << "compiles: " << compiles_ << "\n";
    return s.str();
}

inline std::vector<Tensor> CompileCache::run_entry(const Entry& e, const Flat& flat, std::vector<std::size_t>& out_sizes,
                                                   const TraceFn& trace) {
    out_sizes = e.out_sizes;
    if (e.lazy) {  // a graph-breaking function's later calls: trace again, segments come from their cache
        trace::Tracer tr = make_tracer();
        const Flat outs = trace(tr);
        return finish_segment(tr, flat, outs);
    }
    check_written_memory_unshared(e.writes, flat.tensors);
    std::vector<Tensor> outs = e.run(flat.tensors);
    apply_writes(outs, e.writes, flat.tensors);
    return outs;
}

inline std::vector<char>& CompileCache::dynamic_dims(std::size_t arg, int rank) {
    if (dynamic_.size() <= arg) dynamic_.resize(arg + 1);
    auto& d = dynamic_[arg];
    if (static_cast<int>(d.size()) != rank) d.assign(static_cast<std::size_t>(rank), opt_.dynamic == Dynamic::on ? 1 : 0);
    return d;
}

/// Why flat fails e's guards; under automatic dynamic, marks changed dims symbolic.
inline std::string CompileCache::mismatch_reason(const Entry& e, const Flat& flat) {
    if (flat.tensors.size() != e.guards.size()) return "the number of tensor arguments changed";
    if (flat.numbers != e.numbers) return "a number argument changed value";
    if (flat.sizes != e.sizes) return "a vector argument changed length";
    // every argument that changed, so dims that change together turn symbolic together
    std::string all;
    for (std::size_t i = 0; i < e.guards.size(); ++i) {
        const std::string m = e.guards[i].mismatch(flat.tensors[i]);
        if (m.empty()) continue;
        std::string why = "argument " + std::to_string(i) + " " + m;
        const auto& g = e.guards[i];
        const Tensor& t = flat.tensors[i];
        if (opt_.dynamic == Dynamic::automatic && t.rank() == g.dims.rank() && t.dtype() == g.dtype && e.run) {
            auto& dyn = dynamic_dims(i, t.rank());
            for (int d = 0; d < t.rank(); ++d)
                if (g.dims[d] != cache::symbolic && g.dims[d] != t.shape()[d] && cache::size_class(g.dims[d]) == 2 &&
                    cache::size_class(t.shape()[d]) == 2 && e.lazy == false && polymorphic_) {
                    dyn[static_cast<std::size_t>(d)] = 1;
                    why += "; marking dim " + std::to_string(d) + " dynamic";
                }
        }
        if (!all.empty()) all += "; ";
        all += why;
    }
    return all.empty() ? "unknown" : all;
}

/// Runs a segment through the segment cache (graph-breaking functions). `own` (the last
/// segment): which results may be an argument's memory (copy_aliased_outputs).
inline Executable CompileCache::segment_runner(const ir::Graph& raw, const std::vector<Tensor>& inputs, const std::vector<char>& own,
                                               const std::vector<const void*>& memory) {
    // the key comes from the graph without freezing: folding makes new constants on every
    // trace, whose addresses would never hash the same twice
    ir::Graph g = passes::run_pipeline(raw, opt_.freeze ? nullptr : graph_logger());
    copy_aliased_outputs(g, own, memory);
    const std::uint64_t h = ir::structural_hash(g);
    std::lock_guard lock(seg_mu_);
    for (const auto& s : segments_) {
        if (s.hash != h || s.guards.size() != inputs.size() || !ir::structurally_equal(s.graph, g)) continue;
        bool ok = true;
        for (std::size_t i = 0; i < inputs.size() && ok; ++i) ok = s.guards[i].matches(inputs[i]);
        if (ok) return s.run;
    }
    Segment s{h, g, {}, {}};  // keyed by the graph before freezing
    if (opt_.freeze) {
        g = passes::run_pipeline(raw, graph_logger(), {.freeze = true});
        copy_aliased_outputs(g, own, memory);
    }
    for (const Tensor& t : inputs) s.guards.push_back(cache::TensorGuard::of(t, {}));
    int kernels = 0;
    s.run = make_executable(g, opt_, kernels, false, program_device(g, inputs));
    debug::log("cache", "compiled a graph segment (" + std::to_string(kernels) + " kernels)");
    segments_.push_back(s);
    return s.run;
}

inline std::function<void(const std::string&, const ir::Graph&)> CompileCache::graph_logger() const {
    if (!debug::log_on("graph")) return {};
    return [](const std::string& pass, const ir::Graph& g) { debug::log("graph", "after " + pass + ":\n" + ir::to_string(g)); };
}

/// The first call for these guards: trace, optimize, fuse, run; keeps the program when the
/// trace did not break. `still_polymorphic` receives false when this program had to specialize
/// the dims its guards mark dynamic (mark no more); `breaks` receives the graph breaks. Runs
/// without the lock.
inline std::vector<Tensor> CompileCache::trace_first(const Flat& flat, Entry& entry, bool& still_polymorphic,
                                                     std::vector<trace::Break>& breaks, const TraceFn& trace) {
    // KILN_LOGS=compile_times: where a compile's time goes (the first call of a warm process is
    // this plus loading the cached kernels)
    using Clock = std::chrono::steady_clock;
    const Clock::time_point t_start = Clock::now();
    auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
    trace::Tracer tr = make_tracer();
    const Flat outs = trace(tr);
    const double trace_ms = ms_since(t_start);
    entry.out_sizes = outs.sizes;
    breaks = tr.breaks();
    for (const auto& b : tr.breaks())
        debug::log("graph_breaks", "graph break (" + b.reason + ") at " + kiln::detail::format_location(b.loc));
    if (!tr.breaks().empty()) {
        entry.lazy = true;
        return finish_segment(tr, flat, outs);
    }
    // one whole graph
    ir::Graph& g = tr.graph();
    std::vector<char> own;
    std::vector<const void*> memory;
    tr.set_outputs(outs.tensors, own, memory);
    entry.writes = tr.write_backs();
    check_written_memory_unshared(entry.writes, flat.tensors);
    for (const auto& w : entry.writes) g.outputs.push_back(w.node);
    Clock::time_point t = Clock::now();
    ir::Graph opt = passes::run_pipeline(g, graph_logger(), {.freeze = opt_.freeze});
    copy_aliased_outputs(opt, own, memory);
    const double passes_ms = ms_since(t);
    t = Clock::now();
    bool dynamic = false;
    for (const auto& gd : entry.guards)
        for (auto d : gd.dims) dynamic = dynamic || d == cache::symbolic;
    // a view that slices, merges or broadcasts a symbolic dim bakes its size in: specialize
    // after all (the caller re-guards the entry on every size, under its lock), and mark no
    // more dims dynamic
    still_polymorphic = !dynamic || follows_symbolic_dims(opt, flat.tensors, entry.guards);
    if (!still_polymorphic) dynamic = false;
    entry.graph_text = ir::to_string(opt);
    {
        const fuse::Plan plan = fuse::plan(opt, opt_.limits);
        entry.dot = ir::to_dot(opt, plan.group_of);
        std::ostringstream s;
        for (std::size_t k = 0; k < plan.groups.size(); ++k) {
            const auto& G = plan.groups[k];
            s << "  kernel " << k << ": " << fuse::group_kind_name(G.kind) << " {";
            for (int j : G.nodes) s << " %" << j;
            s << " } -> {";
            for (int j : G.outputs) s << " %" << j;
            s << " }\n";
        }
        entry.fusion_text = s.str();
    }
    entry.hash = ir::structural_hash(opt);
    const double plan_ms = ms_since(t);
    t = Clock::now();
    entry.run = make_executable(opt, opt_, entry.kernels, dynamic, program_device(opt, tr.segment_inputs()));
    const double backend_ms = ms_since(t);
    debug::log("cache", "compiled " + std::to_string(entry.kernels) + " kernel(s), graph hash " + std::to_string(entry.hash));
    if (debug::log_on("output_code")) debug::log("output_code", entry.graph_text);
    t = Clock::now();
    std::vector<Tensor> results = entry.run(tr.segment_inputs());
    apply_writes(results, entry.writes, flat.tensors);
    if (debug::log_on("compile_times")) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "compile of %d node(s), %d kernel(s): trace %.2f ms, passes %.2f ms, fusion plan + texts %.2f ms, backend (kernels "
                      "built or loaded, GEMM plans) %.2f ms, first run (host side) %.2f ms; total %.2f ms",
                      opt.size(), entry.kernels, trace_ms, passes_ms, plan_ms, backend_ms, ms_since(t), ms_since(t_start));
        debug::log("compile_times", buf);
    }
    return results;
}

/// The last segment of a graph-breaking call computes the results (values from earlier segments
/// pass through).
inline std::vector<Tensor> CompileCache::finish_segment(trace::Tracer& tr, const Flat& flat, const Flat& outs) {
    std::vector<Tensor> results(outs.tensors.size());
    std::vector<std::size_t> pending;
    std::vector<char> own;
    std::vector<const void*> memory;
    ir::Graph& g = tr.graph();
    for (std::size_t i = 0; i < outs.tensors.size(); ++i) {
        const Tensor& t = outs.tensors[i];
        if (!t.is_traced() && !tr.records_write_into(t)) {
            results[i] = t;
        } else if (Tensor c = t.is_traced() ? tr.concrete_of(t) : Tensor(); c.defined()) {
            results[i] = c;
        } else {
            g.outputs.push_back(tr.node_of(t));
            own.push_back(tr.returns_own_memory(t));
            memory.push_back(tr.memory_of(t));
            pending.push_back(i);
        }
    }
    const std::vector<trace::WriteBack> writes = tr.write_backs();
    check_written_memory_unshared(writes, flat.tensors);
    for (const auto& w : writes) g.outputs.push_back(w.node);
    if (!g.outputs.empty()) {
        std::vector<Tensor> got = segment_runner(g, tr.segment_inputs(), own, memory)(tr.segment_inputs());
        apply_writes(got, writes, flat.tensors);
        for (std::size_t k = 0; k < pending.size(); ++k) results[pending[k]] = got[k];
    }
    return results;
}

// ------------------------------------------------------------------ the facade's definitions
KILN_DECL CompiledCore::CompiledCore(Options opt) : cache_(std::make_unique<CompileCache>(std::move(opt))) {}
KILN_DECL CompiledCore::~CompiledCore() = default;
KILN_DECL const Options& CompiledCore::options() const { return cache_->options(); }
KILN_DECL std::optional<std::vector<Tensor>> CompiledCore::call(const Flat& flat, std::vector<std::size_t>& out_sizes,
                                                                const TraceFn& trace) {
    return cache_->call(flat, out_sizes, trace);
}
KILN_DECL int CompiledCore::compiles() const { return cache_->compiles(); }
KILN_DECL int CompiledCore::kernels() const { return cache_->kernels(); }
KILN_DECL std::string CompiledCore::graph() const { return cache_->graph(); }
KILN_DECL std::vector<trace::Break> CompiledCore::graph_breaks() const { return cache_->graph_breaks(); }
KILN_DECL std::string CompiledCore::dot() const { return cache_->dot(); }
KILN_DECL std::string CompiledCore::report() const { return cache_->report(); }
KILN_DECL bool CompiledCore::fell_back_to_eager() const { return cache_->fell_back_to_eager(); }

// ------------------------------------------------------------------ row composites run eagerly
/// The programs of run_row_composite, by key, and its counts. A key holds what the guards would
/// otherwise recompile for (dtype, device, rank, layout of each operand), so each program sees only
/// sizes change (they become dynamic dims); compared as plain values (this runs on every call).
struct RowCompositeKey {
    struct Operand {
        bool defined = false;
        DType dtype = DType::f32;
        Device device{};
        int rank = 0;
        bool contiguous = false;
        auto operator<=>(const Operand&) const = default;
    };
    RowComposite op{};
    std::int64_t axis = 0;
    std::uint64_t eps_bits = 0;
    std::array<Operand, 3> operands{};  ///< x, weight, bias
    auto operator<=>(const RowCompositeKey&) const = default;
};
struct RowComposites {
    std::mutex mu;
    std::map<RowCompositeKey, std::shared_ptr<CompiledCore>> programs;
    std::atomic<std::int64_t> calls{0};
};
inline RowComposites& row_composites() {
    // never destroyed: its programs hold device memory and kernels, which must not be freed after
    // the CUDA backend's own statics are gone at exit
    static RowComposites& rc = *new RowComposites;
    return rc;
}
KILN_DECL std::optional<Tensor> run_row_composite(const RowCompositeCall& c, const std::source_location& loc) {
    const Tensor* operands[] = {&c.x, &c.weight, &c.bias};
    RowCompositeKey key{c.op, c.axis, std::bit_cast<std::uint64_t>(c.eps), {}};
    for (std::size_t i = 0; i < 3; ++i)
        if (const Tensor& t = *operands[i]; t.defined())
            key.operands[i] = {true, t.dtype(), t.device(), t.rank(), t.is_contiguous()};
    RowComposites& rc = row_composites();
    std::shared_ptr<CompiledCore> core;
    {
        const std::lock_guard lock(rc.mu);
        std::shared_ptr<CompiledCore>& p = rc.programs[key];
        if (!p) {
            Options o;
            o.recompile_limit = 64;  // sizes only (the key holds the rest): a warning after 64 would mean a bug
            p = std::make_shared<CompiledCore>(std::move(o));
        }
        core = p;
    }
    Flat flat;
    for (const Tensor* t : operands)
        if (t->defined()) flat.tensors.push_back(*t);
    std::vector<std::size_t> sizes;
    std::optional<std::vector<Tensor>> out = core->call(flat, sizes, [&](trace::Tracer& tr) {
        trace::ActiveScope scope(&tr);
        std::vector<Tensor> in;
        for (std::size_t i = 0; i < flat.tensors.size(); ++i) in.push_back(tr.input(flat.tensors[i], static_cast<int>(i)));
        const Tensor w = c.weight.defined() ? in[1] : Tensor(), b = c.bias.defined() ? in[c.weight.defined() ? 2 : 1] : Tensor();
        Flat f;
        switch (c.op) {
            case RowComposite::softmax: f.tensors.push_back(softmax(in[0], c.axis, loc)); break;
            case RowComposite::log_softmax: f.tensors.push_back(log_softmax(in[0], c.axis, loc)); break;
            case RowComposite::layer_norm: f.tensors.push_back(layer_norm(in[0], static_cast<int>(c.axis), w, b, c.eps, loc)); break;
            case RowComposite::rms_norm: {
                const Shape& s = in[0].shape();
                std::vector<std::int64_t> dims(s.end() - c.axis, s.end());
                f.tensors.push_back(rms_norm(in[0], Shape(dims), w, c.eps, loc));
                break;
            }
        }
        return f;
    });
    if (!out || out->size() != 1) return std::nullopt;
    rc.calls.fetch_add(1, std::memory_order_relaxed);
    return std::move((*out)[0]);
}
KILN_DECL RowCompositeStats row_composite_stats() {
    RowComposites& rc = row_composites();
    const std::lock_guard lock(rc.mu);
    RowCompositeStats s;
    s.calls = rc.calls.load(std::memory_order_relaxed);
    for (const auto& [key, p] : rc.programs) s.programs += p->compiles();
    return s;
}

}  // namespace kiln::detail
