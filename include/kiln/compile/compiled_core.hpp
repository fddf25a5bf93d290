// The part of a compiled function that does not depend on its type: the cache of programs under
// guards, recompiles and automatic dynamic dims, tracing through a callback, graph breaks and
// segments. kiln::Compiled<F> is a thin template over it, so each compiled lambda instantiates
// only the flattening of its arguments and results and the call of the lambda itself; the rest is
// compiled once (compiled_core_impl.hpp; once per program under KILN_SEPARATE_COMPILATION).
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/compile/options.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/function_ref.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::detail {

/// Calls the user's function once under a tracer (its tensor arguments replaced by the tracer's
/// inputs) and returns its results, flattened. Called only during CompiledCore::call.
using TraceFn = FunctionRef<Flat(trace::Tracer&)>;

class CompileCache;

class CompiledCore {
public:
    KILN_DECL explicit CompiledCore(Options opt);
    KILN_DECL ~CompiledCore();
    CompiledCore(const CompiledCore&) = delete;
    CompiledCore& operator=(const CompiledCore&) = delete;

    KILN_DECL const Options& options() const;
    /// One call with these flattened arguments: the cached program whose guards pass, or a trace
    /// (through `trace`) and compile. Returns the results, flattened, with the sizes of their
    /// vectors in `out_sizes`; nullopt when the function runs eagerly (the recompile limit).
    KILN_DECL std::optional<std::vector<Tensor>> call(const Flat& flat, std::vector<std::size_t>& out_sizes, const TraceFn& trace);
    KILN_DECL int compiles() const;
    KILN_DECL int kernels() const;
    KILN_DECL std::string graph() const;
    KILN_DECL std::vector<trace::Break> graph_breaks() const;
    KILN_DECL std::string dot() const;
    KILN_DECL std::string report() const;
    KILN_DECL bool fell_back_to_eager() const;

private:
    std::unique_ptr<CompileCache> cache_;
};

/// A row composite (ops/nn.hpp: softmax, log_softmax, layer_norm, rms_norm) on concrete tensors,
/// run as one compiled program: one CompiledCore per op, arguments, dtype, device, rank and
/// layout, process-wide (a size that changes becomes a dynamic dim of that program, so a model's
/// eager calls compile each composite once or twice). nullopt where it runs eagerly after all
/// (the recompile limit).
KILN_DECL std::optional<Tensor> run_row_composite(const RowCompositeCall& c, const std::source_location& loc);
/// What run_row_composite did: calls its programs ran, and programs compiled (recompiles included).
struct RowCompositeStats {
    std::int64_t calls = 0, programs = 0;
};
KILN_DECL RowCompositeStats row_composite_stats();
/// Makes the ops' row composites run through run_row_composite (a function pointer: the ops layer
/// cannot include this one), unless KILN_EAGER_COMPOSITES=0.
inline const bool row_composites_compiled = [] {
    const char* e = std::getenv("KILN_EAGER_COMPOSITES");
    if (!(e && std::string_view(e) == "0")) row_composite_runner() = &run_row_composite;
    return true;
}();

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/compile/compiled_core_impl.hpp"
#endif
