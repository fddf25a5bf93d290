// kiln::compile: trace a function into a graph, optimize and fuse it, cache the program under guards.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backends/cpu/graph_exec.hpp"
#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/backends/cuda/graphs.hpp"
#include "kiln/cache/guards.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/hash.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/passes/pipeline.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

/// How a compiled function runs.
/// The names follow torch.compile's backends: `eager` runs the captured graph one op per kernel,
/// as kiln::eager(expr) runs an expression.
enum class Backend : std::uint8_t {
    none,    ///< no capture: the function runs as written (each fused statement as it comes)
    eager,   ///< captured and optimized, then run one op per kernel, every intermediate materialized
    fused,   ///< captured, optimized and fused (the default)
    custom,  ///< Options::custom_backend turns the graph into an executable
    graph = eager,  ///< the former name of `eager`
};
/// Whether dims may change without recompiling.
enum class Dynamic : std::uint8_t {
    automatic,  ///< static first; a dim that changes size becomes symbolic, so a third size reuses the program
    on,         ///< every dim symbolic from the first call (sizes 0 and 1 stay specialized)
    off,        ///< every new size recompiles
};
/// How a compiled program runs on a CUDA device.
enum class Mode : std::uint8_t {
    normal,           ///< launch each kernel of each call
    reduce_overhead,  ///< replay each call as one CUDA graph (backends/cuda/graphs.hpp has the rules); the CPU ignores it
};
/// What happens when a function would compile more than Options::recompile_limit times.
enum class Stance : std::uint8_t { fallback_eager, error };

/// Thrown when the recompile limit is hit with Stance::error.
class RecompileLimitError : public Error { using Error::Error; };

/// A program a backend made from a graph: input tensors in, output tensors out.
using Executable = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Options {
    Backend backend = Backend::fused;
    Mode mode = Mode::normal;
    Dynamic dynamic = Dynamic::automatic;
    int recompile_limit = 8;
    Stance stance = Stance::fallback_eager;
    bool fullgraph = false;  ///< a graph break throws GraphBreakError instead of splitting the graph
    /// Like torch inductor's freezing: captured tensors are snapshotted at compile time (each
    /// compile, recompiles included, takes its own snapshot); passes may fold them (BatchNorm into
    /// its convolution: passes/fold_conv_affine.hpp); later writes to them are not seen. Off:
    /// captured tensors are read on every call.
    bool freeze = false;
    std::function<Executable(const ir::Graph&)> custom_backend{};
    fuse::Limits limits{};
};

namespace detail {

// ------------------------------------------------------------------ flattening arguments and results
/// Arguments flattened: tensors in order, numbers (guarded by value), and the sizes of vectors.
struct Flat {
    std::vector<Tensor> tensors;
    std::vector<double> numbers;
    std::vector<std::size_t> sizes;
};

template <class T> struct is_tuple_like : std::false_type {};
template <class... A> struct is_tuple_like<std::tuple<A...>> : std::true_type {};
template <class A, class B> struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, std::size_t N> struct is_array<std::array<T, N>> : std::true_type {};

// Aggregates (plain structs of Tensors, numbers and containers of them, no base classes) are
// taken apart with structured bindings; their field count comes from brace-initialization with a
// value convertible to anything (the technique of Boost.PFR), up to max_fields fields.
inline constexpr std::size_t max_fields = 12;
struct AnyField {
    template <class T> operator T() const;  // never defined: only in unevaluated contexts
};
template <class T, std::size_t... I>
constexpr bool brace_constructible(std::index_sequence<I...>) {
    return requires { T{(void(I), AnyField{})...}; };
}
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
    if constexpr (N < max_fields + 1 && brace_constructible<T>(std::make_index_sequence<N + 1>{})) return field_count<T, N + 1>();
    else return N;
}
template <class T>
inline constexpr bool is_struct_of_fields = std::is_aggregate_v<T> && std::is_class_v<T> && !std::is_same_v<T, Tensor> &&
                                            field_count<T>() >= 1 && field_count<T>() <= max_fields;

/// The fields of aggregate a as a tuple of references.
template <class T> auto fields(T& a) {
    constexpr std::size_t n = field_count<std::remove_const_t<T>>();
#define KILN_FIELDS_(N, ...)                       \
    if constexpr (n == N) {                        \
        auto& [__VA_ARGS__] = a;                   \
        return std::tie(__VA_ARGS__);              \
    } else
    KILN_FIELDS_(1, f0)
    KILN_FIELDS_(2, f0, f1)
    KILN_FIELDS_(3, f0, f1, f2)
    KILN_FIELDS_(4, f0, f1, f2, f3)
    KILN_FIELDS_(5, f0, f1, f2, f3, f4)
    KILN_FIELDS_(6, f0, f1, f2, f3, f4, f5)
    KILN_FIELDS_(7, f0, f1, f2, f3, f4, f5, f6)
    KILN_FIELDS_(8, f0, f1, f2, f3, f4, f5, f6, f7)
    KILN_FIELDS_(9, f0, f1, f2, f3, f4, f5, f6, f7, f8)
    KILN_FIELDS_(10, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)
    KILN_FIELDS_(11, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10)
    KILN_FIELDS_(12, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11)
    static_assert(n >= 1 && n <= max_fields, "kiln::compile: aggregates of 1 to 12 fields");
#undef KILN_FIELDS_
}
/// The type of field I of aggregate T.
template <class T, std::size_t I>
using field_t = std::remove_cvref_t<std::tuple_element_t<I, decltype(fields(std::declval<T&>()))>>;

/// The type a compiled function returns for a result of type T: tensor expressions become
/// Tensors (materialized), also inside tuples, pairs, vectors and arrays.
template <class T> struct materialized { using type = T; };
template <class T> requires IsExprNode<T>::value struct materialized<T> { using type = Tensor; };
template <class... A> struct materialized<std::tuple<A...>> { using type = std::tuple<typename materialized<A>::type...>; };
template <class A, class B> struct materialized<std::pair<A, B>> {
    using type = std::pair<typename materialized<A>::type, typename materialized<B>::type>;
};
template <class T, class A> struct materialized<std::vector<T, A>> { using type = std::vector<typename materialized<T>::type>; };
template <class T, std::size_t N> struct materialized<std::array<T, N>> { using type = std::array<typename materialized<T>::type, N>; };
template <class T> using materialized_t = typename materialized<std::remove_cvref_t<T>>::type;

/// v with every tensor expression in it evaluated (a Tensor), as materialized_t describes.
template <class T> materialized_t<T> materialize_result(T&& v) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<materialized_t<T>, D>) {
        return std::forward<T>(v);
    } else if constexpr (IsExprNode<D>::value) {
        return Tensor(v);
    } else if constexpr (is_vector<D>::value) {
        materialized_t<T> out;
        out.reserve(v.size());
        for (const auto& x : v) out.push_back(materialize_result(x));
        return out;
    } else if constexpr (is_array<D>::value) {
        materialized_t<T> out;
        for (std::size_t i = 0; i < v.size(); ++i) out[i] = materialize_result(v[i]);
        return out;
    } else {
        return std::apply([](const auto&... x) { return materialized_t<T>{materialize_result(x)...}; }, v);
    }
}

template <class T> void flatten(const T& a, Flat& f) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<D, Tensor>) {
        f.tensors.push_back(a);
    } else if constexpr (std::is_arithmetic_v<D>) {
        f.numbers.push_back(static_cast<double>(a));
    } else if constexpr (is_vector<D>::value || is_array<D>::value) {
        f.sizes.push_back(a.size());
        for (const auto& x : a) flatten(x, f);
    } else if constexpr (is_tuple_like<D>::value) {
        std::apply([&](const auto&... x) { (flatten(x, f), ...); }, a);
    } else if constexpr (is_struct_of_fields<D>) {
        std::apply([&](const auto&... x) { (flatten(x, f), ...); }, fields(a));
    } else {
        static_assert(std::is_same_v<D, Tensor>,
                      "kiln::compile: arguments and results must be Tensors, numbers, or std::tuple / std::pair / "
                      "std::vector / std::array / aggregate structs of them");
    }
}

/// A copy of a with each Tensor replaced by next() (the traced or concrete tensor for it).
template <class T, class Next> T rebuild(const T& a, Next& next) {
    using D = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<D, Tensor>) {
        return next();
    } else if constexpr (std::is_arithmetic_v<D>) {
        return a;
    } else if constexpr (is_vector<D>::value) {
        D out;
        out.reserve(a.size());
        for (const auto& x : a) out.push_back(rebuild(x, next));
        return out;
    } else if constexpr (is_array<D>::value) {
        D out;
        for (std::size_t i = 0; i < a.size(); ++i) out[i] = rebuild(a[i], next);
        return out;
    } else if constexpr (is_tuple_like<D>::value) {
        return std::apply([&](const auto&... x) { return D{rebuild(x, next)...}; }, a);
    } else {
        return std::apply([&](const auto&... x) { return D{rebuild(x, next)...}; }, fields(a));
    }
}

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
        dst.copy_(outs[n + i]);
    }
    outs.resize(n);
}

/// A segment of a graph-breaking function: cached by structural hash and input guards.
struct Segment {
    std::uint64_t hash;
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

/// Shapes of every node for inputs of these shapes (dynamic programs re-derive them on each
/// call). Returns -1, or the first node whose shape cannot be derived: operands that do not
/// broadcast, or a view that cannot follow a changed dim (rederive_view).
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
            case ir::Kind::reduce: case ir::Kind::arg_reduce: {
                const Shape& x = g[n.in[0]].shape;
                Shape s;
                for (int d = 0; d < x.rank(); ++d) {
                    if (!(n.mask & (1u << d))) s.push_back(x[d]);
                    else if (n.keepdim) s.push_back(1);
                }
                n.shape = s;
                break;
            }
            case ir::Kind::matmul: {
                const Shape& a = g[n.in[0]].shape;
                const Shape& b = g[n.in[1]].shape;
                Shape ba, bb, batch;
                for (int d = 0; d < a.rank() - 2; ++d) ba.push_back(a[d]);
                for (int d = 0; d < b.rank() - 2; ++d) bb.push_back(b[d]);
                kiln::detail::try_broadcast(ba, bb, batch);
                if (a.rank() > 1) batch.push_back(a[a.rank() - 2]);
                if (b.rank() > 1) batch.push_back(b[b.rank() - 1]);
                n.shape = batch;
                break;
            }
            case ir::Kind::view:
                if (!rederive_view(n, recorded[static_cast<std::size_t>(n.in[0])], g[n.in[0]].shape)) return i;
                break;
            case ir::Kind::view_write: {  // the view written into follows its base like a view
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

/// Whether two plans of one graph group the same nodes the same way (their row spaces may differ).
inline bool same_grouping(const fuse::Plan& a, const fuse::Plan& b) {
    if (a.groups.size() != b.groups.size()) return false;
    for (std::size_t k = 0; k < a.groups.size(); ++k) {
        const fuse::Group &x = a.groups[k], &y = b.groups[k];
        if (x.kind != y.kind || x.nodes != y.nodes || x.outputs != y.outputs || x.leaves != y.leaves || x.mask != y.mask ||
            x.bias != y.bias || x.act != y.act || x.in_place != y.in_place)
            return false;
    }
    return true;
}

/// A program's graph with shapes re-derived for these inputs (dynamic programs), and its plan
/// for them: planned again, because the fuser's choices follow shapes, and two dims the trace
/// saw equal (one that became dynamic and one that did not, or two dynamic ones) need not stay
/// equal: a value over one of them is not a row over the other.
struct ShapedPlan {
    ir::Graph g;
    fuse::Plan p;
};
inline ShapedPlan shaped_plan(const ir::Graph& g, const std::vector<Tensor>& in, const fuse::Limits& lim, int device) {
    ShapedPlan s{g, {}};
    infer_shapes(s.g, in);
    s.p = fuse::plan(s.g, lim);
    if (device >= 0) fuse::absorb_matmul_epilogues(s.g, s.p);
    return s;
}

inline Executable make_backend_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic, int device);

/// The backend's executable for an optimized graph (device: a CUDA device index, or -1 for the CPU),
/// replayed as CUDA graphs under Mode::reduce_overhead.
inline Executable make_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic, int device = -1) {
    Executable e = make_backend_executable(g, opt, kernels, dynamic, device);
    if (device < 0 || opt.mode != Mode::reduce_overhead) return e;
    auto replay = std::make_shared<cuda::detail::GraphReplay>(std::move(e), device);
    return [replay](const std::vector<Tensor>& in) { return (*replay)(in); };
}

inline Executable make_backend_executable(const ir::Graph& g, const Options& opt, int& kernels, bool dynamic, int device) {
    if (opt.backend == Backend::custom) {
        if (!opt.custom_backend) throw ValueError("kiln::compile: Backend::custom needs Options::custom_backend");
        kernels = 0;
        return opt.custom_backend(g);
    }
    fuse::Plan plan;
    if (opt.backend == Backend::eager) {
        // every computed node its own kernel: the captured graph, no fusion
        fuse::Limits one = opt.limits;
        one.max_nodes = 1;
        one.max_row = 0;
        ir::Graph copy = g;  // every computed node an output: each one materialized
        for (int i = 0; i < copy.size(); ++i)
            if (copy[i].kind != ir::Kind::input && copy[i].kind != ir::Kind::constant && copy[i].kind != ir::Kind::scalar)
                copy.outputs.push_back(i);
        plan = fuse::plan(copy, one);
        kernels = plan.kernels();
        const std::size_t nout = g.outputs.size();
        if (device >= 0) {
            auto cprog = std::make_shared<cuda::detail::CudaGraphProgram>(copy, plan, device);
            return [cprog, nout](const std::vector<Tensor>& in) {
                std::vector<Tensor> all = cprog->run(in);
                all.resize(nout);
                return all;
            };
        }
        auto prog = std::make_shared<kiln::detail::CpuGraphProgram>(copy, plan);
        return [prog, nout](const std::vector<Tensor>& in) {
            std::vector<Tensor> all = prog->run(in);
            all.resize(nout);
            return all;
        };
    }
    plan = fuse::plan(g, opt.limits);
    if (device >= 0) fuse::absorb_matmul_epilogues(g, plan);  // cuBLASLt applies bias, relu and gelu_tanh
    kernels = plan.kernels();
    if (debug::log_on("fusion")) {
        std::ostringstream s;
        s << kernels << " kernel(s) from " << g.size() << " nodes:";
        for (const auto& G : plan.groups) {
            s << "\n  " << fuse::group_kind_name(G.kind) << " {";
            for (int j : G.nodes) s << " %" << j;
            s << " }";
        }
        debug::log("fusion", s.str());
    }
    if (device >= 0) {
        auto cprog = std::make_shared<cuda::detail::CudaGraphProgram>(g, plan, device);
        if (!dynamic) return [cprog](const std::vector<Tensor>& in) { return cprog->run(in); };
        // the kernels are shape-generic; each input shape gets its graph and plan once, and a plan
        // that groups differently gets a program (and kernels) of its own
        struct Instance {
            ShapedPlan s;
            std::shared_ptr<cuda::detail::CudaGraphProgram> own;
        };
        auto shaped = std::make_shared<ShapeInstances<Instance>>();
        const fuse::Limits lim = opt.limits;
        return [cprog, shaped, lim, device](const std::vector<Tensor>& in) {
            const auto inst = shaped->get(in, [&] {
                auto made = std::make_shared<Instance>(Instance{shaped_plan(cprog->graph(), in, lim, device), nullptr});
                if (!same_grouping(made->s.p, cprog->plan()))
                    made->own = std::make_shared<cuda::detail::CudaGraphProgram>(made->s.g, made->s.p, device);
                return made;
            });
            return inst->own ? inst->own->run(in) : cprog->run_graph(inst->s.g, inst->s.p, in);
        };
    }
    auto prog = std::make_shared<kiln::detail::CpuGraphProgram>(g, plan);
    if (!dynamic) return [prog](const std::vector<Tensor>& in) { return prog->run(in); };
    // each input shape gets its program (shapes, plan, memory plan) once; the trace and passes
    // are shared by all sizes
    auto shaped = std::make_shared<ShapeInstances<kiln::detail::CpuGraphProgram>>();
    const fuse::Limits lim = opt.limits;
    return [prog, shaped, lim](const std::vector<Tensor>& in) {
        const auto inst = shaped->get(in, [&] {
            ShapedPlan s = shaped_plan(prog->graph(), in, lim, -1);
            return std::make_shared<kiln::detail::CpuGraphProgram>(std::move(s.g), std::move(s.p));
        });
        return inst->run(in);
    };
}

}  // namespace detail

/// A compiled function: call it like the original. Thread-safe; concurrent first calls compile once.
template <class F>
class Compiled {
public:
    Compiled(F fn, Options opt) : fn_(std::move(fn)), opt_(std::move(opt)), state_(std::make_shared<State>()) {}

    template <class... Args>
    auto operator()(const Args&... args) {
        // results that are tensor expressions come back as Tensors
        using R = detail::materialized_t<std::invoke_result_t<F&, const Args&...>>;
        auto eager = [&]() -> R { return detail::materialize_result(fn_(args...)); };
        if (opt_.backend == Backend::none) return eager();
        detail::Flat flat;
        (detail::flatten(args, flat), ...);
        // fast path: a cached program whose guards pass (run outside the lock)
        std::shared_ptr<detail::Entry> hit;
        bool fallback = false;
        {
            std::shared_lock lock(state_->mu);
            hit = lookup(flat);
            fallback = state_->eager_fallback;
        }
        if (hit) return run_entry<R>(*hit, flat, args...);
        if (fallback) return eager();
        std::unique_lock lock(state_->mu);
        // A compile runs outside the lock, so calls whose programs are cached never wait for it;
        // a call whose guards an in-flight compile will satisfy waits for that one instead of
        // compiling the same program again.
        for (;;) {
            if (auto again = lookup(flat)) {  // compiled by a concurrent call meanwhile
                lock.unlock();
                return run_entry<R>(*again, flat, args...);
            }
            if (state_->eager_fallback) return eager();
            const bool in_flight = std::any_of(state_->compiling.begin(), state_->compiling.end(),
                                               [&](const auto& e) { return e->matches(flat); });
            if (!in_flight) break;
            state_->compiled.wait(lock);
        }
        // a recompile: why, and whether the limit allows it (a compile still in flight counts:
        // concurrent first calls with other shapes are recompiles too)
        const detail::Entry* last = !state_->entries.empty()     ? state_->entries.back().get()
                                    : !state_->compiling.empty() ? state_->compiling.back().get()
                                                                 : nullptr;
        if (last) {
            const std::string why = mismatch_reason(*last, flat);
            if (static_cast<int>(state_->entries.size() + state_->compiling.size()) >= opt_.recompile_limit) {
                const std::string msg = "kiln::compile: recompile limit (" + std::to_string(opt_.recompile_limit) +
                                        ") reached; last reason: " + why;
                if (opt_.stance == Stance::error) throw RecompileLimitError(msg);
                debug::Logs::instance().write("recompiles", msg + "; falling back to eager");
                std::fprintf(stderr, "kiln: warning: %s; running eagerly from now on\n", msg.c_str());
                state_->eager_fallback = true;
                return eager();
            }
            debug::log("recompiles", "recompiling: " + why);
        }
        auto entry = std::make_shared<detail::Entry>();
        entry->numbers = flat.numbers;
        entry->sizes = flat.sizes;
        // dims that already changed size become symbolic (automatic), or all of them (on)
        for (std::size_t i = 0; i < flat.tensors.size(); ++i) {
            std::vector<char>& dyn = dynamic_dims(i, flat.tensors[i].rank());
            entry->guards.push_back(cache::TensorGuard::of(flat.tensors[i], dyn));
        }
        state_->compiles++;
        state_->compiling.push_back(entry);
        // the entry leaves the in-flight list however this call ends, and the calls waiting on it
        // wake (to find it cached, or to compile themselves after a throw)
        struct InFlight {
            State& state;
            std::unique_lock<std::shared_mutex>& lock;
            std::shared_ptr<detail::Entry> entry;
            ~InFlight() {
                if (!lock.owns_lock()) lock.lock();
                std::erase(state.compiling, entry);
                state.compiled.notify_all();
            }
        } in_flight{*state_, lock, entry};
        lock.unlock();
        bool still_polymorphic = true;
        std::vector<trace::Break> breaks;
        R result = trace_first<R>(flat, *entry, still_polymorphic, breaks, args...);
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
        state_->polymorphic = state_->polymorphic && still_polymorphic;
        state_->last_breaks = std::move(breaks);
        state_->entries.push_back(entry);
        return result;
    }

    /// Programs compiled so far (recompiles + 1), and cached entries.
    int compiles() const { return state_->compiles; }
    /// Kernels of the most recent whole-graph program (0 for graph-breaking functions).
    int kernels() const {
        std::shared_lock lock(state_->mu);
        return state_->entries.empty() ? 0 : state_->entries.back()->kernels;
    }
    /// The optimized graph of the most recent program, as text.
    std::string graph() const {
        std::shared_lock lock(state_->mu);
        return state_->entries.empty() ? std::string() : state_->entries.back()->graph_text;
    }
    /// Graph breaks seen by the last trace.
    std::vector<trace::Break> graph_breaks() const {
        std::shared_lock lock(state_->mu);
        return state_->last_breaks;
    }
    /// The most recent program as Graphviz DOT, kernels as clusters.
    std::string dot() const {
        std::shared_lock lock(state_->mu);
        return state_->entries.empty() ? std::string() : state_->entries.back()->dot;
    }
    /// What the most recent compile produced, in words: graphs, breaks, kernels, the graph.
    std::string report() const {
        std::shared_lock lock(state_->mu);
        if (state_->entries.empty()) return "not compiled yet\n";
        const auto& e = *state_->entries.back();
        std::ostringstream s;
        s << "graphs: " << (e.lazy ? state_->last_breaks.size() + 1 : 1) << "\n";
        s << "graph breaks: " << state_->last_breaks.size() << "\n";
        for (const auto& b : state_->last_breaks) s << "  " << b.reason << " at " << kiln::detail::format_location(b.loc) << "\n";
        if (e.lazy) {
            s << "segments compiled: " << state_->segments.size() << "\n";
        } else {
            s << "kernels: " << e.kernels << "\n" << e.fusion_text << "graph:\n" << e.graph_text;
        }
        s << "compiles: " << state_->compiles << "\n";
        return s.str();
    }
    /// Whether the recompile limit switched this function to eager.
    bool fell_back_to_eager() const { return state_->eager_fallback; }

private:
    struct State {
        mutable std::shared_mutex mu;
        std::condition_variable_any compiled;  ///< notified when a compile finishes
        std::vector<std::shared_ptr<detail::Entry>> entries;
        std::vector<std::shared_ptr<detail::Entry>> compiling;  ///< compiles in flight (guards set, no program yet)
        bool polymorphic = true;  ///< no compile had to specialize a dim marked dynamic
        std::vector<std::vector<char>> dynamic;  ///< per argument tensor, per dim
        std::vector<std::vector<Dims>> seen;     ///< sizes seen per argument tensor
        std::mutex seg_mu;
        std::vector<detail::Segment> segments;
        std::vector<trace::Break> last_breaks;
        std::atomic<int> compiles{0};
        bool eager_fallback = false;
    };

    std::shared_ptr<detail::Entry> lookup(const detail::Flat& flat) const {
        for (const auto& e : state_->entries)
            if (e->matches(flat)) return e;
        return nullptr;
    }

    template <class R, class... Args>
    R run_entry(const detail::Entry& e, const detail::Flat& flat, const Args&... args) {
        if (e.lazy) return trace_call<R>(flat, e, args...);
        detail::check_written_memory_unshared(e.writes, flat.tensors);
        std::vector<Tensor> outs = e.run(flat.tensors);
        detail::apply_writes(outs, e.writes, flat.tensors);
        return unflatten<R>(outs, e.out_sizes);
    }

    std::vector<char>& dynamic_dims(std::size_t arg, int rank) {
        if (state_->dynamic.size() <= arg) state_->dynamic.resize(arg + 1);
        auto& d = state_->dynamic[arg];
        if (static_cast<int>(d.size()) != rank) d.assign(static_cast<std::size_t>(rank), opt_.dynamic == Dynamic::on ? 1 : 0);
        return d;
    }

    /// Why flat fails e's guards; under automatic dynamic, marks changed dims symbolic.
    std::string mismatch_reason(const detail::Entry& e, const detail::Flat& flat) {
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
                        cache::size_class(t.shape()[d]) == 2 && e.lazy == false && state_->polymorphic) {
                        dyn[static_cast<std::size_t>(d)] = 1;
                        why += "; marking dim " + std::to_string(d) + " dynamic";
                    }
            }
            if (!all.empty()) all += "; ";
            all += why;
        }
        return all.empty() ? "unknown" : all;
    }

    template <class... Args>
    auto call_traced(trace::Tracer& tr, const detail::Flat& flat, const Args&... args) {
        std::size_t k = 0;
        auto next = [&]() {
            const int arg = static_cast<int>(k++);
            return tr.input(flat.tensors[static_cast<std::size_t>(arg)], arg);
        };
        trace::ActiveScope scope(&tr);
        return detail::materialize_result(
            std::apply([&](const auto&... a) { return fn_(a...); }, std::tuple<Args...>{detail::rebuild(args, next)...}));
    }

    /// Runs a segment through the segment cache (graph-breaking functions). `own` (the last
    /// segment): which results may be an argument's memory (detail::copy_aliased_outputs).
    Executable segment_runner(const ir::Graph& raw, const std::vector<Tensor>& inputs, const std::vector<char>& own = {},
                              const std::vector<const void*>& memory = {}) {
        // the key comes from the graph without freezing: folding makes new constants on every
        // trace, whose addresses would never hash the same twice
        ir::Graph g = passes::run_pipeline(raw, opt_.freeze ? nullptr : graph_logger());
        detail::copy_aliased_outputs(g, own, memory);
        const std::uint64_t h = ir::structural_hash(g);
        std::lock_guard lock(state_->seg_mu);
        for (const auto& s : state_->segments) {
            if (s.hash != h || s.guards.size() != inputs.size()) continue;
            bool ok = true;
            for (std::size_t i = 0; i < inputs.size() && ok; ++i) ok = s.guards[i].matches(inputs[i]);
            if (ok) return s.run;
        }
        if (opt_.freeze) {
            g = passes::run_pipeline(raw, graph_logger(), {.freeze = true});
            detail::copy_aliased_outputs(g, own, memory);
        }
        detail::Segment s{h, {}, {}};
        for (const Tensor& t : inputs) s.guards.push_back(cache::TensorGuard::of(t, {}));
        int kernels = 0;
        s.run = detail::make_executable(g, opt_, kernels, false, detail::program_device(g, inputs));
        debug::log("cache", "compiled a graph segment (" + std::to_string(kernels) + " kernels)");
        state_->segments.push_back(s);
        return s.run;
    }

    std::function<void(const std::string&, const ir::Graph&)> graph_logger() const {
        if (!debug::log_on("graph")) return {};
        return [](const std::string& pass, const ir::Graph& g) { debug::log("graph", "after " + pass + ":\n" + ir::to_string(g)); };
    }

    template <class R>
    R unflatten(const std::vector<Tensor>& outs, const std::vector<std::size_t>& sizes) {
        std::size_t k = 0, s = 0;
        return unflatten_one<R>(outs, k, sizes, s);
    }
    template <class R>
    R unflatten_one(const std::vector<Tensor>& outs, std::size_t& k, const std::vector<std::size_t>& sizes, std::size_t& s) {
        using D = std::remove_cvref_t<R>;
        if constexpr (std::is_same_v<D, Tensor>) {
            return outs[k++];
        } else if constexpr (detail::is_vector<D>::value) {
            D out;
            const std::size_t n = sizes[s++];
            for (std::size_t i = 0; i < n; ++i) out.push_back(unflatten_one<typename D::value_type>(outs, k, sizes, s));
            return out;
        } else if constexpr (detail::is_array<D>::value) {
            D out;
            ++s;
            for (auto& x : out) x = unflatten_one<typename D::value_type>(outs, k, sizes, s);
            return out;
        } else if constexpr (detail::is_tuple_like<D>::value) {
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return D{unflatten_one<std::tuple_element_t<I, D>>(outs, k, sizes, s)...};
            }(std::make_index_sequence<std::tuple_size_v<D>>{});
        } else {
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return D{unflatten_one<detail::field_t<D, I>>(outs, k, sizes, s)...};
            }(std::make_index_sequence<detail::field_count<D>()>{});
        }
    }

    /// The first call for these guards: trace, optimize, fuse, run; keeps the program when the
    /// trace did not break.
    /// `still_polymorphic` receives false when this program had to specialize the dims its guards
    /// mark dynamic (mark no more); `breaks` receives the graph breaks. Runs without the lock.
    template <class R, class... Args>
    R trace_first(const detail::Flat& flat, detail::Entry& entry, bool& still_polymorphic,
                  std::vector<trace::Break>& breaks, const Args&... args) {
        trace::Tracer tr([this](const ir::Graph& g, const std::vector<Tensor>& in) { return segment_runner(g, in)(in); },
                         opt_.fullgraph);
        R traced = call_traced(tr, flat, args...);
        detail::Flat outs;
        detail::flatten(traced, outs);
        entry.out_sizes = outs.sizes;
        breaks = tr.breaks();
        for (const auto& b : tr.breaks())
            debug::log("graph_breaks", "graph break (" + b.reason + ") at " + kiln::detail::format_location(b.loc));
        if (!tr.breaks().empty()) {
            entry.lazy = true;
            return finish_segment<R>(tr, flat, outs, entry.out_sizes);
        }
        // one whole graph
        ir::Graph& g = tr.graph();
        std::vector<char> own;
        std::vector<const void*> memory;
        for (const Tensor& t : outs.tensors) {
            g.outputs.push_back(tr.node_of(t));
            own.push_back(tr.returns_own_memory(t));
            memory.push_back(tr.memory_of(t));
        }
        entry.writes = tr.write_backs();
        detail::check_written_memory_unshared(entry.writes, flat.tensors);
        for (const auto& w : entry.writes) g.outputs.push_back(w.node);
        ir::Graph opt = passes::run_pipeline(g, graph_logger(), {.freeze = opt_.freeze});
        detail::copy_aliased_outputs(opt, own, memory);
        bool dynamic = false;
        for (const auto& gd : entry.guards)
            for (auto d : gd.dims) dynamic = dynamic || d == cache::symbolic;
        // a view that slices, merges or broadcasts a symbolic dim bakes its size in: specialize
        // after all (the caller re-guards the entry on every size, under its lock), and mark no
        // more dims dynamic
        still_polymorphic = !dynamic || detail::follows_symbolic_dims(opt, flat.tensors, entry.guards);
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
        entry.run = detail::make_executable(opt, opt_, entry.kernels, dynamic, detail::program_device(opt, tr.segment_inputs()));
        debug::log("cache", "compiled " + std::to_string(entry.kernels) + " kernel(s), graph hash " + std::to_string(entry.hash));
        if (debug::log_on("output_code")) debug::log("output_code", entry.graph_text);
        std::vector<Tensor> results = entry.run(tr.segment_inputs());
        detail::apply_writes(results, entry.writes, flat.tensors);
        return unflatten<R>(results, entry.out_sizes);
    }

    /// A graph-breaking function's later calls: trace again, segments come from their cache.
    template <class R, class... Args>
    R trace_call(const detail::Flat& flat, const detail::Entry& entry, const Args&... args) {
        trace::Tracer tr([this](const ir::Graph& g, const std::vector<Tensor>& in) { return segment_runner(g, in)(in); },
                         opt_.fullgraph);
        R traced = call_traced(tr, flat, args...);
        detail::Flat outs;
        detail::flatten(traced, outs);
        return finish_segment<R>(tr, flat, outs, entry.out_sizes);
    }

    template <class R>
    R finish_segment(trace::Tracer& tr, const detail::Flat& flat, const detail::Flat& outs, const std::vector<std::size_t>& sizes) {
        // the last segment computes the results (values from earlier segments pass through)
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
        detail::check_written_memory_unshared(writes, flat.tensors);
        for (const auto& w : writes) g.outputs.push_back(w.node);
        if (!g.outputs.empty()) {
            std::vector<Tensor> got = segment_runner(g, tr.segment_inputs(), own, memory)(tr.segment_inputs());
            detail::apply_writes(got, writes, flat.tensors);
            for (std::size_t k = 0; k < pending.size(); ++k) results[pending[k]] = got[k];
        }
        return unflatten<R>(results, sizes);
    }

    F fn_;
    Options opt_;
    std::shared_ptr<State> state_;
};

/// Compiles fn: its first call traces it into a graph, which is optimized, fused and cached;
/// later calls whose inputs pass the guards run the cached program without calling fn.
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, Options opt = {}) {
    return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(opt));
}

/// Compiles fn and calls it once with args, then reports what kiln made of it: graphs, graph
/// breaks (with source locations), fusion groups and kernels, and the optimized graph.
template <class F, class... Args>
std::string explain(F&& fn, const Args&... args) {
    auto c = compile(std::forward<F>(fn));
    (void)c(args...);
    return c.report();
}

}  // namespace kiln
