// One executor for every device: a plan's steps run in order, each kernel step (an elementwise,
// row, reduce or matmul group) handed to the device's Steps; views, writes into views, library
// calls, the memory plan's releases and the profile log are this one code for the CPU and CUDA.
// A compiled program is a GraphProgram, and a device's DeviceBackend makes them: compile/ asks
// backend_for(device) (backends/registry.hpp) and has no device branches of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/fuse/limits.hpp"
#include "kiln/fuse/memory_plan.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::fuse {

/// What a device does for the executor.
class Steps {
public:
    virtual ~Steps() = default;
    /// Runs kernel step k (an elementwise, row, reduce or matmul group), writing its outputs into vals.
    virtual void kernel(std::size_t k, const Group& G, std::vector<Tensor>& vals) = 0;
    /// Issues every kernel queued so far: host-side work that follows (a library call, a copy)
    /// is then ordered after them.
    virtual void flush() {}
    /// Whether every step so far has been issued, so that a value dropped now is not read later by
    /// a kernel still waiting to be issued.
    virtual bool issued() const { return true; }
    /// Whether library calls only queue their work (a device's stream), so that their host time is
    /// their setup (a first call's plans) rather than the work itself.
    virtual bool asynchronous() const { return false; }
    /// The tensor node `id` (of the given shape and dtype) is written into: a planned buffer bound
    /// in vals, or new memory on the device.
    virtual Tensor output(std::vector<Tensor>& vals, int id, const Shape& shape, DType dtype) = 0;
    /// Whether `t` is in this device's memory (a write may then take it over).
    virtual bool on_device(const Tensor& t) const = 0;
    /// Waits for everything issued (the profile log's timings).
    virtual void wait() {}
    /// The device's name in the profile log.
    virtual std::string name() const = 0;
};

/// A write into a view of a value: the base copied (unless the write may take its memory, when
/// it is the base's only reader), then the value stored through the view.
inline void run_write_step(const ir::Graph& g, const Group& G, std::vector<Tensor>& vals, Steps& s) {
    const int o = G.outputs[0];
    const ir::Node& n = g[o];
    const Tensor& base = vals[static_cast<std::size_t>(n.in[0])];
    const Tensor& src = vals[static_cast<std::size_t>(n.in[1])];
    Tensor out;
    const bool take = G.in_place && base.is_contiguous() && base.dtype() == n.dtype && s.on_device(base);
    if (take && Tensor(base.storage(), base.offset() + static_cast<std::int64_t>(n.value), src.shape(), n.args, n.dtype).is_same(src)) {
        vals[static_cast<std::size_t>(o)] = base;  // its producer stored the value here already (Plan::store_into)
        return;
    }
    s.flush();  // the copies queue behind everything before them
    // a write over the whole base in row-major order (a parameter or a gradient buffer written
    // through a view of its storage) replaces every element: the base is not copied first
    const bool whole = static_cast<std::int64_t>(n.value) == 0 && src.numel() == base.numel() &&
                       n.args == contiguous_strides(src.shape());
    if (take) {
        out = base;
    } else if (whole) {
        out = s.output(vals, o, n.shape, n.dtype);
    } else {
        out = s.output(vals, o, n.shape, n.dtype);
        out.copy_(base);
    }
    Tensor(out.storage(), out.offset() + static_cast<std::int64_t>(n.value), src.shape(), n.args, n.dtype).copy_(src);
    vals[static_cast<std::size_t>(o)] = out;
}

/// Runs plan over vals (inputs and constants bound; planned buffers may be bound too): each group
/// in order, dropping each intermediate after its last reader (mem.dead_after, mem the memory
/// plan of plan) once every step so far has been issued. Returns the graph's outputs.
inline std::vector<Tensor> execute(const ir::Graph& g, const Plan& plan, const MemoryPlan& mem, std::vector<Tensor>& vals,
                                   Steps& s) {
    const bool profile = debug::log_on("profile");
    std::vector<int> dead;
    for (std::size_t k = 0; k < plan.groups.size(); ++k) {
        const Group& G = plan.groups[k];
        const auto t0 = std::chrono::steady_clock::now();
        if (!plan.store_into.empty())  // outputs stored straight into captured memory by their write
            for (int o : G.outputs)
                if (const int w = plan.store_into[static_cast<std::size_t>(o)]; w >= 0) {
                    const ir::Node& wn = g[w];
                    const Tensor& base = vals[static_cast<std::size_t>(wn.in[0])];
                    // o is the write's value (at the write's strides: row-major, or channels-last
                    // for an elementwise kernel) or what it reshapes (row-major)
                    if (base.is_contiguous() && s.on_device(base))
                        vals[static_cast<std::size_t>(o)] = Tensor(base.storage(), base.offset() + static_cast<std::int64_t>(wn.value), g[o].shape,
                                                                   o == wn.in[1] ? wn.args : contiguous_strides(g[o].shape), g[o].dtype);
                }
        switch (G.kind) {
            case Group::Kind::elementwise:
            case Group::Kind::row:
            case Group::Kind::reduce:
            case Group::Kind::matmul: s.kernel(k, G, vals); break;
            case Group::Kind::write:
                run_write_step(g, G, vals, s);  // (flushes before it copies)
                break;
            case Group::Kind::call: {
                s.flush();  // the op queues its work behind everything before it
                const auto t_call = std::chrono::steady_clock::now();
                vals[static_cast<std::size_t>(G.outputs[0])] = ir::run_call(g[G.outputs[0]], vals);
                if (const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_call).count();
                    ms > 1 && s.asynchronous() && debug::log_on("compile_times"))  // a first call's plans (cuDNN's, cuBLASLt's)
                    debug::log("compile_times", "call " + g[G.outputs[0]].call->key + ": " + std::to_string(ms) + " ms on the host");
                break;
            }
            case Group::Kind::view: {
                const ir::Node& n = g[G.outputs[0]];
                const Tensor& in = vals[static_cast<std::size_t>(n.in[0])];
                if (!in.is_contiguous()) s.flush();  // the copy below runs behind its producer
                const Tensor src = in.contiguous();
                vals[static_cast<std::size_t>(G.outputs[0])] =
                    Tensor(src.storage(), src.offset() + static_cast<std::int64_t>(n.value), n.shape, n.args, n.dtype);
                break;
            }
        }
        dead.insert(dead.end(), mem.dead_after[k].begin(), mem.dead_after[k].end());
        if (s.issued()) {
            for (int i : dead) vals[static_cast<std::size_t>(i)] = Tensor();
            dead.clear();
        }
        if (profile) {
            s.flush();
            s.wait();
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            std::string nodes;
            for (int j : G.nodes) nodes += " %" + std::to_string(j);
            const ir::Node& last = g[G.outputs[0]];
            const std::string what = G.kind == Group::Kind::call ? " " + last.call->key : " -> " + last.shape.str();
            debug::log("profile", s.name() + " " + group_kind_name(G.kind) + " group " + std::to_string(k) + " {" + nodes + " }" + what +
                                      ": " + std::to_string(us) + " us");
        }
    }
    s.flush();
    std::vector<Tensor> out;
    out.reserve(g.outputs.size());
    for (int o : g.outputs) out.push_back(vals[static_cast<std::size_t>(o)]);
    return out;
}

/// Whether two plans of one graph group the same nodes the same way (their row spaces may differ).
inline bool same_grouping(const Plan& a, const Plan& b) {
    if (a.groups.size() != b.groups.size()) return false;
    for (std::size_t k = 0; k < a.groups.size(); ++k) {
        const Group &x = a.groups[k], &y = b.groups[k];
        if (x.kind != y.kind || x.nodes != y.nodes || x.outputs != y.outputs || x.leaves != y.leaves || x.mask != y.mask ||
            x.bias != y.bias || x.act != y.act || x.act_kind != y.act_kind || x.in_place != y.in_place || x.stored != y.stored)
            return false;
    }
    return true;
}

/// A compiled graph on one device.
class GraphProgram {
public:
    virtual ~GraphProgram() = default;
    virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs) const = 0;
    virtual const ir::Graph& graph() const = 0;
    virtual const Plan& plan() const = 0;
    /// This program for the same graph with shapes re-derived for other input sizes (g) and
    /// planned again for them (p): it may share this program's kernels.
    virtual std::shared_ptr<const GraphProgram> reshaped(ir::Graph g, Plan p) const = 0;
};

/// What compile needs of a device.
class DeviceBackend {
public:
    virtual ~DeviceBackend() = default;
    /// The device's program for a planned graph.
    virtual std::shared_ptr<const GraphProgram> program(ir::Graph g, Plan plan) const = 0;
    /// Changes the device makes to a plan before its program is built (CUDA: matmul groups take
    /// their bias and activation as a GEMM epilogue).
    virtual void adjust_plan(const ir::Graph&, Plan&) const {}
    /// Changes the device makes to the fuser's limits (CUDA: no row groups for column reductions).
    virtual void adjust_limits(Limits&) const {}
    /// The executable for Mode::reduce_overhead (CUDA: replayed as a CUDA graph); e itself where
    /// the device has no such mode.
    virtual Executable replayed(Executable e) const { return e; }
};

}  // namespace kiln::fuse
