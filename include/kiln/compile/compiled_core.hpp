// The part of a compiled function that does not depend on its type: the cache of programs under
// guards, recompiles and automatic dynamic dims, tracing through a callback, graph breaks and
// segments. kiln::Compiled<F> is a thin template over it, so each compiled lambda instantiates
// only the flattening of its arguments and results and the call of the lambda itself; the rest is
// compiled once (compiled_core_impl.hpp; once per program under KILN_SEPARATE_COMPILATION).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/compile/options.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/function_ref.hpp"
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

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/compile/compiled_core_impl.hpp"
#endif
