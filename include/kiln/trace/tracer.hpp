// Tracing: tracing tensors, the active tracer that records every op as an IR node, and graph breaks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/function_ref.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/expr/node.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln {

/// Thrown by a traced function compiled with fullgraph = true when it would break the graph.
class GraphBreakError : public Error { using Error::Error; };

namespace trace {

class Tracer;

/// The memory a traced tensor views: the current value of a whole logical tensor (row-major, its
/// own shape and dtype), standing for storage. Every traced Tensor handle is a strided view
/// (shape, strides, offset over the base's row-major layout) of one base, like an eager tensor of
/// its storage. A write into any view makes a new value of the base (functionalization: a write is
/// a graph node, the graph stays pure); every view sees it, because a view's node is re-derived
/// from the base's current node when the base's version changed.
struct Base {
    std::uint64_t tracer = 0;  ///< id of the tracer that made it (ids are never reused, addresses are)
    int segment = -1;          ///< segment `node` belongs to
    int node = -1;             ///< the current value's node
    int own_node = -1;         ///< the input (or constant) node that is this base's own memory in `segment`, if any
    int version = 0;           ///< bumped by every write
    Shape shape;
    DType dtype = DType::f32;
    Device device;    ///< where the value lives: where its inputs and captured tensors do
    Tensor concrete;  ///< the current value once a graph break ran the segment that computed it
    int arg = -1;     ///< flat index of the argument this base is: written back into it after the call
    Tensor target;    ///< concrete memory outside the trace this base stands for: written back into it
    bool outside = false;  ///< target existed before the trace (so the program writes it back on every call)
    bool dirty = false;    ///< written since the last write-back
};

/// What a traced Tensor handle holds: its base, and the node of its view for the base's version.
struct Value {
    std::uint64_t tracer = 0;
    std::shared_ptr<Base> base;
    unsigned fixed = 0;  ///< dims whose extent a slice fixed (Tensor::with_view)
    int segment = -1, node = -1, version = -1;
};

/// One graph break: where it happened and why.
struct Break {
    std::source_location loc;
    std::string reason;
};

/// A traced write the program must apply to memory outside it after it runs: the final value's
/// node and where it goes (argument `arg`, or the concrete `target`).
struct WriteBack {
    int node = -1;
    int arg = -1;
    Tensor target;
};

/// Records ops into a graph. A graph break runs the graph recorded so far (through `run_segment`,
/// supplied by kiln::compile), binds every live base to its concrete tensor, applies the writes
/// made so far to memory outside the trace, and starts a new segment whose inputs are those tensors.
class Tracer {
public:
    /// Runs a segment: the graph and the concrete tensors of its inputs; returns its outputs.
    using SegmentRunner = std::function<std::vector<Tensor>(const ir::Graph&, const std::vector<Tensor>&)>;

    KILN_DECL Tracer(SegmentRunner run, bool fullgraph);
    Tracer(const Tracer&) = delete;
    Tracer& operator=(const Tracer&) = delete;
    KILN_DECL ~Tracer();

    /// The tracer of this thread's traced call, or nullptr.
    static Tracer*& active() {
        thread_local Tracer* t = nullptr;
        return t;
    }

    std::uint64_t id() const { return id_; }
    ir::Graph& graph() { return graph_; }
    const std::vector<Tensor>& segment_inputs() const { return inputs_; }
    const std::vector<Break>& breaks() const { return breaks_; }

    /// A new graph input bound to `concrete`; `arg` >= 0: the flat argument it is (its base is
    /// written back into that argument when the function writes into it).
    Tensor input(const Tensor& concrete, int arg = -1);

    /// A tracing tensor for node `id` of the current segment (a new value: its own base).
    KILN_DECL Tensor make(int id);

    /// A traced view of t's base (a movement op on a tracing tensor). Its node is made now, as
    /// every op's is (and again when a write gives the base a new value).
    KILN_DECL Tensor view(const Tensor& t, const Shape& shape, const Strides& strides, std::int64_t offset, unsigned fixed);

    /// A traced copy of t (clone, contiguous): a new base holding a copy of t's current value, in
    /// memory of its own when it leaves the program (ops::Copy, which passes keep).
    Tensor copy(const Tensor& t);

    /// The node that stands for t in the current segment (adding an input, constant or view if needed).
    int node_of(const Tensor& t);

    KILN_DECL int scalar(double value, DType dtype);

    /// Whether a write into dst must be recorded (functionalized) rather than done at once: dst is
    /// traced, or it is memory from outside the trace (a captured tensor: the program writes it on
    /// every call), or memory the trace already wrote into.
    KILN_DECL bool records_write_into(const Tensor& dst) const;

    /// Whether the trace wrote into t's memory (a concrete tensor): reading it must be recorded too.
    bool wrote(const Tensor& t) const { return !t.is_traced() && written_storage(t) != nullptr; }

    /// Whether work on concrete tensor t must be recorded rather than done now: the trace wrote into
    /// its memory, or it is memory from outside the trace of a tensor that requires grad (a
    /// parameter, or a detached view of one: a training step writes it later in the same trace, so
    /// a value computed from it now would be stale on the next call).
    KILN_DECL bool live(const Tensor& t) const;

    /// Treats concrete memory made during the trace as memory from outside it: the program reads it
    /// and writes it back on every call, as a captured tensor (state that must outlive the call,
    /// made on its first use: a gradient buffer, an optimizer's moments).
    void adopt(const Tensor& t) {
        if (t.storage()) adopted_.insert(t.storage().get());
    }

    /// dst = value (node `value`, broadcast to dst's shape and converted to its dtype), recorded as
    /// a new value of dst's base: the value itself when dst is the whole base, otherwise the base
    /// with dst's elements replaced (a view_write node).
    void write(const Tensor& dst, int value, const std::source_location& loc, std::string_view op = "assign");

    /// Graph break: runs the current segment and returns the concrete tensor t stands for.
    KILN_DECL Tensor materialize(const Tensor& t, const std::source_location& loc, const std::string& reason);

    /// The concrete tensor of a traced t whose base was computed by an earlier segment (undefined
    /// otherwise): a view of the base's concrete value.
    Tensor concrete_of(const Tensor& t);

    /// Runs the current segment with every live base as an output; binds the bases and writes
    /// what the segment wrote into memory outside the trace.
    void flush();

    /// Whether returning t may return memory the program did not make: t is a concrete tensor, or a
    /// view of an argument (or earlier segment's value) it never wrote. Otherwise, where the passes
    /// turn t's node into an input (x * 1 is x) or a write makes it one, the program must copy it.
    bool returns_own_memory(const Tensor& t) const {
        if (!t.is_traced()) return true;
        const Base& b = *checked(t)->base;
        return b.own_node >= 0 && b.node == b.own_node && b.segment == segment_;
    }

    /// Makes `outs` the graph's outputs, in order; `own` and `memory` receive each one's
    /// returns_own_memory and memory_of (what copy_aliased_outputs needs).
    KILN_DECL void set_outputs(const std::vector<Tensor>& outs, std::vector<char>& own, std::vector<const void*>& memory);

    /// Which memory a result is in eager: its traced base, or a concrete tensor's storage. Two
    /// results with one identity alias (y and y.t()); results with different ones never may, even
    /// where the passes make them one node (x * 2 returned twice).
    const void* memory_of(const Tensor& t) const {
        return t.is_traced() ? static_cast<const void*>(checked(t)->base.get()) : static_cast<const void*>(t.storage().get());
    }

    /// The writes the program must apply after it runs (the function wrote into an argument or
    /// into memory from outside the trace), each with its value's node in the current segment.
    std::vector<WriteBack> write_backs();

private:
    /// No tracer is active on this thread for a scope (work that must run, not be recorded).
    struct Untraced {
        Tracer* prev = Tracer::active();
        Untraced() { Tracer::active() = nullptr; }
        ~Untraced() { Tracer::active() = prev; }
        Untraced(const Untraced&) = delete;
        Untraced& operator=(const Untraced&) = delete;
    };

    static std::uint64_t next_id() {
        static std::atomic<std::uint64_t> n{0};
        return ++n;
    }
    /// Applies the writes pending on a storage before its memory is read or written directly.
    static void pending_hook(const kiln::detail::Storage* s);

    Value* checked(const Tensor& t) const {
        Value* v = t.traced_value().get();
        if (v->tracer != id_)
            throw Error("kiln::compile: a tracing tensor escaped its traced call (stored outside the function?)");
        return v;
    }
    static bool identity(const Tensor& t, const Base& b) {
        return t.offset() == 0 && t.shape() == b.shape && t.strides() == contiguous_strides(b.shape);
    }
    /// The device node `id`'s value lives on: an input's or captured tensor's, else its operands'
    /// (the first one on a GPU).
    Device device_of_node(int id);
    std::shared_ptr<Base> new_base(int node, const Shape& shape, DType dtype);
    KILN_DECL Tensor view_of(const std::shared_ptr<Base>& b, const Shape& shape, const Strides& strides, std::int64_t offset,
                             unsigned fixed = 0);
    int input_node(const Tensor& concrete);
    /// Gives b a node in the current segment: a base computed by an earlier segment comes in as
    /// an input bound to its concrete value.
    KILN_DECL void current(Base& b);
    int view_node(int of, const Shape& shape, const Strides& strides, std::int64_t offset, DType dtype, unsigned fixed = 0);
    /// The base standing for the storage of concrete tensor t (memory outside the function, or
    /// made by it before this point), created on the first write: the whole storage as a 1-D tensor
    /// of t's dtype, read at run time; t is a strided view of it.
    std::shared_ptr<Base> storage_base(const Tensor& t);
    KILN_DECL std::shared_ptr<Base> written_storage(const Tensor& t) const;
    void flush_for_break(const std::source_location& loc, const std::string& reason);

    SegmentRunner run_;
    bool fullgraph_;
    std::uint64_t id_;
    std::uint64_t first_storage_;  ///< storages with a serial below this existed before the trace
    ir::Graph graph_;
    std::vector<Tensor> inputs_;
    std::vector<int> constants_;
    std::vector<std::weak_ptr<Base>> live_;
    std::vector<std::shared_ptr<Base>> pinned_;  ///< arguments and written storage: kept for their write-backs
    std::map<const kiln::detail::Storage*, std::shared_ptr<Base>> storage_bases_;
    std::set<const kiln::detail::Storage*> adopted_;  ///< made during the trace, treated as outside (adopt)
    std::vector<Break> breaks_;
    std::vector<std::optional<Device>> node_device_;  ///< per node of the current segment, found on demand
    bool hooked_ = false;  ///< this tracer set the pending-writes hook (recorded writes into concrete memory)
    int segment_ = 0;
};

/// Makes `t` the active tracer of this thread for a scope.
class ActiveScope {
public:
    explicit ActiveScope(Tracer* t) : prev_(Tracer::active()) { Tracer::active() = t; }
    ~ActiveScope() { Tracer::active() = prev_; }
    ActiveScope(const ActiveScope&) = delete;
    ActiveScope& operator=(const ActiveScope&) = delete;

private:
    Tracer* prev_;
};

KILN_DECL Tracer& tracer_of(const Tensor& t, const std::source_location& loc);

KILN_DECL Tensor materialize(const Tensor& t, const std::source_location& loc, const char* what);

inline Device device_of(const Tensor& t) { return t.traced_value()->base->device; }

KILN_DECL Tensor record_view(const Tensor& src, const Tensor& view, unsigned fixed);

inline unsigned fixed_dims(const Tensor& t) { return t.traced_value()->fixed; }

KILN_DECL Tensor copy(const Tensor& t, const std::source_location& loc);

// ---------------------------------------------------------------- expressions
namespace detail {
/// A statement's node for one of its tensors.
using LeafNode = FunctionRef<int(const Tensor&)>;
/// Records expression f as nodes of tr's graph; each tensor leaf becomes leaf(tensor)'s node.
KILN_DECL int lower(Tracer& tr, const expr::Flat& f, const LeafNode& leaf);
/// Records f; tensor leaves become graph inputs (traced values) or constants (captured tensors).
KILN_DECL int lower(Tracer& tr, const expr::Flat& f);
}  // namespace detail

/// Records an expression whose leaves include tracing tensors; returns the tracing result.
KILN_DECL Tensor record_expr(const expr::Flat& f, const std::source_location& loc);

}  // namespace trace
}  // namespace kiln

namespace kiln::trace {

namespace detail {
/// A reduce or arg_reduce node over operand `in`.
inline ir::Node reduce_node(ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim, const Shape& out_shape,
                            DType out_dtype, const std::source_location& loc, int in, double correction = 0) {
    ir::Node n;
    n.correction = correction;
    n.kind = kind;
    n.rkind = rk;
    n.arg_max = arg_max;
    n.mask = mask;
    n.keepdim = keepdim;
    n.shape = out_shape;
    n.dtype = out_dtype;
    n.loc = loc;
    n.in = {in};
    return n;
}
}  // namespace detail

/// Records a reduction of an expression with tracing leaves.
KILN_DECL Tensor record_reduce(const expr::Flat& f, ir::Kind kind, ir::ReduceKind rk, bool arg_max, unsigned mask, bool keepdim,
                               const Shape& out_shape, DType out_dtype, const std::source_location& loc, double correction = 0);

/// Records a matrix product with a tracing operand.
KILN_DECL Tensor record_matmul(const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype,
                               const std::source_location& loc);

/// Whether work reading t must be recorded into the active trace rather than done now: t is a
/// tracing tensor, or live for the trace (Tracer::live).
inline bool recorded(const Tensor& t) {
    if (t.is_traced()) return true;
    const Tracer* tr = Tracer::active();
    return tr != nullptr && tr->live(t);
}

/// Runs a library op (ir::CallOp) on its operands: as one Kind::call node when an operand is a
/// tracing tensor or memory the trace wrote into (the op then runs inside the compiled program,
/// with the operands it has there), otherwise at once.
/// `every_call`: record it whenever a trace is active, even over concrete operands (an op whose
/// result must differ per call, such as a random draw).
KILN_DECL Tensor call_op(std::shared_ptr<const ir::CallOp> op, const std::vector<Tensor>& operands, DType out_dtype,
                         const std::source_location& loc, bool every_call = false);

}  // namespace kiln::trace

#if KILN_HEADER_ONLY
#include "kiln/trace/tracer_impl.hpp"
#endif
