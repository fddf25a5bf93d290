// kiln::export_program: a strict capture of a function into one self-contained program (its graph
// in canonical op names, parameters lifted to named inputs, shape constraints on named dims), run
// through the same passes, fuser and caches as kiln::compile; saved to and loaded from one file
// (export/program_file.hpp) that needs no C++ source to run. docs/EXPORT.md describes the format.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/compile.hpp"
#include "kiln/compile/program.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/core/function_ref.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

/// A named dynamic dim and its range, like torch.export.Dim("batch", min=1, max=64). Dims of one
/// name are one size: declaring two inputs' dims with one Dim constrains them to be equal.
struct Dim {
    std::string name;
    std::int64_t min = 1;
    std::int64_t max = std::numeric_limits<std::int64_t>::max();
    Dim() = default;
    Dim(std::string n, std::int64_t lo = 1, std::int64_t hi = std::numeric_limits<std::int64_t>::max())
        : name(std::move(n)), min(lo), max(hi) {}
    /// "batch in [1, 64]"
    std::string str() const {
        return name + " in [" + std::to_string(min) + ", " + (max == std::numeric_limits<std::int64_t>::max() ? "inf" : std::to_string(max)) + "]";
    }
};

/// Per tensor argument (flattened, in order), the dims that are dynamic: {dim index -> Dim}. An
/// argument without an entry, or missing from the end, is static.
using DynamicShapes = std::vector<std::map<int, Dim>>;

struct ExportOptions {
    /// Names for the tensors the function captures (a module's parameters: nn::named_parameters(m)),
    /// lifted to inputs of kind "parameter"; `buffers` (BatchNorm's running statistics) to kind
    /// "buffer". A captured tensor in neither becomes "constant" input `_tensor_constant<N>`.
    std::map<std::string, Tensor> parameters{};
    std::map<std::string, Tensor> buffers{};
    /// Names of the tensor arguments (flattened); missing ones are arg0, arg1, ...
    std::vector<std::string> input_names{};
    /// Names of the results (flattened); missing ones are output0, output1, ...
    std::vector<std::string> output_names{};
};

/// What an exported program's input or output is.
struct TensorSpec {
    enum class Kind : std::uint8_t { user_input, parameter, buffer, constant, user_output };
    std::string name;
    Kind kind = Kind::user_input;
    DType dtype = DType::f32;
    Shape shape;                         ///< the example's sizes
    std::vector<std::string> dim_names;  ///< per dim: the Dim it follows, or "" where it is static
    /// "float32[batch, 784]"
    std::string type_str() const {
        std::string s = std::string(dtype_name(dtype)) + "[";
        for (int d = 0; d < shape.rank(); ++d) {
            if (d) s += ", ";
            const std::string& n = dim_names[static_cast<std::size_t>(d)];
            s += n.empty() ? std::to_string(shape[d]) : n;
        }
        return s + "]";
    }
};
inline const char* spec_kind_name(TensorSpec::Kind k) {
    switch (k) {
        case TensorSpec::Kind::user_input: return "user_input";
        case TensorSpec::Kind::parameter: return "parameter";
        case TensorSpec::Kind::buffer: return "buffer";
        case TensorSpec::Kind::constant: return "constant";
        case TensorSpec::Kind::user_output: return "user_output";
    }
    return "?";
}

/// A captured program: call it with tensors (the function's flattened tensor arguments) to get its
/// flattened results. Thread-safe; copies share their compiled programs.
class ExportedProgram {
public:
    /// The graph: nodes in canonical op names; inputs are the user inputs, then the lifted
    /// parameters, buffers and constants (node kind `input`, index = position in input_specs()).
    const ir::Graph& graph() const { return state_->graph; }
    const std::vector<TensorSpec>& input_specs() const { return state_->inputs; }
    const std::vector<TensorSpec>& output_specs() const { return state_->outputs; }
    /// The lifted tensors by name (parameters, buffers, constants), as saved.
    const std::map<std::string, Tensor>& state_dict() const { return state_->state; }
    /// The named dynamic dims and their ranges.
    const std::vector<Dim>& dims() const { return state_->dims; }
    int num_user_inputs() const { return state_->user_inputs; }
    /// Per node, per dim: "" where it is static, else its size as a formula of the Dims ("batch", "6*batch").
    const std::vector<std::vector<std::string>>& node_dims() const { return state_->node_dims; }

    /// The graph as text, like torch's ep.graph: named inputs with symbolic shapes, one line per node.
    KILN_DECL std::string graph_str() const;
    /// The whole program: the graph, the specs and the constraints.
    KILN_DECL std::string str() const;

    /// Runs the program on the user inputs (any device: parameters follow the inputs' device).
    /// Inputs outside the constraints raise ConstraintError naming the dim and its range.
    KILN_DECL std::vector<Tensor> run(const std::vector<Tensor>& inputs, std::source_location loc = std::source_location::current()) const;
    template <class... T>
        requires(std::is_same_v<std::remove_cvref_t<T>, Tensor> && ...)
    std::vector<Tensor> operator()(const T&... inputs) const {
        return run(std::vector<Tensor>{inputs...});
    }
    /// How run() compiles the program (mode, backend, freeze...); the default is kiln::compile's.
    void set_options(Options opt) {
        std::lock_guard lock(state_->mu);
        state_->opt = std::move(opt);
        state_->runners.clear();
    }
    /// Kernels of the program compiled for the last run (0 before any run).
    int kernels() const {
        std::lock_guard lock(state_->mu);
        return state_->last_kernels;
    }

    /// Writes the program to one file (a safetensors file whose metadata holds the graph): written
    /// under a temporary name and renamed, so a failure leaves no file behind.
    KILN_DECL void save(const std::string& path, std::source_location loc = std::source_location::current()) const;

    /// Checks the inputs against the specs and constraints (what run() does first).
    KILN_DECL void check_inputs(const std::vector<Tensor>& inputs, const std::source_location& loc) const;

    // ---- used by export_program and load_program
    struct State {
        ir::Graph graph;
        std::vector<TensorSpec> inputs, outputs;
        std::map<std::string, Tensor> state;
        std::vector<Dim> dims;
        int user_inputs = 0;
        std::vector<std::vector<std::string>> node_dims;  ///< per node, per dim: its Dim's name or ""
        mutable std::mutex mu;
        Options opt{};
        mutable std::map<int, Executable> runners;  ///< by device (-1: the CPU)
        mutable int last_kernels = 0;
    };
    explicit ExportedProgram(std::shared_ptr<State> s) : state_(std::move(s)) {}

private:
    KILN_DECL Executable runner(int device) const;
    std::shared_ptr<State> state_;
};

namespace detail {

/// One trace of the function, optimized, with its captured tensors lifted to named inputs after the
/// user's (in order of first use).
struct Captured {
    ir::Graph graph;
    std::vector<TensorSpec> lifted;
    std::vector<Tensor> lifted_tensors;
};

/// The graph of one trace (the function has run under `tr`, returning `outs`): outputs, the pure
/// function check, the passes, then the captured tensors lifted to inputs.
KILN_DECL Captured capture(trace::Tracer& tr, int n_user, const Flat& outs, const ExportOptions& opt, const std::source_location& loc);

/// Runs one trace of the user's function over these argument tensors.
using TraceAt = FunctionRef<Captured(const std::vector<Tensor>&)>;

/// export_program once the function can be traced (not a template): the example trace, then, with
/// dynamic dims, one trace per corner of the Dims' sizes and a check trace, whose graphs must be
/// one program; the numbers of its views become formulas of the inputs' dims (ir::SymView).
KILN_DECL ExportedProgram finish_export(const TraceAt& trace_at, const Flat& args, const DynamicShapes& dynamic, const ExportOptions& opt,
                                        const std::source_location& loc);

}  // namespace detail

/// Captures fn as one program over example arguments (a tuple, flattened as kiln::compile does),
/// with the dims `dynamic` declares free to change within their ranges. Strict: a graph break (a
/// tensor's value read while tracing: item(), data(), at(), a branch on a value) is an ExportError
/// naming the construct and where; so is a dynamic dim the program must specialize. With dynamic
/// dims the function is traced once more per corner of the Dims' sizes (2^Dims) and once to check.
template <class F, class... Args>
ExportedProgram export_program(F&& fn, const std::tuple<Args...>& example_args, const DynamicShapes& dynamic = {},
                               const ExportOptions& opt = {}, std::source_location loc = std::source_location::current()) {
    using R = detail::materialized_t<std::invoke_result_t<F&, const Args&...>>;
    detail::Flat flat;
    std::apply([&](const auto&... a) { (detail::flatten(a, flat), ...); }, example_args);
    for (const Tensor& t : flat.tensors)
        if (!t.defined()) kiln::detail::fail<ExportError>("export_program", "an example argument is an undefined tensor", loc);
    auto trace_at = [&](const std::vector<Tensor>& tensors) -> detail::Captured {
        trace::Tracer tr([](const ir::Graph&, const std::vector<Tensor>&) -> std::vector<Tensor> {
            throw InternalError("kiln::export_program: a graph segment ran under a strict capture");
        }, /*fullgraph=*/true);
        detail::Flat outs;
        const no_grad inference;  // an exported program computes values, not gradients
        try {
            trace::ActiveScope scope(&tr);
            std::size_t k = 0;
            auto next = [&]() {
                const int arg = static_cast<int>(k++);
                return tr.input(tensors[static_cast<std::size_t>(arg)], arg);
            };
            std::tuple<Args...> traced = std::apply([&](const auto&... a) { return std::tuple<Args...>{detail::rebuild(a, next)...}; }, example_args);
            R r = detail::materialize_result(std::apply([&](const auto&... a) { return fn(a...); }, traced));
            detail::flatten(r, outs);
        } catch (const GraphBreakError&) {
            const trace::Break b = tr.breaks().empty() ? trace::Break{loc, "a graph break"} : tr.breaks().back();
            kiln::detail::fail<ExportError>(
                "export_program",
                b.reason + " at " + kiln::detail::format_location(b.loc) +
                    " reads a tensor's value while the function is traced, which breaks the graph: an exported program is one graph "
                    "and cannot depend on values (a C++ branch on a tensor's value, item(), data(), at()). Compute it with tensor ops "
                    "(kiln::where for a branch), or pass the value in as an argument",
                loc);
        }
        return detail::capture(tr, static_cast<int>(tensors.size()), outs, opt, loc);
    };
    return detail::finish_export(trace_at, flat, dynamic, opt, loc);
}

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/export/program_impl.hpp"
#endif
