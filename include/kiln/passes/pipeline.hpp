// The pass pipeline: one straight line, verified after every pass, optionally logged.
#pragma once

#include <functional>
#include <string>

#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/ir/verify.hpp"
#include "kiln/passes/constant_layouts.hpp"
#include "kiln/passes/delay_waits.hpp"
#include "kiln/passes/eliminate_common_subexpressions.hpp"
#include "kiln/passes/eliminate_dead_code.hpp"
#include "kiln/passes/fold_call_epilogue.hpp"
#include "kiln/passes/fold_conv_affine.hpp"
#include "kiln/passes/fold_constants.hpp"
#include "kiln/passes/simplify.hpp"

namespace kiln::passes {

/// What the pipeline may assume about the graph.
struct PipelineOptions {
    /// Captured tensors (Kind::constant) may be read now and folded into new constants
    /// (kiln::Options::freeze): fold_conv_affine runs.
    bool freeze = false;
    /// The captured tensors are the program's own copies (an exported program's lifted tensors,
    /// bound by ExportedProgram::run): constant_layouts may bind them in another layout. Implied
    /// by freeze.
    bool owns_constants = false;
};

/// Runs the passes in order; `log(name, graph)` (when set) sees the graph after each one.
inline ir::Graph run_pipeline(ir::Graph g, const std::function<void(const std::string&, const ir::Graph&)>& log = {},
                              PipelineOptions opt = {}) {
    auto step = [&](const char* name, ir::Graph next) {
        ir::verify(next, name);
        if (log) log(name, next);
        return next;
    };
    if (log) log("trace", g);
    ir::verify(g, "trace");
    g = step("fold_constants", fold_constants(std::move(g)));
    g = step("eliminate_common_subexpressions", eliminate_common_subexpressions(g));
    g = step("simplify", simplify(g));
    if (opt.freeze) g = step("fold_conv_affine", fold_conv_affine(g));
    g = step("fold_call_epilogue", fold_call_epilogue(g));
    if (opt.freeze || opt.owns_constants) g = step("constant_layouts", constant_layouts(g));
    g = step("fold_constants", fold_constants(std::move(g)));
    g = step("eliminate_common_subexpressions", eliminate_common_subexpressions(g));
    g = step("eliminate_dead_code", eliminate_dead_code(g));
    g = step("delay_waits", delay_waits(g));
    return g;
}

}  // namespace kiln::passes
