// kiln::export_program's and ExportedProgram's definitions (compiled once in separate compilation),
// included by export/program.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/printer.hpp"
#include "kiln/passes/pipeline.hpp"

namespace kiln {
namespace detail {


/// The Dim a dim of a spec follows, by name (nullptr: static).
inline const Dim* find_dim(const std::vector<Dim>& dims, const std::string& name) {
    for (const Dim& d : dims)
        if (d.name == name) return &d;
    return nullptr;
}

/// A node for messages: "matmul(%3, %5) : float32(8, 16) at model.cpp:42", the location of the
/// node or, for a view (which records none), of the first user that has one.
inline std::string describe_for_user(const ir::Graph& g, int id) {
    std::string s = "%" + std::to_string(id) + " = " + ir::describe(g, id) + " : " + std::string(dtype_name(g[id].dtype)) + g[id].shape.str();
    auto has_loc = [](const ir::Node& n) { return n.loc.line() != 0; };
    if (has_loc(g[id])) return s + " at " + format_location(g[id].loc);
    for (int u = id + 1; u < g.size(); ++u)
        for (int j : g[u].in)
            if (j == id && has_loc(g[u])) return s + ", used by " + std::string(ir::kind_name(g[u].kind)) + " %" + std::to_string(u) + " at " +
                                                 format_location(g[u].loc);
    return s;
}

/// The graph of one trace (the function has run under `tr`, returning `outs`): outputs, the pure
/// function check, the passes, then the captured tensors lifted to inputs.
KILN_DECL Captured capture(trace::Tracer& tr, int n_user, const Flat& outs, const ExportOptions& opt, const std::source_location& loc) {
    auto fail = [&](const std::string& what) { kiln::detail::fail<ExportError>("export_program", what, loc); };
    if (!outs.numbers.empty()) fail("the function returns a number; an exported program returns tensors only");
    if (outs.tensors.empty()) fail("the function returns no tensor");
    ir::Graph& g = tr.graph();
    std::vector<char> own;
    std::vector<const void*> memory;
    tr.set_outputs(outs.tensors, own, memory);
    if (const auto writes = tr.write_backs(); !writes.empty()) {
        const auto& w = writes.front();
        fail(std::string("the function writes into ") + (w.arg >= 0 ? "its tensor argument " + std::to_string(w.arg) : "a tensor it captured") +
             ": an exported program is a pure function of its inputs. Return the new value instead (for a module in training "
             "mode, which updates BatchNorm's running statistics, call nn::eval(model) before exporting)");
    }
    ir::Graph o = passes::run_pipeline(g);
    copy_aliased_outputs(o, own, memory);
    for (const ir::Node& n : o.nodes)
        if (n.kind == ir::Kind::call && n.call->name.empty())
            fail("library op '" + n.call->key + "' has no saved form (no registered name), so a program with it cannot be exported");

    // the captured tensors become inputs: a named tensor (or a view of one: w.t()) is that input
    // (through a view node); others are constants of their own
    auto same_view = [](const Tensor& a, const Tensor& b) {
        return a.storage() == b.storage() && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
    };
    auto inside = [](const Tensor& whole, const Tensor& v) {  // v reads only elements of dense `whole`
        std::vector<std::int64_t> order;
        if (v.storage() != whole.storage() || v.dtype() != whole.dtype() || !dense_order(whole.shape(), whole.strides(), order) ||
            v.offset() < whole.offset())
            return false;
        std::int64_t last = v.offset();
        for (int d = 0; d < v.rank(); ++d) {
            if (v.shape()[d] == 0) return true;
            if (v.strides()[d] < 0) return false;
            last += (v.shape()[d] - 1) * v.strides()[d];
        }
        return last < whole.offset() + whole.numel();
    };
    Captured c;
    ir::Graph& out = c.graph;
    std::vector<int> remap(static_cast<std::size_t>(o.size()), -1);
    std::map<std::string, int> input_node;  // lifted name -> its node in `out`
    for (int i = 0; i < o.size(); ++i) {
        const ir::Node& n = o[i];
        if (n.kind != ir::Kind::constant) {
            ir::Node m = n;
            for (int& j : m.in) j = remap[static_cast<std::size_t>(j)];
            remap[static_cast<std::size_t>(i)] = out.add(std::move(m));
            if (n.kind == ir::Kind::input) out.inputs.push_back(remap[static_cast<std::size_t>(i)]);
            continue;
        }
        std::string name;
        Tensor whole;
        TensorSpec::Kind kind = TensorSpec::Kind::constant;
        for (int pass = 0; pass < 2 && name.empty(); ++pass)  // the exact tensor first, then one it views
            for (const auto* named : {&opt.parameters, &opt.buffers})
                for (const auto& [k, t] : *named)
                    if (name.empty() && t.defined() && (pass == 0 ? same_view(t, n.tensor) : inside(t, n.tensor))) {
                        name = k;
                        whole = t;
                        kind = named == &opt.parameters ? TensorSpec::Kind::parameter : TensorSpec::Kind::buffer;
                    }
        if (name.empty()) {
            // an unnamed view (a captured w.t()): the memory it spans, as one row, and a view of it,
            // so the weights keep their layout and nothing is copied
            whole = n.tensor;
            if (!n.tensor.is_contiguous() && n.tensor.numel() > 0 && n.tensor.storage()) {
                std::int64_t span = 1;
                bool ok = true;
                for (int d = 0; d < n.tensor.rank(); ++d) {
                    ok = ok && n.tensor.strides()[d] >= 0;
                    span += (n.tensor.shape()[d] - 1) * n.tensor.strides()[d];
                }
                if (ok && span <= 2 * n.tensor.numel())
                    whole = Tensor(n.tensor.storage(), n.tensor.offset(), Shape{span}, Strides{1}, n.tensor.dtype());
            }
            for (std::size_t k = 0; k < c.lifted.size() && name.empty(); ++k)
                if (c.lifted[k].kind == TensorSpec::Kind::constant && same_view(c.lifted_tensors[k], whole)) name = c.lifted[k].name;
            if (name.empty()) {
                // a fresh name, never one a parameter, buffer, input or earlier constant has (a model
                // imported from ONNX has parameters named "_tensor_constant0" ...: reusing one of
                // those names would bind this constant to that parameter's values)
                auto taken = [&](const std::string& s) {
                    return input_node.count(s) || opt.parameters.count(s) || opt.buffers.count(s) ||
                           std::find(opt.input_names.begin(), opt.input_names.end(), s) != opt.input_names.end();
                };
                int count = 0;
                for (const TensorSpec& t : c.lifted) count += t.kind == TensorSpec::Kind::constant;
                do name = "_tensor_constant" + std::to_string(count++);
                while (taken(name));
            }
        }
        if (!input_node.count(name)) {
            ir::Node in;
            in.kind = ir::Kind::input;
            in.dtype = whole.dtype();
            in.shape = whole.shape();
            in.index = n_user + static_cast<int>(c.lifted.size());
            const int id = out.add(std::move(in));
            out.inputs.push_back(id);
            input_node[name] = id;
            TensorSpec sp;
            sp.name = name;
            sp.kind = kind;
            sp.dtype = whole.dtype();
            sp.shape = whole.shape();
            sp.dim_names.assign(static_cast<std::size_t>(sp.shape.rank()), "");
            c.lifted.push_back(std::move(sp));
            c.lifted_tensors.push_back(whole);
        }
        const int id = input_node[name];
        if (same_view(whole, n.tensor)) {
            remap[static_cast<std::size_t>(i)] = id;
        } else {  // a view of the named tensor's memory
            int memory = id;  // the input holds the tensor row-major: its memory where it is contiguous
            if (const std::vector<std::int64_t> order = memory_order(whole); !order.empty()) {
                // laid out otherwise (a channels-last weight): its memory is the input read in that
                // order (a view of the row-major input) and copied, which the view below then reads
                ir::Node in_order;
                in_order.kind = ir::Kind::view;
                in_order.dtype = whole.dtype();
                in_order.shape = permuted(whole.shape(), order);
                in_order.args = permuted(contiguous_strides(whole.shape()), order);
                in_order.in = {id};
                ir::Node copy;
                copy.kind = ir::Kind::elementwise;
                copy.op = ops::op_id<ops::Copy>;
                copy.dtype = copy.attr = whole.dtype();
                copy.ct = cast_compute_dtype(whole.dtype(), whole.dtype());
                copy.shape = in_order.shape;
                copy.in = {out.add(std::move(in_order))};
                memory = out.add(std::move(copy));
            }
            ir::Node v;
            v.kind = ir::Kind::view;
            v.dtype = n.tensor.dtype();
            v.shape = n.tensor.shape();
            v.in = {memory};
            v.args = n.tensor.strides();
            v.value = static_cast<double>(n.tensor.offset() - whole.offset());
            remap[static_cast<std::size_t>(i)] = out.add(std::move(v));
        }
    }
    for (int j : o.outputs) out.outputs.push_back(remap[static_cast<std::size_t>(j)]);
    return c;
}

/// Why two traces of one function are not one program with other sizes ("" when they are): the
/// same nodes, ops, operands, dtypes and attributes; sizes, strides and offsets may differ.
inline std::string structure_difference(const Captured& a, const Captured& b) {
    const ir::Graph &x = a.graph, &y = b.graph;
    if (x.size() != y.size() || x.outputs != y.outputs || x.inputs != y.inputs || a.lifted.size() != b.lifted.size())
        return "the traces have different graphs (" + std::to_string(x.size()) + " and " + std::to_string(y.size()) + " nodes)";
    for (std::size_t k = 0; k < a.lifted.size(); ++k)
        if (a.lifted[k].name != b.lifted[k].name || !(a.lifted[k].shape == b.lifted[k].shape))
            return "the captured tensor '" + a.lifted[k].name + "' differs between the traces (a tensor made inside the function from a size?)";
    for (int i = 0; i < x.size(); ++i) {
        const ir::Node &p = x[i], &q = y[i];
        bool same = p.kind == q.kind && p.dtype == q.dtype && p.in == q.in && p.shape.rank() == q.shape.rank();
        if (same) switch (p.kind) {
                case ir::Kind::input: same = p.index == q.index; break;
                case ir::Kind::scalar: same = p.value == q.value || (p.value != p.value && q.value != q.value); break;
                case ir::Kind::elementwise: same = p.op == q.op && p.ct == q.ct && p.attr == q.attr; break;
                case ir::Kind::reduce: same = p.rkind == q.rkind && p.mask == q.mask && p.keepdim == q.keepdim && p.correction == q.correction; break;
                case ir::Kind::arg_reduce: same = p.arg_max == q.arg_max && p.mask == q.mask && p.keepdim == q.keepdim; break;
                case ir::Kind::view: case ir::Kind::view_write: same = p.args.rank() == q.args.rank() && p.mask == q.mask; break;
                case ir::Kind::call: same = p.call->name == q.call->name && p.call->attrs == q.call->attrs; break;
                case ir::Kind::matmul: case ir::Kind::constant: break;
            }
        if (!same) {
            std::string why = "node %" + std::to_string(i) + " differs between the traces: " + describe_for_user(x, i) + " and " + ir::describe(y, i);
            if (p.kind == ir::Kind::scalar)
                why += " (a number computed from a size, such as x.size(1) in a formula, is a constant of the trace: compute it with tensor ops, "
                       "or keep that dim static)";
            return why;
        }
    }
    return "";
}

/// The multilinear fit of one number over the Dims' corner traces: weights per subset of Dims
/// (differences divided by the size steps), or nullopt where they are not integers.
inline std::optional<ir::SymView::Number> fit_number(const std::vector<std::int64_t>& at_corner, const std::vector<std::int64_t>& step) {
    const unsigned k = static_cast<unsigned>(step.size());
    ir::SymView::Number out;
    for (unsigned s = 0; s < (1u << k); ++s) {
        std::int64_t diff = 0;
        for (unsigned t = s;; t = (t - 1) & s) {  // inclusion-exclusion over the subsets t of s
            diff += ((std::popcount(s ^ t) & 1) ? -1 : 1) * at_corner[t];
            if (t == 0) break;
        }
        std::int64_t den = 1;
        for (unsigned d = 0; d < k; ++d)
            if ((s >> d) & 1u) den *= step[d];
        if (diff % den != 0) return std::nullopt;
        if (diff != 0) out.emplace_back(s, diff / den);
    }
    return out;
}

/// A number's formula in the Dims' names, for printing: "batch", "5*batch", "batch*seq + 1".
inline std::string formula_text(const ir::SymView::Number& n, const std::vector<Dim>& dims, const std::vector<std::int64_t>& base) {
    // expand w * prod (x_d - b_d) into monomials
    std::map<unsigned, std::int64_t> mono;
    for (const auto& [mask, w] : n)
        for (unsigned t = mask;; t = (t - 1) & mask) {
            std::int64_t c = w;
            for (std::size_t d = 0; d < dims.size(); ++d)
                if (((mask >> d) & 1u) && !((t >> d) & 1u)) c *= -base[d];
            mono[t] += c;
            if (t == 0) break;
        }
    std::string s;
    for (auto it = mono.rbegin(); it != mono.rend(); ++it) {
        const auto [t, c] = *it;
        if (c == 0) continue;
        std::string term;
        for (std::size_t d = 0; d < dims.size(); ++d)
            if ((t >> d) & 1u) term += (term.empty() ? "" : "*") + dims[d].name;
        const std::int64_t mag = c < 0 ? -c : c;
        if (term.empty()) term = std::to_string(mag);
        else if (mag != 1) term = std::to_string(mag) + "*" + term;
        s += s.empty() ? (c < 0 ? "-" + term : term) : (c < 0 ? " - " : " + ") + term;
    }
    return s.empty() ? "0" : s;
}

/// export_program once the function can be traced (not a template): the example trace, then, with
/// dynamic dims, one trace per corner of the Dims' sizes and a check trace, whose graphs must be
/// one program; the numbers of its views become formulas of the inputs' dims (ir::SymView).
KILN_DECL ExportedProgram finish_export(const TraceAt& trace_at, const Flat& args, const DynamicShapes& dynamic, const ExportOptions& opt,
                                        const std::source_location& loc) {
    auto fail = [&](const std::string& what) { kiln::detail::fail<ExportError>("export_program", what, loc); };
    const int n_user = static_cast<int>(args.tensors.size());
    auto state = std::make_shared<ExportedProgram::State>();
    // ---- the dynamic dims, checked
    if (dynamic.size() > args.tensors.size())
        fail("dynamic_shapes has " + std::to_string(dynamic.size()) + " entries for " + std::to_string(n_user) + " tensor arguments");
    std::vector<std::int64_t> example;                 // per Dim
    std::vector<std::pair<int, int>> first_at;         // per Dim: where it first appears
    std::vector<std::vector<std::string>> in_dims(static_cast<std::size_t>(n_user));
    for (int i = 0; i < n_user; ++i) in_dims[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(args.tensors[static_cast<std::size_t>(i)].rank()), "");
    for (std::size_t i = 0; i < dynamic.size(); ++i) {
        const Tensor& t = args.tensors[i];
        for (const auto& [d, dim] : dynamic[i]) {
            const std::string where = "argument " + std::to_string(i) + " dim " + std::to_string(d);
            if (d < 0 || d >= t.rank()) fail(where + ": the argument " + t.shape().str() + " has no such dim");
            if (dim.name.empty()) fail(where + ": a Dim needs a name");
            if (dim.min < 1 || dim.min > dim.max)
                fail(where + ": Dim '" + dim.name + "' has the range [" + std::to_string(dim.min) + ", " + std::to_string(dim.max) +
                     "]: ranges are non-empty and start at 1 or more");
            const std::int64_t v = t.shape()[d];
            if (v < 2)
                fail(where + " is " + std::to_string(v) + " in the example, and sizes 0 and 1 specialize a program (they change broadcasting): "
                             "export with an example of size 2 or more for Dim '" + dim.name + "'");
            if (v < dim.min || v > dim.max) fail(where + " is " + std::to_string(v) + " in the example, outside " + dim.str());
            if (const Dim* seen = find_dim(state->dims, dim.name)) {
                const std::size_t k = static_cast<std::size_t>(seen - state->dims.data());
                if (seen->min != dim.min || seen->max != dim.max) fail("Dim '" + dim.name + "' is declared with two ranges: " + seen->str() + " and " + dim.str());
                if (example[k] != v)
                    fail(where + " is " + std::to_string(v) + " but another dim declared as Dim '" + dim.name + "' is " + std::to_string(example[k]) +
                         " in the example: dims of one Dim must be equal");
            } else {
                state->dims.push_back(dim);
                example.push_back(v);
                first_at.emplace_back(static_cast<int>(i), d);
            }
            in_dims[i][static_cast<std::size_t>(d)] = dim.name;
        }
    }
    const std::size_t k = state->dims.size();
    if (k > 4) fail(std::to_string(k) + " dynamic Dims: at most 4 are supported (each doubles the traces export takes)");

    Captured base = trace_at(args.tensors);
    ir::Graph& o = base.graph;
    state->node_dims.resize(static_cast<std::size_t>(o.size()));
    for (int i = 0; i < o.size(); ++i) state->node_dims[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(o[i].shape.rank()), "");
    if (k > 0) {
        // sizes for the other traces: a step up from the example, and a second size to check the fit
        std::vector<std::int64_t> up(k), check(k);
        for (std::size_t d = 0; d < k; ++d) {
            const Dim& dm = state->dims[d];
            const std::int64_t hi = std::min<std::int64_t>(dm.max, std::int64_t{1} << 40);
            // prefer sizes no static dim of the program has (an accidental match would hide a specialization)
            auto pick = [&](std::int64_t from, std::int64_t avoid) {
                for (std::int64_t v = from; v <= hi && v < from + 64; ++v)
                    if (v != example[d] && v != avoid && v >= std::max<std::int64_t>(dm.min, 2)) return v;
                for (std::int64_t v = example[d] - 1; v >= std::max<std::int64_t>(dm.min, 2); --v)
                    if (v != avoid) return v;
                return std::int64_t{-1};
            };
            up[d] = pick(example[d] + 1, -1);
            check[d] = pick(example[d] + 3, up[d]);
            if (up[d] < 0 || check[d] < 0)
                fail("Dim '" + dm.name + "' (" + dm.str() + ") leaves no room for other sizes of 2 or more: make the dim static");
        }
        auto shapes_for = [&](const std::vector<std::int64_t>& size) {
            std::vector<Tensor> in;
            for (int i = 0; i < n_user; ++i) {
                const Tensor& t = args.tensors[static_cast<std::size_t>(i)];
                Shape s = t.shape();
                for (int d = 0; d < s.rank(); ++d)
                    if (const std::string& nm = in_dims[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)]; !nm.empty())
                        s[d] = size[static_cast<std::size_t>(find_dim(state->dims, nm) - state->dims.data())];
                in.push_back(empty(s, t.dtype(), t.device()));
            }
            return in;
        };
        auto traced = [&](const std::vector<std::int64_t>& size, const std::string& label) {
            Captured c;
            try {
                c = trace_at(shapes_for(size));
            } catch (const ExportError&) {
                throw;
            } catch (const Error& e) {
                fail("a dim declared dynamic must be specialized: traced again with " + label + ", the function fails: " + e.what() +
                     ". Something in it has the example's size baked in (an operand of a fixed size it must broadcast with, a reshape to "
                     "a fixed size). Fix: remove the dim from dynamic_shapes (it is static), declare dims that must be equal with one "
                     "Dim, or compute the sizes from the input's (x.size(0))");
            }
            if (std::string why = structure_difference(base, c); !why.empty())
                fail("the program's structure depends on a dynamic dim (traced again with " + label + "): " + why);
            return c;
        };
        auto label_of = [&](const std::vector<std::int64_t>& size) {
            std::string s;
            for (std::size_t d = 0; d < k; ++d) { s += d ? ", " : ""; s += state->dims[d].name + " = " + std::to_string(size[d]); }
            return s;
        };
        std::vector<Captured> corner(std::size_t{1} << k);
        for (unsigned m = 1; m < corner.size(); ++m) {
            std::vector<std::int64_t> size = example;
            for (std::size_t d = 0; d < k; ++d)
                if ((m >> d) & 1u) size[d] = up[d];
            corner[m] = traced(size, label_of(size));
        }
        const Captured last = traced(check, label_of(check));
        std::vector<std::int64_t> step(k);
        for (std::size_t d = 0; d < k; ++d) step[d] = up[d] - example[d];
        auto vars = std::make_shared<ir::SymView::Vars>();
        vars->at = first_at;
        vars->base = example;
        std::vector<Shape> check_shapes;
        for (const Tensor& t : shapes_for(check)) check_shapes.push_back(t.shape());
        for (const TensorSpec& t : base.lifted) check_shapes.push_back(t.shape);
        // one number of node i, over the corners: its formula, checked against the check trace
        auto fit = [&](int i, const std::string& what, auto get) -> ir::SymView::Number {
            std::vector<std::int64_t> at(corner.size());
            at[0] = get(o[i]);
            for (unsigned m = 1; m < corner.size(); ++m) at[m] = get(corner[m].graph[i]);
            std::optional<ir::SymView::Number> f = fit_number(at, step);
            ir::SymView probe{vars, {}, {}, {}};
            if (!f || probe.eval(*f, check_shapes) != get(last.graph[i]))
                fail("the " + what + " of " + describe_for_user(o, i) + " is not a sum of products of the dynamic dims (it is " +
                     std::to_string(at[0]) + " with " + label_of(example) + " and " + std::to_string(get(last.graph[i])) + " with " +
                     label_of(check) + "): kiln cannot follow it; keep those dims static");
            return *f;
        };
        for (int i = 0; i < o.size(); ++i) {
            ir::Node& n = o[i];
            for (int d = 0; d < n.shape.rank(); ++d) {
                const ir::SymView::Number f = fit(i, "size of dim " + std::to_string(d), [d](const ir::Node& x) { return x.shape[d]; });
                bool varies = false;
                for (const auto& [mask, w] : f) varies = varies || mask != 0;
                if (varies) state->node_dims[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)] = formula_text(f, state->dims, example);
            }
            if (n.kind != ir::Kind::view && n.kind != ir::Kind::view_write) continue;
            auto sym = std::make_shared<ir::SymView>();
            sym->vars = vars;
            const Shape& vs = n.kind == ir::Kind::view ? n.shape : o[n.in[1]].shape;
            for (int d = 0; d < vs.rank(); ++d) {
                sym->shape.push_back(fit(i, "view size " + std::to_string(d), [&, d](const ir::Node& x) {
                    return x.kind == ir::Kind::view ? x.shape[d] : std::int64_t{0};
                }));
                sym->strides.push_back(fit(i, "view stride " + std::to_string(d), [d](const ir::Node& x) { return x.args[d]; }));
            }
            if (n.kind == ir::Kind::view_write) {  // its written view's sizes are its value operand's
                sym->shape.clear();
                const int v = n.in[1];
                for (int d = 0; d < vs.rank(); ++d)
                    sym->shape.push_back(fit(v, "size of dim " + std::to_string(d), [d](const ir::Node& x) { return x.shape[d]; }));
            }
            sym->offset = fit(i, "view offset", [](const ir::Node& x) { return static_cast<std::int64_t>(x.value); });
            n.sym = std::move(sym);
        }
        // the program for the check sizes, from the formulas, is the check trace
        ir::Graph copy = o;
        int bad = -1;
        std::string why;
        try {
            bad = infer_shapes(copy, check_shapes);
        } catch (const Error& e) {
            bad = -2;
            why = e.what();
        }
        if (bad != -1)
            fail("a dim declared dynamic must be specialized: with " + label_of(check) + " the program does not hold together at " +
                 (bad >= 0 ? describe_for_user(o, bad) : "a library op (" + why + ")") +
                 ". That op bakes the size of a dynamic dim in (an operand of a fixed size it must broadcast with, or a view kiln "
                 "cannot follow). Fix: remove the dim from dynamic_shapes (it is static), declare dims that must be equal with one "
                 "Dim, or write the op so it keeps the dim whole");
        for (int i = 0; i < o.size(); ++i)
            if (!(copy[i].shape == last.graph[i].shape))
                fail("with " + label_of(check) + ", " + describe_for_user(o, i) + " would be " + copy[i].shape.str() + " but the function makes it " +
                     last.graph[i].shape.str() + ": kiln cannot follow this dim; keep it static");
    }

    // ---- specs
    for (int i = 0; i < n_user; ++i) {
        const Tensor& t = args.tensors[static_cast<std::size_t>(i)];
        TensorSpec s;
        s.name = static_cast<std::size_t>(i) < opt.input_names.size() ? opt.input_names[static_cast<std::size_t>(i)] : "arg" + std::to_string(i);
        s.kind = TensorSpec::Kind::user_input;
        s.dtype = t.dtype();
        s.shape = t.shape();
        s.dim_names = in_dims[static_cast<std::size_t>(i)];
        state->inputs.push_back(std::move(s));
    }
    for (std::size_t j = 0; j < base.lifted.size(); ++j) {
        state->inputs.push_back(base.lifted[j]);
        state->state[base.lifted[j].name] = base.lifted_tensors[j].cpu().contiguous();
    }
    for (std::size_t j = 0; j < o.outputs.size(); ++j) {
        const int id = o.outputs[j];
        TensorSpec s;
        s.name = j < opt.output_names.size() ? opt.output_names[j] : "output" + std::to_string(j);
        s.kind = TensorSpec::Kind::user_output;
        s.dtype = o[id].dtype;
        s.shape = o[id].shape;
        s.dim_names = state->node_dims[static_cast<std::size_t>(id)];
        state->outputs.push_back(std::move(s));
    }
    state->user_inputs = n_user;
    state->graph = std::move(o);
    return ExportedProgram(std::move(state));
}

}  // namespace detail

// ------------------------------------------------------------------ running and printing
KILN_DECL void ExportedProgram::check_inputs(const std::vector<Tensor>& in, const std::source_location& loc) const {
    // strings are built only for a message: this runs on every call
    const State& s = *state_;
    auto name_of = [&](std::size_t i) { return "input " + std::to_string(i) + " ('" + s.inputs[i].name + "')"; };
    auto dim_of = [&](std::size_t i, int d) { return name_of(i) + " dim " + std::to_string(d); };
    if (in.size() != static_cast<std::size_t>(s.user_inputs))
        kiln::detail::fail<ValueError>("ExportedProgram", "takes " + std::to_string(s.user_inputs) + " tensor inputs, got " + std::to_string(in.size()), loc);
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::size_t first_at[8][2];  // per Dim (at most 4, see finish_export): the input and dim that set its size
    std::int64_t size_of[8];
    for (auto& f : first_at) f[0] = none;
    for (std::size_t i = 0; i < in.size(); ++i) {
        const TensorSpec& sp = s.inputs[i];
        const Tensor& t = in[i];
        if (!t.defined()) kiln::detail::fail<ValueError>("ExportedProgram", name_of(i) + " is an undefined tensor", loc);
        if (t.dtype() != sp.dtype)
            kiln::detail::fail<DTypeError>("ExportedProgram", name_of(i) + " must be " + std::string(dtype_name(sp.dtype)) + ", got " +
                                                                  std::string(dtype_name(t.dtype())), loc);
        if (t.rank() != sp.shape.rank())
            kiln::detail::fail<ConstraintError>("ExportedProgram", name_of(i) + " must be " + sp.type_str() + ", got rank " + std::to_string(t.rank()) +
                                                                       " " + t.shape().str(), loc);
        for (int d = 0; d < t.rank(); ++d) {
            const std::int64_t v = t.shape()[d];
            const std::string& dn = sp.dim_names[static_cast<std::size_t>(d)];
            if (dn.empty()) {
                if (v != sp.shape[d])
                    kiln::detail::fail<ConstraintError>("ExportedProgram", dim_of(i, d) + " is " + std::to_string(v) + ", but the program was exported with it static at " +
                                                                               std::to_string(sp.shape[d]) + " (" + sp.type_str() + ")", loc);
                continue;
            }
            const Dim* dim = detail::find_dim(s.dims, dn);
            const std::size_t k = static_cast<std::size_t>(dim - s.dims.data());
            if (v < dim->min || v > dim->max)
                kiln::detail::fail<ConstraintError>("ExportedProgram", dim_of(i, d) + " ('" + dn + "') is " + std::to_string(v) + ", outside the declared range: " + dim->str(), loc);
            if (first_at[k][0] == none) {
                first_at[k][0] = i;
                first_at[k][1] = static_cast<std::size_t>(d);
                size_of[k] = v;
            } else if (size_of[k] != v) {
                kiln::detail::fail<ConstraintError>("ExportedProgram", dim_of(i, d) + " ('" + dn + "') is " + std::to_string(v) + " but " +
                                                                           dim_of(first_at[k][0], static_cast<int>(first_at[k][1])) + " ('" + dn + "') is " +
                                                                           std::to_string(size_of[k]) + ": dims of one Dim must be equal", loc);
            }
        }
    }
    for (std::size_t i = 1; i < in.size(); ++i)
        if (!(in[i].device() == in[0].device()))
            kiln::detail::fail<DeviceError>("ExportedProgram", "inputs are on different devices (" + in[0].device().str() + " and " + in[i].device().str() + ")", loc);
}

KILN_DECL Executable ExportedProgram::runner(int device) const {
    State& s = *state_;
    std::lock_guard lock(s.mu);
    if (auto it = s.runners.find(device); it != s.runners.end()) return it->second;
    // the lifted tensors become captured constants again (on the inputs' device), so the passes
    // may fold them (Options::freeze) as kiln::compile would
    ir::Graph g = s.graph;
    const Device dev = device < 0 ? Device::cpu() : Device::cuda(device);
    for (std::size_t k = static_cast<std::size_t>(s.user_inputs); k < s.inputs.size(); ++k) {
        ir::Node& n = g[g.inputs[k]];
        n.kind = ir::Kind::constant;
        n.tensor = s.state.at(s.inputs[k].name).to(dev);
        n.index = -1;
        // a lifted constant (memory the function made or captured, not a parameter or buffer) is
        // part of the program: every call sees its exported value, so no write goes into it in
        // place (it would change the next call's result and the program's state_dict)
        n.fresh = s.inputs[k].kind == TensorSpec::Kind::constant;
    }
    g.inputs.resize(static_cast<std::size_t>(s.user_inputs));
    // (the lifted tensors are this program's: a conv2d weight is bound channels-last once, not
    // copied into that layout on every call; constant_layouts)
    g = passes::run_pipeline(std::move(g), {}, {.freeze = s.opt.freeze, .owns_constants = true});
    bool dynamic = false;
    for (int k = 0; k < s.user_inputs; ++k)
        for (const std::string& d : s.inputs[static_cast<std::size_t>(k)].dim_names) dynamic = dynamic || !d.empty();
    int kernels = 0;
    Executable e = detail::make_executable(g, s.opt, kernels, dynamic, device);
    s.last_kernels = kernels;
    s.runners[device] = e;
    return e;
}

KILN_DECL std::vector<Tensor> ExportedProgram::run(const std::vector<Tensor>& inputs, std::source_location loc) const {
    check_inputs(inputs, loc);
    std::vector<Tensor> in;
    in.reserve(inputs.size());
    for (const Tensor& t : inputs) in.push_back(t.is_contiguous() ? t : t.contiguous());
    const int device = in.empty() || !in[0].device().is_cuda() ? -1 : in[0].device().index;
    return runner(device)(in);
}

KILN_DECL std::string ExportedProgram::graph_str() const {
    const State& s = *state_;
    const ir::Graph& g = s.graph;
    std::vector<std::string> names(static_cast<std::size_t>(g.size()));
    for (int i = 0; i < g.size(); ++i) names[static_cast<std::size_t>(i)] = "%" + std::to_string(i);
    for (std::size_t k = 0; k < g.inputs.size(); ++k) names[static_cast<std::size_t>(g.inputs[k])] = "%" + s.inputs[k].name;
    auto type_of = [&](int i) {
        TensorSpec t;
        t.dtype = g[i].dtype;
        t.shape = g[i].shape;
        t.dim_names = s.node_dims[static_cast<std::size_t>(i)];
        return t.type_str();
    };
    std::ostringstream o;
    o << "graph(";
    for (std::size_t k = 0; k < s.inputs.size(); ++k) o << (k ? ", " : "") << "%" << s.inputs[k].name << ": " << s.inputs[k].type_str();
    o << "):\n";
    for (int i = 0; i < g.size(); ++i) {
        if (g[i].kind == ir::Kind::input) continue;
        std::string d = ir::describe(g, i);
        // operands by name: "%12" -> "%fc1.weight" (longest ids first, so %1 does not match %12)
        for (int j = g.size() - 1; j >= 0; --j) {
            if (g[j].kind != ir::Kind::input) continue;
            const std::string from = "%" + std::to_string(j);
            for (std::size_t p = d.find(from); p != std::string::npos; p = d.find(from, p + 1)) {
                const std::size_t e = p + from.size();
                if (e < d.size() && std::isdigit(static_cast<unsigned char>(d[e]))) continue;
                d.replace(p, from.size(), names[static_cast<std::size_t>(j)]);
            }
        }
        o << "    %" << i << " = " << d << " : " << type_of(i) << "\n";
    }
    o << "    return (";
    for (std::size_t k = 0; k < g.outputs.size(); ++k) o << (k ? ", " : "") << names[static_cast<std::size_t>(g.outputs[k])];
    o << ")\n";
    return o.str();
}

KILN_DECL std::string ExportedProgram::str() const {
    const State& s = *state_;
    std::ostringstream o;
    o << "ExportedProgram:\n" << graph_str() << "inputs:\n";
    for (const TensorSpec& t : s.inputs) o << "    " << t.name << ": " << spec_kind_name(t.kind) << " " << t.type_str() << "\n";
    o << "outputs:\n";
    for (const TensorSpec& t : s.outputs) o << "    " << t.name << ": " << t.type_str() << "\n";
    o << "range constraints:";
    if (s.dims.empty()) o << " none";
    o << "\n";
    for (const Dim& d : s.dims) o << "    " << d.str() << "\n";
    return o.str();
}

}  // namespace kiln
