// What kiln::compile makes of a traced graph: cached entries and segments, shape re-derivation for
// dynamic dims, write-backs, and the backend executable (CPU or CUDA program, CUDA graph replay).
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/cpu/graph_exec.hpp"
#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/ir/shapes.hpp"
#include "kiln/cache/guards.hpp"
#include "kiln/compile/options.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/hash.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::detail {

// ------------------------------------------------------------------ compiled entries
/// One cached program: its guards and how to run it.
struct Entry {
    std::vector<cache::TensorGuard> guards;
    std::vector<double> numbers;
    std::vector<std::size_t> sizes;
    bool lazy = false;  ///< the function breaks the graph: every call re-traces, segments are cached
    Executable run;     ///< whole-graph program (not lazy)
    std::vector<std::size_t> out_sizes;  ///< the result's vector sizes
    /// After the results, the program returns the final values of the memory the function wrote
    /// into (an argument, or a tensor from outside the function), copied back after each call.
    std::vector<trace::WriteBack> writes;
    std::string graph_text;
    std::string fusion_text;  ///< the kernels, one line each
    std::string dot;          ///< the graph with kernels as clusters
    int kernels = 0;
    std::uint64_t hash = 0;

    bool matches(const Flat& f) const {
        if (f.tensors.size() != guards.size() || f.numbers != numbers || f.sizes != sizes) return false;
        for (std::size_t i = 0; i < guards.size(); ++i)
            if (!guards[i].matches(f.tensors[i])) return false;
        return true;
    }
};

/// Results whose memory the program must copy, so that each is the memory eager would return:
/// outputs the passes made an input or a captured tensor (x * 1 is x; a clone assigned an
/// argument is the argument) that the function did not return as such (`own[k]` false), so a
/// result never shares memory with an argument the program writes back or that the caller changes
/// later; and outputs the passes merged with an earlier result of another eager memory (`memory`:
/// x * 2 or x.clone() returned twice are one node after CSE, but two tensors in eager).
inline void copy_aliased_outputs(ir::Graph& g, const std::vector<char>& own, const std::vector<const void*>& memory) {
    auto root_of = [&](int r) {
        while (g[r].kind == ir::Kind::view) r = g[r].in[0];
        return r;
    };
    const std::size_t n = std::min(own.size(), g.outputs.size());
    std::vector<int> roots(n);
    for (std::size_t k = 0; k < n; ++k) roots[k] = root_of(g.outputs[k]);
    for (std::size_t k = 0; k < n; ++k) {
        const int r = roots[k];
        bool copy = !own[k] && (g[r].kind == ir::Kind::input || g[r].kind == ir::Kind::constant);
        for (std::size_t j = 0; j < k && !copy && k < memory.size(); ++j) copy = roots[j] == r && memory[j] != memory[k];
        if (!copy) continue;
        const ir::Node& o = g[g.outputs[k]];
        ir::Node c;
        c.kind = ir::Kind::elementwise;
        c.op = ops::op_id<ops::Copy>;
        c.dtype = c.attr = o.dtype;
        c.ct = cast_compute_dtype(o.dtype, o.dtype);
        c.shape = o.shape;
        c.in = {g.outputs[k]};
        g.outputs[k] = g.add(std::move(c));
    }
}

/// A program that writes into an argument, or into captured memory, traces each argument as its
/// own value: when another argument shares that memory, its reads would miss the write and the
/// write-backs could undo each other. That call is a CompileError, never a wrong value.
inline void check_written_memory_unshared(const std::vector<trace::WriteBack>& writes, const std::vector<Tensor>& args) {
    for (const auto& w : writes) {
        const Tensor& dst = w.arg >= 0 ? args[static_cast<std::size_t>(w.arg)] : w.target;
        if (!dst.storage()) continue;
        for (std::size_t j = 0; j < args.size(); ++j)
            if (static_cast<int>(j) != w.arg && args[j].storage() == dst.storage())
                throw CompileError("kiln::compile: the function writes into " +
                                   (w.arg >= 0 ? "argument " + std::to_string(w.arg) : std::string("a captured tensor")) +
                                   ", and argument " + std::to_string(j) +
                                   " shares its memory; pass tensors that do not overlap (clone one) or call the function "
                                   "uncompiled");
    }
}

/// Copies the values a program returned after its results (`outs`' last writes.size()) into the
/// memory the traced function wrote into, and drops them from outs: torch's functionalization
/// writes mutated inputs back at the end of the program in the same way.
inline void apply_writes(std::vector<Tensor>& outs, const std::vector<trace::WriteBack>& writes, const std::vector<Tensor>& args) {
    const std::size_t n = outs.size() - writes.size();
    for (std::size_t i = 0; i < writes.size(); ++i) {
        Tensor dst = writes[i].arg >= 0 ? args[static_cast<std::size_t>(writes[i].arg)] : writes[i].target;
        if (outs[n + i].is_same(dst)) continue;  // the program wrote into this memory itself
        dst.copy_(outs[n + i]);
    }
    outs.resize(n);
}

/// A segment of a graph-breaking function: cached by its graph (looked up by structural hash,
/// matched by full structural equality) and input guards.
struct Segment {
    std::uint64_t hash;
    ir::Graph graph;
    std::vector<cache::TensorGuard> guards;
    Executable run;
};

/// Re-derives view v (recorded over an operand of shape `from`) for an operand of shape `to`:
/// shape, strides and offset. A view reads its operand's row-major layout; each of its dims walks
/// one operand dim (a permute, a split of a dim, a slice, a step) or none (broadcast). It can
/// follow a dim that changed size only when exactly one of its dims walks that whole dim with
/// step 1 from index 0 (permutes, squeezes, unsqueezes, splits and slices of other dims);
/// otherwise (the dim is sliced, merged, split or broadcast) it returns false.
inline bool rederive_view(ir::Node& v, const Shape& from, const Shape& to) {
    if (from == to) return true;
    if (from.rank() != to.rank() || from.numel() == 0 || to.numel() == 0) return false;  // empty: strides 0, nothing to walk
    const int r = from.rank();
    const Strides sf = contiguous_strides(from), st = contiguous_strides(to);
    // the offset as a start index per operand dim
    std::vector<std::int64_t> start(static_cast<std::size_t>(r), 0);
    std::int64_t off = static_cast<std::int64_t>(v.value);
    for (int d = 0; d < r; ++d)
        if (from[d] > 1) {
            start[static_cast<std::size_t>(d)] = off / sf[d];
            off -= start[static_cast<std::size_t>(d)] * sf[d];
        }
    if (off != 0) return false;
    // the operand dim each view dim walks, and its step
    std::vector<int> dim_of(static_cast<std::size_t>(v.shape.rank()), -1);
    std::vector<std::int64_t> step(static_cast<std::size_t>(v.shape.rank()), 0);
    for (int k = 0; k < v.shape.rank(); ++k) {
        if (v.shape[k] == 1 || v.args[k] == 0) continue;
        for (int d = r - 1; d >= 0 && dim_of[static_cast<std::size_t>(k)] < 0; --d) {
            if (from[d] <= 1 || v.args[k] % sf[d] != 0) continue;
            const std::int64_t c = v.args[k] / sf[d];
            if (c > 0 && c * (v.shape[k] - 1) + start[static_cast<std::size_t>(d)] < from[d]) {
                dim_of[static_cast<std::size_t>(k)] = d;
                step[static_cast<std::size_t>(k)] = c;
            }
        }
        if (dim_of[static_cast<std::size_t>(k)] < 0) return false;
    }
    for (int d = 0; d < r; ++d) {
        if (from[d] == to[d]) continue;
        int walkers = 0, whole = 0;
        for (int k = 0; k < v.shape.rank(); ++k)
            if (dim_of[static_cast<std::size_t>(k)] == d) {
                ++walkers;
                whole += step[static_cast<std::size_t>(k)] == 1 && v.shape[k] == from[d] && start[static_cast<std::size_t>(d)] == 0 &&
                         !((v.mask >> k) & 1u);  // a slice that happened to cover the dim is not the dim
            }
        if (walkers != 1 || whole != 1) return false;
    }
    std::int64_t offset = 0;
    for (int d = 0; d < r; ++d) offset += start[static_cast<std::size_t>(d)] * st[d];
    for (int k = 0; k < v.shape.rank(); ++k) {
        const int d = dim_of[static_cast<std::size_t>(k)];
        if (d < 0) continue;
        if (from[d] != to[d]) v.shape[k] = to[d];
        v.args[k] = step[static_cast<std::size_t>(k)] * st[d];
    }
    v.value = static_cast<double>(offset);
    return true;
}

/// A view's numbers from its formulas (ir::SymView) for inputs of these shapes: `shape` receives
/// the view's shape, the node its strides and offset. False where they leave the operand (of shape
/// `of`) or make a negative size.
inline bool apply_sym_view(ir::Node& n, Shape& shape, const std::vector<Shape>& inputs, const Shape& of) {
    const ir::SymView& s = *n.sym;
    if (s.shape.size() > static_cast<std::size_t>(max_rank)) return false;
    Shape sh;
    Dims st;
    std::int64_t offset = 0;
    if (!s.eval(s.offset, inputs, offset) || offset < 0) return false;
    std::int64_t last = offset;
    bool empty = false;
    for (std::size_t d = 0; d < s.shape.size(); ++d) {
        std::int64_t e = 0, k = 0, step = 0;
        if (!s.eval(s.shape[d], inputs, e) || !s.eval(s.strides[d], inputs, k) || e < 0 || k < 0) return false;
        sh.push_back(e);
        st.push_back(k);
        empty = empty || e == 0;
        if (e > 0 && (__builtin_mul_overflow(e - 1, k, &step) || __builtin_add_overflow(last, step, &last))) return false;
    }
    if (!empty && last >= of.numel()) return false;
    shape = sh;
    n.args = st;
    n.value = static_cast<double>(offset);
    return true;
}

/// Shapes of every node for inputs of these shapes (dynamic programs re-derive them on each
/// call). Returns -1, or the first node whose shape cannot be derived: operands that do not
/// broadcast, matrices that do not multiply, or a view that cannot follow a changed dim (rederive_view).
inline int infer_shapes(ir::Graph& g, const std::vector<Shape>& inputs) {
    std::vector<Shape> recorded(static_cast<std::size_t>(g.size()));
    for (int i = 0; i < g.size(); ++i) recorded[static_cast<std::size_t>(i)] = g[i].shape;
    for (int i = 0; i < g.size(); ++i) {
        ir::Node& n = g[i];
        switch (n.kind) {
            case ir::Kind::input: n.shape = inputs[static_cast<std::size_t>(n.index)]; break;
            case ir::Kind::constant: n.shape = n.tensor.shape(); break;
            case ir::Kind::scalar: break;
            case ir::Kind::elementwise: {
                Shape s;
                for (int j : n.in)
                    if (g[j].kind != ir::Kind::scalar && !kiln::detail::try_broadcast(s, g[j].shape, s)) return i;
                n.shape = s;
                break;
            }
            case ir::Kind::reduce: case ir::Kind::arg_reduce:
                n.shape = ir::reduced_shape(g[n.in[0]].shape, n.mask, n.keepdim);
                break;
            case ir::Kind::matmul: {
                ir::MatmulShapes sh = ir::matmul_shapes(g[n.in[0]].shape, g[n.in[1]].shape);
                if (!sh.ok()) return i;
                n.shape = std::move(sh.result);
                break;
            }
            case ir::Kind::view:
                if (n.sym) {
                    if (!apply_sym_view(n, n.shape, inputs, g[n.in[0]].shape)) return i;
                } else if (!rederive_view(n, recorded[static_cast<std::size_t>(n.in[0])], g[n.in[0]].shape)) {
                    return i;
                }
                break;
            case ir::Kind::view_write: {  // the view written into follows its base like a view
                if (n.sym) {
                    Shape vs;
                    if (!apply_sym_view(n, vs, inputs, g[n.in[0]].shape) || !(vs == g[n.in[1]].shape)) return i;
                    n.shape = g[n.in[0]].shape;
                    break;
                }
                ir::Node v;
                v.shape = recorded[static_cast<std::size_t>(n.in[1])];
                v.args = n.args;
                v.value = n.value;
                v.mask = n.mask;
                if (!rederive_view(v, recorded[static_cast<std::size_t>(n.in[0])], g[n.in[0]].shape) || !(v.shape == g[n.in[1]].shape))
                    return i;
                n.shape = g[n.in[0]].shape;
                n.args = v.args;
                n.value = v.value;
                break;
            }
            case ir::Kind::call: {
                std::vector<Shape> in;
                for (int j : n.in) in.push_back(g[j].shape);
                n.shape = n.call->shape(in);
                break;
            }
        }
    }
    return -1;
}
inline void infer_shapes(ir::Graph& g, const std::vector<Tensor>& inputs) {
    std::vector<Shape> shapes;
    std::string list;
    for (const Tensor& t : inputs) {
        shapes.push_back(t.shape());
        if (!list.empty()) list += ", ";
        list += t.shape().str();
    }
    if (const int bad = infer_shapes(g, shapes); bad >= 0) {
        const ir::Node& n = g[bad];
        std::string what = n.kind == ir::Kind::view ? "a view" : n.kind == ir::Kind::view_write ? "a write into a view" : "operands";
        if (n.kind == ir::Kind::elementwise) {
            what = ops::op_name(n.op);
            what += " of operands";
            for (int j : n.in)
                if (g[j].kind != ir::Kind::scalar) {
                    what += ' ';
                    what += g[j].shape.str();
                }
        } else if (n.kind == ir::Kind::matmul) {
            what = "matmul of operands " + g[n.in[0]].shape.str() + " and " + g[n.in[1]].shape.str();
        }
        std::string msg = "kiln::compile: for inputs of shapes ";
        msg += list;
        msg += ", ";
        msg += what;
        msg += " (graph node %";
        msg += std::to_string(bad);
        msg += ") do not fit together";
        throw ShapeError(msg);
    }
}

/// Whether a graph traced over `inputs` can run for every size of the dims guards mark symbolic:
/// probed by inferring its shapes with each symbolic size changed (equal sizes to equal sizes).
inline bool follows_symbolic_dims(const ir::Graph& g, const std::vector<Tensor>& inputs, const std::vector<cache::TensorGuard>& guards) {
    std::vector<Shape> probe;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        Shape s = inputs[i].shape();
        for (int d = 0; d < s.rank() && i < guards.size(); ++d)
            if (guards[i].dims[d] == cache::symbolic) s[d] = 2 * s[d] + 3;
        probe.push_back(s);
    }
    ir::Graph copy = g;
    try {
        return infer_shapes(copy, probe) < 0;
    } catch (const Error&) {  // a library call that cannot take the probe's shapes
        return false;
    }
}

/// The CUDA device a program over these inputs (and the graph's captured tensors) runs on, or -1
/// for the CPU.
inline int program_device(const ir::Graph& g, const std::vector<Tensor>& inputs) {
    for (const Tensor& t : inputs)
        if (t.device().is_cuda()) return t.device().index;
    for (const ir::Node& n : g.nodes)
        if (n.kind == ir::Kind::constant && n.tensor.device().is_cuda()) return n.tensor.device().index;
    return -1;
}

/// A dynamic program's instances for the input shapes it met last: a call whose shapes match one
/// reuses it (no per-call copy of the graph and plan, and its memory plan applies); at most
/// `capacity` are kept, the least recently used goes first.
template <class Instance>
class ShapeInstances {
public:
    static constexpr std::size_t capacity = 8;
    template <class Make>
    std::shared_ptr<const Instance> get(const std::vector<Tensor>& in, Make&& make) {
        std::vector<Shape> key;
        key.reserve(in.size());
        for (const Tensor& t : in) key.push_back(t.shape());
        {
            std::lock_guard lock(mu_);
            for (std::size_t i = 0; i < entries_.size(); ++i)
                if (entries_[i].first == key) {
                    std::rotate(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(i),
                                entries_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
                    return entries_.front().second;
                }
        }
        std::shared_ptr<const Instance> made = make();  // outside the lock: another size may build meanwhile
        std::lock_guard lock(mu_);
        entries_.insert(entries_.begin(), {std::move(key), made});
        if (entries_.size() > capacity) entries_.pop_back();
        return made;
    }
private:
    std::mutex mu_;
    std::vector<std::pair<std::vector<Shape>, std::shared_ptr<const Instance>>> entries_;
};

/// A program's graph with shapes re-derived for these inputs (dynamic programs), and its plan
/// for them: planned again, because the fuser's choices follow shapes, and two dims the trace
/// saw equal (one that became dynamic and one that did not, or two dynamic ones) need not stay
/// equal: a value over one of them is not a row over the other.
struct ShapedPlan {
    ir::Graph g;
    fuse::Plan p;
};
inline ShapedPlan shaped_plan(const ir::Graph& g, const std::vector<Tensor>& in, const fuse::Limits& lim,
                              const fuse::DeviceBackend& be) {
    ShapedPlan s{g, {}};
    infer_shapes(s.g, in);
    s.p = fuse::plan(s.g, lim);
    be.adjust_plan(s.g, s.p);
    return s;
}

/// The device a program runs on, as compile sees it: the one place that names the CPU and CUDA
/// (device: a CUDA device index, or -1 for the CPU).
inline std::shared_ptr<const fuse::DeviceBackend> backend_for(int device) {
    static const auto cpu = std::make_shared<const CpuBackend>();
    if (device < 0) return cpu;
    return std::make_shared<const cuda::detail::CudaBackend>(device);
}

inline Executable make_backend_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic,
                                          std::shared_ptr<const fuse::DeviceBackend> be);

/// The device's executable for an optimized graph (device: a CUDA device index, or -1 for the
/// CPU), replayed as CUDA graphs under Mode::reduce_overhead and max_autotune where the device has
/// them; under the max_autotune modes each call runs with autotuning on (kiln::detail::AutotuneScope).
inline Executable make_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic, int device = -1) {
    const std::shared_ptr<const fuse::DeviceBackend> be = backend_for(device);
    Executable e = make_backend_executable(g, opt, kernels, dynamic, be);
    if (autotunes(opt.mode))
        e = [inner = std::move(e), how = replays_graphs(opt.mode) ? Autotune::graphs : Autotune::launches](const std::vector<Tensor>& in) {
            const AutotuneScope tuning(how);
            return inner(in);
        };
    return replays_graphs(opt.mode) ? be->replayed(std::move(e)) : e;
}

/// KILN_LOGS=memory: the live set at the peak of a call that drops each value after its last
/// reader (fuse::peak_live), the largest values first.
inline void log_peak_memory(const ir::Graph& g, const fuse::Plan& plan) {
    const fuse::MemoryPeak pk = fuse::peak_live(g, plan, fuse::plan_memory(g, plan, false));
    std::ostringstream s;
    const auto mib = [](std::size_t b) { return static_cast<double>(b) / (1 << 20); };
    s << "peak of the values a call makes: " << mib(pk.bytes) << " MiB after group " << pk.group << " of " << plan.groups.size() << " ("
      << mib(pk.pinned) << " MiB of them outputs), " << pk.live.size() << " values:";
    std::size_t shown = 0;
    for (int i : pk.live) {
        if (++shown > 40) break;
        const int gi = plan.group_of[static_cast<std::size_t>(i)];
        s << "\n  " << mib(fuse::node_bytes(g, i)) << " MiB %" << i << " = " << ir::describe(g, i) << " : " << dtype_name(g[i].dtype)
          << g[i].shape.str() << " (group " << gi << (gi >= 0 ? std::string(" ") + fuse::group_kind_name(plan.groups[static_cast<std::size_t>(gi)].kind) : "")
          << (std::find(g.outputs.begin(), g.outputs.end(), i) != g.outputs.end() ? ", output" : "") << ")";
    }
    debug::log("memory", s.str());
}

inline Executable make_backend_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic,
                                          std::shared_ptr<const fuse::DeviceBackend> be) {
    if (opt.backend == Backend::custom) {
        if (!opt.custom_backend) throw ValueError("kiln::compile: Backend::custom needs Options::custom_backend");
        kernels = 0;
        return opt.custom_backend(g);
    }
    if (opt.backend == Backend::eager) {
        // every computed node its own kernel: the captured graph, no fusion
        fuse::Limits one = opt.limits;
        one.max_nodes = 1;
        one.max_row = 0;
        ir::Graph copy = g;  // every computed node an output: each one materialized
        for (int i = 0; i < copy.size(); ++i)
            if (copy[i].kind != ir::Kind::input && copy[i].kind != ir::Kind::constant && copy[i].kind != ir::Kind::scalar)
                copy.outputs.push_back(i);
        fuse::Plan plan = fuse::plan(copy, one);
        kernels = plan.kernels();
        const std::size_t nout = g.outputs.size();
        const auto prog = be->program(std::move(copy), std::move(plan));
        return [prog, nout](const std::vector<Tensor>& in) {
            std::vector<Tensor> all = prog->run(in);
            all.resize(nout);
            return all;
        };
    }
    fuse::Limits lim = opt.limits;
    be->adjust_limits(lim);
    fuse::Plan plan = fuse::plan(g, lim);
    be->adjust_plan(g, plan);
    kernels = plan.kernels();
    if (debug::log_on("fusion")) {
        std::ostringstream s;
        s << kernels << " kernel(s) from " << g.size() << " nodes:";
        for (const auto& G : plan.groups) {
            s << "\n  " << fuse::group_kind_name(G.kind) << " {";
            for (int j : G.nodes) s << " %" << j;
            s << " }";
            if (G.kind == fuse::Group::Kind::write) {
                if (G.stored)
                    s << " stored by its value's kernel";
                else if (G.in_place)
                    s << " in place";
            }
        }
        debug::log("fusion", s.str());
    }
    if (debug::log_on("memory")) log_peak_memory(g, plan);
    const auto prog = be->program(g, std::move(plan));
    if (!dynamic) return [prog](const std::vector<Tensor>& in) { return prog->run(in); };
    // each input shape gets its graph and plan once (the trace and passes are shared by all
    // sizes); the device decides what else it shares (CUDA: the kernels, when the plan groups
    // the same way; the CPU: nothing, its memory plan follows the shapes)
    auto shaped = std::make_shared<ShapeInstances<fuse::GraphProgram>>();
    return [prog, shaped, lim, be](const std::vector<Tensor>& in) {
        const auto inst = shaped->get(in, [&] {
            ShapedPlan s = shaped_plan(prog->graph(), in, lim, *be);
            return prog->reshaped(std::move(s.g), std::move(s.p));
        });
        return inst->run(in);
    };
}

}  // namespace kiln::detail
