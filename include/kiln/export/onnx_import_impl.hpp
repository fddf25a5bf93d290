// ONNX import's definitions (compiled once in separate compilation: kiln::onnx_compiled), included
// by export/onnx_import.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/export/program.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/layers.hpp"

namespace kiln::onnx {

namespace detail {

using Loc = std::source_location;

[[noreturn]] inline void unsupported(const std::string& what, const Loc& loc) { kiln::detail::fail<ImportError>("onnx::load", what, loc); }

/// kiln's dtype of an ONNX element type, if kiln has it.
inline std::optional<DType> dtype_of(int elem) {
    switch (elem) {
        case ::onnx::TensorProto::BOOL: return DType::boolean;
        case ::onnx::TensorProto::INT32: return DType::i32;
        case ::onnx::TensorProto::INT64: return DType::i64;
        case ::onnx::TensorProto::FLOAT16: return DType::f16;
        case ::onnx::TensorProto::BFLOAT16: return DType::bf16;
        case ::onnx::TensorProto::FLOAT: return DType::f32;
        case ::onnx::TensorProto::DOUBLE: return DType::f64;
        default: return std::nullopt;
    }
}
inline std::string elem_name(int elem) {
    const auto* d = ::onnx::TensorProto::DataType_descriptor();
    const auto* v = d->FindValueByNumber(elem);
    return v ? v->name() : "type " + std::to_string(elem);
}
inline DType checked_dtype(int elem, const std::string& what, const Loc& loc) {
    if (auto d = dtype_of(elem)) return *d;
    unsupported(what + " has element type " + elem_name(elem) + ", which kiln does not have (it has bool, int32, int64, float16, bfloat16, float, double)", loc);
}

}  // namespace detail

KILN_DECL Tensor tensor_from_proto(const ::onnx::TensorProto& p, const std::string& dir, std::source_location loc) {
    const std::string what = "tensor '" + p.name() + "'";
    const DType dt = detail::checked_dtype(p.data_type(), what, loc);
    if (p.has_segment()) detail::unsupported(what + " is segmented", loc);
    std::vector<std::int64_t> dims(p.dims().begin(), p.dims().end());
    for (std::int64_t d : dims)
        if (d < 0) kiln::detail::fail<ValueError>("onnx::load", what + " has a negative dim", loc);
    const Shape shape(dims, loc);
    Tensor t(shape, dt);
    const std::size_t n = static_cast<std::size_t>(shape.numel()), esize = dtype_size(dt), bytes = n * esize;
    auto* out = static_cast<unsigned char*>(t.data_ptr());
    auto wrong_size = [&](std::size_t got) {
        kiln::detail::fail<ValueError>("onnx::load", what + " of shape " + shape.str() + " holds " + std::to_string(got) +
                                                         " values or bytes, expected " + std::to_string(n) + " elements", loc);
    };
    if (p.data_location() == ::onnx::TensorProto::EXTERNAL) {
        std::string file;
        std::int64_t offset = 0, length = -1;
        for (const auto& kv : p.external_data()) {
            if (kv.key() == "location") file = kv.value();
            else if (kv.key() == "offset") offset = std::stoll(kv.value());
            else if (kv.key() == "length") length = std::stoll(kv.value());
        }
        if (file.empty() || file.find("..") != std::string::npos || file.front() == '/')
            kiln::detail::fail<ValueError>("onnx::load", what + " names external data outside the model's folder: '" + file + "'", loc);
        std::ifstream f(dir.empty() ? file : dir + "/" + file, std::ios::binary);
        if (!f) kiln::detail::fail<ValueError>("onnx::load", what + ": cannot open its external data file '" + file + "'", loc);
        if (length >= 0 && static_cast<std::size_t>(length) != bytes) wrong_size(static_cast<std::size_t>(length));
        f.seekg(offset);
        f.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(bytes));
        if (static_cast<std::size_t>(f.gcount()) != bytes) kiln::detail::fail<ValueError>("onnx::load", what + ": its external data file '" + file + "' is truncated", loc);
        return t;
    }
    if (p.has_raw_data()) {
        if (p.raw_data().size() != bytes) wrong_size(p.raw_data().size());
        std::memcpy(out, p.raw_data().data(), bytes);
        return t;
    }
    auto copy = [&](const auto& field, auto convert) {
        if (static_cast<std::size_t>(field.size()) != n) wrong_size(static_cast<std::size_t>(field.size()));
        for (std::size_t i = 0; i < n; ++i) convert(field.Get(static_cast<int>(i)), out + i * esize);
    };
    switch (dt) {
        case DType::f32: copy(p.float_data(), [](float v, unsigned char* o) { std::memcpy(o, &v, 4); }); break;
        case DType::f64: copy(p.double_data(), [](double v, unsigned char* o) { std::memcpy(o, &v, 8); }); break;
        case DType::i64: copy(p.int64_data(), [](std::int64_t v, unsigned char* o) { std::memcpy(o, &v, 8); }); break;
        case DType::i32: copy(p.int32_data(), [](std::int32_t v, unsigned char* o) { std::memcpy(o, &v, 4); }); break;
        case DType::boolean: copy(p.int32_data(), [](std::int32_t v, unsigned char* o) { *o = v != 0; }); break;
        case DType::f16:
        case DType::bf16:  // the bits, in the low 16 of int32_data
            copy(p.int32_data(), [](std::int32_t v, unsigned char* o) {
                const auto b = static_cast<std::uint16_t>(v);
                std::memcpy(o, &b, 2);
            });
            break;
    }
    return t;
}

KILN_DECL Tensor read_tensor_file(const std::string& path, std::source_location loc) {
    std::ifstream f(path, std::ios::binary);
    if (!f) kiln::detail::fail<ValueError>("onnx::read_tensor_file", "cannot open '" + path + "'", loc);
    ::onnx::TensorProto p;
    if (!p.ParseFromIstream(&f)) kiln::detail::fail<ValueError>("onnx::read_tensor_file", "'" + path + "' is not a serialized TensorProto", loc);
    const std::size_t slash = path.find_last_of('/');
    return tensor_from_proto(p, slash == std::string::npos ? "" : path.substr(0, slash), loc);
}

namespace detail {

using nn::Window;
using nn::Act;
using nn::conv2d;
using nn::max_pool2d;
using nn::embedding;

/// A value of the ONNX graph while the interpreter runs: a tensor, and whether it is known when
/// the model loads (computed on the host from initializers, constants and shapes only).
struct Value {
    Tensor t;
    bool known = false;
    bool defined() const { return t.defined(); }
};

/// Runs an ONNX graph with kiln ops (traced under export_program).
class Interpreter {
public:
    Interpreter(const ::onnx::GraphProto& g, int opset, std::map<std::string, int> types, std::map<std::string, Tensor> init,
                std::vector<std::string> user_inputs, const Loc& loc)
        : g_(g), opset_(opset), types_(std::move(types)), init_(std::move(init)), user_inputs_(std::move(user_inputs)), loc_(loc) {
        for (int i = 0; i < g_.node_size(); ++i) {
            for (const std::string& name : g_.node(i).input()) ++uses_[name];
            for (const std::string& name : g_.node(i).output()) producer_[name] = i;
        }
        for (const auto& o : g_.output()) ++uses_[o.name()];
    }

    std::vector<Tensor> run(const std::vector<Tensor>& inputs) {
        vals_.clear();
        for (const auto& [name, t] : init_) vals_[name] = Value{t, true};
        for (std::size_t i = 0; i < user_inputs_.size(); ++i) vals_[user_inputs_[i]] = Value{inputs[i], false};
        std::vector<char> done(static_cast<std::size_t>(g_.node_size()), 0);
        for (int i = 0; i < g_.node_size(); ++i) {
            const ::onnx::NodeProto& n = g_.node(i);
            if (done[static_cast<std::size_t>(i)]) continue;  // absorbed into a convolution before it
            node_ = &n;
            std::vector<Value> in;
            bool all_known = true;
            for (const std::string& name : n.input()) {
                if (name.empty()) { in.emplace_back(); continue; }
                auto it = vals_.find(name);
                if (it == vals_.end()) fail<ValueError>("reads '" + name + "', which no earlier node, input or initializer defines");
                in.push_back(it->second);
                all_known = all_known && it->second.known;
            }
            const bool fold = all_known && !in.empty();
            epi_ = Epilogue{};
            if (!fold && n.op_type() == "Conv") plan_epilogue(i);
            std::optional<trace::ActiveScope> host;  // a known value is computed now, on the host: a constant of the program
            if (fold) host.emplace(nullptr);
            std::optional<Tensor> narrow = fold ? std::nullopt : attention(i, in);
            if (!narrow && !fold) narrow = narrow_op(i, in);
            const std::vector<Tensor> out = narrow ? std::vector<Tensor>{*narrow} : apply(n, in);
            const bool known = fold || n.op_type() == "Constant" || n.op_type() == "Shape" || n.op_type() == "Size" ||
                               n.op_type() == "ConstantOfShape" || n.op_type() == "EyeLike" || n.op_type() == "Range";
            if (known && !host) host.emplace(nullptr);  // (and so is its dtype's cast below)
            for (int k = 0; k < n.output_size(); ++k) {
                if (n.output(k).empty()) continue;
                if (static_cast<std::size_t>(k) >= out.size() || !out[static_cast<std::size_t>(k)].defined())
                    unsupported_here("output " + std::to_string(k) + " ('" + n.output(k) + "') is not implemented");
                Tensor t = out[static_cast<std::size_t>(k)];
                // ONNX fixes each output's type; kiln's promotion can differ (int / int, pow(int, float));
                // a narrowed op keeps its narrow type (the Cast after it is then a no-op)
                if (auto it = types_.find(n.output(k)); !narrow && it != types_.end() && !cast_back_to(i, k, t.dtype()))
                    if (auto d = dtype_of(it->second); d && *d != t.dtype()) t = t.to(*d);
                vals_[n.output(k)] = Value{t, known && !t.is_traced()};
            }
            host.reset();
            if (epi_.used)  // the Add and Relu the convolution took: their outputs are its output
                for (int j : epi_.nodes) {
                    done[static_cast<std::size_t>(j)] = 1;
                    vals_[g_.node(j).output(0)] = vals_[n.output(0)];
                }
        }
        std::vector<Tensor> outs;
        for (const auto& o : g_.output()) {
            auto it = vals_.find(o.name());
            if (it == vals_.end()) kiln::detail::fail<ValueError>("onnx::load", "graph output '" + o.name() + "' is never computed", loc_);
            outs.push_back(it->second.t);
        }
        return outs;
    }

private:
    const ::onnx::GraphProto& g_;
    int opset_;
    std::map<std::string, int> types_;
    std::map<std::string, Tensor> init_;
    std::vector<std::string> user_inputs_;
    Loc loc_;
    std::map<std::string, Value> vals_;
    std::map<std::string, int> uses_;  ///< how many node inputs (and graph outputs) read each value
    std::map<std::string, int> producer_;  ///< the node that writes each value
    const ::onnx::NodeProto* node_ = nullptr;

    /// Node n's attribute `name`, or null.
    static const ::onnx::AttributeProto* attr_of(const ::onnx::NodeProto& n, const char* name) {
        for (const auto& a : n.attribute())
            if (a.name() == name) return &a;
        return nullptr;
    }
    /// The dtype a Cast node converts to (nullopt for a dtype kiln lacks).
    static std::optional<DType> cast_target(const ::onnx::NodeProto& c) {
        if (c.op_type() != "Cast") return std::nullopt;
        if (const auto* a = attr_of(c, "to")) return dtype_of(static_cast<int>(a->i()));
        return std::nullopt;
    }

    /// A bf16 / f16 op as ONNX writers spell it (kiln's exporter among them: ONNX has few kernels
    /// for the narrow types): Cast to float, one op in float, Cast back. Node i is that op when each
    /// operand is a Cast to float of a value of the narrow type (or a known number the narrow type
    /// holds exactly, or a reduction's axes) and its one reader is the Cast back. Run on the narrow
    /// values instead: kiln computes a bf16 / f16 op in float and rounds once, the same numbers, and
    /// the program keeps kiln's own form (a bias add that a GEMM's epilogue takes, no cast pairs
    /// between the fused ops). nullopt where node i is not such an op (it then runs as written).
    std::optional<Tensor> narrow_op(int i, const std::vector<Value>& in) {
        static const std::set<std::string> ops = {"Add",  "Sub",  "Mul",     "Div",        "Neg",       "Abs",       "Exp",      "Log",
                                                  "Sqrt", "Reciprocal", "Sin", "Cos",  "Tanh",      "Erf",       "Sigmoid",  "Relu",
                                                  "Max",  "Min",  "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"};
        const ::onnx::NodeProto& n = g_.node(i);
        if (!ops.count(n.op_type()) || n.output_size() != 1 || in.empty()) return std::nullopt;
        const int j = sole_reader(n.output(0), i);
        const std::optional<DType> t = j >= 0 ? cast_target(g_.node(j)) : std::nullopt;
        if (!t || (*t != DType::bf16 && *t != DType::f16)) return std::nullopt;
        std::vector<Value> narrow(in.size());
        bool any = false;
        for (int k = 0; k < n.input_size(); ++k) {
            const std::size_t kk = static_cast<std::size_t>(k);
            if (!in[kk].defined()) continue;
            const auto p = producer_.find(n.input(k));
            const ::onnx::NodeProto* c = p != producer_.end() && p->second < i ? &g_.node(p->second) : nullptr;
            if (c && cast_target(*c) == DType::f32 && c->input_size() == 1) {
                const auto v = vals_.find(c->input(0));
                if (v != vals_.end() && v->second.defined() && v->second.t.dtype() == *t) {
                    narrow[kk] = v->second;
                    any = true;
                    continue;
                }
            }
            const Tensor& x = in[kk].t;
            const bool axes = k == 1 && n.op_type().rfind("Reduce", 0) == 0 && x.dtype() == DType::i64;
            bool number = false;
            if (in[kk].known && x.numel() == 1 && is_floating(x.dtype())) {
                const trace::ActiveScope host(nullptr);  // a known value: read on the host, not traced
                number = x.to(*t).to(DType::f64).item<double>() == x.to(DType::f64).item<double>();
            }
            if (!in[kk].known || !(axes || number)) return std::nullopt;
            narrow[kk] = in[kk];
        }
        if (!any) return std::nullopt;
        const std::vector<Tensor> out = apply(n, narrow);
        if (out.size() != 1 || !out[0].defined() || out[0].dtype() != *t) return std::nullopt;  // (its nodes are dead code)
        return out[0];
    }

    /// Whether n only rearranges its input (Transpose, Reshape, ...).
    static bool layout_op(const ::onnx::NodeProto& n) {
        static const std::set<std::string> ops = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"};
        return ops.count(n.op_type()) > 0;
    }
    /// Whether output k of node i is a layout op's over a narrowed value whose one reader casts it
    /// back to `d`, its dtype now: the float its ONNX type says would be cast straight back,
    /// exactly, so it keeps its dtype (no cast pair between kiln's ops).
    bool cast_back_to(int i, int k, DType d) const {
        const ::onnx::NodeProto& n = g_.node(i);
        if (!layout_op(n) || (d != DType::bf16 && d != DType::f16)) return false;
        const int j = sole_reader(n.output(k), i);
        return j >= 0 && cast_target(g_.node(j)) == d;
    }

    /// scaled_dot_product_attention as ONNX writers decompose it: MatMul(Softmax(S [+ mask |
    /// Where(mask, S, -inf)]) [-> Dropout], v), q, k and v of rank 4, the softmax over the last axis,
    /// and the scores S either
    /// - MatMul(q, Transpose(k, 0 1 3 2)) times 1/sqrt(D) or divided by sqrt(D) (kiln's exporter,
    ///   Hugging Face's eager attention), or
    /// - MatMul(q * a, k^T * b) with a * b = 1/sqrt(D), k^T a Transpose(k, 0 1 3 2) or
    ///   Reshape(Transpose(Reshape(k, (-1, S, D)), 0 2 1), (.., D, S)) (torch.onnx's decomposition of
    ///   F.scaled_dot_product_attention, which scales q and k by sqrt of the scale each).
    /// Node i is that final MatMul: run it as nn::scaled_dot_product_attention (one kernel on CUDA;
    /// the decomposition's nodes become dead code). q, k and v that are Casts to float of one narrow
    /// dtype are read narrow (the result is then that dtype, as narrow_op's are). A Dropout here
    /// runs in inference mode (the importer refuses training mode): the identity. nullopt where node
    /// i is not such a MatMul.
    std::optional<Tensor> attention(int i, const std::vector<Value>& in) {
        const ::onnx::NodeProto& n = g_.node(i);
        if (n.op_type() != "MatMul" || in.size() != 2 || !in[0].defined() || !in[1].defined() || in[0].known) return std::nullopt;
        auto made_by = [&](const std::string& name, const char* op) -> const ::onnx::NodeProto* {
            const auto p = producer_.find(name);
            if (p == producer_.end() || p->second >= i) return nullptr;
            const ::onnx::NodeProto* m = &g_.node(p->second);
            return m->op_type() == op ? m : nullptr;
        };
        auto value = [&](const std::string& name) -> const Value* {
            const auto v = vals_.find(name);
            return v != vals_.end() && v->second.defined() ? &v->second : nullptr;
        };
        auto scalar = [&](const std::string& name, double& out) {  // a known one-element float
            const Value* v = value(name);
            if (!v || !v->known || v->t.numel() != 1 || !is_floating(v->t.dtype())) return false;
            const trace::ActiveScope host(nullptr);
            out = v->t.to(DType::f64).item<double>();
            return true;
        };
        const ::onnx::NodeProto* sm = made_by(n.input(0), "Softmax");
        if (const ::onnx::NodeProto* dr = sm ? nullptr : made_by(n.input(0), "Dropout")) sm = made_by(dr->input(0), "Softmax");
        if (!sm || opset_ < 13) return std::nullopt;
        if (const auto* a = attr_of(*sm, "axis"); a && a->i() != -1 && a->i() != 3) return std::nullopt;
        // S, masked or not
        std::string scores = sm->input(0);
        Tensor mask;
        if (const ::onnx::NodeProto* add = made_by(scores, "Add")) {
            // the scores side: a MatMul, or a Mul / Div of one (a mask may be a Mul too: (1 - m) * -big)
            auto scores_like = [&](const std::string& name) {
                if (made_by(name, "MatMul")) return true;
                const ::onnx::NodeProto* sc = made_by(name, "Mul");
                if (!sc) sc = made_by(name, "Div");
                return sc && (made_by(sc->input(0), "MatMul") || made_by(sc->input(1), "MatMul"));
            };
            const int which = scores_like(add->input(0)) ? 0 : 1;
            const Value* m = value(add->input(1 - which));
            if (!m || !is_floating(m->t.dtype())) return std::nullopt;
            mask = m->t;
            scores = add->input(which);
        } else if (const ::onnx::NodeProto* wh = made_by(scores, "Where")) {
            double neg = 0;
            const Value* m = value(wh->input(0));
            if (!m || m->t.dtype() != DType::boolean || !scalar(wh->input(2), neg) || neg != -INFINITY) return std::nullopt;
            mask = m->t;
            scores = wh->input(1);
        }
        auto has_perm = [&](const ::onnx::NodeProto& t, std::initializer_list<std::int64_t> want) {
            const auto* perm = attr_of(t, "perm");
            if (!perm || perm->ints_size() != static_cast<int>(want.size())) return false;
            int at = 0;
            for (std::int64_t w : want)
                if (perm->ints(at++) != w) return false;
            return true;
        };
        // k from k^T: Transpose(k, 0 1 3 2), or Reshape(Transpose(Reshape(k, (-1, S, D)), 0 2 1), (.., D, S))
        auto untransposed = [&](const std::string& kt) -> std::optional<std::string> {
            if (const ::onnx::NodeProto* tr = made_by(kt, "Transpose")) {
                if (has_perm(*tr, {0, 1, 3, 2})) return tr->input(0);
                return std::nullopt;
            }
            const ::onnx::NodeProto* outer = made_by(kt, "Reshape");
            const ::onnx::NodeProto* tr = outer ? made_by(outer->input(0), "Transpose") : nullptr;
            const ::onnx::NodeProto* inner = tr && has_perm(*tr, {0, 2, 1}) ? made_by(tr->input(0), "Reshape") : nullptr;
            const Value* k = inner ? value(inner->input(0)) : nullptr;
            const Value* flat = inner ? value(inner->output(0)) : nullptr;
            const Value* kv = value(kt);
            if (!k || !flat || !kv || k->t.rank() != 4 || flat->t.rank() != 3 || kv->t.rank() != 4) return std::nullopt;
            const Shape& ks = k->t.shape();
            if (!(flat->t.shape() == Shape{ks[0] * ks[1], ks[2], ks[3]}) || !(kv->t.shape() == Shape{ks[0], ks[1], ks[3], ks[2]}))
                return std::nullopt;
            return inner->input(0);
        };
        // the scores' q and k, and the scale they carry (c times, or divided by c)
        std::string qn, kn;
        double c = 0;
        bool div = false;
        if (const ::onnx::NodeProto* qk = made_by(scores, "MatMul")) {  // (q * a) @ (k^T * b)
            auto scaled = [&](const std::string& name, std::string& t, double& f) {
                const ::onnx::NodeProto* m = made_by(name, "Mul");
                if (!m) return false;
                const int s_at = scalar(m->input(1), f) ? 1 : scalar(m->input(0), f) ? 0 : -1;
                if (s_at < 0) return false;
                t = m->input(1 - s_at);
                return true;
            };
            std::string kt;
            double a = 0, b = 0;
            if (!scaled(qk->input(0), qn, a) || !scaled(qk->input(1), kt, b)) return std::nullopt;
            const std::optional<std::string> k = untransposed(kt);
            if (!k) return std::nullopt;
            kn = *k;
            c = a * b;
        } else {  // (q @ k^T) * c or / c
            const ::onnx::NodeProto* sc = made_by(scores, "Mul");
            div = !sc;
            if (!sc) sc = made_by(scores, "Div");
            if (!sc) return std::nullopt;
            const int mm_at = made_by(sc->input(0), "MatMul") ? 0 : 1;
            if (div && mm_at != 0) return std::nullopt;
            const ::onnx::NodeProto* mm = made_by(sc->input(mm_at), "MatMul");
            if (!mm || !scalar(sc->input(1 - mm_at), c)) return std::nullopt;
            const ::onnx::NodeProto* tr = made_by(mm->input(1), "Transpose");
            if (!tr || !has_perm(*tr, {0, 1, 3, 2})) return std::nullopt;
            qn = mm->input(0);
            kn = tr->input(0);
        }
        const Value* q = value(qn);
        const Value* k = value(kn);
        if (!q || !k || q->t.rank() != 4 || k->t.rank() != 4 || in[1].t.rank() != 4) return std::nullopt;
        const double d = static_cast<double>(q->t.size(3)), want = div ? std::sqrt(d) : 1.0 / std::sqrt(d);
        if (std::abs(c - want) > 1e-6 * want) return std::nullopt;
        // read through Casts to float of one narrow dtype
        Tensor ops[3] = {q->t, k->t, in[1].t};
        const std::string names[3] = {qn, kn, n.input(1)};
        std::optional<DType> narrow;
        Tensor nops[3];
        for (int a = 0; a < 3; ++a) {
            const ::onnx::NodeProto* cast = made_by(names[a], "Cast");
            const Value* from = cast && cast_target(*cast) == DType::f32 ? value(cast->input(0)) : nullptr;
            if (!from || (from->t.dtype() != DType::bf16 && from->t.dtype() != DType::f16) || (narrow && *narrow != from->t.dtype())) {
                narrow.reset();
                break;
            }
            narrow = from->t.dtype();
            nops[a] = from->t;
        }
        if (narrow) {  // only where the result goes back to that dtype (through layout ops): the same numbers
            int j = sole_reader(n.output(0), i);
            while (j >= 0 && layout_op(g_.node(j)) && g_.node(j).output_size() == 1) j = sole_reader(g_.node(j).output(0), j);
            if (j >= 0 && cast_target(g_.node(j)) == *narrow) std::copy(std::begin(nops), std::end(nops), std::begin(ops));
        }
        return nn::scaled_dot_product_attention(ops[0], ops[1], ops[2], mask, loc_);
    }

    /// What a Conv may absorb from the nodes after it: Conv -> Relu, Conv -> Add(z) [-> Relu], with z
    /// computed already; conv2d's fused residual and activation (one cuDNN call where cuDNN runs
    /// it), as ResNet's blocks are written in C++.
    struct Epilogue {
        Tensor residual;
        bool relu = false;
        std::vector<int> nodes;  ///< the absorbed nodes
        bool used = false;       ///< set by conv() when it fused them
    };
    mutable Epilogue epi_;  // conv() (const) says whether it used it

    /// The one node after node i that reads value v (-1 when v has other readers or is an output).
    int sole_reader(const std::string& v, int i) const {
        auto u = uses_.find(v);
        if (u == uses_.end() || u->second != 1) return -1;
        for (int j = i + 1; j < g_.node_size(); ++j)
            for (const std::string& name : g_.node(j).input())
                if (name == v) return j;
        return -1;
    }
    void plan_epilogue(int i) {
        const ::onnx::NodeProto& n = g_.node(i);
        if (n.output_size() != 1) return;
        int j = sole_reader(n.output(0), i);
        if (j < 0) return;
        const ::onnx::NodeProto* m = &g_.node(j);
        if (m->op_type() == "Add" && m->input_size() == 2 && m->output_size() == 1) {
            const std::string& other = m->input(0) == n.output(0) ? m->input(1) : m->input(0);
            auto z = vals_.find(other);
            if (other == n.output(0) || z == vals_.end()) return;
            epi_.residual = z->second.t;
            epi_.nodes.push_back(j);
            const int k = sole_reader(m->output(0), j);
            if (k >= 0 && g_.node(k).op_type() == "Relu") {
                epi_.relu = true;
                epi_.nodes.push_back(k);
            }
        } else if (m->op_type() == "Relu") {
            epi_.relu = true;
            epi_.nodes.push_back(j);
        }
    }

    std::string node_text() const {
        return "node '" + node_->name() + "' (" + node_->op_type() + ", opset " + std::to_string(opset_) + ")";
    }
    template <class E> [[noreturn]] void fail(const std::string& what) const { kiln::detail::fail<E>("onnx::load", node_text() + " " + what, loc_); }
    [[noreturn]] void unsupported_here(const std::string& what) const { fail<ImportError>(what); }

    // ---- attributes
    const ::onnx::AttributeProto* attr(const char* name) const { return attr_of(*node_, name); }
    std::int64_t ai(const char* name, std::int64_t def) const {
        const auto* a = attr(name);
        return a ? a->i() : def;
    }
    double af(const char* name, double def) const {
        const auto* a = attr(name);
        return a ? a->f() : def;
    }
    std::string as(const char* name, const std::string& def) const {
        const auto* a = attr(name);
        return a ? a->s() : def;
    }
    std::optional<std::vector<std::int64_t>> aints(const char* name) const {
        const auto* a = attr(name);
        if (!a) return std::nullopt;
        return std::vector<std::int64_t>(a->ints().begin(), a->ints().end());
    }

    // ---- values known when the model loads
    /// The values of v as S (read as dtype dt), which kiln needs when it builds the program.
    template <class S> std::vector<S> known_values(const Value& v, const char* what, DType dt) const {
        if (!v.known)
            unsupported_here(std::string("needs its ") + what +
                             " when the model loads, but it is computed from the inputs' values (a data-dependent shape)");
        const trace::ActiveScope host(nullptr);
        const Tensor c = v.t.to(dt).contiguous();
        const auto* p = static_cast<const S*>(c.data_ptr());
        return std::vector<S>(p, p + c.numel());
    }
    std::vector<std::int64_t> ints(const Value& v, const char* what) const { return known_values<std::int64_t>(v, what, DType::i64); }
    double number(const Value& v, const char* what) const {
        const std::vector<double> x = known_values<double>(v, what, DType::f64);
        if (x.size() != 1) fail<ShapeError>(std::string("'s ") + what + " must hold one value, got shape " + v.t.shape().str());
        return x[0];
    }
    /// axes from an attribute (older opsets) or an input (newer), normalized to rank.
    std::optional<std::vector<std::int64_t>> axes_of(const std::vector<Value>& in, std::size_t input, int rank) const {
        std::optional<std::vector<std::int64_t>> a = aints("axes");
        if (!a && in.size() > input && in[input].defined()) a = ints(in[input], "axes");
        if (a)
            for (auto& x : *a) {
                if (x < -rank || x >= std::max(rank, 1)) fail<ShapeError>("axis " + std::to_string(x) + " is out of range for rank " + std::to_string(rank));
                if (x < 0) x += rank;
            }
        return a;
    }
    int axis_of(std::int64_t a, int rank) const {
        if (a < -rank || a >= std::max(rank, 1)) fail<ShapeError>("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
        return static_cast<int>(a < 0 ? a + rank : a);
    }

    static Tensor T(const Tensor& t) { return t; }
    template <class E> Tensor T(const E& e) const { return Tensor(e, loc_); }

    // ---- helpers
    /// x[..., index, ...] along axis for integer indices of any shape (numpy's take; negative
    /// indices count from the end): kiln's gather over x seen as (outer, n, inner).
    Tensor take(const Tensor& x, int axis, Tensor idx) const {
        const std::int64_t n = x.size(axis);
        if (idx.dtype() != DType::i64 && idx.dtype() != DType::i32) fail<DTypeError>("indices must be int32 or int64, got " + std::string(dtype_name(idx.dtype())));
        if (idx.rank() == 0 && !idx.is_traced()) {  // one known index: a view
            const std::int64_t i = [&] {
                const trace::ActiveScope host(nullptr);
                return idx.to(DType::i64).item<std::int64_t>();
            }();
            if (i < -n || i >= n) fail<ValueError>("index " + std::to_string(i) + " is out of range for a dim of size " + std::to_string(n));
            return x.select(axis, i < 0 ? i + n : i, loc_);
        }
        idx = T(where(idx < 0, idx + n, idx));
        if (axis == 0 && x.rank() == 2 && idx.is_traced()) return embedding(x, idx, loc_);  // a lookup table: the library op
        std::int64_t outer = 1, inner = 1;
        for (int d = 0; d < axis; ++d) outer *= x.size(d);
        for (int d = axis + 1; d < x.rank(); ++d) inner *= x.size(d);
        const std::int64_t k = idx.numel();
        const Tensor x3 = x.reshape({outer, n, inner}, loc_);
        const Tensor i3 = idx.reshape({1, k, 1}, loc_).expand({outer, k, inner}, loc_);
        const Tensor g = gather(x3, 1, i3, loc_);
        std::vector<std::int64_t> shape;
        for (int d = 0; d < axis; ++d) shape.push_back(x.size(d));
        for (int d = 0; d < idx.rank(); ++d) shape.push_back(idx.size(d));
        for (int d = axis + 1; d < x.rank(); ++d) shape.push_back(x.size(d));
        return g.reshape(Shape(shape, loc_), loc_);
    }
    /// x at host-known positions along axis (reversed or strided slices, reflect and edge padding).
    Tensor take_known(const Tensor& x, int axis, const std::vector<std::int64_t>& pos) const {
        Tensor idx(Shape{static_cast<std::int64_t>(pos.size())}, DType::i64);
        {
            const trace::ActiveScope host(nullptr);
            if (!pos.empty()) std::memcpy(idx.data_ptr(), pos.data(), pos.size() * sizeof(std::int64_t));
        }
        if (pos.empty()) return x.slice(axis, 0, 0, 1, loc_);
        return take(x, axis, idx);
    }
    /// numpy broadcasting of two shapes.
    Shape broadcast(const Shape& a, const Shape& b) const {
        const int r = std::max(a.rank(), b.rank());
        Shape out = Shape::filled(r, 1);
        for (int i = 0; i < r; ++i) {
            const std::int64_t x = i - (r - a.rank()) >= 0 ? a[i - (r - a.rank())] : 1;
            const std::int64_t y = i - (r - b.rank()) >= 0 ? b[i - (r - b.rank())] : 1;
            if (x != y && x != 1 && y != 1) fail<ShapeError>("cannot broadcast shapes " + a.str() + " and " + b.str());
            out[i] = x == 1 ? y : x;
        }
        return out;
    }
    static Tensor as_float(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(default_float_dtype); }

    /// Reshape to 2-D at axis (the pre-13 softmax's coercion).
    Tensor to_2d(const Tensor& x, int axis) const {
        std::int64_t a = 1, b = 1;
        for (int d = 0; d < x.rank(); ++d) (d < axis ? a : b) *= x.size(d);
        return x.reshape({a, b}, loc_);
    }

    /// Pads as ONNX writes them (begins, then ends, for each spatial dim), from auto_pad or pads.
    std::vector<std::int64_t> window_pads(const Tensor& x, const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& s,
                                          const std::vector<std::int64_t>& dil) const {
        const std::size_t nd = k.size();
        const std::string ap = as("auto_pad", "NOTSET");
        std::vector<std::int64_t> pads = aints("pads").value_or(std::vector<std::int64_t>(2 * nd, 0));
        if (pads.size() != 2 * nd) fail<ShapeError>("has " + std::to_string(pads.size()) + " pads for " + std::to_string(nd) + " spatial dims");
        if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
            for (std::size_t i = 0; i < nd; ++i) {
                const std::int64_t in = x.size(static_cast<int>(2 + i)), out = (in + s[i] - 1) / s[i];
                const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * s[i] + (k[i] - 1) * dil[i] + 1 - in);
                pads[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
                pads[i + nd] = total - pads[i];
            }
        } else if (ap == "VALID") {
            std::fill(pads.begin(), pads.end(), 0);
        } else if (ap != "NOTSET") {
            fail<ValueError>("has an unknown auto_pad '" + ap + "'");
        }
        return pads;
    }
    /// kiln::pad's list (last dim first) from ONNX's begins/ends of the dims from `first`.
    static std::vector<std::int64_t> torch_pads(const std::vector<std::int64_t>& onnx, int rank, int first) {
        const std::size_t nd = onnx.size() / 2;
        std::vector<std::int64_t> p;
        for (int d = rank - 1; d >= first; --d) {
            const std::size_t i = static_cast<std::size_t>(d - first);
            p.push_back(i < nd ? onnx[i] : 0);
            p.push_back(i < nd ? onnx[i + nd] : 0);
        }
        return p;
    }

    struct WindowAttrs {
        std::vector<std::int64_t> k, s, dil, pads;
        std::size_t nd = 0;
    };
    WindowAttrs window_attrs(const Tensor& x, std::optional<std::vector<std::int64_t>> kernel) const {
        WindowAttrs w;
        if (x.rank() < 3) fail<ShapeError>("needs an input of rank 3 or more (N, C, spatial...), got " + x.shape().str());
        w.nd = static_cast<std::size_t>(x.rank() - 2);
        if (!kernel) kernel = aints("kernel_shape");
        if (!kernel || kernel->size() != w.nd) fail<ShapeError>("needs kernel_shape with one size per spatial dim of " + x.shape().str());
        w.k = *kernel;
        w.s = aints("strides").value_or(std::vector<std::int64_t>(w.nd, 1));
        w.dil = aints("dilations").value_or(std::vector<std::int64_t>(w.nd, 1));
        if (w.s.size() != w.nd || w.dil.size() != w.nd) fail<ShapeError>("has strides or dilations of the wrong length");
        w.pads = window_pads(x, w.k, w.s, w.dil);
        return w;
    }

    /// Pooling over windows as the elementwise max or sum of strided views of the padded input
    /// (any rank, asymmetric pads, ceil_mode): one fused kernel.
    Tensor pool_views(const Tensor& x, const WindowAttrs& w, bool is_max, bool ceil_mode, bool count_include_pad) const {
        const int r = x.rank();
        std::vector<std::int64_t> pads = w.pads, outs(w.nd);
        for (std::size_t i = 0; i < w.nd; ++i) {
            const std::int64_t in = x.size(static_cast<int>(2 + i)) + pads[i] + pads[i + w.nd];
            const std::int64_t span = w.dil[i] * (w.k[i] - 1) + 1;
            if (in < span) fail<ShapeError>("has a window larger than the padded input " + x.shape().str());
            std::int64_t o = ceil_mode ? (in - span + w.s[i] - 1) / w.s[i] + 1 : (in - span) / w.s[i] + 1;
            // a last window must start inside the input or its left padding
            if (ceil_mode && (o - 1) * w.s[i] >= x.size(static_cast<int>(2 + i)) + pads[i]) --o;
            outs[i] = o;
            const std::int64_t need = (o - 1) * w.s[i] + span - in;
            if (need > 0) pads[i + w.nd] += need;  // extra end padding that no window reads as data
        }
        const std::vector<std::int64_t> tp = torch_pads(pads, r, 2);
        const bool any_pad = std::any_of(tp.begin(), tp.end(), [](std::int64_t p) { return p != 0; });
        const double lowest = -std::numeric_limits<double>::infinity();
        const Tensor xp = any_pad ? pad(x, tp, is_max ? Scalar(is_floating(x.dtype()) ? lowest : -9.2e18) : Scalar(0), loc_) : x;
        // the view of the padded input that window offset t (row-major over the kernel) reads
        auto window_view = [&](const Tensor& src, std::int64_t t) {
            Tensor v = src;
            for (std::size_t i = w.nd; i-- > 0;) {
                const std::int64_t start = (t % w.k[i]) * w.dil[i];
                t /= w.k[i];
                v = v.slice(static_cast<int>(2 + i), start, start + (outs[i] - 1) * w.s[i] + 1, w.s[i], loc_);
            }
            return v;
        };
        Tensor acc;
        const std::int64_t terms = std::accumulate(w.k.begin(), w.k.end(), std::int64_t{1}, std::multiplies<>());
        for (std::int64_t t = 0; t < terms; ++t) {
            const Tensor v = window_view(xp, t);
            acc = !acc.defined() ? v : is_max ? T(maximum(acc, v)) : T(acc + v);
        }
        if (is_max) return acc;
        if (count_include_pad && w.pads == pads) return T(acc / static_cast<double>(terms));
        // the number of input (or, with count_include_pad, declared-padding) elements each window covers
        Tensor counts;
        {
            const trace::ActiveScope host(nullptr);
            Shape s = Shape::filled(r, 1);
            for (std::size_t i = 0; i < w.nd; ++i) s[static_cast<int>(2 + i)] = x.size(static_cast<int>(2 + i));
            Tensor ones_in = ones(s, x.dtype());
            if (count_include_pad) ones_in = pad(ones_in, torch_pads(w.pads, r, 2), 1);
            std::vector<std::int64_t> rest_pads = pads;
            if (count_include_pad)
                for (std::size_t i = 0; i < 2 * w.nd; ++i) rest_pads[i] -= w.pads[i];
            const Tensor op = pad(ones_in, torch_pads(rest_pads, r, 2), 0);
            for (std::int64_t t = 0; t < terms; ++t) {
                const Tensor v = window_view(op, t);
                counts = !counts.defined() ? v.contiguous() : Tensor(counts + v);
            }
        }
        return T(acc / counts);
    }

    Tensor conv(const std::vector<Value>& in) const {
        const Tensor& x = in[0].t;
        const Tensor& w = in[1].t;
        const Tensor b = in.size() > 2 ? in[2].t : Tensor{};
        if (x.rank() != 3 && x.rank() != 4) unsupported_here("is a " + std::to_string(x.rank() - 2) + "-D convolution; kiln has 1-D and 2-D");
        std::vector<std::int64_t> kernel;
        for (int d = 2; d < w.rank(); ++d) kernel.push_back(w.size(d));
        WindowAttrs a = window_attrs(x, kernel);
        const std::int64_t group = ai("group", 1);
        if (!is_floating(x.dtype())) fail<DTypeError>("needs floating inputs, got " + std::string(dtype_name(x.dtype())));
        Tensor x4 = x, w4 = w;
        if (x.rank() == 3) {  // 1-D as 2-D of height 1
            x4 = x.unsqueeze(2, loc_);
            w4 = w.unsqueeze(2, loc_);
            a.k.insert(a.k.begin(), 1);
            a.s.insert(a.s.begin(), 1);
            a.dil.insert(a.dil.begin(), 1);
            a.pads = {0, a.pads[0], 0, a.pads[1]};
            a.nd = 2;
        }
        Window win;
        win.kh = a.k[0], win.kw = a.k[1], win.sh = a.s[0], win.sw = a.s[1], win.dh = a.dil[0], win.dw = a.dil[1];
        if (a.pads[0] == a.pads[2] && a.pads[1] == a.pads[3]) {
            win.ph = a.pads[0], win.pw = a.pads[1];
        } else {
            x4 = pad(x4, torch_pads(a.pads, 4, 2), 0, loc_);
        }
        const std::int64_t c = x4.size(1);
        if (group < 1 || c % group != 0 || w4.size(0) % group != 0 || w4.size(1) * group != c)
            fail<ShapeError>("has group " + std::to_string(group) + " that does not fit input " + x.shape().str() + " and weight " + w.shape().str());
        Tensor y;
        if (group == 1 && x.rank() == 4 && !epi_.nodes.empty()) {
            // the expected output: (N, OC, OH, OW); a residual of another shape or dtype is not absorbed
            const Shape out{x4.size(0), w4.size(0), win.out_h(x4.size(2)), win.out_w(x4.size(3))};
            const Tensor& z = epi_.residual;
            if (!z.defined() || (z.shape() == out && z.dtype() == x.dtype())) {
                epi_.used = true;
                y = nn::detail::conv2d_nhwc(x4.permute({0, 2, 3, 1}, loc_), w4, b, win, epi_.relu ? Act::relu : Act::none, loc_,
                                            z.defined() ? z.permute({0, 2, 3, 1}, loc_) : Tensor{})
                        .permute({0, 3, 1, 2}, loc_);
                return y;
            }
        }
        if (group == 1) {
            y = conv2d(x4, w4, b, win, Act::none, loc_);
        } else {
            const std::int64_t ci = c / group, co = w4.size(0) / group;
            std::vector<Tensor> parts;
            for (std::int64_t gi = 0; gi < group; ++gi)
                parts.push_back(conv2d(x4.slice(1, gi * ci, (gi + 1) * ci, 1, loc_), w4.slice(0, gi * co, (gi + 1) * co, 1, loc_),
                                       b.defined() ? b.slice(0, gi * co, (gi + 1) * co, 1, loc_) : Tensor{}, win, Act::none, loc_));
            y = cat(parts, 1, loc_);
        }
        return x.rank() == 3 ? y.squeeze(2, loc_) : y;
    }


    /// ConvTranspose as the convolution it is the gradient of: the input spread `stride` apart
    /// with zeros, padded by dilation * (k - 1) - pads, convolved with the flipped, transposed weight.
    Tensor conv_transpose(const std::vector<Value>& in) const {
        Tensor x = in[0].t, w = in[1].t;
        const Tensor b = in.size() > 2 ? in[2].t : Tensor{};
        if (x.rank() != 3 && x.rank() != 4) unsupported_here("is a " + std::to_string(x.rank() - 2) + "-D transposed convolution; kiln has 1-D and 2-D");
        const bool one_d = x.rank() == 3;
        if (one_d) {
            x = x.unsqueeze(2, loc_);
            w = w.unsqueeze(2, loc_);
        }
        const std::size_t nd = 2;
        auto per_dim = [&](const char* name, std::int64_t def) {
            std::vector<std::int64_t> v = aints(name).value_or(std::vector<std::int64_t>(one_d ? 1 : 2, def));
            if (one_d) v.insert(v.begin(), def);
            if (v.size() != nd) fail<ShapeError>("has " + std::string(name) + " of the wrong length");
            return v;
        };
        const std::vector<std::int64_t> s = per_dim("strides", 1), dil = per_dim("dilations", 1), outpad = per_dim("output_padding", 0);
        const std::vector<std::int64_t> k = {w.size(2), w.size(3)};
        const std::int64_t group = ai("group", 1), cin = x.size(1), cout = w.size(1) * group;
        if (group < 1 || w.size(0) != cin || cin % group != 0) fail<ShapeError>("has weight " + w.shape().str() + " that does not fit input " + x.shape().str() + " with group " + std::to_string(group));
        // pads: given, or from auto_pad and output_shape
        std::vector<std::int64_t> pads(2 * nd, 0);
        if (auto p = aints("pads")) {
            if (one_d) pads = {0, (*p)[0], 0, (*p)[1]};
            else pads = *p;
        }
        std::vector<std::int64_t> out_shape;
        if (auto o = aints("output_shape")) {
            out_shape = *o;
            if (out_shape.size() > nd) out_shape.erase(out_shape.begin(), out_shape.end() - static_cast<std::ptrdiff_t>(nd) + (one_d ? 1 : 0));
            if (one_d) out_shape.insert(out_shape.begin(), 1);
        }
        const std::string ap = as("auto_pad", "NOTSET");
        if (!out_shape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
            for (std::size_t i = 0; i < nd; ++i) {
                const std::int64_t in_i = x.size(static_cast<int>(2 + i));
                const std::int64_t want = !out_shape.empty() ? out_shape[i] : in_i * s[i];
                const std::int64_t total = s[i] * (in_i - 1) + outpad[i] + ((k[i] - 1) * dil[i] + 1) - want;
                // as ONNX's reference and Runtime do (the spec's text swaps SAME_UPPER's halves); a
                // negative total makes the output larger
                pads[i] = ap == "SAME_LOWER" ? total - total / 2 : total / 2;
                pads[i + nd] = total - pads[i];
            }
        }
        // spread the input: (N, C, H, W) -> (N, C, (H - 1) * sh + 1, (W - 1) * sw + 1)
        const std::int64_t N = x.size(0), H = x.size(2), W = x.size(3);
        Tensor z = x;
        if (s[0] > 1 || s[1] > 1) {
            z = pad(x.reshape({N, cin, H, 1, W, 1}, loc_), {0, s[1] - 1, 0, 0, 0, s[0] - 1}, 0, loc_)
                    .reshape({N, cin, H * s[0], W * s[1]}, loc_)
                    .slice(2, 0, (H - 1) * s[0] + 1, 1, loc_)
                    .slice(3, 0, (W - 1) * s[1] + 1, 1, loc_);
        }
        std::vector<std::int64_t> around;  // kiln::pad's order: W (left, right), then H (top, bottom)
        for (int i = 1; i >= 0; --i) {
            const std::size_t u = static_cast<std::size_t>(i);
            const std::int64_t full = dil[u] * (k[u] - 1);
            around.push_back(full - pads[u]);
            around.push_back(full - pads[u + nd] + outpad[u]);
        }
        z = pad(z, around, 0, loc_);  // negative entries crop
        std::vector<std::int64_t> rh(static_cast<std::size_t>(k[0])), rw(static_cast<std::size_t>(k[1]));
        for (std::int64_t i = 0; i < k[0]; ++i) rh[static_cast<std::size_t>(i)] = k[0] - 1 - i;
        for (std::int64_t i = 0; i < k[1]; ++i) rw[static_cast<std::size_t>(i)] = k[1] - 1 - i;
        const Tensor wf = take_known(take_known(w, 2, rh), 3, rw);  // flipped: (Cin, Cout/g, kh, kw)
        Window win;
        win.kh = k[0], win.kw = k[1], win.dh = dil[0], win.dw = dil[1];
        const std::int64_t ci = cin / group, co = cout / group;
        std::vector<Tensor> parts;
        for (std::int64_t gi = 0; gi < group; ++gi) {
            const Tensor wg = wf.slice(0, gi * ci, (gi + 1) * ci, 1, loc_).transpose(0, 1, loc_).contiguous();  // (Cout/g, Cin/g, kh, kw)
            const Tensor zg = group == 1 ? z : z.slice(1, gi * ci, (gi + 1) * ci, 1, loc_);
            parts.push_back(conv2d(zg, wg, b.defined() ? b.slice(0, gi * co, (gi + 1) * co, 1, loc_) : Tensor{}, win, Act::none, loc_));
        }
        const Tensor y = group == 1 ? parts[0] : cat(parts, 1, loc_);
        return one_d ? y.squeeze(2, loc_) : y;
    }

    Tensor pool(const std::vector<Value>& in, bool is_max) const {
        const Tensor& x = in[0].t;
        const WindowAttrs a = window_attrs(x, std::nullopt);
        const bool ceil_mode = ai("ceil_mode", 0) != 0;
        if (is_max && x.rank() == 4 && !ceil_mode && a.pads[0] == a.pads[2] && a.pads[1] == a.pads[3] && a.pads[0] <= a.k[0] / 2 &&
            a.pads[1] <= a.k[1] / 2 && is_floating(x.dtype())) {
            Window win;
            win.kh = a.k[0], win.kw = a.k[1], win.sh = a.s[0], win.sw = a.s[1], win.ph = a.pads[0], win.pw = a.pads[1];
            win.dh = a.dil[0], win.dw = a.dil[1];
            return max_pool2d(x, win, loc_);
        }
        return pool_views(x, a, is_max, ceil_mode, ai("count_include_pad", 0) != 0);
    }

    Tensor reduce(const std::string& op, const std::vector<Value>& in) const {
        const Tensor& x = in[0].t;
        const bool axes_input = op == "ReduceSum" ? opset_ >= 13 : opset_ >= 18;
        std::optional<std::vector<std::int64_t>> axes = axes_of(in, axes_input ? 1 : in.size(), x.rank());
        const bool keep = ai("keepdims", 1) != 0;
        if ((!axes || axes->empty()) && ai("noop_with_empty_axes", 0) != 0) return x;
        Axes ax;
        if (axes && !axes->empty()) ax = Axes(*axes);
        if (x.rank() == 0) ax = Axes{};
        if (op == "ReduceSum") return sum(x, ax, keep, loc_);
        if (op == "ReduceMean") return mean(as_float(x), ax, keep, loc_);
        if (op == "ReduceMax") return max(x, ax, keep, loc_);
        if (op == "ReduceMin") return min(x, ax, keep, loc_);
        if (op == "ReduceProd") return prod(x, ax, keep, loc_);
        if (op == "ReduceL1") return sum(T(abs(x)), ax, keep, loc_);
        if (op == "ReduceL2") return T(sqrt(sum(T(as_float(x) * as_float(x)), ax, keep, loc_)));
        if (op == "ReduceSumSquare") return sum(T(x * x), ax, keep, loc_);
        if (op == "ReduceLogSum") return T(log(sum(as_float(x), ax, keep, loc_)));
        return logsumexp(as_float(x), ax, keep, loc_);  // ReduceLogSumExp
    }

    Tensor arg(const std::vector<Value>& in, bool is_max) const {
        Tensor x = in[0].t;
        const int axis = axis_of(ai("axis", 0), x.rank());
        const bool keep = ai("keepdims", 1) != 0;
        if (ai("select_last_index", 0) == 0) return is_max ? argmax(x, axis, keep, loc_) : argmin(x, axis, keep, loc_);
        const std::int64_t n = x.size(axis);
        std::vector<std::int64_t> rev(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) rev[static_cast<std::size_t>(i)] = n - 1 - i;
        x = take_known(x, axis, rev);
        const Tensor i = is_max ? argmax(x, axis, keep, loc_) : argmin(x, axis, keep, loc_);
        return T((n - 1) - i);
    }

    Tensor softmax_like(const std::string& op, const Tensor& x) const {
        const bool legacy = opset_ < 13;
        const int axis = axis_of(ai("axis", legacy ? 1 : -1), x.rank());
        const Tensor v = legacy ? to_2d(x, axis) : x;
        const int a = legacy ? 1 : axis;
        Tensor y;
        if (op == "Softmax") y = softmax(v, a, loc_);
        else if (op == "LogSoftmax") y = log_softmax(v, a, loc_);
        else {  // Hardmax: 1 at the first maximum
            const Tensor am = argmax(v, a, true, loc_);
            Shape s = Shape::filled(v.rank(), 1);
            s[a] = v.size(a);
            const Tensor ramp = arange(v.size(a), DType::i64, v.device(), loc_).reshape(s, loc_);
            y = T(cast(ramp == am, v.dtype()));
        }
        return legacy ? y.reshape(x.shape(), loc_) : y;
    }

    std::vector<Tensor> layer_norm_op(const std::vector<Value>& in) const {
        const Tensor& x0 = in[0].t;
        const int axis = axis_of(ai("axis", -1), x0.rank());
        const double eps = af("epsilon", 1e-5);
        const DType dt = x0.dtype();
        const Tensor x = ai("stash_type", 1) == 1 && (dt == DType::f16 || dt == DType::bf16) ? x0.to(DType::f32) : x0;
        std::vector<std::int64_t> axes;
        for (int d = axis; d < x.rank(); ++d) axes.push_back(d);
        const Tensor mu = mean(x, axes, true, loc_);
        const Tensor rstd = T(rsqrt(mean(T(square(x - mu)), axes, true, loc_) + eps));
        Tensor y = T((x - mu) * rstd);
        if (y.dtype() != dt) y = y.to(dt);
        y = T(y * in[1].t);
        if (in.size() > 2 && in[2].defined()) y = T(y + in[2].t);
        return {y, mu, rstd};
    }

    /// Per-channel (dim 1) parameter shaped to broadcast against x.
    Tensor channel(const Tensor& p, const Tensor& x) const {
        Shape s = Shape::filled(x.rank(), 1);
        s[1] = p.numel();
        return p.reshape(s, loc_);
    }

    Tensor reshape_op(const Tensor& x, std::vector<std::int64_t> shape) const {
        const bool allow_zero = ai("allowzero", 0) != 0;
        for (std::size_t i = 0; i < shape.size(); ++i)
            if (shape[i] == 0 && !allow_zero) {
                if (static_cast<int>(i) >= x.rank()) fail<ShapeError>("copies dim " + std::to_string(i) + " of " + x.shape().str() + ", which it does not have");
                shape[i] = x.size(static_cast<int>(i));
            }
        return x.reshape(Shape(shape, loc_), loc_);
    }

    Tensor slice_op(const std::vector<Value>& in) const {
        Tensor x = in[0].t;
        std::vector<std::int64_t> starts, ends, axes, steps;
        if (opset_ < 10) {
            starts = aints("starts").value_or(std::vector<std::int64_t>{});
            ends = aints("ends").value_or(std::vector<std::int64_t>{});
            axes = aints("axes").value_or(std::vector<std::int64_t>{});
        } else {
            starts = ints(in[1], "starts");
            ends = ints(in[2], "ends");
            if (in.size() > 3 && in[3].defined()) axes = ints(in[3], "axes");
            if (in.size() > 4 && in[4].defined()) steps = ints(in[4], "steps");
        }
        if (axes.empty())
            for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
        if (steps.empty()) steps.assign(starts.size(), 1);
        if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
            fail<ShapeError>("has starts, ends, axes and steps of different lengths");
        for (std::size_t i = 0; i < starts.size(); ++i) {
            const int a = axis_of(axes[i], x.rank());
            const std::int64_t n = x.size(a), st = steps[i];
            if (st == 0) fail<ValueError>("has a step of 0");
            auto clampi = [](std::int64_t v, std::int64_t lo, std::int64_t hi) { return std::min(std::max(v, lo), hi); };
            std::int64_t s = starts[i] < 0 ? starts[i] + n : starts[i];
            std::int64_t e = ends[i] < 0 ? ends[i] + n : ends[i];
            if (ends[i] < std::numeric_limits<std::int64_t>::min() / 2) e = -1;
            if (st > 0) {
                s = clampi(s, 0, n);
                e = clampi(e, 0, n);
                x = x.slice(a, s, std::max(s, e), st, loc_);
            } else {
                s = clampi(s, 0, n - 1);
                e = clampi(e, -1, n - 1);
                std::vector<std::int64_t> pos;
                for (std::int64_t j = s; j > e; j += st) pos.push_back(j);
                x = take_known(x, a, pos);
            }
        }
        return x;
    }

    Tensor pad_op(const std::vector<Value>& in) const {
        Tensor x = in[0].t;
        const std::string mode = as("mode", "constant");
        std::vector<std::int64_t> pads = opset_ < 11 ? aints("pads").value_or(std::vector<std::int64_t>{}) : ints(in[1], "pads");
        double value = opset_ < 11 ? af("value", 0) : in.size() > 2 && in[2].defined() ? number(in[2], "constant_value") : 0.0;
        const int r = x.rank();
        std::vector<std::int64_t> axes;
        if (in.size() > 3 && in[3].defined()) {
            for (std::int64_t a : ints(in[3], "axes")) axes.push_back(axis_of(a, r));
        } else {
            for (int d = 0; d < r; ++d) axes.push_back(d);
        }
        if (pads.size() != 2 * axes.size()) fail<ShapeError>("has " + std::to_string(pads.size()) + " pads for " + std::to_string(axes.size()) + " axes");
        std::vector<std::int64_t> full(2 * static_cast<std::size_t>(r), 0);
        for (std::size_t i = 0; i < axes.size(); ++i) {
            full[static_cast<std::size_t>(axes[i])] = pads[i];
            full[static_cast<std::size_t>(axes[i] + r)] = pads[i + axes.size()];
        }
        if (mode == "constant") return pad(x, torch_pads(full, r, 0), Scalar(value), loc_);
        if (mode != "reflect" && mode != "edge") fail<ValueError>("has an unknown mode '" + mode + "'");
        for (int d = 0; d < r; ++d) {
            const std::int64_t b = full[static_cast<std::size_t>(d)], e = full[static_cast<std::size_t>(d + r)], n = x.size(d);
            if (b == 0 && e == 0) continue;
            if (b < 0 || e < 0) unsupported_here("has a negative pad in mode " + mode);
            if (mode == "reflect" && (b >= n || e >= n)) fail<ShapeError>("reflects " + std::to_string(std::max(b, e)) + " elements of a dim of size " + std::to_string(n));
            std::vector<std::int64_t> pos;
            for (std::int64_t j = -b; j < n + e; ++j)
                pos.push_back(j < 0 ? (mode == "edge" ? 0 : -j) : j >= n ? (mode == "edge" ? n - 1 : 2 * (n - 1) - j) : j);
            x = take_known(x, d, pos);
        }
        return x;
    }

    Tensor constant(const ::onnx::NodeProto& n) const {
        const trace::ActiveScope host(nullptr);
        for (const auto& a : n.attribute()) {
            const std::string& k = a.name();
            if (k == "value") return tensor_from_proto(a.t(), "", loc_);
            if (k == "value_float") return full(Shape{}, a.f(), DType::f32);
            if (k == "value_int") return full(Shape{}, a.i(), DType::i64);
            if (k == "value_floats" || k == "value_ints") {
                const bool f = k == "value_floats";
                Tensor t(Shape{static_cast<std::int64_t>(f ? a.floats_size() : a.ints_size())}, f ? DType::f32 : DType::i64);
                if (f) std::copy(a.floats().begin(), a.floats().end(), static_cast<float*>(t.data_ptr()));
                else std::copy(a.ints().begin(), a.ints().end(), static_cast<std::int64_t*>(t.data_ptr()));
                return t;
            }
        }
        unsupported_here("has a kind of value kiln does not read (sparse tensors and strings are not supported)");
    }

    Tensor int_divide(const Tensor& a, const Tensor& b) const {
        if (is_floating(a.dtype()) || is_floating(b.dtype())) return T(a / b);
        return T(floor_divide(a - fmod(a, b), b));  // ONNX's integer Div truncates toward zero
    }


    /// The negative log-likelihood of log-probabilities x (N, C, ...) at integer targets (N, ...):
    /// NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss after a log_softmax.
    Tensor nll(const Tensor& x, const Tensor& target, const Tensor& weight) const {
        if (x.rank() < 2 || target.rank() != x.rank() - 1) fail<ShapeError>("needs input (N, C, ...) and target (N, ...), got " + x.shape().str() + " and " + target.shape().str());
        const std::string red = as("reduction", "mean");
        const bool has_ii = attr("ignore_index") != nullptr;
        const std::int64_t ii = ai("ignore_index", 0);
        const Tensor t = has_ii ? T(where(target == ii, 0, target)) : target;
        const Tensor picked = gather(x, 1, t.unsqueeze(1, loc_), loc_).squeeze(1, loc_);
        Tensor w;
        if (weight.defined()) w = take(weight, 0, t);
        if (has_ii) w = w.defined() ? T(where(target == ii, 0, w)) : T(cast(target != ii, x.dtype()));
        const Tensor loss = w.defined() ? T(-(picked * w)) : T(-picked);
        if (red == "none") return loss;
        if (red == "sum") return sum(loss, {}, false, loc_);
        if (red != "mean") fail<ValueError>("has an unknown reduction '" + red + "'");
        return w.defined() ? T(sum(loss, {}, false, loc_) / sum(w, {}, false, loc_)) : mean(loss, {}, false, loc_);
    }

    /// Resize (and Upsample) as ONNX's reference computes it, one axis at a time: each output
    /// position is a weighted sum of a few input positions along the axis (nearest: one, linear: 2,
    /// cubic: 4), both known when the model loads, so an axis is a few gathers and a fused sum.
    Tensor resize(const Tensor& x, std::vector<double> scales, std::vector<std::int64_t> sizes, const std::string& coord_mode) const {
        const std::string mode = as("mode", "nearest"), nearest = as("nearest_mode", "round_prefer_floor");
        const double A = af("cubic_coeff_a", -0.75);
        const bool exclude = ai("exclude_outside", 0) != 0;
        if (coord_mode == "tf_crop_and_resize") unsupported_here("uses coordinate_transformation_mode tf_crop_and_resize");
        if (mode != "nearest" && mode != "linear" && mode != "cubic") fail<ValueError>("has an unknown mode '" + mode + "'");
        const int r = x.rank();
        if (!sizes.empty()) {
            if (static_cast<int>(sizes.size()) != r) fail<ShapeError>("has " + std::to_string(sizes.size()) + " sizes for rank " + std::to_string(r));
            scales.clear();
            for (int d = 0; d < r; ++d) scales.push_back(static_cast<double>(sizes[static_cast<std::size_t>(d)]) / static_cast<double>(x.size(d)));
        } else {
            if (static_cast<int>(scales.size()) != r) fail<ShapeError>("has " + std::to_string(scales.size()) + " scales for rank " + std::to_string(r));
            for (int d = 0; d < r; ++d) sizes.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(x.size(d)) * scales[static_cast<std::size_t>(d)])));
        }
        Tensor y = x;
        for (int d = 0; d < r; ++d) {
            const std::int64_t in = x.size(d), out = sizes[static_cast<std::size_t>(d)];
            const double scale = scales[static_cast<std::size_t>(d)];
            if (out == in && scale == 1.0) continue;
            const int n = mode == "cubic" ? 4 : 2;
            std::vector<std::vector<std::int64_t>> idx(static_cast<std::size_t>(n), std::vector<std::int64_t>(static_cast<std::size_t>(out)));
            std::vector<std::vector<double>> wt(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(out)));
            const double out_w = scale * static_cast<double>(in);
            for (std::int64_t o = 0; o < out; ++o) {
                const double xo = static_cast<double>(o);
                double xi;
                if (coord_mode == "align_corners") xi = out_w == 1 ? 0.0 : xo * static_cast<double>(in - 1) / (out_w - 1);
                else if (coord_mode == "asymmetric") xi = xo / scale;
                else if (coord_mode == "pytorch_half_pixel") xi = out_w == 1 ? -0.5 : (xo + 0.5) / scale - 0.5;
                else if (coord_mode == "half_pixel") xi = (xo + 0.5) / scale - 0.5;
                else if (coord_mode == "tf_half_pixel_for_nn") xi = (xo + 0.5) / scale;
                else fail<ValueError>("has an unknown coordinate_transformation_mode '" + coord_mode + "'");
                const double fl = std::floor(xi);
                const double ratio = xi == fl ? 1.0 : xi - fl;
                std::vector<double> c;
                if (mode == "nearest") {
                    if (xi == fl) c = {0, 1};
                    else if (nearest == "round_prefer_floor") c = {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
                    else if (nearest == "round_prefer_ceil") c = {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
                    else if (nearest == "floor") c = {1, 0};
                    else if (nearest == "ceil") c = {0, 1};
                    else fail<ValueError>("has an unknown nearest_mode '" + nearest + "'");
                } else if (mode == "linear") {
                    c = {1 - ratio, ratio};
                } else {
                    const double t = ratio;
                    c = {((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A, ((A + 2) * t - (A + 3)) * t * t + 1,
                         ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1, ((A * (2 - t) - 5 * A) * (2 - t) + 8 * A) * (2 - t) - 4 * A};
                }
                // the n positions nearest to xi (ties to the lower), as the reference picks them
                // (at an integer xi the reference takes ratio 1 over [xi - 1, xi])
                const std::int64_t first = static_cast<std::int64_t>(xi == fl ? fl - 1 : fl) - n / 2 + 1;
                double total = 0;
                for (int k = 0; k < n; ++k) {
                    const std::int64_t p = first + k;
                    double w = c[static_cast<std::size_t>(k)];
                    if (exclude && (p < 0 || p >= in)) w = 0;
                    idx[static_cast<std::size_t>(k)][static_cast<std::size_t>(o)] = std::clamp<std::int64_t>(p, 0, in - 1);
                    wt[static_cast<std::size_t>(k)][static_cast<std::size_t>(o)] = w;
                    total += w;
                }
                if (exclude && total != 0)
                    for (int k = 0; k < n; ++k) wt[static_cast<std::size_t>(k)][static_cast<std::size_t>(o)] /= total;
            }
            Tensor acc;
            for (int k = 0; k < n; ++k) {
                const auto& w = wt[static_cast<std::size_t>(k)];
                if (std::all_of(w.begin(), w.end(), [](double v) { return v == 0; })) continue;
                const Tensor v = take_known(y, d, idx[static_cast<std::size_t>(k)]);
                Tensor term = v;
                if (!std::all_of(w.begin(), w.end(), [](double v) { return v == 1; })) {
                    Tensor wt_t;
                    {
                        const trace::ActiveScope host(nullptr);
                        Shape s = Shape::filled(r, 1);
                        s[d] = out;
                        wt_t = Tensor(s, DType::f64);
                        std::copy(w.begin(), w.end(), static_cast<double*>(wt_t.data_ptr()));
                        wt_t = wt_t.to(is_floating(x.dtype()) ? x.dtype() : DType::f32);
                    }
                    term = T(v * wt_t);
                }
                acc = acc.defined() ? T(acc + term) : term;
            }
            y = acc.dtype() == x.dtype() ? acc : acc.to(x.dtype());
        }
        return y;
    }

    /// Upsample's and Resize-10's nearest: the input position floor(o / scale).
    Tensor resize_nearest_floor(const Tensor& x, const std::vector<double>& scales) const {
        if (static_cast<int>(scales.size()) != x.rank()) fail<ShapeError>("has " + std::to_string(scales.size()) + " scales for rank " + std::to_string(x.rank()));
        Tensor y = x;
        for (int d = 0; d < x.rank(); ++d) {
            const double sc = scales[static_cast<std::size_t>(d)];
            const std::int64_t out = static_cast<std::int64_t>(std::floor(static_cast<double>(x.size(d)) * sc));
            if (out == x.size(d)) continue;
            std::vector<std::int64_t> pos;
            for (std::int64_t o = 0; o < out; ++o) pos.push_back(std::min<std::int64_t>(x.size(d) - 1, static_cast<std::int64_t>(std::floor(static_cast<double>(o) / sc))));
            y = take_known(y, d, pos);
        }
        return y;
    }

    /// Elementwise ONNX ops (each output element reads only the operands' elements at its index).
    static bool elementwise_op(const std::string& op) {
        static const std::set<std::string> ops = {
            "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Erf", "Sigmoid", "Relu", "Floor",
            "Ceil", "Round", "Sign", "Not", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softplus", "Softsign", "HardSwish",
            "IsNaN", "Mish", "Gelu", "HardSigmoid", "Elu", "Celu", "Selu", "LeakyRelu", "ThresholdedRelu", "Shrink", "IsInf",
            "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or",
            "Xor", "Where", "Max", "Min", "Sum", "Mean", "Clip", "Cast", "CastLike"};
        return ops.count(op) != 0;
    }
    /// A 4-D value whose memory is channels-last (NHWC) under its NCHW shape: a convolution's output.
    static bool channels_last(const Tensor& t) {
        if (!t.defined() || t.rank() != 4 || t.is_contiguous()) return false;
        std::int64_t expect = 1;  // from the strides (a permute here would record a view while tracing)
        for (int d : {1, 3, 2, 0}) {
            if (t.size(d) != 1 && t.strides()[d] != expect) return false;
            expect *= t.size(d);
        }
        return true;
    }

    /// Runs node n. An elementwise node over a convolution's output runs in its channels-last
    /// order (operands seen through the same permutation, the result permuted back: views only), so
    /// its result stays channels-last and the next convolution reads it without a copy; computed in
    /// the NCHW order it would be written NCHW and copied back before every convolution.
    std::vector<Tensor> apply(const ::onnx::NodeProto& n, const std::vector<Value>& in) {
        if (elementwise_op(n.op_type()) && std::any_of(in.begin(), in.end(), [](const Value& v) { return channels_last(v.t); })) {
            bool fits = true;
            for (const Value& v : in) fits = fits && (!v.defined() || v.t.rank() <= 4);
            if (fits) {
                std::vector<Value> nhwc = in;
                for (Value& v : nhwc) {
                    if (!v.defined() || (v.t.rank() < 2 && v.t.numel() == 1)) continue;  // scalars broadcast as they are
                    Tensor t = v.t;
                    while (t.rank() < 4) t = t.unsqueeze(0, loc_);
                    v.t = t.permute({0, 2, 3, 1}, loc_);
                }
                std::vector<Tensor> out = apply_node(n, nhwc);
                for (Tensor& t : out)
                    if (t.defined() && t.rank() == 4) t = t.permute({0, 3, 1, 2}, loc_);
                return out;
            }
        }
        return apply_node(n, in);
    }

    std::vector<Tensor> apply_node(const ::onnx::NodeProto& n, const std::vector<Value>& in) {
        const std::string& op = n.op_type();
        if (!n.domain().empty() && n.domain() != "ai.onnx") unsupported_here("is in domain '" + n.domain() + "', which kiln does not implement");
        auto need = [&](std::size_t k) {
            if (in.size() < k) fail<ValueError>("has " + std::to_string(in.size()) + " inputs, needs " + std::to_string(k));
            for (std::size_t i = 0; i < k; ++i)
                if (!in[i].defined()) fail<ValueError>("lacks its input " + std::to_string(i));
        };
        auto x = [&]() -> const Tensor& { need(1); return in[0].t; };
        auto y = [&]() -> const Tensor& { need(2); return in[1].t; };
        auto one = [](const Tensor& t) { return std::vector<Tensor>{t}; };
        auto unary = [&](auto f) { return one(T(f(x()))); };
        // ---- elementwise
        if (op == "Identity") return one(x());
        if (op == "Abs") return unary([](const Tensor& v) { return abs(v); });
        if (op == "Neg") return unary([](const Tensor& v) { return neg(v); });
        if (op == "Exp") return unary([](const Tensor& v) { return exp(v); });
        if (op == "Log") return unary([](const Tensor& v) { return log(v); });
        if (op == "Sqrt") return unary([](const Tensor& v) { return sqrt(v); });
        if (op == "Reciprocal") return unary([](const Tensor& v) { return reciprocal(v); });
        if (op == "Sin") return unary([](const Tensor& v) { return sin(v); });
        if (op == "Cos") return unary([](const Tensor& v) { return cos(v); });
        if (op == "Tan") return unary([](const Tensor& v) { return tan(v); });
        if (op == "Tanh") return unary([](const Tensor& v) { return tanh(v); });
        if (op == "Erf") return unary([](const Tensor& v) { return erf(v); });
        if (op == "Sigmoid") return unary([](const Tensor& v) { return sigmoid(v); });
        if (op == "Relu") return unary([](const Tensor& v) { return relu(v); });
        if (op == "Floor") return unary([](const Tensor& v) { return floor(v); });
        if (op == "Ceil") return unary([](const Tensor& v) { return ceil(v); });
        if (op == "Round") return unary([](const Tensor& v) { return round(v); });
        if (op == "Sign") return unary([](const Tensor& v) { return sign(v); });
        if (op == "Not") return unary([](const Tensor& v) { return logical_not(v); });
        if (op == "Sinh") return unary([](const Tensor& v) { return (exp(v) - exp(-v)) * 0.5; });
        if (op == "Cosh") return unary([](const Tensor& v) { return (exp(v) + exp(-v)) * 0.5; });
        if (op == "Asinh") return unary([](const Tensor& v) { return log(v + sqrt(v * v + 1)); });
        if (op == "Acosh") return unary([](const Tensor& v) { return log(v + sqrt(v * v - 1)); });
        if (op == "Atanh") return unary([](const Tensor& v) { return log((1 + v) / (1 - v)) * 0.5; });
        if (op == "Softplus") return unary([](const Tensor& v) { return softplus(v); });
        if (op == "Softsign") return unary([](const Tensor& v) { return v / (abs(v) + 1); });
        if (op == "HardSwish") return unary([](const Tensor& v) { return hardswish(v); });
        if (op == "IsNaN") return unary([](const Tensor& v) { return v != v; });
        if (op == "Mish") return unary([](const Tensor& v) { return v * tanh(softplus(v)); });
        if (op == "Gelu") {  // opset 20
            const std::string approx = as("approximate", "none");
            if (approx == "tanh") return unary([](const Tensor& v) { return gelu_tanh(v); });
            if (approx != "none") fail<ValueError>("has an unknown approximate '" + approx + "'");
            return unary([](const Tensor& v) { return gelu(v); });
        }
        if (op == "HardSigmoid") {
            const double a = af("alpha", 0.2), b = af("beta", 0.5);
            return unary([&](const Tensor& v) { return maximum(minimum(v * a + b, 1.0), 0.0); });
        }
        if (op == "Elu" || op == "Celu") {
            const double a = af("alpha", 1.0);
            if (op == "Elu") return unary([&](const Tensor& v) { return where(v > 0, v, (exp(v) - 1) * a); });
            return unary([&](const Tensor& v) { return maximum(v, 0.0) + minimum((exp(v / a) - 1) * a, 0.0); });
        }
        if (op == "Selu") {
            const double a = af("alpha", 1.67326319217681884765625), g = af("gamma", 1.05070102214813232421875);
            return unary([&](const Tensor& v) { return where(v > 0, v * g, (exp(v) * a - a) * g); });
        }
        if (op == "LeakyRelu") {
            const double a = af("alpha", 0.01);
            return unary([&](const Tensor& v) { return where(v >= 0, v, v * a); });
        }
        if (op == "ThresholdedRelu") {
            const double a = af("alpha", 1.0);
            return unary([&](const Tensor& v) { return where(v > a, v, 0.0); });
        }
        if (op == "Shrink") {
            const double l = af("lambd", 0.5), b = af("bias", 0.0);
            return unary([&](const Tensor& v) { return where(v < -l, v + b, where(v > l, v - b, 0)); });
        }
        if (op == "IsInf") {
            const bool pos = ai("detect_positive", 1) != 0, negv = ai("detect_negative", 1) != 0;
            const double inf = std::numeric_limits<double>::infinity();
            if (pos && negv) return unary([&](const Tensor& v) { return abs(v) == inf; });
            if (pos) return unary([&](const Tensor& v) { return v == inf; });
            if (negv) return unary([&](const Tensor& v) { return v == -inf; });
            return one(zeros(x().shape(), DType::boolean, x().device(), loc_));
        }
        if (op == "PRelu") {
            // a slope of one value per channel (C) broadcasts along dim 1 (older exporters write that)
            const bool per_channel = y().rank() == 1 && x().rank() > 2 && y().size(0) == x().size(1) && y().size(0) != x().size(x().rank() - 1);
            const Tensor slope = per_channel ? channel(y(), x()) : y();
            return one(T(where(x() < 0, x() * slope, x())));
        }
        if (op == "Add") return one(T(x() + y()));
        if (op == "Sub") return one(T(x() - y()));
        if (op == "Mul") return one(T(x() * y()));
        if (op == "Div") return one(int_divide(x(), y()));
        if (op == "Pow") return one(T(pow(x(), y())));
        if (op == "Mod") return one(ai("fmod", 0) ? T(fmod(x(), y())) : T(remainder(x(), y())));
        if (op == "Equal") return one(T(x() == y()));
        if (op == "Less") return one(T(x() < y()));
        if (op == "LessOrEqual") return one(T(x() <= y()));
        if (op == "Greater") return one(T(x() > y()));
        if (op == "GreaterOrEqual") return one(T(x() >= y()));
        if (op == "And") return one(T(logical_and(x(), y())));
        if (op == "Or") return one(T(logical_or(x(), y())));
        if (op == "Xor") return one(T(logical_and(logical_or(x(), y()), logical_not(logical_and(x(), y())))));
        if (op == "Where") {
            need(3);
            return one(T(where(in[0].t, in[1].t, in[2].t)));
        }
        if (op == "Max" || op == "Min" || op == "Sum" || op == "Mean") {
            need(1);
            Tensor acc = in[0].t;
            for (std::size_t i = 1; i < in.size(); ++i)
                acc = op == "Max" ? T(maximum(acc, in[i].t)) : op == "Min" ? T(minimum(acc, in[i].t)) : T(acc + in[i].t);
            if (op == "Mean") acc = T(acc / static_cast<double>(in.size()));
            return one(acc);
        }
        if (op == "Clip") {
            Tensor v = x();
            if (opset_ < 11) {
                if (attr("min")) v = T(maximum(v, af("min", 0)));
                if (attr("max")) v = T(minimum(v, af("max", 0)));
                return one(v);
            }
            if (in.size() > 1 && in[1].defined()) v = T(where(v < in[1].t, in[1].t, v));
            if (in.size() > 2 && in[2].defined()) v = T(where(v > in[2].t, in[2].t, v));
            return one(v);
        }
        if (op == "Cast") {
            const DType d = checked_dtype(static_cast<int>(ai("to", 0)), "its target", loc_);
            return one(x().to(d, loc_));
        }
        if (op == "CastLike") return one(x().to(y().dtype(), loc_));
        // ---- reductions
        if (op.rfind("Reduce", 0) == 0 && (op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin" ||
                                           op == "ReduceProd" || op == "ReduceL1" || op == "ReduceL2" || op == "ReduceSumSquare" ||
                                           op == "ReduceLogSum" || op == "ReduceLogSumExp")) {
            need(1);
            return one(reduce(op, in));
        }
        if (op == "ArgMax" || op == "ArgMin") {
            need(1);
            return one(arg(in, op == "ArgMax"));
        }
        if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") return one(softmax_like(op, x()));
        if (op == "LayerNormalization") {
            need(2);
            return layer_norm_op(in);
        }
        if (op == "BatchNormalization") {
            need(5);
            if (ai("training_mode", 0) != 0 || n.output_size() > 1) unsupported_here("runs in training mode (only inference is supported)");
            const Tensor& v = x();
            const double eps = af("epsilon", 1e-5);
            return one(T((v - channel(in[3].t, v)) * rsqrt(channel(in[4].t, v) + eps) * channel(in[1].t, v) + channel(in[2].t, v)));
        }
        if (op == "InstanceNormalization") {
            need(3);
            const Tensor& v = x();
            std::vector<std::int64_t> axes;
            for (int d = 2; d < v.rank(); ++d) axes.push_back(d);
            const Tensor mu = mean(v, axes, true, loc_);
            const Tensor var = mean(T(square(v - mu)), axes, true, loc_);
            return one(T((v - mu) * rsqrt(var + af("epsilon", 1e-5)) * channel(in[1].t, v) + channel(in[2].t, v)));
        }
        if (op == "MeanVarianceNormalization") {
            const Tensor& v = x();
            const std::vector<std::int64_t> axes = aints("axes").value_or(std::vector<std::int64_t>{0, 2, 3});
            const Tensor mu = mean(v, axes, true, loc_);
            const Tensor var = T(mean(T(v * v), axes, true, loc_) - mu * mu);
            return one(T((v - mu) / (sqrt(var) + 1e-9)));
        }
        if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
            const Tensor& v = x();
            std::vector<std::int64_t> axes;
            for (int d = 2; d < v.rank(); ++d) axes.push_back(d);
            return one(op == "GlobalMaxPool" ? max(v, axes, true, loc_) : mean(v, axes, true, loc_));
        }
        // ---- matrix products, convolution, pooling
        if (op == "MatMul") return one(matmul(x(), y(), loc_));
        if (op == "Gemm") {
            Tensor a = x(), b = y();
            if (ai("transA", 0)) a = a.t(loc_);
            if (ai("transB", 0)) b = b.t(loc_);
            const double alpha = af("alpha", 1.0), beta = af("beta", 1.0);
            Tensor r = matmul(a, b, loc_);
            if (alpha != 1.0) r = T(r * alpha);
            if (in.size() > 2 && in[2].defined()) r = beta == 1.0 ? T(r + in[2].t) : T(r + in[2].t * beta);
            return one(r);
        }
        if (op == "Conv") {
            need(2);
            return one(conv(in));
        }
        if (op == "ConvTranspose") {
            need(2);
            return one(conv_transpose(in));
        }
        if (op == "MaxPool" || op == "AveragePool") {
            need(1);
            if (op == "MaxPool" && n.output_size() > 1 && !n.output(1).empty()) unsupported_here("returns Indices, which kiln does not compute");
            return one(pool(in, op == "MaxPool"));
        }
        // ---- shapes and views
        if (op == "Constant") return one(constant(n));
        if (op == "Shape" || op == "Size") {
            const Tensor& v = x();
            const trace::ActiveScope host(nullptr);
            if (op == "Size") return one(full(Shape{}, v.numel(), DType::i64));
            const int r = v.rank();
            std::int64_t s = ai("start", 0), e = ai("end", r);
            s = std::clamp<std::int64_t>(s < 0 ? s + r : s, 0, r);
            e = std::clamp<std::int64_t>(e < 0 ? e + r : e, 0, r);
            Tensor t(Shape{std::max<std::int64_t>(0, e - s)}, DType::i64);
            for (std::int64_t d = s; d < e; ++d) static_cast<std::int64_t*>(t.data_ptr())[d - s] = v.size(static_cast<int>(d));
            return one(t);
        }
        if (op == "ConstantOfShape") {
            const std::vector<std::int64_t> s = (need(1), ints(in[0], "shape"));
            const trace::ActiveScope host(nullptr);
            const auto* a = attr("value");
            if (!a) return one(zeros(Shape(s, loc_), DType::f32));
            const Tensor v = tensor_from_proto(a->t(), "", loc_);
            return one(v.reshape({1}).expand(Shape(s, loc_)).contiguous());
        }
        if (op == "EyeLike") {
            const Tensor& v = x();
            const trace::ActiveScope host(nullptr);
            if (v.rank() != 2) fail<ShapeError>("needs a 2-D input, got " + v.shape().str());
            const DType d = attr("dtype") ? checked_dtype(static_cast<int>(ai("dtype", 1)), "its dtype", loc_) : v.dtype();
            const Tensor rows = arange(v.size(0), DType::i64).unsqueeze(1);
            const Tensor cols = arange(v.size(1), DType::i64);
            return one(Tensor(cast(cols - rows == ai("k", 0), d)));
        }
        if (op == "Range") {
            need(3);
            const double s = number(in[0], "start"), l = number(in[1], "limit"), d = number(in[2], "delta");
            const trace::ActiveScope host(nullptr);
            const std::int64_t count = std::max<std::int64_t>(0, static_cast<std::int64_t>(std::ceil((l - s) / d)));
            return one(Tensor(arange(0, static_cast<double>(count), 1, DType::f64) * d + s).to(in[0].t.dtype()));
        }
        if (op == "Reshape") {
            if (opset_ < 5) return one(reshape_op(x(), aints("shape").value_or(std::vector<std::int64_t>{})));
            return one(reshape_op(x(), (need(2), ints(in[1], "shape"))));
        }
        if (op == "Flatten") {
            const Tensor& v = x();
            std::int64_t a = ai("axis", 1);
            if (a < 0) a += v.rank();
            if (a < 0 || a > v.rank()) fail<ShapeError>("axis " + std::to_string(ai("axis", 1)) + " is out of range for rank " + std::to_string(v.rank()));
            return one(to_2d(v, static_cast<int>(a)));
        }
        if (op == "Transpose") {
            const Tensor& v = x();
            std::vector<std::int64_t> perm = aints("perm").value_or(std::vector<std::int64_t>{});
            if (perm.empty())
                for (int d = v.rank() - 1; d >= 0; --d) perm.push_back(d);
            return one(v.permute(perm, loc_));
        }
        if (op == "Squeeze") {
            Tensor v = x();
            std::optional<std::vector<std::int64_t>> axes = axes_of(in, 1, v.rank());
            if (!axes) return one(v.squeeze());
            std::sort(axes->rbegin(), axes->rend());
            for (std::int64_t a : *axes) v = v.squeeze(a, loc_);
            return one(v);
        }
        if (op == "Unsqueeze") {
            Tensor v = x();
            std::vector<std::int64_t> axes = opset_ < 13 ? aints("axes").value_or(std::vector<std::int64_t>{}) : (need(2), ints(in[1], "axes"));
            const int r = v.rank() + static_cast<int>(axes.size());
            for (auto& a : axes) a = axis_of(a, r);
            std::sort(axes.begin(), axes.end());
            for (std::int64_t a : axes) v = v.unsqueeze(a, loc_);
            return one(v);
        }
        if (op == "Concat") {
            need(1);
            std::vector<Tensor> parts;
            for (const Value& v : in) parts.push_back(v.t);
            return one(cat(parts, axis_of(ai("axis", 0), parts[0].rank()), loc_));
        }
        if (op == "Split") {
            const Tensor& v = x();
            const int axis = axis_of(ai("axis", 0), v.rank());
            std::vector<std::int64_t> sizes = opset_ < 13 ? aints("split").value_or(std::vector<std::int64_t>{})
                                              : in.size() > 1 && in[1].defined() ? ints(in[1], "split") : std::vector<std::int64_t>{};
            const std::int64_t parts = n.output_size(), len = v.size(axis);
            if (sizes.empty()) {
                const std::int64_t each = (len + parts - 1) / parts;
                for (std::int64_t i = 0; i < parts; ++i) sizes.push_back(std::min(each, len - i * each));
            }
            return split(v, sizes, axis, loc_);
        }
        if (op == "Slice") {
            need(opset_ < 10 ? 1 : 3);
            return one(slice_op(in));
        }
        if (op == "Expand") return one(x().expand(broadcast(x().shape(), Shape((need(2), ints(in[1], "shape")), loc_)), loc_));
        if (op == "Tile") {
            const Tensor& v = x();
            const std::vector<std::int64_t> reps = (need(2), ints(in[1], "repeats"));
            if (static_cast<int>(reps.size()) != v.rank()) fail<ShapeError>("has " + std::to_string(reps.size()) + " repeats for rank " + std::to_string(v.rank()));
            std::vector<std::int64_t> s2, e2, out;
            for (int d = 0; d < v.rank(); ++d) {
                s2.push_back(1), s2.push_back(v.size(d));
                e2.push_back(reps[static_cast<std::size_t>(d)]), e2.push_back(v.size(d));
                out.push_back(reps[static_cast<std::size_t>(d)] * v.size(d));
            }
            return one(v.reshape(Shape(s2, loc_), loc_).expand(Shape(e2, loc_), loc_).reshape(Shape(out, loc_), loc_));
        }
        if (op == "Gather") {
            const Tensor& v = x();
            return one(take(v, axis_of(ai("axis", 0), v.rank()), y()));
        }
        if (op == "GatherElements") {
            const Tensor& v = x();
            const int axis = axis_of(ai("axis", 0), v.rank());
            return one(gather(v, axis, T(where(y() < 0, y() + v.size(axis), y())), loc_));
        }
        if (op == "ScatterElements" || op == "Scatter") {
            need(3);
            const Tensor& v = x();
            const int axis = axis_of(ai("axis", 0), v.rank());
            const Tensor idx = T(where(y() < 0, y() + v.size(axis), y()));
            const std::string red = as("reduction", "none");
            if (red == "none") return one(scatter(v, axis, idx, in[2].t, loc_));
            if (red == "add") return one(scatter_add(v, axis, idx, in[2].t, loc_));
            unsupported_here("has reduction '" + red + "' (kiln has none and add)");
        }
        if (op == "Trilu") {
            const std::int64_t k = in.size() > 1 && in[1].defined() ? static_cast<std::int64_t>(number(in[1], "k")) : 0;
            return one(ai("upper", 1) ? T(triu(x(), k, loc_)) : T(tril(x(), k, loc_)));
        }
        if (op == "OneHot") {
            need(3);
            const std::int64_t depth = static_cast<std::int64_t>(number(in[1], "depth"));
            const Tensor& idx = x();
            const int axis = axis_of(ai("axis", -1), idx.rank() + 1);
            const Tensor vals = in[2].t;
            Shape s = Shape::filled(idx.rank() + 1, 1);
            s[axis] = depth;
            const Tensor ramp = arange(depth, DType::i64, idx.device(), loc_).reshape(s, loc_);
            const Tensor i = T(where(idx < 0, idx + depth, idx)).unsqueeze(axis, loc_);
            return one(T(where(ramp == i, vals.select(0, 1, loc_), vals.select(0, 0, loc_))));
        }
        if (op == "Dropout") {
            if (in.size() > 2 && in[2].defined() && number(in[2], "training_mode") != 0) unsupported_here("runs in training mode (random)");
            std::vector<Tensor> r{x()};
            if (n.output_size() > 1) r.push_back(ones(x().shape(), DType::boolean, x().device(), loc_));
            return r;
        }
        if (op == "DepthToSpace" || op == "SpaceToDepth") {
            const Tensor& v = x();
            if (v.rank() != 4) fail<ShapeError>("needs a 4-D input, got " + v.shape().str());
            const std::int64_t b = ai("blocksize", 0), N = v.size(0), C = v.size(1), H = v.size(2), W = v.size(3);
            if (b < 1) fail<ValueError>("needs a positive blocksize");
            if (op == "SpaceToDepth")
                return one(v.reshape({N, C, H / b, b, W / b, b}, loc_).permute({0, 3, 5, 1, 2, 4}, loc_).reshape({N, C * b * b, H / b, W / b}, loc_));
            if (as("mode", "DCR") == "DCR")
                return one(v.reshape({N, b, b, C / (b * b), H, W}, loc_).permute({0, 3, 4, 1, 5, 2}, loc_).reshape({N, C / (b * b), H * b, W * b}, loc_));
            return one(v.reshape({N, C / (b * b), b, b, H, W}, loc_).permute({0, 1, 4, 2, 5, 3}, loc_).reshape({N, C / (b * b), H * b, W * b}, loc_));
        }
        if (op == "Pad") {
            need(1);
            return one(pad_op(in));
        }
        if (op == "NegativeLogLikelihoodLoss") {
            need(2);
            return one(nll(in[0].t, in[1].t, in.size() > 2 ? in[2].t : Tensor{}));
        }
        if (op == "SoftmaxCrossEntropyLoss") {
            need(2);
            const Tensor lp = log_softmax(in[0].t, 1, loc_);
            return {nll(lp, in[1].t, in.size() > 2 ? in[2].t : Tensor{}), lp};
        }
        if (op == "CumSum") {
            need(2);
            const Tensor& v = x();
            const int axis = axis_of(static_cast<std::int64_t>(number(in[1], "axis")), v.rank());
            const bool excl = ai("exclusive", 0) != 0, rev = ai("reverse", 0) != 0;
            const std::int64_t len = v.size(axis);
            Tensor m;  // (len, len): out[j] = sum over i of in[i] * m[i][j]
            const DType dt = is_floating(v.dtype()) ? v.dtype() : DType::f64;
            {
                const trace::ActiveScope host(nullptr);
                const Tensor i = arange(len, DType::i64).unsqueeze(1), j = arange(len, DType::i64);
                m = rev ? (excl ? Tensor(cast(i > j, dt)) : Tensor(cast(i >= j, dt))) : (excl ? Tensor(cast(i < j, dt)) : Tensor(cast(i <= j, dt)));
            }
            const Tensor moved = v.transpose(axis, v.rank() - 1, loc_);
            const Tensor s = matmul(moved.dtype() == dt ? moved : moved.to(dt), m, loc_).transpose(axis, v.rank() - 1, loc_);
            return one(s.dtype() == v.dtype() ? s : s.to(v.dtype()));
        }
        if (op == "LRN") {
            const Tensor& v = x();
            const std::int64_t size = ai("size", 0);
            if (size < 1 || v.rank() < 3) fail<ShapeError>("needs size >= 1 and an input (N, C, ...), got " + v.shape().str());
            const double alpha = af("alpha", 1e-4), beta = af("beta", 0.75), bias = af("bias", 1.0);
            std::vector<std::int64_t> p(2 * static_cast<std::size_t>(v.rank()), 0);
            p[1] = (size - 1) / 2;
            p[1 + static_cast<std::size_t>(v.rank())] = size - 1 - (size - 1) / 2;
            const Tensor sq = pad(T(v * v), torch_pads(p, v.rank(), 0), 0, loc_);
            Tensor acc;
            for (std::int64_t k = 0; k < size; ++k) {
                const Tensor s = sq.slice(1, k, k + v.size(1), 1, loc_);
                acc = acc.defined() ? T(acc + s) : s;
            }
            return one(T(v / pow(acc * (alpha / static_cast<double>(size)) + bias, beta)));
        }
        if (op == "Resize" || op == "Upsample") {
            need(1);
            std::vector<double> scales;
            std::vector<std::int64_t> sizes;
            auto doubles = [&](const Value& v, const char* what) { return known_values<double>(v, what, DType::f64); };
            std::string coord = as("coordinate_transformation_mode", "half_pixel");
            if (op == "Upsample" || opset_ < 11) {
                if (op == "Upsample" && opset_ < 9) {
                    const auto* a = attr("scales");
                    if (a) scales.assign(a->floats().begin(), a->floats().end());
                } else {
                    need(2);
                    scales = doubles(in[1], "scales");
                }
                coord = "asymmetric";
                if (as("mode", "nearest") == "nearest") return one(resize_nearest_floor(x(), scales));
            } else {
                if (in.size() > 3 && in[3].defined() && in[3].t.numel() > 0) sizes = ints(in[3], "sizes");
                else if (in.size() > 2 && in[2].defined()) scales = doubles(in[2], "scales");
            }
            return one(resize(x(), scales, sizes, coord));
        }
        unsupported_here("is not an op kiln imports");
    }
};

/// The ONNX opset of a model's default domain.
inline int default_opset(const ::onnx::ModelProto& m) {
    for (const auto& o : m.opset_import())
        if (o.domain().empty() || o.domain() == "ai.onnx") return static_cast<int>(o.version());
    return 1;
}

}  // namespace detail

KILN_DECL ExportedProgram from_model(const ::onnx::ModelProto& model_in, const LoadOptions& opt, const std::string& dir, std::source_location loc) {
    ::onnx::ModelProto model = model_in;
    const int opset = detail::default_opset(model);
    std::map<std::string, int> types;
    try {  // the dtype ONNX fixes for each value (kiln's promotion may differ): shape inference's
        ::onnx::shape_inference::InferShapes(model);
    } catch (const std::exception&) {
        // a model ONNX cannot infer still runs; values keep kiln's dtypes
    }
    const ::onnx::GraphProto& g = model.graph();
    for (const auto& v : g.value_info())
        if (v.type().has_tensor_type()) types[v.name()] = v.type().tensor_type().elem_type();
    for (const auto& v : g.output())
        if (v.type().has_tensor_type()) types[v.name()] = v.type().tensor_type().elem_type();
    std::map<std::string, Tensor> init;
    for (const auto& t : g.initializer()) init[t.name()] = tensor_from_proto(t, dir, loc);
    // user inputs: graph inputs that no initializer gives (older models list initializers as inputs)
    std::vector<std::string> names;
    std::vector<Tensor> examples;
    DynamicShapes dynamic;
    for (const auto& [name, t] : opt.constants) {
        bool found = false;
        for (const auto& in : g.input()) found = found || in.name() == name;
        if (!found) kiln::detail::fail<ValueError>("onnx::load", "LoadOptions::constants binds '" + name + "', which is not an input of the model", loc);
        init[name] = t.cpu();
    }
    for (const auto& in : g.input()) {
        if (init.count(in.name())) continue;
        if (!in.type().has_tensor_type())
            detail::unsupported("input '" + in.name() + "' is not a tensor (sequences, maps and optionals are not supported)", loc);
        const auto& tt = in.type().tensor_type();
        const DType dt = detail::checked_dtype(tt.elem_type(), "input '" + in.name() + "'", loc);
        if (!tt.has_shape()) detail::unsupported("input '" + in.name() + "' has no shape (not even its rank)", loc);
        std::vector<std::int64_t> shape;
        std::map<int, Dim> dyn;
        const auto fixed = opt.shapes.find(in.name());
        for (int d = 0; d < tt.shape().dim_size(); ++d) {
            const auto& dim = tt.shape().dim(d);
            if (fixed != opt.shapes.end()) {
                if (fixed->second.rank() != tt.shape().dim_size())
                    kiln::detail::fail<ShapeError>("onnx::load", "LoadOptions::shapes gives input '" + in.name() + "' shape " + fixed->second.str() +
                                                                     ", but it has rank " + std::to_string(tt.shape().dim_size()), loc);
                shape.push_back(fixed->second[d]);
            } else if (dim.has_dim_value()) {
                shape.push_back(dim.dim_value());
            } else {
                const std::string name = dim.has_dim_param() && !dim.dim_param().empty() ? dim.dim_param() : in.name() + "_" + std::to_string(d);
                auto it = opt.dims.find(name);
                Dim D = it != opt.dims.end() ? it->second : Dim(name);
                if (D.name.empty()) D.name = name;
                auto ex = opt.example_sizes.find(name);
                const std::int64_t size = ex != opt.example_sizes.end() ? ex->second : std::clamp<std::int64_t>(8, std::max<std::int64_t>(D.min, 2), D.max);
                shape.push_back(size);
                dyn[d] = D;
            }
        }
        names.push_back(in.name());
        examples.push_back(zeros(Shape(shape, loc), dt));
        dynamic.push_back(dyn);
    }
    ExportOptions eo;
    for (const auto& [name, t] : init) eo.parameters[name] = t;
    eo.input_names = names;
    for (const auto& o : g.output()) eo.output_names.push_back(o.name());
    detail::Interpreter interp(g, opset, types, init, names, loc);
    auto fn = [&](const std::vector<Tensor>& in) { return interp.run(in); };
    bool any_dynamic = false;
    for (const auto& d : dynamic) any_dynamic = any_dynamic || !d.empty();
    return export_program(fn, std::make_tuple(examples), any_dynamic ? dynamic : DynamicShapes{}, eo, loc);
}

KILN_DECL ExportedProgram load(const std::string& path, const LoadOptions& opt, std::source_location loc) {
    std::ifstream f(path, std::ios::binary);
    if (!f) kiln::detail::fail<ValueError>("onnx::load", "cannot open '" + path + "'", loc);
    ::onnx::ModelProto m;
    if (!m.ParseFromIstream(&f)) kiln::detail::fail<ValueError>("onnx::load", "'" + path + "' is not an ONNX model (it does not parse as a ModelProto)", loc);
    const std::size_t slash = path.find_last_of('/');
    return from_model(m, opt, slash == std::string::npos ? "" : path.substr(0, slash), loc);
}

}  // namespace kiln::onnx
