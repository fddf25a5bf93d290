// The program file's definitions (compiled once in separate compilation), included by
// export/program_file.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/cache/files.hpp"
#include "kiln/export/program.hpp"
#include "kiln/ir/library_ops.hpp"
#include "kiln/ir/verify.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/io.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/version.hpp"

namespace kiln {
namespace detail::program_file {

/// The library ops kiln defines, registered once before a file's calls are looked up. They are
/// registered here, not at static initialization in their headers: a registration there compiles
/// each op's kernels into every translation unit that includes the header.
inline void register_builtin_library_ops() {
    static const bool done = [] {
        kiln::detail::register_index_ops();
        nn::detail::register_conv2d();
        nn::detail::register_max_pool2d();
        nn::detail::register_embedding();
        nn::detail::register_attention();
        return true;
    }();
    (void)done;
}

/// A double as C99 hex-float text: exact, and it spells inf and nan.
inline std::string num(double v) {
    if (std::isnan(v)) return "\"nan\"";
    if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
    char b[64];
    std::snprintf(b, sizeof b, "\"%a\"", v);
    return b;
}
inline std::string ints(const Dims& d) {
    std::string s = "[";
    for (int i = 0; i < d.rank(); ++i) { s += i ? "," : ""; s += std::to_string(d[i]); }
    return s + "]";
}
inline std::string names(const std::vector<std::string>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) { s += i ? "," : ""; s += nn::detail::json_quote(v[i]); }
    return s + "]";
}
inline std::string q(std::string_view s) { return nn::detail::json_quote(s); }
/// A formula of a view's number: [[variable mask, weight], ...].
inline std::string sym_number(const ir::SymView::Number& n) {
    std::string s = "[";
    for (std::size_t i = 0; i < n.size(); ++i) {
        s += i ? ",[" : "[";
        s += std::to_string(n[i].first) + "," + std::to_string(n[i].second) + "]";
    }
    return s + "]";
}

inline std::string spec_json(const TensorSpec& t) {
    return "{\"name\":" + q(t.name) + ",\"kind\":" + q(spec_kind_name(t.kind)) + ",\"dtype\":" + q(dtype_name(t.dtype)) +
           ",\"shape\":" + ints(t.shape) + ",\"dims\":" + names(t.dim_names) + "}";
}

/// The program (graph, specs, constraints) as JSON.
inline std::string to_json(const ExportedProgram::State& s) {
    std::string o = "{\"format\":" + q(format_name) + ",\"version\":" + std::to_string(format_version) + ",\"dims\":[";
    for (std::size_t k = 0; k < s.dims.size(); ++k)
        o += std::string(k ? "," : "") + "{\"name\":" + q(s.dims[k].name) + ",\"min\":" + std::to_string(s.dims[k].min) + ",\"max\":" +
             std::to_string(s.dims[k].max) + "}";
    o += "],\"inputs\":[";
    for (std::size_t k = 0; k < s.inputs.size(); ++k) { o += k ? "," : ""; o += spec_json(s.inputs[k]); }
    o += "],\"outputs\":[";
    for (std::size_t k = 0; k < s.outputs.size(); ++k) {
        std::string j = spec_json(s.outputs[k]);
        j.insert(1, "\"node\":" + std::to_string(s.graph.outputs[k]) + ",");
        o += k ? "," : "";
        o += j;
    }
    o += "],\"user_inputs\":" + std::to_string(s.user_inputs);
    const ir::Graph& g = s.graph;
    const ir::SymView::Vars* vars = nullptr;
    for (const ir::Node& n : g.nodes)
        if (n.sym) vars = n.sym->vars.get();
    if (vars) {
        o += ",\"sym_vars\":[";
        for (std::size_t k = 0; k < vars->at.size(); ++k)
            o += std::string(k ? "," : "") + "[" + std::to_string(vars->at[k].first) + "," + std::to_string(vars->at[k].second) + "," +
                 std::to_string(vars->base[k]) + "]";
        o += "]";
    }
    o += ",\"nodes\":[";
    for (int i = 0; i < g.size(); ++i) {
        const ir::Node& n = g[i];
        o += std::string(i ? ",\n" : "\n") + "{\"kind\":" + q(ir::kind_name(n.kind)) + ",\"dtype\":" + q(dtype_name(n.dtype)) + ",\"shape\":" + ints(n.shape);
        if (!n.in.empty()) {
            o += ",\"in\":[";
            for (std::size_t j = 0; j < n.in.size(); ++j) { o += j ? "," : ""; o += std::to_string(n.in[j]); }
            o += "]";
        }
        bool named = false;
        for (const std::string& d : s.node_dims[static_cast<std::size_t>(i)]) named = named || !d.empty();
        if (named) o += ",\"dims\":" + names(s.node_dims[static_cast<std::size_t>(i)]);
        switch (n.kind) {
            case ir::Kind::input: o += ",\"index\":" + std::to_string(n.index); break;
            case ir::Kind::scalar: o += ",\"value\":" + num(n.value); break;
            case ir::Kind::elementwise:
                o += ",\"op\":" + q(ops::op_name(n.op)) + ",\"ct\":" + q(dtype_name(n.ct)) + ",\"to\":" + q(dtype_name(n.attr));
                break;
            case ir::Kind::reduce:
                o += ",\"reduce\":" + q(ir::reduce_name(n.rkind)) + ",\"axes\":" + std::to_string(n.mask) + ",\"keepdim\":" + (n.keepdim ? "true" : "false") +
                     ",\"correction\":" + num(n.correction);
                break;
            case ir::Kind::arg_reduce:
                o += std::string(",\"arg\":") + (n.arg_max ? "\"max\"" : "\"min\"") + ",\"axes\":" + std::to_string(n.mask) +
                     ",\"keepdim\":" + (n.keepdim ? "true" : "false");
                break;
            case ir::Kind::view: case ir::Kind::view_write:
                o += ",\"strides\":" + ints(n.args) + ",\"offset\":" + std::to_string(static_cast<std::int64_t>(n.value)) + ",\"fixed\":" + std::to_string(n.mask);
                if (n.sym) {
                    if (n.sym->vars.get() != vars) throw InternalError("kiln: an exported program's views use two sets of variables");
                    o += ",\"sym\":{\"shape\":[";
                    for (std::size_t d = 0; d < n.sym->shape.size(); ++d) { o += d ? "," : ""; o += sym_number(n.sym->shape[d]); }
                    o += "],\"strides\":[";
                    for (std::size_t d = 0; d < n.sym->strides.size(); ++d) { o += d ? "," : ""; o += sym_number(n.sym->strides[d]); }
                    o += "],\"offset\":" + sym_number(n.sym->offset) + "}";
                }
                break;
            case ir::Kind::call: {
                o += ",\"call\":" + q(n.call->name) + ",\"attrs\":{";
                for (std::size_t k = 0; k < n.call->attrs.size(); ++k) { o += k ? "," : ""; o += q(n.call->attrs[k].first) + ":" + num(n.call->attrs[k].second); }
                o += "}";
                break;
            }
            case ir::Kind::matmul: case ir::Kind::constant: break;
        }
        o += "}";
    }
    o += "\n]}";
    return o;
}

KILN_DECL std::uint64_t checksum(const std::string& program, const std::map<std::string, Tensor>& tensors) {
    std::uint64_t h = cache::hash64(program);
    for (const auto& [name, t] : tensors) {
        h = cache::hash64(name, h);
        const Tensor c = t.cpu().contiguous();
        h = cache::hash64(std::string_view(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel()) * c.element_size()), h);
    }
    return h;
}

/// Reads the JSON of a program file into a State, checking every field (a file may say anything).
class Reader {
public:
    Reader(const std::filesystem::path& path, const std::source_location& loc) : path_(path), loc_(loc) {}
    [[noreturn]] void bad(const std::string& what) const { nn::detail::file_error<ValueError>("load_program", path_, what, loc_); }

    using J = nn::detail::JsonValue;
    const J* field(const J& o, const std::string& key, J::Kind kind, const std::string& where, bool required = true) const {
        if (o.kind != J::Kind::object) bad(where + " is " + nn::detail::json_kind_name(o.kind) + ", not an object");
        for (std::size_t i = 0; i < o.keys.size(); ++i)
            if (o.keys[i] == key) {
                if (o.items[i].kind != kind)
                    bad(where + "'s \"" + key + "\" is " + nn::detail::json_kind_name(o.items[i].kind) + ", not " + nn::detail::json_kind_name(kind));
                return &o.items[i];
            }
        if (required) bad(where + " has no \"" + key + "\"");
        return nullptr;
    }
    std::int64_t integer(const J& o, const std::string& key, const std::string& where, std::int64_t lo, std::int64_t hi) const {
        const J* v = field(o, key, J::Kind::number, where);
        if (!v->integer || *v->integer < lo || *v->integer > hi)
            bad(where + "'s \"" + key + "\" is " + v->text + ", not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return *v->integer;
    }
    std::string text(const J& o, const std::string& key, const std::string& where) const { return field(o, key, J::Kind::string, where)->text; }
    double number(const J& o, const std::string& key, const std::string& where) const {
        const std::string t = text(o, key, where);
        char* end = nullptr;
        const double v = std::strtod(t.c_str(), &end);
        if (t.empty() || end != t.c_str() + t.size()) bad(where + "'s \"" + key + "\" is \"" + t + "\", not a number");
        return v;
    }
    DType dtype(const J& o, const std::string& key, const std::string& where) const {
        const std::string t = text(o, key, where);
        for (DType d : all_dtypes)
            if (dtype_name(d) == t) return d;
        bad(where + "'s \"" + key + "\" is \"" + t + "\", not a dtype");
    }
    Dims dims(const J& o, const std::string& key, const std::string& where, std::int64_t lo) const {
        const J* a = field(o, key, J::Kind::array, where);
        if (a->items.size() > static_cast<std::size_t>(max_rank)) bad(where + "'s \"" + key + "\" has more than " + std::to_string(max_rank) + " dims");
        Dims d;
        for (const J& v : a->items) {
            if (v.kind != J::Kind::number || !v.integer || *v.integer < lo || *v.integer > (std::int64_t{1} << 48))
                bad(where + "'s \"" + key + "\" holds " + (v.kind == J::Kind::number ? v.text : std::string(nn::detail::json_kind_name(v.kind))) +
                    ", not a size");
            d.push_back(*v.integer);
        }
        return d;
    }
    /// The one of `kinds` named `text` (by `name_of`); `where` has no such kind otherwise.
    template <class K, class Name>
    K kind_named(const std::string& text, std::initializer_list<K> kinds, Name name_of, const std::string& where) const {
        for (K k : kinds)
            if (text == name_of(k)) return k;
        bad(where + " has kind \"" + text + "\"");
    }
    /// A shape whose element count (in bytes) fits in int64, as kiln's tensors need.
    void checked_shape(const Shape& shape, DType d, const std::string& where) const {
        if (std::string p = nn::detail::shape_problem(shape.vec(), dtype_size(d)); !p.empty()) bad(where + "'s shape " + shape.str() + ": " + p);
    }
    std::vector<std::string> strings(const J& o, const std::string& key, const std::string& where, std::size_t n) const {
        const J* a = field(o, key, J::Kind::array, where);
        if (a->items.size() != n) bad(where + "'s \"" + key + "\" has " + std::to_string(a->items.size()) + " entries, not " + std::to_string(n));
        std::vector<std::string> out;
        for (const J& v : a->items) {
            if (v.kind != J::Kind::string) bad(where + "'s \"" + key + "\" holds " + nn::detail::json_kind_name(v.kind) + ", not a string");
            out.push_back(v.text);
        }
        return out;
    }
    bool boolean(const J& o, const std::string& key, const std::string& where) const { return field(o, key, J::Kind::boolean, where)->boolean; }

    TensorSpec spec(const J& o, const std::string& where) const {
        TensorSpec t;
        t.name = text(o, "name", where);
        const std::string kind = text(o, "kind", where);
        t.kind = kind_named(kind, {TensorSpec::Kind::user_input, TensorSpec::Kind::parameter, TensorSpec::Kind::buffer,
                                   TensorSpec::Kind::constant, TensorSpec::Kind::user_output}, spec_kind_name, where);
        t.dtype = dtype(o, "dtype", where);
        t.shape = dims(o, "shape", where, 0);
        checked_shape(t.shape, t.dtype, where);
        t.dim_names = strings(o, "dims", where, static_cast<std::size_t>(t.shape.rank()));
        return t;
    }

    std::shared_ptr<ExportedProgram::State> read(const J& doc) const {
        auto s = std::make_shared<ExportedProgram::State>();
        const std::string top = "the program";
        if (text(doc, "format", top) != format_name) bad("the program's format is not \"" + std::string(format_name) + "\"");
        for (const J& d : field(doc, "dims", J::Kind::array, top)->items) {
            Dim dim(text(d, "name", "a dim"), integer(d, "min", "a dim", 0, INT64_MAX), integer(d, "max", "a dim", 0, INT64_MAX));
            if (dim.name.empty() || dim.min > dim.max || detail::find_dim(s->dims, dim.name)) bad("dim \"" + dim.name + "\" is empty, repeated or has no sizes");
            s->dims.push_back(dim);
        }
        if (s->dims.size() > 4) bad("the program declares " + std::to_string(s->dims.size()) + " dynamic dims; kiln exports at most 4");
        const J* nodes = field(doc, "nodes", J::Kind::array, top);
        const int count = static_cast<int>(nodes->items.size());
        s->user_inputs = static_cast<int>(integer(doc, "user_inputs", top, 0, count));
        for (const J& i : field(doc, "inputs", J::Kind::array, top)->items) s->inputs.push_back(spec(i, "input " + std::to_string(s->inputs.size())));
        std::shared_ptr<ir::SymView::Vars> vars;
        if (const J* sv = field(doc, "sym_vars", J::Kind::array, top, false)) {
            vars = std::make_shared<ir::SymView::Vars>();
            if (sv->items.size() > 8) bad("the program has more than 8 shape variables");
            for (const J& v : sv->items) {
                if (v.kind != J::Kind::array || v.items.size() != 3) bad("a shape variable is not [input, dim, size]");
                std::int64_t x[3];
                for (int c = 0; c < 3; ++c) {
                    const J& e = v.items[static_cast<std::size_t>(c)];
                    if (e.kind != J::Kind::number || !e.integer || *e.integer < 0 || *e.integer > (std::int64_t{1} << 48)) bad("a shape variable holds a bad number");
                    x[c] = *e.integer;
                }
                if (x[0] >= s->user_inputs || x[0] >= static_cast<std::int64_t>(s->inputs.size()) || x[1] >= s->inputs[static_cast<std::size_t>(x[0])].shape.rank())
                    bad("a shape variable names a dim no user input has");
                vars->at.emplace_back(static_cast<int>(x[0]), static_cast<int>(x[1]));
                vars->base.push_back(x[2]);
            }
        }
        auto sym_number = [&](const J& a, const std::string& where) {
            if (a.kind != J::Kind::array || a.items.size() > 64) bad(where + " has a malformed formula");
            ir::SymView::Number n;
            for (const J& t : a.items) {
                if (t.kind != J::Kind::array || t.items.size() != 2 || t.items[0].kind != J::Kind::number || t.items[1].kind != J::Kind::number ||
                    !t.items[0].integer || !t.items[1].integer || *t.items[0].integer < 0 || *t.items[0].integer >= (1 << vars->at.size()) ||
                    *t.items[1].integer < -(std::int64_t{1} << 40) || *t.items[1].integer > (std::int64_t{1} << 40))
                    bad(where + " has a malformed formula term");
                n.emplace_back(static_cast<unsigned>(*t.items[0].integer), *t.items[1].integer);
            }
            return n;
        };
        ir::Graph& g = s->graph;
        s->node_dims.resize(static_cast<std::size_t>(count));
        for (int i = 0; i < count; ++i) {
            const J& j = nodes->items[static_cast<std::size_t>(i)];
            const std::string where = "node " + std::to_string(i);
            ir::Node n;
            const std::string kind = text(j, "kind", where);
            n.kind = kind_named(kind, {ir::Kind::input, ir::Kind::scalar, ir::Kind::elementwise, ir::Kind::reduce, ir::Kind::arg_reduce,
                                       ir::Kind::matmul, ir::Kind::view, ir::Kind::call, ir::Kind::view_write}, ir::kind_name, where);
            n.dtype = dtype(j, "dtype", where);
            n.shape = dims(j, "shape", where, 0);
            checked_shape(n.shape, n.dtype, where);
            if (const J* in = field(j, "in", J::Kind::array, where, false))
                for (const J& v : in->items) {
                    if (v.kind != J::Kind::number || !v.integer || *v.integer < 0 || *v.integer >= i) bad(where + " reads a node that does not precede it");
                    n.in.push_back(static_cast<int>(*v.integer));
                }
            if (field(j, "dims", J::Kind::array, where, false)) {
                s->node_dims[static_cast<std::size_t>(i)] = strings(j, "dims", where, static_cast<std::size_t>(n.shape.rank()));
            } else {
                s->node_dims[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(n.shape.rank()), "");
            }
            switch (n.kind) {
                case ir::Kind::input:
                    n.index = static_cast<int>(integer(j, "index", where, 0, static_cast<std::int64_t>(s->inputs.size()) - 1));
                    break;
                case ir::Kind::scalar: n.value = number(j, "value", where); break;
                case ir::Kind::elementwise: {
                    const std::string op = text(j, "op", where);
                    bool found = false;
                    ops::for_each_op([&](auto t) {
                        if (decltype(t)::type::name == op) {
                            n.op = ops::op_id<typename decltype(t)::type>;
                            found = true;
                        }
                    });
                    if (!found) bad(where + " computes \"" + op + "\", which is not an op of this kiln");
                    n.ct = dtype(j, "ct", where);
                    n.attr = dtype(j, "to", where);
                    if (n.op == ops::op_id<ops::Cast> && n.attr != n.dtype) bad(where + " casts to " + std::string(dtype_name(n.attr)) + " but has dtype " + std::string(dtype_name(n.dtype)));
                    break;
                }
                case ir::Kind::reduce: {
                    const std::string r = text(j, "reduce", where);
                    bool found = false;
                    for (auto k : {ir::ReduceKind::sum, ir::ReduceKind::prod, ir::ReduceKind::max, ir::ReduceKind::min, ir::ReduceKind::mean})
                        if (r == ir::reduce_name(k)) {
                            n.rkind = k;
                            found = true;
                        }
                    if (!found) bad(where + " reduces by \"" + r + "\", which is not a reduction of this kiln");
                    n.mask = static_cast<unsigned>(integer(j, "axes", where, 0, (1 << max_rank) - 1));
                    n.keepdim = boolean(j, "keepdim", where);
                    n.correction = number(j, "correction", where);
                    break;
                }
                case ir::Kind::arg_reduce: {
                    const std::string a = text(j, "arg", where);
                    if (a != "max" && a != "min") bad(where + " is an arg-reduction by \"" + a + "\"");
                    n.arg_max = a == "max";
                    n.mask = static_cast<unsigned>(integer(j, "axes", where, 0, (1 << max_rank) - 1));
                    n.keepdim = boolean(j, "keepdim", where);
                    break;
                }
                case ir::Kind::view: case ir::Kind::view_write:
                    n.args = dims(j, "strides", where, 0);
                    n.value = static_cast<double>(integer(j, "offset", where, 0, std::int64_t{1} << 48));
                    n.mask = static_cast<unsigned>(integer(j, "fixed", where, 0, (1 << max_rank) - 1));
                    if (const J* sj = field(j, "sym", J::Kind::object, where, false)) {
                        if (!vars) bad(where + " has formulas but the program declares no shape variables");
                        auto sym = std::make_shared<ir::SymView>();
                        sym->vars = vars;
                        for (const J& f : field(*sj, "shape", J::Kind::array, where)->items) sym->shape.push_back(sym_number(f, where));
                        for (const J& f : field(*sj, "strides", J::Kind::array, where)->items) sym->strides.push_back(sym_number(f, where));
                        sym->offset = sym_number(*field(*sj, "offset", J::Kind::array, where), where);
                        if (sym->shape.size() != sym->strides.size() || sym->strides.size() != static_cast<std::size_t>(n.args.rank()))
                            bad(where + " has formulas for another rank");
                        n.sym = std::move(sym);
                    }
                    break;
                case ir::Kind::call: {
                    const std::string name = text(j, "call", where);
                    const J* attrs = field(j, "attrs", J::Kind::object, where);
                    ir::CallAttrs a;
                    for (std::size_t k = 0; k < attrs->keys.size(); ++k) a.emplace_back(attrs->keys[k], number(*attrs, attrs->keys[k], where + "'s attrs"));
                    register_builtin_library_ops();
                    const ir::LibraryOpFactory make = ir::find_library_op(name);
                    if (!make)
                        bad(where + " calls library op \"" + name + "\", which this program does not know (a user-defined op is registered with ir::register_library_op before loading)");
                    try {
                        n.call = make(a);
                    } catch (const Error& e) {
                        bad(where + " (" + name + "): " + e.what());
                    }
                    break;
                }
                case ir::Kind::matmul: case ir::Kind::constant: break;
            }
            g.add(std::move(n));
        }
        // inputs: node order as listed, each index once
        std::vector<int> input_of(s->inputs.size(), -1);
        for (int i = 0; i < g.size(); ++i)
            if (g[i].kind == ir::Kind::input) {
                int& slot = input_of[static_cast<std::size_t>(g[i].index)];
                if (slot >= 0) bad("two nodes are input " + std::to_string(g[i].index));
                slot = i;
            }
        for (std::size_t k = 0; k < input_of.size(); ++k) {
            if (input_of[k] < 0) bad("input " + std::to_string(k) + " (" + s->inputs[k].name + ") has no node");
            const ir::Node& n = g[input_of[k]];
            if (n.dtype != s->inputs[k].dtype || !(n.shape == s->inputs[k].shape))
                bad("input " + std::to_string(k) + " (" + s->inputs[k].name + ") does not match its node");
            g.inputs.push_back(input_of[k]);
        }
        if (s->user_inputs > static_cast<int>(s->inputs.size())) bad("more user inputs than inputs");
        for (std::size_t k = 0; k < s->inputs.size(); ++k) {
            const bool user = static_cast<int>(k) < s->user_inputs;
            if (user != (s->inputs[k].kind == TensorSpec::Kind::user_input)) bad("input " + std::to_string(k) + " (" + s->inputs[k].name + ") has the wrong kind");
            for (const std::string& d : s->inputs[k].dim_names)
                if (!d.empty() && (!user || !detail::find_dim(s->dims, d))) bad("input " + std::to_string(k) + " names dim \"" + d + "\", which is not declared");
        }
        for (const J& o : field(doc, "outputs", J::Kind::array, top)->items) {
            const std::string where = "output " + std::to_string(s->outputs.size());
            s->outputs.push_back(spec(o, where));
            g.outputs.push_back(static_cast<int>(integer(o, "node", where, 0, count - 1)));
        }
        if (g.outputs.empty()) bad("the program has no outputs");
        return s;
    }

    /// Checks what the verifier does not: the shapes every node gets from the inputs' are the ones
    /// recorded, views stay inside their operands, reduced axes exist.
    void check_consistent(const ExportedProgram::State& s) const {
        const ir::Graph& g = s.graph;
        try {
            ir::verify(g, "load");
        } catch (const InternalError& e) {
            bad(std::string("the graph fails verification: ") + e.what());
        }
        for (int i = 0; i < g.size(); ++i) {
            const ir::Node& n = g[i];
            const std::string where = "node " + std::to_string(i);
            if ((n.kind == ir::Kind::reduce || n.kind == ir::Kind::arg_reduce) && (n.mask >> g[n.in[0]].shape.rank()) != 0)
                bad(where + " reduces axes its operand does not have");
            if (n.kind == ir::Kind::view || n.kind == ir::Kind::view_write) {
                const Shape& vs = n.kind == ir::Kind::view ? n.shape : g[n.in[1]].shape;
                if (n.args.rank() != vs.rank()) bad(where + " has " + std::to_string(n.args.rank()) + " strides for " + std::to_string(vs.rank()) + " dims");
                std::int64_t last = static_cast<std::int64_t>(n.value), step = 0;
                bool empty = false, over = false;
                for (int d = 0; d < vs.rank(); ++d) {
                    empty = empty || vs[d] == 0;
                    over = over || (vs[d] > 0 && (__builtin_mul_overflow(vs[d] - 1, n.args[d], &step) || __builtin_add_overflow(last, step, &last)));
                }
                if (!empty && (over || last >= g[n.in[0]].shape.numel())) bad(where + " views elements past the end of its operand");
            }
            if (n.kind == ir::Kind::view_write && (n.dtype != g[n.in[0]].dtype || n.dtype != g[n.in[1]].dtype))
                bad(where + " writes a value of another dtype");
        }
        ir::Graph copy = g;
        std::vector<Shape> shapes;
        for (const TensorSpec& t : s.inputs) shapes.push_back(t.shape);
        int broken = -1;
        try {
            broken = infer_shapes(copy, shapes);
        } catch (const Error& e) {
            bad(std::string("the graph's shapes do not hold together: ") + e.what());
        }
        if (broken >= 0) bad("node " + std::to_string(broken) + "'s operands do not fit together");
        for (int i = 0; i < g.size(); ++i) {
            if (!(copy[i].shape == g[i].shape))
                bad("node " + std::to_string(i) + " is recorded as " + g[i].shape.str() + " but its operands make it " + copy[i].shape.str());
            if (g[i].sym && (!(copy[i].args == g[i].args) || copy[i].value != g[i].value))
                bad("node " + std::to_string(i) + "'s formulas do not give its recorded strides and offset");
        }
        for (std::size_t k = 0; k < s.outputs.size(); ++k) {
            const ir::Node& n = g[g.outputs[k]];
            if (n.dtype != s.outputs[k].dtype || !(n.shape == s.outputs[k].shape)) bad("output " + std::to_string(k) + " does not match its node");
        }
    }

private:
    std::filesystem::path path_;
    std::source_location loc_;
};

}  // namespace detail::program_file

KILN_DECL void ExportedProgram::save(const std::string& path, std::source_location loc) const {
    namespace pf = detail::program_file;
    const State& s = *state_;
    const std::string program = pf::to_json(s);
    std::map<std::string, std::string> meta{{"format", pf::format_name},
                                            {"version", std::to_string(pf::format_version)},
                                            {"kiln_version", KILN_VERSION_STRING},
                                            {"program", program},
                                            {"checksum", cache::to_hex(pf::checksum(program, s.state))}};
    nn::save_safetensors(path, s.state, meta, loc);
}

KILN_DECL ExportedProgram load_program(const std::string& path, std::source_location loc) {
    namespace pf = detail::program_file;
    pf::Reader r(path, loc);
    nn::detail::SafetensorsContents c = nn::detail::read_safetensors("load_program", path, true, loc);
    auto meta = [&](const std::string& key) -> const std::string& {
        auto it = c.metadata.find(key);
        if (it == c.metadata.end()) r.bad("has no \"" + key + "\" in its metadata: not a kiln program file (a plain safetensors file?)");
        return it->second;
    };
    if (meta("format") != pf::format_name) r.bad("is a \"" + meta("format") + "\" file, not a kiln program (\"" + pf::format_name + "\")");
    const std::string& v = meta("version");
    char* end = nullptr;
    const long version = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || end != v.c_str() + v.size() || version < 1) r.bad("has format version \"" + v + "\"");
    if (version > pf::format_version)
        r.bad("has format version " + v + ", newer than this kiln reads (" + std::to_string(pf::format_version) + "): it was written by kiln " +
              (c.metadata.count("kiln_version") ? c.metadata.at("kiln_version") : std::string("?")) + "; upgrade kiln to load it");
    const std::string& program = meta("program");
    if (meta("checksum") != cache::to_hex(pf::checksum(program, c.tensors)))
        r.bad("is corrupted: its checksum does not match its contents");
    nn::detail::JsonParser parser(program, "program byte");
    std::string error;
    std::optional<nn::detail::JsonValue> doc = parser.parse_document(error);
    if (!doc) r.bad("holds invalid program JSON: " + error);
    std::shared_ptr<ExportedProgram::State> s = r.read(*doc);
    for (const TensorSpec& t : s->inputs) {
        if (t.kind == TensorSpec::Kind::user_input) continue;
        auto it = c.tensors.find(t.name);
        if (it == c.tensors.end()) r.bad("has no tensor \"" + t.name + "\" for input " + t.name);
        if (it->second.dtype() != t.dtype || !(it->second.shape() == t.shape)) r.bad("tensor \"" + t.name + "\" does not match its input's spec");
        s->state[t.name] = it->second;
    }
    if (s->state.size() != c.tensors.size()) r.bad("holds tensors that no input reads");
    r.check_consistent(*s);
    return ExportedProgram(std::move(s));
}

}  // namespace kiln