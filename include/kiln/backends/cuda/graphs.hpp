// mode = reduce_overhead: a compiled program replayed as CUDA graphs (one launch per call).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backends/cuda/allocator.hpp"
#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/graph_stats.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/debug/logs.hpp"

namespace kiln::cuda {

namespace detail {

/// Called before every replay of a captured graph when set: kiln::dist sets it so that a graph
/// whose collectives would run on a failed (aborted) communicator throws DistError instead.
inline void (*&before_replay_hook())() {
    static void (*hook)() = nullptr;
    return hook;
}

/// Replays a program (inputs -> outputs on one CUDA device) as CUDA graphs.
///
/// The rules (docs/ARCHITECTURE.md, "reduce_overhead"):
/// - The first call with a given set of input shapes runs normally (it compiles the kernels and
///   warms cuBLASLt); the second captures the run into a graph instance, later ones replay it.
/// - An input whose address (and strides) did not change between the two calls before a capture
///   is bound: the graph reads the caller's memory in place, so writing into that tensor between
///   calls is seen by the next replay. Any other input is copied, on every call, into a buffer the
///   instance owns. When a bound input later arrives at another address, a new instance is
///   captured with that input copied.
/// - Outputs are never overwritten while anyone still holds them: an instance is replayed only
///   when no tensor outside it refers to its outputs' memory. With the usual `y = f(x)` loop two
///   instances alternate; when all instances (at most `max_instances`) are held, the call runs
///   without a graph, into fresh memory.
/// - Memory allocated during a capture comes from the instance's own capture stream, whose cached
///   blocks no other work receives and empty_cache() leaves alone while the instance lives.
class GraphReplay {
public:
    using Run = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

    GraphReplay(Run run, int device, int max_instances = 3) : run_(std::move(run)), device_(device), max_(max_instances) {}
    GraphReplay(const GraphReplay&) = delete;
    GraphReplay& operator=(const GraphReplay&) = delete;

    std::vector<Tensor> operator()(const std::vector<Tensor>& in) {
        std::lock_guard lock(mutex_);
        Shapes& s = shapes_for(in);
        const bool first = s.last.empty();
        std::vector<Tensor> previous = std::move(s.last);
        s.last = in;
        if (first) return fallback(in);
        for (auto& inst : s.instances)
            if (inst->can_replay(in)) return replay(*inst, in);
        if (static_cast<int>(s.instances.size()) >= max_) {
            if (debug::log_on("cudagraphs")) {
                std::string why;
                for (std::size_t i = 0; i < s.instances.size(); ++i) why += "; instance " + std::to_string(i) + ": " + s.instances[i]->why_not(in);
                debug::log("cudagraphs", "no graph instance can replay this call, running without a graph" + why);
            }
            return fallback(in);
        }
        // inputs at the address of the previous call are bound in place, the others copied
        std::vector<char> bind(in.size(), 0);
        for (std::size_t k = 0; k < in.size(); ++k) bind[k] = same_place(in[k], previous[k]);
        s.instances.push_back(capture(in, bind));
        return replay(*s.instances.back(), in);
    }

private:
    struct Instance {
        int device = 0;
        std::unique_ptr<Stream> stream;  // capture stream: its cached blocks belong to this instance
        CUgraph graph = nullptr;
        CUgraphExec exec = nullptr;
        std::vector<Tensor> bound;       // per input: the caller's tensor read in place, or undefined
        std::vector<Tensor> staged;      // per input: the instance's copy buffer, or undefined
        std::vector<Tensor> outputs;     // what the graph writes
        std::vector<long> baseline;      // use counts of the outputs' storage with no caller holding them
        std::vector<char> external;      // per output: memory from before the capture (a parameter the program
                                         // writes in place): the caller holding it is the point, not a conflict

        bool can_replay(const std::vector<Tensor>& in) const {
            for (std::size_t k = 0; k < in.size(); ++k)
                if (bound[k].defined() && !same_place(in[k], bound[k])) return false;
            for (std::size_t k = 0; k < outputs.size(); ++k)
                if (!external[k] && outputs[k].storage().use_count() > baseline[k]) return false;  // the caller holds an output
            return true;
        }
        /// Why can_replay is false (for the cudagraphs log).
        std::string why_not(const std::vector<Tensor>& in) const {
            for (std::size_t k = 0; k < in.size(); ++k)
                if (bound[k].defined() && !same_place(in[k], bound[k])) return "input " + std::to_string(k) + " moved";
            for (std::size_t k = 0; k < outputs.size(); ++k)
                if (!external[k] && outputs[k].storage().use_count() > baseline[k])
                    return "output " + std::to_string(k) + " " + outputs[k].shape().str() + " is held (" +
                           std::to_string(outputs[k].storage().use_count()) + " uses, " + std::to_string(baseline[k]) + " at capture)";
            return "free";
        }
        ~Instance() {
            if (!driver_state().ok()) return;
            const Driver& d = driver_state();
            if (exec) {
                d.stream_synchronize(current_stream(device));  // replays queued there may still run
                d.graph_exec_destroy(exec);
            }
            if (graph) d.graph_destroy(graph);
            outputs.clear();
            staged.clear();
            if (stream) device_allocator_at(device).reserve_stream(stream->handle(), false);
        }
    };
    struct Shapes {
        std::vector<Shape> shapes;
        std::vector<Tensor> last;  // the inputs of the previous call with these shapes
        std::vector<std::unique_ptr<Instance>> instances;
    };

    static bool same_place(const Tensor& a, const Tensor& b) {
        return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.strides() == b.strides() &&
               a.shape() == b.shape() && a.dtype() == b.dtype();
    }

    Shapes& shapes_for(const std::vector<Tensor>& in) {
        std::vector<Shape> sh;
        for (const Tensor& t : in) sh.push_back(t.shape());
        for (auto& s : sets_)
            if (s->shapes == sh) return *s;
        sets_.push_back(std::make_unique<Shapes>());
        sets_.back()->shapes = std::move(sh);
        return *sets_.back();
    }

    std::vector<Tensor> fallback(const std::vector<Tensor>& in) {
        {
            std::lock_guard l(graph_stats_mutex());
            ++graph_stats_ref().fallbacks;
        }
        return run_(in);
    }

    std::unique_ptr<Instance> capture(const std::vector<Tensor>& in, const std::vector<char>& bind) {
        auto inst = std::make_unique<Instance>();
        inst->device = device_;
        inst->stream = std::make_unique<Stream>(device_);
        device_allocator_at(device_).reserve_stream(inst->stream->handle(), true);
        std::vector<Tensor> args(in.size());
        const std::uint64_t first_serial = kiln::detail::Storage::next_serial();  // storages made from here on are the capture's
        inst->bound.resize(in.size());
        inst->staged.resize(in.size());
        {
            StreamGuard guard(*inst->stream);
            for (std::size_t k = 0; k < in.size(); ++k) {
                if (bind[k]) {
                    inst->bound[k] = in[k];
                    args[k] = in[k];
                } else {
                    inst->staged[k] = Tensor(in[k].shape(), in[k].dtype(), in[k].device());
                    args[k] = inst->staged[k];
                }
            }
            check(driver().stream_begin_capture(inst->stream->handle(), /*CU_STREAM_CAPTURE_MODE_RELAXED*/ 2),
                  "cuStreamBeginCapture");
            try {
                inst->outputs = run_(args);
            } catch (...) {
                CUgraph g = nullptr;
                driver().stream_end_capture(inst->stream->handle(), &g);
                if (g) driver().graph_destroy(g);
                throw;
            }
            check(driver().stream_end_capture(inst->stream->handle(), &inst->graph), "cuStreamEndCapture");
            check(driver().graph_instantiate(&inst->exec, inst->graph, 0), "cuGraphInstantiate");
        }
        args.clear();
        for (const Tensor& o : inst->outputs) {
            inst->baseline.push_back(o.storage().use_count());
            inst->external.push_back(o.storage() && o.storage()->serial() < first_serial);
        }
        {
            std::lock_guard l(graph_stats_mutex());
            ++graph_stats_ref().captures;
        }
        int nb = 0;
        for (char b : bind) nb += b;
        debug::log("cudagraphs", "captured a graph instance: " + std::to_string(nb) + " input(s) bound in place, " +
                                     std::to_string(static_cast<int>(in.size()) - nb) + " copied per call");
        return inst;
    }

    std::vector<Tensor> replay(Instance& inst, const std::vector<Tensor>& in) {
        if (void (*hook)() = before_replay_hook()) hook();
        for (std::size_t k = 0; k < in.size(); ++k)
            if (inst.staged[k].defined()) inst.staged[k].copy_(in[k]);
        check(driver().graph_launch(inst.exec, current_stream(device_)), "cuGraphLaunch");
        {
            std::lock_guard l(graph_stats_mutex());
            ++graph_stats_ref().replays;
        }
        return inst.outputs;
    }

    Run run_;
    int device_;
    int max_;
    std::mutex mutex_;
    std::vector<std::unique_ptr<Shapes>> sets_;
};

}  // namespace detail

}  // namespace kiln::cuda
