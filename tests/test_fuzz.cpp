// Random-program differential fuzzer (issue 13): kiln::compile and kiln eager against an
// independent float64 interpreter of the same program, over the patterns the compile fuzzer in
// test_compile.cpp never makes: elementwise ops with broadcasting and C++ numbers, full and
// per-axis reductions followed by differently shaped work, strided/step/transposed/selected and
// 0-d inputs, integer inputs divided into floats, mixed dtypes, re-calls with new shapes under
// automatic dynamic shapes, writes into views (of clones, results and inputs), several outputs.
//
// Environment: KILN_FUZZ_GRAPHS=N (default 2000), KILN_FUZZ_SEED0=S (first seed, default 0),
// KILN_FUZZ_DEVICE=cuda (inputs on the GPU; skips loudly without one), KILN_FUZZ_SEED=S (run only
// seed S and print its program), KILN_FUZZ_VERBOSE=1 (print every program before it runs),
// KILN_FUZZ_SHRINK=N (programs shrunk per failure class, default 3; 0: none), KILN_FUZZ_PRINT=N (detailed failure reports, default 12),
// KILN_FUZZ_FORK=0 (run kiln in this process; by default on the CPU kiln runs in child processes
// that stream their verdicts, so that a crash or a hang is counted and reported for its seed like
// any failure, and the run goes on in a new child), KILN_FUZZ_TIMEOUT=S (seconds without progress
// before a child is declared hung, default 120), KILN_FUZZ_CRASH_SEED=S (raise SIGSEGV before
// compiling seed S: checks that a crash is reported and the run goes on).
//
// Tolerances (stated; see tol_of): every reference element carries its value, a magnitude s that
// bounds how far rounding can move it (a running forward-error scale: |a| + |b| for a + b, the
// derivative times the operand's s plus |r| for a function, the sum of the s of its terms for a
// sum), and flags. An element no rounding touched (integers, bools, abs/neg/max/min/where/copies
// of exact values) must match exactly; an element rounded only in float64 within 1e-9 s + 1e-12;
// an element that went through float32 within 2e-5 s + 1e-5. A comparison whose operands are
// closer than their tolerances (or a float->int cast near an integer) marks the element "unsure",
// and everything computed from it is skipped; generated steps with > 25% unsure elements, values
// over 1e6, exp arguments over 10, divisors under 0.25 in magnitude or sqrt/log arguments under 0.05
// are not generated.
#include <doctest/doctest.h>

#include <kiln/kiln.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#if defined(__unix__)
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#define KILN_FUZZ_CAN_FORK 1
#endif

namespace {

using kiln::DType;
using kiln::Tensor;
using I64 = std::int64_t;
using Shp = std::vector<I64>;
constexpr I64 kEnd = std::numeric_limits<I64>::max();  // a slice's "to the end"

// =========================================================================== programs
enum class Op : std::uint8_t {
    neg, abs, exp, tanh, sigmoid, sin, cos, tan, relu, sqrt, log, reciprocal, square, lnot,  // unary
    add, sub, mul, div, maximum, minimum, gt, lt, ge, le, eq, ne, land, lor,               // binary
    where,                                                                                 // ternary
};

const char* op_name(Op o) {
    static const char* names[] = {"neg", "abs", "exp", "tanh", "sigmoid", "sin", "cos", "tan", "relu", "sqrt",
                                  "log", "reciprocal", "square", "logical_not", "add", "sub", "mul", "div",
                                  "maximum", "minimum", "gt", "lt", "ge", "le", "eq", "ne", "logical_and",
                                  "logical_or", "where"};
    return names[static_cast<int>(o)];
}
/// The C++ operator spelling of an op, or nullptr when it is a function call.
const char* op_symbol(Op o) {
    switch (o) {
        case Op::add: return "+";
        case Op::sub: return "-";
        case Op::mul: return "*";
        case Op::div: return "/";
        case Op::gt: return ">";
        case Op::lt: return "<";
        case Op::ge: return ">=";
        case Op::le: return "<=";
        case Op::eq: return "==";
        case Op::ne: return "!=";
        default: return nullptr;
    }
}

enum class RK : std::uint8_t { sum, mean, max, min, var, logsumexp, softmax, log_softmax };
const char* rk_name(RK r) {
    static const char* names[] = {"sum", "mean", "max", "min", "var", "logsumexp", "softmax", "log_softmax"};
    return names[static_cast<int>(r)];
}

/// Step kinds. reduce_mul: rk(a * b, axes); reduce_where: sum(where(a, b, 0.0), axes).
enum class SK : std::uint8_t { unary, binary, scalar, where, safe_div, cast, reduce, reduce_mul, reduce_where, view, clone, write };
/// What a write stores: op(b, c), op(b, num), b (assign), b (copy_), num (fill_).
enum class WK : std::uint8_t { expr, scalar_expr, tensor, copy, fill };

struct ViewOp {
    enum Kind : std::uint8_t { slice, select, transpose, permute, unsqueeze, flatten, merge_last } kind = slice;
    I64 dim = 0, start = 0, stop = kEnd, step = 1;  // select: start is the index; transpose: start is the other dim
    std::vector<I64> perm;
};

struct Step {
    SK kind = SK::unary;
    Op op = Op::add;
    RK rk = RK::sum;
    int a = -1, b = -1, c = -1;  // value ids (where: a is the condition; b or c -1: the number)
    double num = 0;              // the C++ number operand
    bool num_int = false, num_left = false;
    std::vector<I64> axes;       // reductions: empty = all axes; softmax: axes[0]
    bool keepdim = false;
    DType dt = DType::f32;       // cast target
    std::vector<ViewOp> chain;   // view: the view; write: the view of value a written into
    WK wk = WK::expr;
};

/// How an input's values are drawn.
enum class Fill : std::uint8_t { normal, positive, ints, pos_ints, boolean, onehot };
/// How the argument is made from its base tensor, outside the compiled function.
enum class Outer : std::uint8_t { none, step2, offset1, transpose, select };

struct InputSpec {
    DType dt = DType::f32;
    Fill fill = Fill::normal;
    std::vector<int> dims;  // >= 0: a size variable; -1: a literal 1
    Outer outer = Outer::none;
    int od = 0, od2 = 0;    // the dim(s) of the outer view (select: od2 is the index)
    I64 extra = 0;          // step2: base = 2n - extra; select: the size of the selected dim
};

struct Program {
    std::uint64_t seed = 0;
    std::vector<InputSpec> inputs;
    std::vector<std::vector<I64>> vars;                    // [call][variable] sizes
    std::vector<std::vector<std::vector<double>>> data;    // [call][input] base values
    std::vector<Step> steps;
    std::vector<int> outputs;
    bool tuple_result = false;
    int nin() const { return static_cast<int>(inputs.size()); }
    int calls() const { return static_cast<int>(vars.size()); }
};

I64 numel(const Shp& s) {
    I64 n = 1;
    for (I64 d : s) n *= d;
    return n;
}

std::string shp_str(const Shp& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

const char* dt_name(DType d) {
    switch (d) {
        case DType::boolean: return "bool";
        case DType::i32: return "i32";
        case DType::i64: return "i64";
        case DType::f32: return "f32";
        case DType::f64: return "f64";
        default: return "?";
    }
}

/// The logical shape of input i for call k, and the shape of the base tensor it is a view of.
Shp input_shape(const Program& p, int i, int k) {
    Shp s;
    for (int d : p.inputs[static_cast<std::size_t>(i)].dims) s.push_back(d < 0 ? 1 : p.vars[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)]);
    return s;
}
Shp base_shape(const Program& p, int i, int k) {
    const InputSpec& in = p.inputs[static_cast<std::size_t>(i)];
    Shp s = input_shape(p, i, k);
    switch (in.outer) {
        case Outer::none: break;
        case Outer::step2: s[static_cast<std::size_t>(in.od)] = 2 * s[static_cast<std::size_t>(in.od)] - in.extra; break;
        case Outer::offset1: s[static_cast<std::size_t>(in.od)] += 2; break;
        case Outer::transpose: std::swap(s[static_cast<std::size_t>(in.od)], s[static_cast<std::size_t>(in.od2)]); break;
        case Outer::select: s.insert(s.begin() + in.od, in.extra); break;
    }
    return s;
}
/// The outer view as view ops over the base.
std::vector<ViewOp> outer_chain(const InputSpec& in) {
    ViewOp v;
    switch (in.outer) {
        case Outer::none: return {};
        case Outer::step2: v.kind = ViewOp::slice; v.dim = in.od; v.start = 0; v.stop = kEnd; v.step = 2; break;
        case Outer::offset1: v.kind = ViewOp::slice; v.dim = in.od; v.start = 1; v.stop = -1; break;
        case Outer::transpose: v.kind = ViewOp::transpose; v.dim = in.od; v.start = in.od2; break;
        case Outer::select: v.kind = ViewOp::select; v.dim = in.od; v.start = in.od2; break;
    }
    return {v};
}

// ---------------------------------------------------------------------------- printing
std::string num_str(double v, bool is_int) {
    if (is_int) return std::to_string(static_cast<I64>(v));
    std::ostringstream s;
    s.precision(17);
    s << v;
    std::string r = s.str();
    if (r.find_first_of(".e") == std::string::npos) r += ".0";
    return r;
}
std::string vname(const Program& p, int v) { return (v < p.nin() ? "x" : "t") + std::to_string(v); }
std::string bound_str(I64 b) { return b == kEnd ? "end" : std::to_string(b); }
std::string view_str(const ViewOp& o) {
    switch (o.kind) {
        case ViewOp::slice:
            return ".slice(" + std::to_string(o.dim) + ", " + bound_str(o.start) + ", " + bound_str(o.stop) +
                   (o.step != 1 ? ", " + std::to_string(o.step) : "") + ")";
        case ViewOp::select: return ".select(" + std::to_string(o.dim) + ", " + std::to_string(o.start) + ")";
        case ViewOp::transpose: return ".transpose(" + std::to_string(o.dim) + ", " + std::to_string(o.start) + ")";
        case ViewOp::permute: {
            std::string s = ".permute({";
            for (std::size_t i = 0; i < o.perm.size(); ++i) s += (i ? ", " : "") + std::to_string(o.perm[i]);
            return s + "})";
        }
        case ViewOp::unsqueeze: return ".unsqueeze(" + std::to_string(o.dim) + ")";
        case ViewOp::flatten: return ".reshape({-1})";
        case ViewOp::merge_last: return ".reshape({<all but the last two dims>, -1})";
    }
    return "?";
}
std::string chain_str(const std::vector<ViewOp>& c) {
    std::string s;
    for (const ViewOp& o : c) s += view_str(o);
    return s;
}
std::string axes_str(const Step& s) {
    std::string r = "{";
    for (std::size_t i = 0; i < s.axes.size(); ++i) r += (i ? ", " : "") + std::to_string(s.axes[i]);
    return r + "}";
}
std::string binary_str(Op op, const std::string& a, const std::string& b) {
    if (const char* sym = op_symbol(op)) return a + " " + sym + " " + b;
    return std::string(op_name(op)) + "(" + a + ", " + b + ")";
}
std::string reduce_str(RK rk, const std::string& x, const Step& s) {
    if (rk == RK::softmax || rk == RK::log_softmax) return std::string(rk_name(rk)) + "(" + x + ", " + std::to_string(s.axes[0]) + ")";
    if (s.axes.empty() && !s.keepdim) return std::string(rk_name(rk)) + "(" + x + ")";
    return std::string(rk_name(rk)) + "(" + x + ", " + axes_str(s) + (s.keepdim ? ", keepdim=true" : "") + ")";
}

std::string step_str(const Program& p, int id, const Step& s) {
    auto V = [&](int v) { return vname(p, v); };
    const std::string n = num_str(s.num, s.num_int);
    std::string lhs = "  " + V(id) + " = ";
    switch (s.kind) {
        case SK::unary:
            if (s.op == Op::square) return lhs + V(s.a) + " * " + V(s.a);
            return lhs + op_name(s.op) + "(" + V(s.a) + ")";
        case SK::binary: return lhs + binary_str(s.op, V(s.a), V(s.b));
        case SK::scalar: return lhs + (s.num_left ? binary_str(s.op, n, V(s.a)) : binary_str(s.op, V(s.a), n));
        case SK::where: return lhs + "where(" + V(s.a) + ", " + (s.b >= 0 ? V(s.b) : n) + ", " + (s.c >= 0 ? V(s.c) : n) + ")";
        case SK::safe_div: return lhs + V(s.a) + " / (abs(" + V(s.b) + ") + 0.5)";
        case SK::cast: return lhs + "cast(" + V(s.a) + ", " + dt_name(s.dt) + ")";
        case SK::reduce: return lhs + reduce_str(s.rk, V(s.a), s);
        case SK::reduce_mul: return lhs + reduce_str(s.rk, V(s.a) + " * " + V(s.b), s);
        case SK::reduce_where: return lhs + reduce_str(RK::sum, "where(" + V(s.a) + ", " + V(s.b) + ", 0.0)", s);
        case SK::view: return lhs + V(s.a) + chain_str(s.chain);
        case SK::clone: return lhs + V(s.a) + ".clone()";
        case SK::write: {
            std::string w = "  " + V(s.a) + chain_str(s.chain);
            switch (s.wk) {
                case WK::expr: w += ".assign(" + binary_str(s.op, V(s.b), V(s.c)) + ")"; break;
                case WK::scalar_expr: w += ".assign(" + binary_str(s.op, V(s.b), n) + ")"; break;
                case WK::tensor: w += ".assign(" + V(s.b) + ")"; break;
                case WK::copy: w += ".copy_(" + V(s.b) + ")"; break;
                case WK::fill: w += ".fill_(" + n + ")"; break;
            }
            return w + ";  // " + V(id) + " = the written view";
        }
    }
    return "?";
}

std::string program_str(const Program& p) {
    std::ostringstream o;
    static const char* var_names = "ABCD";
    o << "seed " << p.seed << ":\n";
    for (int i = 0; i < p.nin(); ++i) {
        const InputSpec& in = p.inputs[static_cast<std::size_t>(i)];
        std::string dims = "(";
        for (std::size_t d = 0; d < in.dims.size(); ++d)
            dims += std::string(d ? ", " : "") + (in.dims[d] < 0 ? std::string("1") : std::string(1, var_names[in.dims[d]]));
        dims += in.dims.size() == 1 ? ",)" : ")";
        std::string values;
        switch (in.fill) {
            case Fill::normal: values = "randn" + dims; break;
            case Fill::positive: values = "abs(randn" + dims + ") + 0.5"; break;
            case Fill::ints: values = "randint(-5, 6, " + dims + ")"; break;
            case Fill::pos_ints: values = "randint(1, 7, " + dims + ")"; break;
            case Fill::boolean: values = "rand_bool" + dims; break;
            case Fill::onehot: values = "one_hot" + dims; break;
        }
        o << "  x" << i << " = " << values << " [" << dt_name(in.dt) << "]";
        if (in.outer != Outer::none)
            o << "  passed as base" << shp_str(base_shape(p, i, 0)) << chain_str(outer_chain(in)) << " (shapes of call 0)";
        o << "\n";
    }
    for (std::size_t s = 0; s < p.steps.size(); ++s) o << step_str(p, p.nin() + static_cast<int>(s), p.steps[s]) << "\n";
    o << "  return " << (p.tuple_result ? "std::tuple{" : "{");
    for (std::size_t k = 0; k < p.outputs.size(); ++k) o << (k ? ", " : "") << vname(p, p.outputs[k]);
    o << "}\n  calls (one compiled function, called in order):";
    for (int k = 0; k < p.calls(); ++k) {
        o << "\n    call " << k << ":";
        for (int i = 0; i < p.nin(); ++i) o << " x" << i << shp_str(input_shape(p, i, k));
    }
    return o.str();
}

// =========================================================================== the float64 reference
// Each element: value v, magnitude s (see the header) and flags.
constexpr std::uint8_t F_LOWP = 1, F_INEXACT = 2, F_UNSURE = 4;
constexpr double kMaxFloat = 1e6, kMaxInt = 16777216.0, kMaxScale = 1e9;

double tol_of(double s, std::uint8_t f) {
    if (!(f & F_INEXACT)) return 0;
    return (f & F_LOWP) ? 2e-5 * s + 1e-5 : 1e-9 * s + 1e-12;
}

int cat(DType d) { return d == DType::boolean ? 0 : (d == DType::i32 || d == DType::i64) ? 1 : 2; }

/// torch.promote_types over bool, i32, i64, f32, f64.
DType promote(DType a, DType b) {
    if (a == b) return a;
    if (cat(a) != cat(b)) return cat(a) > cat(b) ? a : b;
    return cat(a) == 1 ? DType::i64 : DType::f64;
}

struct Dense {
    Shp shape;
    DType dt = DType::f32;
    std::vector<double> v, s;
    std::vector<std::uint8_t> f;
    void resize(I64 n) {
        v.assign(static_cast<std::size_t>(n), 0);
        s.assign(static_cast<std::size_t>(n), 0);
        f.assign(static_cast<std::size_t>(n), 0);
    }
};

bool bcast(const Shp& a, const Shp& b, Shp& out) {
    const std::size_t r = std::max(a.size(), b.size());
    Shp o(r);
    for (std::size_t i = 0; i < r; ++i) {
        const I64 x = i < r - a.size() ? 1 : a[i - (r - a.size())];
        const I64 y = i < r - b.size() ? 1 : b[i - (r - b.size())];
        if (x != y && x != 1 && y != 1) return false;
        o[i] = x == 1 ? y : x;
    }
    out = o;
    return true;
}

/// Strides (in elements of a dense row-major `in`) that read `in` broadcast to `out`.
std::vector<I64> bcast_strides(const Shp& in, const Shp& out) {
    std::vector<I64> st(out.size(), 0);
    I64 acc = 1;
    for (int i = static_cast<int>(in.size()) - 1, o = static_cast<int>(out.size()) - 1; i >= 0; --i, --o) {
        st[static_cast<std::size_t>(o)] = in[static_cast<std::size_t>(i)] == 1 ? 0 : acc;
        acc *= in[static_cast<std::size_t>(i)];
    }
    return st;
}

/// Calls f(k, offsets) for every element k (row-major) of `shape`, offsets[j] walking strides[j].
template <class F>
void odometer(const Shp& shape, const std::vector<std::vector<I64>>& strides, F&& f) {
    const int r = static_cast<int>(shape.size());
    const I64 n = numel(shape);
    std::vector<I64> idx(static_cast<std::size_t>(r), 0), off(strides.size(), 0);
    for (I64 k = 0; k < n; ++k) {
        f(k, off);
        for (int d = r - 1; d >= 0; --d) {
            const auto du = static_cast<std::size_t>(d);
            ++idx[du];
            for (std::size_t j = 0; j < strides.size(); ++j) off[j] += strides[j][du];
            if (idx[du] < shape[du]) break;
            for (std::size_t j = 0; j < strides.size(); ++j) off[j] -= strides[j][du] * shape[du];
            idx[du] = 0;
        }
    }
}

struct Arg {
    const Dense* d = nullptr;
    double num = 0;
    bool num_int = false;
};

/// torch.result_type: dimensioned tensors decide, then 0-dim tensors, then numbers (an int
/// number is int64, a float number the default float32); a later group only counts when its
/// category is higher.
DType result_type(const std::vector<Arg>& args) {
    std::optional<DType> dim, zero, num;
    auto add = [](std::optional<DType>& g, DType d) { g = g ? promote(*g, d) : d; };
    for (const Arg& a : args) {
        if (!a.d) add(num, a.num_int ? DType::i64 : DType::f32);
        else if (a.d->shape.empty()) add(zero, a.d->dt);
        else add(dim, a.d->dt);
    }
    auto combine = [](std::optional<DType> hi, std::optional<DType> lo) -> std::optional<DType> {
        if (!hi) return lo;
        if (!lo) return hi;
        return cat(*lo) > cat(*hi) ? promote(*hi, *lo) : *hi;
    };
    const auto r = combine(dim, combine(zero, num));
    return r ? *r : DType::f32;
}

enum class Rule { same, float_math, compare, logical, where };
Rule rule_of(Op o) {
    switch (o) {
        case Op::neg: case Op::abs: case Op::relu: case Op::square: case Op::add: case Op::sub: case Op::mul:
        case Op::maximum: case Op::minimum: return Rule::same;
        case Op::gt: case Op::lt: case Op::ge: case Op::le: case Op::eq: case Op::ne: return Rule::compare;
        case Op::lnot: case Op::land: case Op::lor: return Rule::logical;
        case Op::where: return Rule::where;
        default: return Rule::float_math;
    }
}
bool allows_bool(Op o) { return !(o == Op::neg || o == Op::abs || o == Op::relu || o == Op::sub); }

/// One element of an elementwise op. Returns false outside the op's safe domain.
bool eval_elem(Op op, DType odt, const double* v, const double* s, const std::uint8_t* f, int n, double& r,
               double& sr, std::uint8_t& fr) {
    std::uint8_t fin = 0;
    for (int i = 0; i < n; ++i) fin |= f[i];
    const double a = v[0], b = n > 1 ? v[1] : 0;
    bool rounds = true;
    auto pick2 = [&](bool first) {  // maximum / minimum: exact, continuous
        const int c = first ? 0 : 1;
        r = v[c];
        const bool tie = std::abs(a - b) <= tol_of(s[0], f[0]) + tol_of(s[1], f[1]);
        sr = tie ? std::max(s[0], s[1]) : s[c];
        fr = static_cast<std::uint8_t>((tie ? (f[0] | f[1]) : f[c]) | (fin & F_UNSURE));
        rounds = false;
    };
    auto compare = [&](bool res) {
        r = res ? 1 : 0;
        sr = 1;
        const bool near = (fin & F_INEXACT) && std::abs(a - b) <= tol_of(s[0], f[0]) + tol_of(s[1], f[1]);
        fr = static_cast<std::uint8_t>((fin & F_UNSURE) | (near ? F_UNSURE : 0));
        rounds = false;
    };
    fr = fin;
    switch (op) {
        case Op::neg: r = -a; sr = s[0]; rounds = false; break;
        case Op::abs: r = std::abs(a); sr = s[0]; rounds = false; break;
        case Op::relu: r = a > 0 ? a : 0; sr = s[0]; rounds = false; break;
        case Op::exp:
            if (a > 10) return false;
            r = std::exp(a);
            sr = r * s[0] + r;
            break;
        case Op::tanh: r = std::tanh(a); sr = (1 - r * r) * s[0] + std::abs(r); break;
        case Op::sigmoid: r = 1 / (1 + std::exp(-a)); sr = r * (1 - r) * s[0] + r; break;
        case Op::sin: r = std::sin(a); sr = std::abs(std::cos(a)) * s[0] + std::abs(r); break;
        case Op::cos: r = std::cos(a); sr = std::abs(std::sin(a)) * s[0] + std::abs(r); break;
        case Op::tan:
            if (std::abs(a) > 1.2) return false;
            r = std::tan(a);
            sr = (1 + r * r) * s[0] + std::abs(r);
            break;
        case Op::sqrt:
            if (a < 0.05) return false;
            r = std::sqrt(a);
            sr = 0.5 / r * s[0] + r;
            break;
        case Op::log:
            if (a < 0.05) return false;
            r = std::log(a);
            sr = s[0] / a + std::abs(r);
            break;
        case Op::reciprocal:
            if (std::abs(a) < 0.25) return false;
            r = 1 / a;
            sr = s[0] / (a * a) + std::abs(r);
            break;
        case Op::square: r = a * a; sr = 2 * std::abs(a) * s[0]; break;
        case Op::lnot: r = a == 0; sr = 1; fr = fin & F_UNSURE; rounds = false; break;
        case Op::add: r = a + b; sr = s[0] + s[1]; break;
        case Op::sub: r = a - b; sr = s[0] + s[1]; break;
        case Op::mul: r = a * b; sr = s[0] * std::abs(b) + std::abs(a) * s[1]; break;
        case Op::div:
            if (std::abs(b) < 0.25) return false;
            r = a / b;
            sr = s[0] / std::abs(b) + std::abs(a) * s[1] / (b * b);
            break;
        case Op::maximum: pick2(!(b > a)); break;
        case Op::minimum: pick2(!(b < a)); break;
        case Op::gt: compare(a > b); break;
        case Op::lt: compare(a < b); break;
        case Op::ge: compare(a >= b); break;
        case Op::le: compare(a <= b); break;
        case Op::eq: compare(a == b); break;
        case Op::ne: compare(a != b); break;
        case Op::land: r = (a != 0) && (b != 0); sr = 1; fr = fin & F_UNSURE; rounds = false; break;
        case Op::lor: r = (a != 0) || (b != 0); sr = 1; fr = fin & F_UNSURE; rounds = false; break;
        case Op::where: {
            const int c = v[0] != 0 ? 1 : 2;
            r = v[c];
            sr = s[c];
            fr = static_cast<std::uint8_t>(f[c] | (f[0] & F_UNSURE));
            rounds = false;
            break;
        }
    }
    if (!std::isfinite(r) || !std::isfinite(sr)) return false;
    switch (cat(odt)) {
        case 2:
            if (rounds) fr |= F_INEXACT;
            if (odt == DType::f32 && (fr & F_INEXACT)) fr |= F_LOWP;
            if (odt == DType::f32 && static_cast<double>(static_cast<float>(r)) != r) fr |= F_INEXACT | F_LOWP;
            if (std::abs(r) > kMaxFloat || sr > kMaxScale) return false;
            break;
        case 1:
            if (std::abs(r) > kMaxInt) return false;
            fr &= F_UNSURE;
            break;
        default:
            r = r != 0;
            fr &= F_UNSURE;
            break;
    }
    return true;
}

/// An elementwise op over tensors and numbers, with numpy broadcasting and torch promotion.
bool ew(Op op, const std::vector<Arg>& args, Dense& out) {
    Shp shape;
    bool first = true;
    for (const Arg& a : args)
        if (a.d) {
            if (first) { shape = a.d->shape; first = false; }
            else if (!bcast(shape, a.d->shape, shape)) return false;
        }
    if (first) return false;
    const Rule rule = rule_of(op);
    std::vector<Arg> promoted(args.begin() + (rule == Rule::where ? 1 : 0), args.end());
    if (rule == Rule::where && (!args[0].d || args[0].d->dt != DType::boolean)) return false;
    const DType rt = result_type(promoted);
    if (cat(rt) == 0 && !allows_bool(op)) return false;
    DType odt = rt;
    if (rule == Rule::float_math) odt = cat(rt) == 2 ? rt : DType::f32;
    if (rule == Rule::compare || rule == Rule::logical) odt = DType::boolean;
    out.shape = shape;
    out.dt = odt;
    out.resize(numel(shape));
    std::vector<std::vector<I64>> strides;
    for (const Arg& a : args)
        if (a.d) strides.push_back(bcast_strides(a.d->shape, shape));
    bool ok = true;
    const int n = static_cast<int>(args.size());
    odometer(shape, strides, [&](I64 k, const std::vector<I64>& off) {
        if (!ok) return;
        double v[3], s[3];
        std::uint8_t f[3];
        int j = 0;
        for (int i = 0; i < n; ++i) {
            const Arg& a = args[static_cast<std::size_t>(i)];
            if (a.d) {
                const auto o = static_cast<std::size_t>(off[static_cast<std::size_t>(j++)]);
                v[i] = a.d->v[o];
                s[i] = a.d->s[o];
                f[i] = a.d->f[o];
            } else {
                v[i] = a.num;
                s[i] = std::abs(a.num);
                f[i] = 0;
            }
        }
        const auto ku = static_cast<std::size_t>(k);
        ok = eval_elem(op, odt, v, s, f, n, out.v[ku], out.s[ku], out.f[ku]);
    });
    return ok;
}

/// Normalizes reduction axes into a mask; false for bad or repeated axes.
bool axes_mask(const std::vector<I64>& axes, int r, unsigned& mask) {
    mask = 0;
    if (axes.empty()) {
        mask = r == 0 ? 0u : (1u << r) - 1u;
        return true;
    }
    if (r == 0) return false;
    for (I64 a : axes) {
        if (a < -r || a >= r) return false;
        const int d = static_cast<int>(a < 0 ? a + r : a);
        if (mask & (1u << d)) return false;
        mask |= 1u << d;
    }
    return true;
}

bool reduce_ref(RK rk, const Dense& x, const std::vector<I64>& axes, bool keep, Dense& out) {
    const int r = static_cast<int>(x.shape.size());
    unsigned mask;
    if (!axes_mask(axes, r, mask)) return false;
    DType odt = x.dt;
    if (rk == RK::sum) odt = cat(x.dt) == 2 ? x.dt : DType::i64;
    if (rk == RK::mean && cat(x.dt) != 2) return false;
    if ((rk == RK::max || rk == RK::min) && x.dt == DType::boolean) return false;
    Shp oshape;
    std::vector<I64> ost(static_cast<std::size_t>(r), 0);
    I64 acc = 1, cnt = 1;
    for (int d = r - 1; d >= 0; --d) {
        const auto du = static_cast<std::size_t>(d);
        if (mask & (1u << d)) cnt *= x.shape[du];
        else { ost[du] = acc; acc *= x.shape[du]; }
    }
    for (int d = 0; d < r; ++d) {
        if (!(mask & (1u << d))) oshape.push_back(x.shape[static_cast<std::size_t>(d)]);
        else if (keep) oshape.push_back(1);
    }
    if (cnt == 0 || acc == 0) return false;
    out.shape = oshape;
    out.dt = odt;
    out.resize(acc);
    const bool is_max = rk == RK::max, extreme = rk == RK::max || rk == RK::min;
    std::vector<std::uint8_t> unsure(static_cast<std::size_t>(acc), 0);
    if (extreme) std::fill(out.v.begin(), out.v.end(), is_max ? -INFINITY : INFINITY);
    odometer(x.shape, {ost}, [&](I64 k, const std::vector<I64>& off) {
        const auto o = static_cast<std::size_t>(off[0]), ku = static_cast<std::size_t>(k);
        unsure[o] |= x.f[ku] & F_UNSURE;
        if (extreme) {
            out.v[o] = is_max ? std::max(out.v[o], x.v[ku]) : std::min(out.v[o], x.v[ku]);
        } else {
            out.v[o] += x.v[ku];
            out.s[o] += x.s[ku];
            out.f[o] |= x.f[ku];
        }
    });
    if (extreme) {  // a second pass: the magnitude and flags of every element that ties with the extreme
        std::vector<double> tm(static_cast<std::size_t>(acc));
        std::vector<char> seen(static_cast<std::size_t>(acc), 0);
        odometer(x.shape, {ost}, [&](I64 k, const std::vector<I64>& off) {  // the extreme's own tolerance
            const auto o = static_cast<std::size_t>(off[0]), ku = static_cast<std::size_t>(k);
            if (!seen[o] && x.v[ku] == out.v[o]) { seen[o] = 1; tm[o] = tol_of(x.s[ku], x.f[ku]); }
        });
        odometer(x.shape, {ost}, [&](I64 k, const std::vector<I64>& off) {
            const auto o = static_cast<std::size_t>(off[0]), ku = static_cast<std::size_t>(k);
            if (std::abs(x.v[ku] - out.v[o]) <= tm[o] + tol_of(x.s[ku], x.f[ku])) {
                out.s[o] = std::max(out.s[o], x.s[ku]);
                out.f[o] |= x.f[ku];
            }
        });
    }
    for (std::size_t o = 0; o < out.v.size(); ++o) {
        if (rk == RK::mean) {
            out.v[o] /= static_cast<double>(cnt);
            out.s[o] /= static_cast<double>(cnt);
        }
        if (cat(odt) == 2 && !extreme) out.f[o] |= F_INEXACT;
        if (odt == DType::f32 && (out.f[o] & F_INEXACT)) out.f[o] |= F_LOWP;
        if (cat(odt) != 2) out.f[o] &= F_UNSURE;
        out.f[o] |= unsure[o];
        if (!std::isfinite(out.v[o]) || std::abs(out.v[o]) > (cat(odt) == 2 ? kMaxFloat : kMaxInt)) return false;
    }
    return true;
}

I64 reduced_count(const Shp& shape, const std::vector<I64>& axes) {
    unsigned mask;
    if (!axes_mask(axes, static_cast<int>(shape.size()), mask)) return 0;
    I64 n = 1;
    for (std::size_t d = 0; d < shape.size(); ++d)
        if (mask & (1u << d)) n *= shape[d];
    return n;
}

/// var, logsumexp, softmax and log_softmax from their definitions, with the primitives above.
bool composite_ref(RK rk, const Dense& x, const std::vector<I64>& axes, bool keep, Dense& out) {
    if (cat(x.dt) != 2) return false;
    Arg X{&x};
    switch (rk) {
        case RK::var: {
            const I64 n = reduced_count(x.shape, axes);
            if (n < 2) return false;
            Dense m, d, sq, ss;
            if (!reduce_ref(RK::mean, x, axes, true, m) || !ew(Op::sub, {X, {&m}}, d) || !ew(Op::mul, {{&d}, {&d}}, sq) ||
                !reduce_ref(RK::sum, sq, axes, keep, ss))
                return false;
            return ew(Op::div, {{&ss}, {nullptr, static_cast<double>(n - 1), false}}, out);
        }
        case RK::logsumexp: {
            Dense m, d, e, s, l;
            if (!reduce_ref(RK::max, x, axes, true, m) || !ew(Op::sub, {X, {&m}}, d) || !ew(Op::exp, {{&d}}, e) ||
                !reduce_ref(RK::sum, e, axes, true, s) || !ew(Op::log, {{&s}}, l) || !ew(Op::add, {{&l}, {&m}}, out))
                return false;
            if (!keep) {
                unsigned mask;
                axes_mask(axes, static_cast<int>(x.shape.size()), mask);
                Shp sh;
                for (std::size_t dd = 0; dd < x.shape.size(); ++dd)
                    if (!(mask & (1u << dd))) sh.push_back(x.shape[dd]);
                out.shape = sh;
            }
            return true;
        }
        case RK::softmax: case RK::log_softmax: {
            Dense m, d, e, s;
            if (!reduce_ref(RK::max, x, axes, true, m) || !ew(Op::sub, {X, {&m}}, d) || !ew(Op::exp, {{&d}}, e) ||
                !reduce_ref(RK::sum, e, axes, true, s))
                return false;
            if (rk == RK::softmax) return ew(Op::div, {{&e}, {&s}}, out);
            Dense l, lse;
            return ew(Op::log, {{&s}}, l) && ew(Op::add, {{&l}, {&m}}, lse) && ew(Op::sub, {X, {&lse}}, out);
        }
        default: return false;
    }
}

/// Conversion to another dtype (a cast, or the conversion of a write).
bool cast_ref(const Dense& x, DType to, Dense& out) {
    out = x;
    out.dt = to;
    for (std::size_t i = 0; i < x.v.size(); ++i) {
        double& v = out.v[i];
        std::uint8_t& f = out.f[i];
        const double t = tol_of(x.s[i], x.f[i]);
        if (cat(to) == 0) {
            if ((f & F_INEXACT) && std::abs(v) <= t) f |= F_UNSURE;
            v = v != 0;
            f &= F_UNSURE;
            out.s[i] = 1;
        } else if (cat(to) == 1) {
            if (cat(x.dt) == 2) {
                if ((f & F_INEXACT) && std::abs(v - std::round(v)) <= t) f |= F_UNSURE;
                v = std::trunc(v);
            }
            if (std::abs(v) > kMaxInt) return false;
            f &= F_UNSURE;
            out.s[i] = std::abs(v);
        } else if (to == DType::f32 && static_cast<double>(static_cast<float>(v)) != v) {
            f |= F_INEXACT | F_LOWP;
        }
    }
    return true;
}

// ---------------------------------------------------------------- storage and views
struct Store {
    DType dt;
    std::vector<double> v, s;
    std::vector<std::uint8_t> f;
};
/// A value: a strided view of a store (op results own a fresh store; views share one).
struct RV {
    int store = 0;
    I64 off = 0;
    Shp shape, strides;
    DType dt = DType::f32;
};
struct RefState {
    std::vector<Store> stores;
    std::vector<RV> vals;
};

Shp row_major(const Shp& s) {
    Shp st(s.size(), 1);
    I64 acc = 1;
    for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
        st[static_cast<std::size_t>(i)] = acc;
        acc *= std::max<I64>(s[static_cast<std::size_t>(i)], 1);
    }
    return st;
}
bool contiguous(const RV& x) {
    I64 expect = 1;
    for (int i = static_cast<int>(x.shape.size()) - 1; i >= 0; --i) {
        const auto iu = static_cast<std::size_t>(i);
        if (x.shape[iu] == 1) continue;
        if (x.strides[iu] != expect) return false;
        expect *= x.shape[iu];
    }
    return true;
}

bool norm_dim(I64 d, int rank, int& out) {
    if (rank == 0 || d < -rank || d >= rank) return false;
    out = static_cast<int>(d < 0 ? d + rank : d);
    return true;
}

/// Applies one view op (torch semantics, as kiln implements them); false when invalid or empty.
bool view_rv(const RV& x, const ViewOp& o, RV& out) {
    RV y = x;
    const int r = static_cast<int>(x.shape.size());
    int d = 0, d2 = 0;
    switch (o.kind) {
        case ViewOp::slice: {
            if (!norm_dim(o.dim, r, d) || o.step <= 0) return false;
            const auto du = static_cast<std::size_t>(d);
            const I64 n = x.shape[du];
            auto clamp = [n](I64 i) { return std::clamp<I64>(i < 0 ? i + n : i, 0, n); };
            const I64 b = clamp(o.start), e = clamp(o.stop);
            const I64 len = e > b ? (e - b + o.step - 1) / o.step : 0;
            if (len == 0) return false;
            y.off += b * x.strides[du];
            y.shape[du] = len;
            y.strides[du] *= o.step;
            break;
        }
        case ViewOp::select: {
            if (!norm_dim(o.dim, r, d)) return false;
            const auto du = static_cast<std::size_t>(d);
            const I64 i = o.start < 0 ? o.start + x.shape[du] : o.start;
            if (i < 0 || i >= x.shape[du]) return false;
            y.off += i * x.strides[du];
            y.shape.erase(y.shape.begin() + d);
            y.strides.erase(y.strides.begin() + d);
            break;
        }
        case ViewOp::transpose:
            if (!norm_dim(o.dim, r, d) || !norm_dim(o.start, r, d2)) return false;
            std::swap(y.shape[static_cast<std::size_t>(d)], y.shape[static_cast<std::size_t>(d2)]);
            std::swap(y.strides[static_cast<std::size_t>(d)], y.strides[static_cast<std::size_t>(d2)]);
            break;
        case ViewOp::permute: {
            if (static_cast<int>(o.perm.size()) != r) return false;
            unsigned seen = 0;
            for (int i = 0; i < r; ++i) {
                if (!norm_dim(o.perm[static_cast<std::size_t>(i)], r, d) || (seen & (1u << d))) return false;
                seen |= 1u << d;
                y.shape[static_cast<std::size_t>(i)] = x.shape[static_cast<std::size_t>(d)];
                y.strides[static_cast<std::size_t>(i)] = x.strides[static_cast<std::size_t>(d)];
            }
            break;
        }
        case ViewOp::unsqueeze: {
            if (o.dim < -(r + 1) || o.dim > r || r >= 8) return false;
            d = static_cast<int>(o.dim < 0 ? o.dim + r + 1 : o.dim);
            const I64 st = d < r ? x.strides[static_cast<std::size_t>(d)] * x.shape[static_cast<std::size_t>(d)] : 1;
            y.shape.insert(y.shape.begin() + d, 1);
            y.strides.insert(y.strides.begin() + d, st);
            break;
        }
        case ViewOp::flatten: case ViewOp::merge_last: {
            if (!contiguous(x)) return false;  // only true views: a copying reshape would break write aliasing
            if (o.kind == ViewOp::flatten) {
                y.shape = {numel(x.shape)};
            } else {
                if (r < 2) return false;
                y.shape.assign(x.shape.begin(), x.shape.end() - 2);
                y.shape.push_back(x.shape[static_cast<std::size_t>(r - 2)] * x.shape[static_cast<std::size_t>(r - 1)]);
            }
            y.strides = row_major(y.shape);
            break;
        }
    }
    out = y;
    return true;
}

Dense read(const RefState& st, const RV& x) {
    Dense d;
    d.shape = x.shape;
    d.dt = x.dt;
    d.resize(numel(x.shape));
    const Store& s = st.stores[static_cast<std::size_t>(x.store)];
    odometer(x.shape, {x.strides}, [&](I64 k, const std::vector<I64>& off) {
        const auto o = static_cast<std::size_t>(x.off + off[0]), ku = static_cast<std::size_t>(k);
        d.v[ku] = s.v[o];
        d.s[ku] = s.s[o];
        d.f[ku] = s.f[o];
    });
    return d;
}

int add_value(RefState& st, Dense&& d) {
    RV r;
    r.store = static_cast<int>(st.stores.size());
    r.shape = d.shape;
    r.strides = row_major(d.shape);
    r.dt = d.dt;
    st.stores.push_back({d.dt, std::move(d.v), std::move(d.s), std::move(d.f)});
    st.vals.push_back(r);
    return static_cast<int>(st.vals.size()) - 1;
}

/// Generated values stay well inside what a float32 comparison can judge.
bool sane(const Dense& d) {
    if (d.v.empty()) return false;
    std::size_t unsure = 0;
    for (std::size_t i = 0; i < d.v.size(); ++i) {
        if (!std::isfinite(d.v[i]) || std::abs(d.v[i]) > (cat(d.dt) == 2 ? kMaxFloat : kMaxInt) || d.s[i] > kMaxScale) return false;
        unsure += (d.f[i] & F_UNSURE) != 0;
    }
    return unsure * 4 <= d.v.size();
}

/// The state before any step: each input a view of its base store.
RefState ref_init(const Program& p, int k) {
    RefState st;
    for (int i = 0; i < p.nin(); ++i) {
        const InputSpec& in = p.inputs[static_cast<std::size_t>(i)];
        const std::vector<double>& vals = p.data[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
        Store s{in.dt, vals, {}, std::vector<std::uint8_t>(vals.size(), 0)};
        for (double v : vals) s.s.push_back(std::abs(v));
        st.stores.push_back(std::move(s));
        RV r;
        r.store = i;
        r.shape = base_shape(p, i, k);
        r.strides = row_major(r.shape);
        r.dt = in.dt;
        for (const ViewOp& o : outer_chain(in)) {
            const bool ok = view_rv(r, o, r);
            (void)ok;
        }
        st.vals.push_back(r);
    }
    return st;
}

/// Runs one step on the reference; false when the step is not valid (or not well-conditioned).
bool ref_step(const Step& s, RefState& st) {
    auto D = [&](int v) { return read(st, st.vals[static_cast<std::size_t>(v)]); };
    const Arg number{nullptr, s.num, s.num_int};
    Dense out;
    switch (s.kind) {
        case SK::unary: {
            const Dense a = D(s.a);
            if (s.op == Op::square) {
                if (!ew(Op::mul, {{&a}, {&a}}, out)) return false;
            } else if (!ew(s.op, {{&a}}, out)) {
                return false;
            }
            break;
        }
        case SK::binary: {
            const Dense a = D(s.a), b = D(s.b);
            if (!ew(s.op, {{&a}, {&b}}, out)) return false;
            break;
        }
        case SK::scalar: {
            const Dense a = D(s.a);
            if (!ew(s.op, s.num_left ? std::vector<Arg>{number, {&a}} : std::vector<Arg>{{&a}, number}, out)) return false;
            break;
        }
        case SK::where: {
            const Dense c = D(s.a);
            Dense b, e;
            if (s.b >= 0) b = D(s.b);
            if (s.c >= 0) e = D(s.c);
            const Arg ab = s.b >= 0 ? Arg{&b} : number, ac = s.c >= 0 ? Arg{&e} : number;
            if (!ew(Op::where, {{&c}, ab, ac}, out)) return false;
            break;
        }
        case SK::safe_div: {
            const Dense a = D(s.a), b = D(s.b);
            Dense ab, den;
            if (!ew(Op::abs, {{&b}}, ab) || !ew(Op::add, {{&ab}, {nullptr, 0.5, false}}, den) || !ew(Op::div, {{&a}, {&den}}, out))
                return false;
            break;
        }
        case SK::cast:
            if (!cast_ref(D(s.a), s.dt, out)) return false;
            break;
        case SK::reduce: {
            const Dense a = D(s.a);
            const bool ok = s.rk <= RK::min ? reduce_ref(s.rk, a, s.axes, s.keepdim, out) : composite_ref(s.rk, a, s.axes, s.keepdim, out);
            if (!ok) return false;
            break;
        }
        case SK::reduce_mul: {
            const Dense a = D(s.a), b = D(s.b);
            Dense m;
            if (!ew(Op::mul, {{&a}, {&b}}, m) || !reduce_ref(s.rk, m, s.axes, s.keepdim, out)) return false;
            break;
        }
        case SK::reduce_where: {
            const Dense c = D(s.a), x = D(s.b);
            Dense w;
            if (!ew(Op::where, {{&c}, {&x}, {nullptr, 0.0, false}}, w) || !reduce_ref(RK::sum, w, s.axes, s.keepdim, out)) return false;
            break;
        }
        case SK::view: {
            RV r = st.vals[static_cast<std::size_t>(s.a)];
            for (const ViewOp& o : s.chain)
                if (!view_rv(r, o, r)) return false;
            st.vals.push_back(r);
            return sane(read(st, r));
        }
        case SK::clone: out = D(s.a); break;
        case SK::write: {
            RV t = st.vals[static_cast<std::size_t>(s.a)];
            for (const ViewOp& o : s.chain)
                if (!view_rv(t, o, t)) return false;
            Dense src;
            switch (s.wk) {
                case WK::expr: {
                    const Dense b = D(s.b), c = D(s.c);
                    if (!ew(s.op, {{&b}, {&c}}, src)) return false;
                    break;
                }
                case WK::scalar_expr: {
                    const Dense b = D(s.b);
                    if (!ew(s.op, {{&b}, number}, src)) return false;
                    break;
                }
                case WK::tensor: case WK::copy: src = D(s.b); break;
                case WK::fill:
                    src.dt = s.num_int ? (t.dt == DType::boolean ? DType::boolean : DType::i64) : DType::f64;
                    src.resize(1);
                    src.v[0] = s.num;
                    src.s[0] = std::abs(s.num);
                    break;
            }
            Shp b;
            if (!bcast(src.shape, t.shape, b) || b != t.shape) return false;
            if (t.dt == DType::boolean ? src.dt != DType::boolean : cat(src.dt) > cat(t.dt)) return false;
            Dense conv;
            if (!cast_ref(src, t.dt, conv)) return false;
            // the source is evaluated before anything is written (numpy's `a[1:-1] = expr`)
            Store& store = st.stores[static_cast<std::size_t>(t.store)];
            const std::vector<I64> sst = bcast_strides(conv.shape, t.shape);
            odometer(t.shape, {t.strides, sst}, [&](I64, const std::vector<I64>& off) {
                const auto o = static_cast<std::size_t>(t.off + off[0]), j = static_cast<std::size_t>(off[1]);
                store.v[o] = conv.v[j];
                store.s[o] = conv.s[j];
                store.f[o] = conv.f[j];
            });
            st.vals.push_back(t);
            return sane(read(st, t));
        }
    }
    if (!sane(out)) return false;
    add_value(st, std::move(out));
    return true;
}

bool ref_run(const Program& p, int k, RefState& st) {
    st = ref_init(p, k);
    for (const Step& s : p.steps)
        if (!ref_step(s, st)) return false;
    return true;
}

// =========================================================================== kiln
/// Materializes one expression: fused (and traced under kiln::compile) or kiln eager.
struct Mat {
    bool eager = false;
    template <class E> Tensor operator()(const E& e) const { return eager ? kiln::eager(e) : Tensor(e); }
};

Tensor apply_view(const Tensor& x, const ViewOp& o) {
    switch (o.kind) {
        case ViewOp::slice: return x.slice(o.dim, o.start, o.stop, o.step);
        case ViewOp::select: return x.select(o.dim, o.start);
        case ViewOp::transpose: return x.transpose(o.dim, o.start);
        case ViewOp::permute: return x.permute(o.perm);
        case ViewOp::unsqueeze: return x.unsqueeze(o.dim);
        case ViewOp::flatten: return x.reshape({-1});
        case ViewOp::merge_last: {
            std::vector<I64> s;
            for (int d = 0; d + 2 < x.rank(); ++d) s.push_back(x.size(d));
            s.push_back(-1);
            return x.reshape(kiln::Shape(s));
        }
    }
    return x;
}

Tensor run_unary(Op op, const Tensor& x, const Mat& m) {
    switch (op) {
        case Op::neg: return m(kiln::neg(x));
        case Op::abs: return m(kiln::abs(x));
        case Op::exp: return m(kiln::exp(x));
        case Op::tanh: return m(kiln::tanh(x));
        case Op::sigmoid: return m(kiln::sigmoid(x));
        case Op::sin: return m(kiln::sin(x));
        case Op::cos: return m(kiln::cos(x));
        case Op::tan: return m(kiln::tan(x));
        case Op::relu: return m(kiln::relu(x));
        case Op::sqrt: return m(kiln::sqrt(x));
        case Op::log: return m(kiln::log(x));
        case Op::reciprocal: return m(kiln::reciprocal(x));
        case Op::square: return m(x * x);
        case Op::lnot: return m(kiln::logical_not(x));
        default: break;
    }
    throw std::logic_error("fuzz: not a unary op");
}

Tensor run_binary(Op op, const Tensor& x, const Tensor& y, const Mat& m) {
    switch (op) {
        case Op::add: return m(x + y);
        case Op::sub: return m(x - y);
        case Op::mul: return m(x * y);
        case Op::div: return m(x / y);
        case Op::maximum: return m(kiln::maximum(x, y));
        case Op::minimum: return m(kiln::minimum(x, y));
        case Op::gt: return m(x > y);
        case Op::lt: return m(x < y);
        case Op::ge: return m(x >= y);
        case Op::le: return m(x <= y);
        case Op::eq: return m(x == y);
        case Op::ne: return m(x != y);
        case Op::land: return m(kiln::logical_and(x, y));
        case Op::lor: return m(kiln::logical_or(x, y));
        default: break;
    }
    throw std::logic_error("fuzz: not a binary op");
}

/// x op n, or n op x (a C++ number operand: N is double or int64).
template <class N>
Tensor run_scalar(Op op, const Tensor& x, N n, bool left, const Mat& m) {
    if (left) {
        switch (op) {
            case Op::add: return m(n + x);
            case Op::sub: return m(n - x);
            case Op::mul: return m(n * x);
            case Op::div: return m(n / x);
            default: break;
        }
    } else {
        switch (op) {
            case Op::add: return m(x + n);
            case Op::sub: return m(x - n);
            case Op::mul: return m(x * n);
            case Op::div: return m(x / n);
            case Op::maximum: return m(kiln::maximum(x, n));
            case Op::minimum: return m(kiln::minimum(x, n));
            case Op::gt: return m(x > n);
            case Op::lt: return m(x < n);
            default: break;
        }
    }
    throw std::logic_error("fuzz: no such scalar op");
}

template <class N>
Tensor run_where(const Tensor& c, const Tensor* b, const Tensor* e, N n, const Mat& m) {
    if (b && e) return m(kiln::where(c, *b, *e));
    if (b) return m(kiln::where(c, *b, n));
    return m(kiln::where(c, n, *e));
}

kiln::Axes axes_of(const Step& s) { return s.axes.empty() ? kiln::Axes{} : kiln::Axes(std::vector<I64>(s.axes)); }

Tensor run_reduce(RK rk, const Tensor& x, const Step& s) {
    const kiln::Axes ax = axes_of(s);
    switch (rk) {
        case RK::sum: return kiln::sum(x, ax, s.keepdim);
        case RK::mean: return kiln::mean(x, ax, s.keepdim);
        case RK::max: return kiln::max(x, ax, s.keepdim);
        case RK::min: return kiln::min(x, ax, s.keepdim);
        case RK::var: return kiln::var(x, ax, s.keepdim);
        case RK::logsumexp: return kiln::logsumexp(x, ax, s.keepdim);
        case RK::softmax: return kiln::softmax(x, s.axes[0]);
        case RK::log_softmax: return kiln::log_softmax(x, s.axes[0]);
    }
    return x;
}

/// The program over kiln tensors (the body kiln::compile traces, or run eagerly as is).
std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& in, const Mat& m) {
    std::vector<Tensor> v = in;
    v.reserve(in.size() + p.steps.size());
    for (const Step& s : p.steps) {
        auto V = [&](int i) -> const Tensor& { return v[static_cast<std::size_t>(i)]; };
        Tensor r;
        switch (s.kind) {
            case SK::unary: r = run_unary(s.op, V(s.a), m); break;
            case SK::binary: r = run_binary(s.op, V(s.a), V(s.b), m); break;
            case SK::scalar:
                r = s.num_int ? run_scalar(s.op, V(s.a), static_cast<I64>(s.num), s.num_left, m)
                              : run_scalar(s.op, V(s.a), s.num, s.num_left, m);
                break;
            case SK::where: {
                const Tensor* b = s.b >= 0 ? &V(s.b) : nullptr;
                const Tensor* e = s.c >= 0 ? &V(s.c) : nullptr;
                r = s.num_int ? run_where(V(s.a), b, e, static_cast<I64>(s.num), m) : run_where(V(s.a), b, e, s.num, m);
                break;
            }
            case SK::safe_div: r = m(V(s.a) / (kiln::abs(V(s.b)) + 0.5)); break;
            case SK::cast: r = m(kiln::cast(V(s.a), s.dt)); break;
            case SK::reduce: r = run_reduce(s.rk, V(s.a), s); break;
            case SK::reduce_mul:
                r = s.rk == RK::mean ? kiln::mean(V(s.a) * V(s.b), axes_of(s), s.keepdim) : kiln::sum(V(s.a) * V(s.b), axes_of(s), s.keepdim);
                break;
            case SK::reduce_where: r = kiln::sum(kiln::where(V(s.a), V(s.b), 0.0), axes_of(s), s.keepdim); break;
            case SK::view:
                r = V(s.a);
                for (const ViewOp& o : s.chain) r = apply_view(r, o);
                break;
            case SK::clone: r = V(s.a).clone(); break;
            case SK::write: {
                Tensor t = V(s.a);
                for (const ViewOp& o : s.chain) t = apply_view(t, o);
                switch (s.wk) {
                    case WK::expr:
                        if (s.op == Op::add) t.assign(V(s.b) + V(s.c));
                        else if (s.op == Op::sub) t.assign(V(s.b) - V(s.c));
                        else t.assign(V(s.b) * V(s.c));
                        break;
                    case WK::scalar_expr:
                        if (s.op == Op::add) t.assign(V(s.b) + s.num);
                        else t.assign(V(s.b) * s.num);
                        break;
                    case WK::tensor: t.assign(V(s.b)); break;
                    case WK::copy: t.copy_(V(s.b)); break;
                    case WK::fill:
                        if (s.num_int) t.fill_(kiln::Scalar(static_cast<I64>(s.num)));
                        else t.fill_(kiln::Scalar(s.num));
                        break;
                }
                r = t;
                break;
            }
        }
        v.push_back(r);
    }
    std::vector<Tensor> out;
    for (int o : p.outputs) out.push_back(v[static_cast<std::size_t>(o)]);
    return out;
}

/// The values of any CPU or CUDA tensor in row-major order, read element by element through its
/// strides (no kiln kernel involved for CPU tensors).
std::vector<double> read_all(const Tensor& t0) {
    const Tensor t = t0.device().is_cpu() ? t0 : t0.cpu();
    std::vector<double> out(static_cast<std::size_t>(t.numel()));
    Shp shape(t.shape().begin(), t.shape().end()), strides(t.strides().begin(), t.strides().end());
    const char* base = static_cast<const char*>(t.data_ptr());
    const auto es = static_cast<I64>(t.element_size());
    odometer(shape, {strides}, [&](I64 k, const std::vector<I64>& off) {
        const char* q = base + off[0] * es;
        double v = 0;
        switch (t.dtype()) {
            case DType::boolean: { bool b; std::memcpy(&b, q, 1); v = b; break; }
            case DType::i32: { std::int32_t x; std::memcpy(&x, q, 4); v = x; break; }
            case DType::i64: { std::int64_t x; std::memcpy(&x, q, 8); v = static_cast<double>(x); break; }
            case DType::f32: { float x; std::memcpy(&x, q, 4); v = x; break; }
            case DType::f64: { double x; std::memcpy(&x, q, 8); v = x; break; }
            default: v = NAN; break;
        }
        out[static_cast<std::size_t>(k)] = v;
    });
    return out;
}

Tensor make_base(const InputSpec& in, const Shp& shape, const std::vector<double>& vals, kiln::Device dev) {
    Tensor t(kiln::Shape(shape), in.dt);
    kiln::visit_dtype(in.dt, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_arithmetic_v<T>) {
            T* q = t.data<T>();
            for (std::size_t i = 0; i < vals.size(); ++i) q[i] = static_cast<T>(vals[i]);
        }
    });
    return dev.is_cpu() ? t : t.to(dev);
}

// =========================================================================== checking
struct Verdict {
    int kind = 0;  // 0 ok, 1 InternalError, 2 other kiln::Error (or std::exception), 3 wrong result
    std::string key, detail;
};

std::string exc_type(const std::exception& e) {
    if (dynamic_cast<const kiln::InternalError*>(&e)) return "InternalError";
    if (dynamic_cast<const kiln::ShapeError*>(&e)) return "ShapeError";
    if (dynamic_cast<const kiln::DTypeError*>(&e)) return "DTypeError";
    if (dynamic_cast<const kiln::ValueError*>(&e)) return "ValueError";
    if (dynamic_cast<const kiln::DeviceError*>(&e)) return "DeviceError";
    if (dynamic_cast<const kiln::CompileError*>(&e)) return "CompileError";
    if (dynamic_cast<const kiln::GraphBreakError*>(&e)) return "GraphBreakError";
    if (dynamic_cast<const kiln::Error*>(&e)) return "kiln::Error";
    return "std::exception";
}

/// A message with its numbers, shapes and source locations blanked, to group failures.
std::string normalize(const std::string& msg) {
    std::string s;
    for (std::size_t i = 0; i < msg.size();) {
        if (msg.compare(i, 4, " at ") == 0) {  // " at file.cpp:12"
            const std::size_t e = msg.find_first_of(" ,;)\n", i + 4);
            const std::string tok = msg.substr(i + 4, e == std::string::npos ? std::string::npos : e - i - 4);
            if (tok.find(".cpp:") != std::string::npos || tok.find(".hpp:") != std::string::npos) {
                i = e == std::string::npos ? msg.size() : e;
                continue;
            }
        }
        if (std::isdigit(static_cast<unsigned char>(msg[i]))) {
            s += '#';
            while (i < msg.size() && std::isdigit(static_cast<unsigned char>(msg[i]))) ++i;
            continue;
        }
        s += msg[i++];
    }
    // "(#, #, #)" -> "(..)"
    std::string t;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '(') {
            std::size_t j = i + 1;
            while (j < s.size() && (s[j] == '#' || s[j] == ',' || s[j] == ' ')) ++j;
            if (j < s.size() && s[j] == ')') {
                t += "(..)";
                i = j;
                continue;
            }
        }
        t += s[i];
    }
    if (t.size() > 140) t = t.substr(0, 140) + "...";
    return t;
}

std::string index_str(I64 k, const Shp& shape) {
    Shp idx(shape.size());
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        idx[static_cast<std::size_t>(d)] = k % shape[static_cast<std::size_t>(d)];
        k /= shape[static_cast<std::size_t>(d)];
    }
    std::string s = "[";
    for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
    return s + "]";
}

/// Compares values; returns "" or a description of the first difference.
std::string compare_values(const std::vector<double>& got, const Dense& want) {
    for (std::size_t i = 0; i < want.v.size(); ++i) {
        const std::uint8_t f = want.f[i];
        if (f & F_UNSURE) continue;
        const double g = got[i], w = want.v[i], t = tol_of(want.s[i], f);
        const bool ok = (f & F_INEXACT) ? std::abs(g - w) <= t : g == w;
        if (!ok) {
            std::ostringstream o;
            o.precision(9);
            o << "at " << index_str(static_cast<I64>(i), want.shape) << " got " << g << " want " << w;
            if (f & F_INEXACT) o << " (tolerance " << t << ")";
            else o << " (exact)";
            std::size_t bad = 0;
            for (std::size_t j = 0; j < want.v.size(); ++j) {
                const std::uint8_t fj = want.f[j];
                if (fj & F_UNSURE) continue;
                bad += (fj & F_INEXACT) ? !(std::abs(got[j] - want.v[j]) <= tol_of(want.s[j], fj)) : got[j] != want.v[j];
            }
            o << "; " << bad << " of " << want.v.size() << " elements differ";
            return o.str();
        }
    }
    return "";
}

/// Checks one call's outputs and the caller's input bases against the reference.
Verdict check_call(const Program& p, int k, const RefState& ref, const std::vector<Tensor>& outs,
                   const std::vector<Tensor>& bases, const std::string& who) {
    const std::string call = k == 0 ? "first call" : "re-call with new shapes";
    Verdict v;
    if (outs.size() != p.outputs.size()) {
        v.kind = 3;
        v.key = who + ": wrong number of outputs";
        v.detail = std::to_string(outs.size()) + " outputs, want " + std::to_string(p.outputs.size());
        return v;
    }
    for (std::size_t j = 0; j < outs.size(); ++j) {
        const Dense want = read(ref, ref.vals[static_cast<std::size_t>(p.outputs[j])]);
        const Tensor& o = outs[j];
        const Shp got_shape(o.shape().begin(), o.shape().end());
        const std::string name = "output " + std::to_string(j) + " (" + vname(p, p.outputs[j]) + ")";
        if (got_shape != want.shape) {
            v = {3, who + ": wrong shape (" + call + ")", name + " shape " + shp_str(got_shape) + ", want " + shp_str(want.shape)};
            return v;
        }
        if (o.dtype() != want.dt) {
            v = {3, who + ": wrong dtype (" + call + ")",
                 name + " dtype " + std::string(kiln::dtype_name(o.dtype())) + ", want " + std::string(kiln::dtype_name(want.dt))};
            return v;
        }
        const std::string d = compare_values(read_all(o), want);
        if (!d.empty()) {
            v = {3, who + ": wrong values (" + call + ")", name + " " + shp_str(want.shape) + " " + dt_name(want.dt) + ": " + d};
            return v;
        }
    }
    for (int i = 0; i < p.nin(); ++i) {
        const Store& s = ref.stores[static_cast<std::size_t>(i)];
        Dense want;
        want.shape = base_shape(p, i, k);
        want.dt = s.dt;
        want.v = s.v;
        want.s = s.s;
        want.f = s.f;
        const std::string d = compare_values(read_all(bases[static_cast<std::size_t>(i)]), want);
        if (!d.empty()) {
            v = {3, who + ": caller's input after the call differs from eager semantics (" + call + ")",
                 "input x" + std::to_string(i) + " (its base tensor " + shp_str(want.shape) + "): " + d};
            return v;
        }
    }
    return v;
}

struct Env {
    kiln::Device dev = kiln::Device::cpu();
    /// KILN_FUZZ_LIMITS=cuda: compile with CUDA's fusion limits on the CPU (column sums as reduce
    /// groups, sibling reductions joined, producers recomputed: CudaBackend::adjust_limits)
    bool cuda_limits = false;
};

/// Fresh inputs of call k: the base tensors and the arguments (views of them).
void make_args(const Program& p, int k, const Env& env, std::vector<Tensor>& bases, std::vector<Tensor>& args) {
    bases.clear();
    args.clear();
    for (int i = 0; i < p.nin(); ++i) {
        const InputSpec& in = p.inputs[static_cast<std::size_t>(i)];
        Tensor b = make_base(in, base_shape(p, i, k), p.data[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)], env.dev);
        Tensor a = b;
        for (const ViewOp& o : outer_chain(in)) a = apply_view(a, o);
        bases.push_back(b);
        args.push_back(a);
    }
}

/// Runs p compiled (one kiln::compile, called once per call shape in order) or eagerly, against
/// the reference states `refs` (one per call).
Verdict run_check(const Program& p, const std::vector<RefState>& refs, bool eager, const Env& env) {
    const std::string who = eager ? "eager" : "compile";
    std::vector<Tensor> bases, args;
    auto body = [&p](const std::vector<Tensor>& xs) { return run_program(p, xs, Mat{false}); };
    auto body2 = [&p](const std::vector<Tensor>& xs) {
        std::vector<Tensor> o = run_program(p, xs, Mat{false});
        return std::make_tuple(o.at(0), o.at(1));
    };
    kiln::Options opt;
    if (env.cuda_limits) {
        opt.limits.column_rows = false;
        opt.limits.merge_reductions = opt.limits.recompute = true;
    }
    std::optional<decltype(kiln::compile(body))> f;
    std::optional<decltype(kiln::compile(body2))> f2;
    for (int k = 0; k < p.calls(); ++k) {
        Verdict v;
        try {
            make_args(p, k, env, bases, args);
            std::vector<Tensor> outs;
            if (eager) {
                outs = run_program(p, args, Mat{true});
            } else if (p.tuple_result) {
                if (!f2) f2.emplace(kiln::compile(body2, opt));
                auto [a, b] = (*f2)(args);
                outs = {a, b};
            } else {
                if (!f) f.emplace(kiln::compile(body, opt));
                outs = (*f)(args);
            }
            v = check_call(p, k, refs[static_cast<std::size_t>(k)], outs, bases, who);
        } catch (const std::exception& e) {
            const std::string t = exc_type(e);
            v.kind = t == "InternalError" ? 1 : 2;
            v.key = who + ": " + t + ": " + normalize(e.what());
            v.detail = "threw " + t + ": " + e.what();
        }
        if (v.kind) {
            v.detail = "call " + std::to_string(k) + ": " + v.detail;
            return v;
        }
    }
    return {};
}

/// Runs the checks `modes` (false: compiled, true: eager) of p. With `fork`, in a child process,
/// so that a crash or a hang in kiln is one more counted failure (kind 4) instead of the end of
/// the run: the parent never runs kiln code, each child makes its own thread pool.
std::vector<Verdict> checks(const Program& p, const std::vector<RefState>& refs, const Env& env, const std::vector<bool>& modes,
                            bool fork, int timeout_s) {
    std::vector<Verdict> out;
#ifdef KILN_FUZZ_CAN_FORK
    if (fork) {
        std::cout.flush();
        std::fflush(nullptr);
        int fds[2];
        if (pipe(fds) != 0) throw std::runtime_error("fuzz: pipe failed");
        const pid_t pid = ::fork();
        if (pid < 0) throw std::runtime_error("fuzz: fork failed");
        if (pid == 0) {
            close(fds[0]);
            for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
            for (const bool eager : modes) {
                const Verdict v = run_check(p, refs, eager, env);
                std::string msg = std::to_string(v.kind) + '\x1f' + v.key + '\x1f' + v.detail + '\x1e';
                for (std::size_t done = 0; done < msg.size();) {
                    const ssize_t n = ::write(fds[1], msg.data() + done, msg.size() - done);
                    if (n <= 0) _exit(3);
                    done += static_cast<std::size_t>(n);
                }
            }
            _exit(0);
        }
        close(fds[1]);
        std::string buf;
        bool hung = false;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            pollfd pfd{fds[0], POLLIN, 0};
            if (left <= 0 || poll(&pfd, 1, static_cast<int>(left)) == 0) {
                hung = true;
                kill(pid, SIGKILL);
                break;
            }
            char chunk[4096];
            const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
            if (n <= 0) break;
            buf.append(chunk, static_cast<std::size_t>(n));
        }
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        for (std::size_t pos = 0; pos < buf.size();) {
            const std::size_t end = buf.find('\x1e', pos);
            if (end == std::string::npos) break;
            const std::string rec = buf.substr(pos, end - pos);
            const std::size_t a = rec.find('\x1f'), b = rec.find('\x1f', a + 1);
            out.push_back({std::atoi(rec.substr(0, a).c_str()), rec.substr(a + 1, b - a - 1), rec.substr(b + 1)});
            pos = end + 1;
        }
        if (out.size() < modes.size()) {  // the check that did not report crashed or hung
            const std::string who = modes[out.size()] ? "eager" : "compile";
            std::string what = hung ? "hang (killed after " + std::to_string(timeout_s) + " s)"
                               : WIFSIGNALED(status) ? std::string("crash: ") + strsignal(WTERMSIG(status))
                                                     : "child exited with status " + std::to_string(WEXITSTATUS(status));
            out.push_back({4, who + ": " + what, what});
            while (out.size() < modes.size()) out.push_back({});  // not run
        }
        return out;
    }
#endif
    (void)fork;
    (void)timeout_s;
    for (const bool eager : modes) out.push_back(run_check(p, refs, eager, env));
    return out;
}

// =========================================================================== the generator
struct Features {
    bool dynamic = false, strided = false, zero_d = false, int_div = false, write = false, write_input = false,
         multi = false, full_reduce = false, reduce_diff = false, stencil = false, cross_entropy = false;
};

class Gen {
public:
    explicit Gen(std::uint64_t seed) : rng_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) { p.seed = seed; }

    Program p;
    std::vector<RefState> st;  // per call

    bool build() {
        Features ft;
        ft.dynamic = coin(0.35);
        ft.strided = coin(0.35);
        ft.zero_d = coin(0.2);
        ft.int_div = coin(0.3);
        ft.write = coin(0.35);
        ft.write_input = coin(0.2);
        ft.multi = coin(0.4);
        ft.full_reduce = coin(0.3);
        ft.reduce_diff = coin(0.35);
        ft.stencil = coin(0.12);
        ft.cross_entropy = coin(0.1);
        make_inputs(ft);
        st.clear();
        for (int k = 0; k < p.calls(); ++k) st.push_back(ref_init(p, k));
        // forced patterns and random steps, shuffled
        std::vector<int> plan;
        const int nrand = 1 + uni(7);
        for (int i = 0; i < nrand; ++i) plan.push_back(0);
        if (ft.full_reduce) plan.push_back(1);
        if (ft.reduce_diff) plan.push_back(2);
        if (ft.int_div) plan.push_back(3);
        if (ft.write) plan.push_back(4);
        if (ft.write_input) plan.push_back(5);
        if (ft.stencil) plan.push_back(6);
        if (ft.cross_entropy) plan.push_back(7);
        std::shuffle(plan.begin(), plan.end(), rng_);
        for (int what : plan)
            for (int attempt = 0; attempt < 6; ++attempt) {
                int r = -1;
                switch (what) {
                    case 0: r = random_step(); break;
                    case 1: r = pat_reduce_then(true); break;
                    case 2: r = pat_reduce_then(false); break;
                    case 3: r = pat_int_div(); break;
                    case 4: r = pat_write(false); break;
                    case 5: r = pat_write(true); break;
                    case 6: r = pat_stencil(); break;
                    case 7: r = pat_cross_entropy(); break;
                }
                if (r >= 0) break;
            }
        // every input takes part
        for (int i = 0; i < p.nin(); ++i) {
            if (used(i)) continue;
            for (int attempt = 0; attempt < 8 && !used(i); ++attempt) {
                const int w = uni(4);
                if (w == 0) step_unary(i);
                else if (w == 1) step_reduce(i, coin(0.3));
                else step_binary(i);
            }
        }
        if (p.steps.empty())
            for (int attempt = 0; attempt < 20 && p.steps.empty(); ++attempt) random_step();
        if (p.steps.empty()) return false;
        choose_outputs(ft.multi);
        return true;
    }

private:
    std::mt19937_64 rng_;

    int uni(int n) { return static_cast<int>(rng_() % static_cast<std::uint64_t>(n)); }
    bool coin(double pr) { return std::uniform_real_distribution<double>(0, 1)(rng_) < pr; }
    template <class T> T any_of(std::initializer_list<T> l) { return *(l.begin() + uni(static_cast<int>(l.size()))); }

    int nv() const { return static_cast<int>(st[0].vals.size()); }
    DType dt(int v) const { return st[0].vals[static_cast<std::size_t>(v)].dt; }
    const Shp& shape(int v, int k = 0) const { return st[static_cast<std::size_t>(k)].vals[static_cast<std::size_t>(v)].shape; }
    int rank(int v) const { return static_cast<int>(shape(v).size()); }
    bool is_float(int v) const { return cat(dt(v)) == 2; }
    bool is_bool(int v) const { return dt(v) == DType::boolean; }
    const Step* producer(int v) const { return v < p.nin() ? nullptr : &p.steps[static_cast<std::size_t>(v - p.nin())]; }

    bool used(int v) const {
        for (const Step& s : p.steps)
            if (s.a == v || s.b == v || s.c == v) return true;
        return false;
    }

    /// Adds step s if it is valid for every call's shapes; returns its value id or -1.
    int emit(const Step& s) {
        std::vector<RefState> saved = st;
        for (RefState& r : st)
            if (!ref_step(s, r)) {
                st = std::move(saved);
                return -1;
            }
        p.steps.push_back(s);
        return nv() - 1;
    }

    template <class Pred> std::vector<int> cands(Pred&& ok) const {
        std::vector<int> c;
        for (int v = 0; v < nv(); ++v)
            if (ok(v)) c.push_back(v);
        return c;
    }
    /// A candidate, recent values preferred.
    int choose(const std::vector<int>& c) {
        if (c.empty()) return -1;
        if (c.size() > 3 && coin(0.5)) return c[c.size() - 1 - static_cast<std::size_t>(uni(3))];
        return c[static_cast<std::size_t>(uni(static_cast<int>(c.size())))];
    }
    bool bc_all(int a, int b) const {
        Shp o;
        for (int k = 0; k < p.calls(); ++k)
            if (!bcast(shape(a, k), shape(b, k), o)) return false;
        return true;
    }
    int partner(int a, bool numeric) {
        std::vector<int> c = cands([&](int v) { return v != a && bc_all(a, v) && (!numeric || !is_bool(v)); });
        if (c.empty() || coin(0.1)) return bc_all(a, a) && (!numeric || !is_bool(a)) ? a : -1;
        return choose(c);
    }
    double number(bool& is_int, bool int_ok) {
        if (int_ok && coin(0.4)) {
            is_int = true;
            return any_of<double>({1, 2, 3, -2, 5});
        }
        is_int = false;
        return any_of<double>({0.5, 2.0, -1.5, 3.0, 0.25, 2.5, -4.0, 1.0});
    }
    std::vector<I64> random_axes(int r, bool& all) {
        if (r == 0 || all || coin(0.2)) {
            all = true;
            return {};
        }
        std::vector<I64> ax;
        if (r >= 2 && coin(0.3)) {
            for (int d = 0; d < r; ++d)
                if (coin(0.5)) ax.push_back(d);
            if (ax.empty()) ax.push_back(uni(r));
        } else {
            ax.push_back(uni(r));
        }
        for (I64& a : ax)
            if (coin(0.3)) a -= r;
        std::shuffle(ax.begin(), ax.end(), rng_);
        return ax;
    }

    // ---------------------------------------------------------------- inputs
    void make_inputs(const Features& ft) {
        const int mr = 1 + uni(4);  // master rank: inputs are suffixes of it (numpy broadcasting)
        std::vector<int> master(static_cast<std::size_t>(mr));
        for (int d = 0; d < mr; ++d) master[static_cast<std::size_t>(d)] = d;
        auto add_input = [&](DType d, Fill f, std::vector<int> dims) {
            InputSpec in;
            in.dt = d;
            in.fill = f;
            in.dims = std::move(dims);
            p.inputs.push_back(in);
        };
        auto random_dims = [&](int r) {
            std::vector<int> dims(master.end() - r, master.end());
            for (int& x : dims)
                if (coin(0.15)) x = -1;
            return dims;
        };
        auto random_float = [&]() { return coin(0.8) ? DType::f32 : DType::f64; };
        const int n = 1 + uni(3);
        for (int i = 0; i < n; ++i) {
            const int r = uni(mr + 1) == 0 && coin(0.3) ? 0 : 1 + uni(mr);
            const int w = uni(100);
            if (w < 62) add_input(random_float(), coin(0.8) ? Fill::normal : Fill::positive, random_dims(r));
            else if (w < 80) add_input(coin(0.6) ? DType::i32 : DType::i64, coin(0.7) ? Fill::ints : Fill::pos_ints, random_dims(r));
            else add_input(DType::boolean, Fill::boolean, random_dims(r));
        }
        if (ft.zero_d) add_input(any_of({DType::f32, DType::f64, DType::i64}), Fill::normal, {});
        if (ft.int_div) {
            add_input(coin(0.5) ? DType::i32 : DType::i64, coin(0.6) ? Fill::ints : Fill::pos_ints, random_dims(1 + uni(mr)));
            if (coin(0.4)) add_input(coin(0.5) ? DType::i32 : DType::i64, Fill::pos_ints, random_dims(1 + uni(mr)));
        }
        if (ft.cross_entropy && mr >= 2) {
            add_input(random_float(), Fill::normal, {master[static_cast<std::size_t>(mr - 2)], master[static_cast<std::size_t>(mr - 1)]});
            add_input(DType::boolean, Fill::onehot, {master[static_cast<std::size_t>(mr - 2)], master[static_cast<std::size_t>(mr - 1)]});
        }
        for (InputSpec& in : p.inputs) {  // fills that fit the dtypes
            const bool int_fill = in.fill == Fill::ints || in.fill == Fill::pos_ints;
            const bool bool_fill = in.fill == Fill::boolean || in.fill == Fill::onehot;
            if (cat(in.dt) == 0 && !bool_fill) in.fill = Fill::boolean;
            if (cat(in.dt) == 1 && !int_fill) in.fill = Fill::ints;
            if (cat(in.dt) == 2 && (int_fill || bool_fill)) in.fill = Fill::normal;
        }
        // views as arguments
        std::vector<int> can;
        for (int i = 0; i < p.nin(); ++i)
            if (!p.inputs[static_cast<std::size_t>(i)].dims.empty()) can.push_back(i);
        if (!can.empty()) {
            std::shuffle(can.begin(), can.end(), rng_);
            const int nstrided = ft.strided ? 1 + uni(static_cast<int>(can.size())) : (coin(0.1) ? 1 : 0);
            for (int j = 0; j < nstrided; ++j) {
                InputSpec& in = p.inputs[static_cast<std::size_t>(can[static_cast<std::size_t>(j)])];
                const int r = static_cast<int>(in.dims.size());
                const int w = uni(r >= 2 ? 4 : 3);
                in.od = uni(r);
                if (w == 0) { in.outer = Outer::step2; in.extra = uni(2); }
                else if (w == 1) in.outer = Outer::offset1;
                else if (w == 2) { in.outer = Outer::select; in.od = uni(r + 1); in.extra = 2 + uni(3); in.od2 = uni(static_cast<int>(in.extra)); }
                else { in.outer = Outer::transpose; in.od2 = (in.od + 1 + uni(r - 1)) % r; }
            }
        }
        // sizes: call 0, then (dynamic) calls with new sizes of some variables
        std::vector<char> var_used(4, 0);
        for (const InputSpec& in : p.inputs)
            for (int d : in.dims)
                if (d >= 0) var_used[static_cast<std::size_t>(d)] = 1;
        auto fits = [&](const std::vector<I64>& vs) {
            for (int i = 0; i < p.nin(); ++i) {
                I64 nb = 1;
                for (int d : p.inputs[static_cast<std::size_t>(i)].dims) nb *= d < 0 ? 1 : vs[static_cast<std::size_t>(d)];
                if (nb > 3000) return false;
            }
            return true;
        };
        auto draw = [&]() -> I64 { return coin(0.2) ? 13 + uni(28) : (coin(0.1) ? 2 : 3 + uni(10)); };
        std::vector<I64> vs(4);
        for (int tries = 0;; ++tries) {
            for (I64& x : vs) x = tries < 40 ? draw() : 2 + uni(4);
            if (fits(vs)) break;
        }
        p.vars.push_back(vs);
        const int calls = ft.dynamic ? 3 + (coin(0.3) ? 1 : 0) : 1;
        while (static_cast<int>(p.vars.size()) < calls) {
            std::vector<I64> next = p.vars.back();
            bool changed = false;
            for (int tries = 0; tries < 100 && !changed; ++tries) {
                next = p.vars.back();
                for (int j = 0; j < 4; ++j)
                    if (var_used[static_cast<std::size_t>(j)] && coin(0.6)) next[static_cast<std::size_t>(j)] = tries < 60 ? draw() : 2 + uni(4);
                changed = next != p.vars.back() && fits(next);
            }
            if (!changed) break;  // no variable to change: a static program
            p.vars.push_back(next);
        }
        // values
        p.data.assign(static_cast<std::size_t>(p.calls()), {});
        for (int k = 0; k < p.calls(); ++k)
            for (int i = 0; i < p.nin(); ++i) p.data[static_cast<std::size_t>(k)].push_back(draw_values(p.inputs[static_cast<std::size_t>(i)], base_shape(p, i, k)));
    }

    std::vector<double> draw_values(const InputSpec& in, const Shp& shape) {
        const I64 n = numel(shape);
        std::vector<double> v(static_cast<std::size_t>(n));
        std::normal_distribution<double> normal;
        for (double& x : v) {
            switch (in.fill) {
                case Fill::normal: x = normal(rng_); break;
                case Fill::positive: x = std::abs(normal(rng_)) + 0.5; break;
                case Fill::ints: x = uni(11) - 5; break;
                case Fill::pos_ints: x = 1 + uni(6); break;
                case Fill::boolean: x = uni(2); break;
                case Fill::onehot: x = 0; break;
            }
            if (in.dt == DType::f32) x = static_cast<float>(x);
        }
        if (in.fill == Fill::onehot && !shape.empty()) {
            const I64 c = shape.back();
            for (I64 r = 0; r < n / c; ++r) v[static_cast<std::size_t>(r * c + uni(static_cast<int>(c)))] = 1;
        }
        return v;
    }

    // ---------------------------------------------------------------- single steps
    int step_unary(int a) {
        if (a < 0) a = choose(cands([](int) { return true; }));
        if (a < 0) return -1;
        Step s;
        s.kind = SK::unary;
        s.a = a;
        if (is_bool(a)) s.op = coin(0.7) ? Op::lnot : any_of({Op::exp, Op::sigmoid});
        else if (!is_float(a)) s.op = any_of({Op::neg, Op::abs, Op::relu, Op::square, Op::exp, Op::tanh, Op::sin, Op::sqrt, Op::reciprocal});
        else s.op = any_of({Op::neg, Op::abs, Op::exp, Op::tanh, Op::sigmoid, Op::sin, Op::cos, Op::tan, Op::relu, Op::sqrt,
                             Op::log, Op::reciprocal, Op::square, Op::tanh, Op::exp});
        return emit(s);
    }

    int step_binary(int a) {
        if (a < 0) a = choose(cands([](int) { return true; }));
        if (a < 0) return -1;
        const int b = partner(a, false);
        if (b < 0) return -1;
        Step s;
        s.kind = SK::binary;
        s.a = a;
        s.b = b;
        if (coin(0.5)) std::swap(s.a, s.b);
        const int w = uni(100);
        if (is_bool(a) && is_bool(b) && w < 40) s.op = any_of({Op::land, Op::lor, Op::ne, Op::eq});
        else if (w < 72) s.op = any_of({Op::add, Op::sub, Op::mul, Op::div, Op::maximum, Op::minimum, Op::add, Op::mul, Op::sub});
        else s.op = any_of({Op::gt, Op::lt, Op::ge, Op::le, Op::eq, Op::ne});
        return emit(s);
    }

    int step_scalar(int a) {
        if (a < 0) a = choose(cands([&](int v) { return !is_bool(v) || coin(0.2); }));
        if (a < 0) return -1;
        Step s;
        s.kind = SK::scalar;
        s.a = a;
        s.num = number(s.num_int, true);
        s.num_left = coin(0.25);
        s.op = s.num_left ? any_of({Op::add, Op::sub, Op::mul, Op::div})
                          : any_of({Op::add, Op::sub, Op::mul, Op::div, Op::maximum, Op::minimum, Op::gt, Op::lt, Op::mul});
        return emit(s);
    }

    /// A bool value (a comparison made for it when there is none).
    int condition() {
        std::vector<int> c = cands([&](int v) { return is_bool(v); });
        if (!c.empty() && coin(0.7)) return choose(c);
        const int a = choose(cands([&](int v) { return !is_bool(v); }));
        if (a < 0) return -1;
        if (a < 0) return choose(c);
        if (coin(0.4)) {
            Step s;
            s.kind = SK::scalar;
            s.a = a;
            s.op = any_of({Op::gt, Op::lt});
            s.num = any_of<double>({0.0, 0.5, -0.5, 1.0});
            s.num_int = !is_float(a);
            if (s.num_int) s.num = std::round(s.num);
            return emit(s);
        }
        const int b = partner(a, true);
        if (b < 0 || b == a) return -1;
        Step s;
        s.kind = SK::binary;
        s.a = a;
        s.b = b;
        s.op = any_of({Op::gt, Op::lt, Op::ge});
        return emit(s);
    }

    int step_where() {
        const int c = condition();
        if (c < 0) return -1;
        Step s;
        s.kind = SK::where;
        s.a = c;
        s.b = partner(c, true);
        if (s.b < 0) return -1;
        if (coin(0.4)) {
            s.num = number(s.num_int, !is_float(s.b));
            if (coin(0.5)) std::swap(s.b, s.c);  // the number first
        } else {
            s.c = partner(s.b, true);
            if (s.c < 0) return -1;
        }
        return emit(s);
    }

    int step_safe_div(int a) {
        if (a < 0) a = choose(cands([&](int v) { return !is_bool(v); }));
        if (a < 0) return -1;
        const int b = partner(a, true);
        if (b < 0) return -1;
        Step s;
        s.kind = SK::safe_div;
        s.a = a;
        s.b = b;
        return emit(s);
    }

    int step_cast() {
        const int a = choose(cands([](int) { return true; }));
        if (a < 0) return -1;
        Step s;
        s.kind = SK::cast;
        s.a = a;
        if (is_float(a)) s.dt = coin(0.75) ? (dt(a) == DType::f32 ? DType::f64 : DType::f32) : DType::i32;
        else if (is_bool(a)) s.dt = any_of({DType::f32, DType::i32});
        else s.dt = any_of({DType::f32, DType::f64, dt(a) == DType::i32 ? DType::i64 : DType::i32});
        return emit(s);
    }

    int step_reduce(int a, bool full) {
        if (a < 0) a = choose(cands([&](int v) { return !is_bool(v) || coin(0.3); }));
        if (a < 0) return -1;
        if (a < 0) return -1;
        Step s;
        s.kind = SK::reduce;
        s.a = a;
        s.rk = is_bool(a) ? RK::sum : any_of({RK::sum, RK::sum, RK::mean, RK::max, RK::min});
        if (s.rk == RK::mean && !is_float(a)) s.rk = RK::sum;
        s.axes = random_axes(rank(a), full);
        s.keepdim = coin(0.5);
        return emit(s);
    }

    int step_composite() {
        const int a = choose(cands([&](int v) { return is_float(v) && rank(v) >= 1; }));
        if (a < 0) return -1;
        if (a < 0) return -1;
        Step s;
        s.kind = SK::reduce;
        s.a = a;
        s.rk = any_of({RK::var, RK::logsumexp, RK::softmax, RK::log_softmax});
        if (s.rk == RK::softmax || s.rk == RK::log_softmax) {
            s.axes = {uni(rank(a)) - (coin(0.5) ? rank(a) : 0)};
        } else {
            bool full = false;
            s.axes = random_axes(rank(a), full);
            s.keepdim = coin(0.5);
        }
        return emit(s);
    }

    int step_reduce_expr() {
        Step s;
        bool full = false;
        if (coin(0.6)) {
            const int a = choose(cands([&](int v) { return !is_bool(v); }));
            if (a < 0) return -1;
            if (a < 0) return -1;
            const int b = partner(a, true);
            if (b < 0) return -1;
            s.kind = SK::reduce_mul;
            s.a = a;
            s.b = b;
            s.rk = coin(0.5) ? RK::mean : RK::sum;
            Shp o;
            bcast(shape(a), shape(b), o);
            s.axes = random_axes(static_cast<int>(o.size()), full);
        } else {
            const int c = condition();
            if (c < 0) return -1;
            const int b = partner(c, true);
            if (b < 0) return -1;
            s.kind = SK::reduce_where;
            s.a = c;
            s.b = b;
            Shp o;
            bcast(shape(c), shape(b), o);
            s.axes = random_axes(static_cast<int>(o.size()), full);
        }
        s.keepdim = coin(0.5);
        return emit(s);
    }

    ViewOp random_slice(int r, bool for_write) {
        ViewOp o;
        o.kind = ViewOp::slice;
        o.dim = uni(r) - (coin(0.3) ? r : 0);
        const int w = uni(for_write ? 7 : 8);
        switch (w) {
            case 0: o.start = 1; o.stop = -1; break;
            case 1: o.start = 0; o.stop = 1; break;
            case 2: o.start = 0; o.stop = kEnd; o.step = 2; break;
            case 3: o.start = 1; o.stop = kEnd; o.step = 2; break;
            case 4: o.start = -2; o.stop = kEnd; break;
            case 5: o.start = 1; o.stop = 3; break;
            case 6: o.start = 0; o.stop = -1; break;
            default: o.start = 1; o.stop = kEnd; break;
        }
        return o;
    }

    int step_view(int a) {
        if (a < 0) a = choose(cands([](int) { return true; }));
        if (a < 0) return -1;
        const int r = rank(a);
        Step s;
        s.kind = SK::view;
        s.a = a;
        ViewOp o;
        const int w = r == 0 ? 99 : uni(100);
        if (r == 0) {
            o.kind = ViewOp::unsqueeze;
            o.dim = 0;
        } else if (w < 35) {
            o = random_slice(r, false);
        } else if (w < 50) {
            o.kind = ViewOp::select;
            o.dim = uni(r);
            o.start = any_of<I64>({0, -1, 1});
        } else if (w < 65 && r >= 2) {
            o.kind = ViewOp::transpose;
            o.dim = uni(r);
            o.start = (o.dim + 1 + uni(r - 1)) % r;
        } else if (w < 72 && r >= 3) {
            o.kind = ViewOp::permute;
            for (int d = 0; d < r; ++d) o.perm.push_back(d);
            std::shuffle(o.perm.begin(), o.perm.end(), rng_);
        } else if (w < 85 || r == 0) {
            o.kind = ViewOp::unsqueeze;
            o.dim = uni(r + 1);
        } else {
            o.kind = r >= 3 && coin(0.5) ? ViewOp::merge_last : ViewOp::flatten;
        }
        s.chain = {o};
        return emit(s);
    }

    int step_clone(int a) {
        if (a < 0) a = choose(cands([](int) { return true; }));
        if (a < 0) return -1;
        Step s;
        s.kind = SK::clone;
        s.a = a;
        return emit(s);
    }

    int random_step() {
        const int w = uni(100);
        if (w < 12) return step_unary(-1);
        if (w < 30) return step_binary(-1);
        if (w < 42) return step_scalar(-1);
        if (w < 49) return step_where();
        if (w < 53) return step_safe_div(-1);
        if (w < 57) return step_cast();
        if (w < 72) return step_reduce(-1, false);
        if (w < 77) return step_composite();
        if (w < 81) return step_reduce_expr();
        if (w < 94) return step_view(-1);
        return step_clone(-1);
    }

    // ---------------------------------------------------------------- patterns
    /// A reduction (full or over some axes), then elementwise work of another shape on it:
    /// sum(x, {}, true) - x.slice(0, 0, 1), max(x, 0) * 2, tan(min(x)), ...
    int pat_reduce_then(bool full) {
        const int a = choose(cands([&](int v) { return !is_bool(v) && (full || rank(v) >= 1); }));
        if (a < 0) return -1;
        if (a < 0) return -1;
        const int r = step_reduce(a, full);
        if (r < 0) return -1;
        if (!full && coin(0.1)) return r;
        const int w = uni(100);
        if (w < 30) return step_scalar(r);
        if (w < 50) return step_unary(r);
        if (w < 80 && rank(a) >= 1) {
            Step v;  // a row (or column) of the reduced tensor itself
            v.kind = SK::view;
            v.a = a;
            ViewOp o;
            o.kind = ViewOp::slice;
            o.dim = coin(0.7) ? 0 : uni(rank(a));
            o.start = coin(0.7) ? 0 : -1;
            o.stop = o.start == 0 ? 1 : kEnd;
            v.chain = {o};
            const int row = emit(v);
            if (row < 0) return r;
            Step s;
            s.kind = SK::binary;
            s.a = r;
            s.b = row;
            s.op = any_of({Op::sub, Op::add, Op::mul, Op::maximum});
            if (coin(0.3)) std::swap(s.a, s.b);
            const int e = emit(s);
            return e >= 0 ? e : r;
        }
        const int e = step_binary(r);
        return e >= 0 ? e : r;
    }

    /// Integer inputs divided into floats: x_int / 3, x_int / y_float, x_int / y_int.
    int pat_int_div() {
        const int a = choose(cands([&](int v) { return cat(dt(v)) == 1; }));
        if (a < 0) return -1;
        if (a < 0) return -1;
        const int w = uni(100);
        int r;
        if (w < 40) {
            Step s;
            s.kind = SK::scalar;
            s.a = a;
            s.op = Op::div;
            s.num_int = coin(0.6);
            s.num = s.num_int ? any_of<double>({3, 2, -4}) : any_of<double>({2.5, -0.5, 4.0});
            r = emit(s);
        } else if (w < 70) {
            const int b = choose(cands([&](int v) { return v != a && !is_bool(v) && bc_all(a, v); }));
            if (b < 0) return -1;
            Step s;
            s.kind = SK::binary;
            s.a = a;
            s.b = b;
            s.op = Op::div;
            if (coin(0.3)) std::swap(s.a, s.b);
            r = emit(s);
        } else if (w < 85) {
            r = step_safe_div(a);
        } else {
            Step s;
            s.kind = SK::scalar;
            s.a = a;
            s.op = Op::div;
            s.num_left = true;
            s.num_int = true;
            s.num = 7;
            r = emit(s);
        }
        if (r >= 0 && coin(0.4)) {
            const int q = step_reduce(r, false);
            if (q >= 0) return q;
        }
        return r;
    }

    std::vector<ViewOp> write_chain(int base) {
        const int r = rank(base);
        if (r == 0) return {};
        const int w = uni(100);
        std::vector<ViewOp> c;
        if (w < 30) {  // the interior of a stencil
            ViewOp o;
            o.kind = ViewOp::slice;
            o.dim = 0;
            o.start = 1;
            o.stop = -1;
            c.push_back(o);
            if (r >= 2 && coin(0.6)) {
                o.dim = 1;
                c.push_back(o);
            }
        } else if (w < 50) {  // whole rows
            ViewOp o;
            o.kind = ViewOp::slice;
            o.dim = 0;
            const int f = uni(4);
            o.start = f == 0 ? 0 : f == 1 ? 1 : f == 2 ? 0 : -1;
            o.stop = f == 0 ? 1 : f == 1 ? 3 : f == 2 ? 2 : kEnd;
            c.push_back(o);
        } else if (w < 65) {  // a step
            ViewOp o;
            o.kind = ViewOp::slice;
            o.dim = uni(r);
            o.start = uni(2);
            o.stop = kEnd;
            o.step = 2;
            c.push_back(o);
        } else if (w < 80) {
            ViewOp o;
            o.kind = ViewOp::select;
            o.dim = uni(r);
            o.start = any_of<I64>({0, -1, 1});
            c.push_back(o);
        } else if (w < 90 && r >= 2) {
            ViewOp o;
            o.kind = ViewOp::transpose;
            o.dim = 0;
            o.start = 1;
            c.push_back(o);
            c.push_back(random_slice(r, true));
        } else if (w < 95) {
            c.push_back(random_slice(r, true));
        }
        return c;
    }

    /// A write into a view: of a clone, of a computed value, of a view, or of an input.
    int pat_write(bool to_input) {
        int base = -1;
        if (to_input) {
            base = choose(cands([&](int v) { return v < p.nin() && rank(v) >= 1; }));
        } else {
            const int w = uni(100);
            if (w < 50) {
                const int a = choose(cands([&](int v) { return rank(v) >= 1 || coin(0.2); }));
                if (a < 0) return -1;
                base = a < 0 ? -1 : step_clone(a);
            } else if (w < 80) {
                base = choose(cands([&](int v) { return v >= p.nin() && producer(v)->kind != SK::view && producer(v)->kind != SK::write; }));
            } else {
                base = choose(cands([&](int v) { return v >= p.nin() && producer(v)->kind == SK::view; }));
            }
        }
        if (base < 0) return -1;
        Step s;
        s.kind = SK::write;
        s.a = base;
        s.chain = write_chain(base);
        // the target's shape for every call
        std::vector<Shp> tshape;
        for (int k = 0; k < p.calls(); ++k) {
            RV t = st[static_cast<std::size_t>(k)].vals[static_cast<std::size_t>(base)];
            for (const ViewOp& o : s.chain)
                if (!view_rv(t, o, t)) return -1;
            tshape.push_back(t.shape);
        }
        const DType tdt = dt(base);
        auto fits = [&](int v) {
            for (int k = 0; k < p.calls(); ++k) {
                Shp o;
                if (!bcast(shape(v, k), tshape[static_cast<std::size_t>(k)], o) || o != tshape[static_cast<std::size_t>(k)]) return false;
            }
            return tdt == DType::boolean ? is_bool(v) : cat(dt(v)) <= cat(tdt);
        };
        std::vector<int> srcs = cands(fits);
        if (srcs.size() < 2 && coin(0.8)) {  // the same view of a value shaped like the base (the base itself too)
            const int u = choose(cands([&](int v) {
                for (int k = 0; k < p.calls(); ++k)
                    if (shape(v, k) != shape(base, k)) return false;
                return tdt == DType::boolean ? is_bool(v) : cat(dt(v)) <= cat(tdt);
            }));
            if (u >= 0 && !s.chain.empty()) {
                Step vs;
                vs.kind = SK::view;
                vs.a = u;
                vs.chain = s.chain;
                const int nvv = emit(vs);
                if (nvv >= 0) srcs.push_back(nvv);
            } else if (u >= 0) {
                srcs.push_back(u);
            }
        }
        const int w = uni(100);
        if (w < 20 || srcs.empty()) {
            s.wk = WK::fill;
            if (cat(tdt) == 2) s.num = number(s.num_int, false);
            else if (tdt == DType::boolean) { s.num_int = true; s.num = uni(2); }
            else { s.num_int = true; s.num = any_of<double>({1, 2, 3, -2, 5}); }
        } else if (w < 50) {
            s.wk = coin(0.5) ? WK::copy : WK::tensor;
            s.b = choose(srcs);
        } else if (w < 85) {
            s.wk = WK::expr;
            s.op = any_of({Op::add, Op::sub, Op::mul});
            s.b = choose(srcs);
            s.c = choose(srcs);
        } else {
            s.wk = WK::scalar_expr;
            s.op = coin(0.5) ? Op::mul : Op::add;
            s.b = choose(srcs);
            s.num = number(s.num_int, false);
        }
        const int t = emit(s);
        if (t >= 0 && coin(0.6)) {  // read the written tensor afterwards
            const int w2 = uni(3);
            if (w2 == 0) step_unary(base);
            else if (w2 == 1) step_reduce(base, coin(0.3));
            else step_scalar(base);
        }
        return t;
    }

    /// numpy's stencil: u = a.clone(); u[1:-1, 1:-1] = (neighbours of a), possibly twice.
    int pat_stencil() {
        const int a = choose(cands([&](int v) {
            if (!is_float(v) || rank(v) < 1 || rank(v) > 2) return false;
            for (int k = 0; k < p.calls(); ++k)
                for (I64 d : shape(v, k))
                    if (d < 3) return false;
            return true;
        }));
        if (a < 0) return -1;
        const int u = step_clone(a);
        if (u < 0) return -1;
        const int r = rank(a);
        auto sl = [](I64 dim, I64 b, I64 e) {
            ViewOp o;
            o.kind = ViewOp::slice;
            o.dim = dim;
            o.start = b;
            o.stop = e;
            return o;
        };
        int last = -1;
        for (int it = 0; it < 1 + uni(2); ++it) {
            const int src = it == 0 ? a : u;  // the second sweep reads the first's result
            std::vector<int> nb;
            const std::vector<std::pair<I64, I64>> shifts = {{0, -2}, {2, kEnd}};
            for (auto [b, e] : shifts) {
                Step v;
                v.kind = SK::view;
                v.a = src;
                v.chain = {sl(0, b, e)};
                if (r == 2) v.chain.push_back(sl(1, 1, -1));
                nb.push_back(emit(v));
                if (r == 2) {
                    Step h;
                    h.kind = SK::view;
                    h.a = src;
                    h.chain = {sl(0, 1, -1), sl(1, b, e)};
                    nb.push_back(emit(h));
                }
            }
            for (int x : nb)
                if (x < 0) return last;
            int lhs = nb[0], rhs = nb[1];
            if (r == 2) {
                Step s1;
                s1.kind = SK::binary;
                s1.op = Op::add;
                s1.a = nb[0];
                s1.b = nb[2];
                Step s2 = s1;
                s2.a = nb[1];
                s2.b = nb[3];
                lhs = emit(s1);
                rhs = emit(s2);
                if (lhs < 0 || rhs < 0) return last;
            }
            Step w;
            w.kind = SK::write;
            w.a = u;
            w.chain = {sl(0, 1, -1)};
            if (r == 2) w.chain.push_back(sl(1, 1, -1));
            w.wk = WK::expr;
            w.op = coin(0.5) ? Op::add : Op::sub;
            w.b = lhs;
            w.c = rhs;
            const int t = emit(w);
            if (t < 0) return last;
            last = t;
        }
        if (coin(0.5)) step_reduce(u, true);
        return last;
    }

    /// logsumexp(logits, 1) - sum(where(onehot, logits, 0), 1), maybe averaged.
    int pat_cross_entropy() {
        const int L = choose(cands([&](int v) { return is_float(v) && rank(v) == 2; }));
        if (L < 0) return -1;
        int m = choose(cands([&](int v) { return is_bool(v) && bc_all(L, v) && rank(v) == 2; }));
        if (m < 0) {
            Step s;
            s.kind = SK::scalar;
            s.a = L;
            s.op = Op::gt;
            s.num = 0.5;
            m = emit(s);
            if (m < 0) return -1;
        }
        const I64 ax = coin(0.5) ? 1 : -1;
        Step l;
        l.kind = SK::reduce;
        l.rk = RK::logsumexp;
        l.a = L;
        l.axes = {ax};
        const int lse = emit(l);
        Step w;
        w.kind = SK::reduce_where;
        w.a = m;
        w.b = L;
        w.axes = {ax};
        const int pk = emit(w);
        if (lse < 0 || pk < 0) return -1;
        Step d;
        d.kind = SK::binary;
        d.op = Op::sub;
        d.a = lse;
        d.b = pk;
        const int loss = emit(d);
        if (loss >= 0 && coin(0.5)) {
            Step mm;
            mm.kind = SK::reduce;
            mm.rk = RK::mean;
            mm.a = loss;
            const int r = emit(mm);
            if (r >= 0) return r;
        }
        return loss;
    }

    void choose_outputs(bool multi) {
        const int n = nv(), nin = p.nin();
        std::vector<int> out = {n - 1};
        const int want = multi ? 2 + uni(2) : 1;
        std::vector<int> pref;  // written bases and reductions first
        for (int v = nin; v < n; ++v) {
            const Step& s = *producer(v);
            if (s.kind == SK::write && s.a >= nin) pref.push_back(s.a);
            if (s.kind == SK::reduce || s.kind == SK::reduce_mul || s.kind == SK::reduce_where) pref.push_back(v);
        }
        for (int tries = 0; tries < 40 && static_cast<int>(out.size()) < want; ++tries) {
            const int v = !pref.empty() && coin(0.6) ? pref[static_cast<std::size_t>(uni(static_cast<int>(pref.size())))] : nin + uni(n - nin);
            if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
        }
        p.outputs = out;
        p.tuple_result = out.size() == 2 && coin(0.4);
    }
};

// =========================================================================== coverage
struct Coverage {
    int full_reduce = 0, reduce_diff = 0, strided = 0, zero_d = 0, int_div = 0, dynamic = 0, write_view = 0,
        write_input = 0, multi = 0;
};

void cover(const Program& p, const RefState& st, Coverage& c) {
    const int nin = p.nin();
    auto shape = [&](int v) -> const Shp& { return st.vals[static_cast<std::size_t>(v)].shape; };
    auto is_reduction = [&](int v) {
        if (v < nin) return false;
        const Step& s = p.steps[static_cast<std::size_t>(v - nin)];
        return (s.kind == SK::reduce && s.rk != RK::softmax && s.rk != RK::log_softmax) || s.kind == SK::reduce_mul ||
               s.kind == SK::reduce_where;
    };
    auto reduced_input = [&](int v) {
        const Step& s = p.steps[static_cast<std::size_t>(v - nin)];
        if (s.kind == SK::reduce) return shape(s.a);
        Shp o;
        bcast(shape(s.a), shape(s.b), o);
        return o;
    };
    bool full = false, diff = false, idiv = false, wv = false, wi = false;
    for (std::size_t j = 0; j < p.steps.size(); ++j) {
        const Step& s = p.steps[j];
        const int id = nin + static_cast<int>(j);
        if (is_reduction(id) && (s.axes.empty() || reduced_count(reduced_input(id), s.axes) == numel(reduced_input(id)))) full = true;
        const bool elementwise = s.kind == SK::unary || s.kind == SK::binary || s.kind == SK::scalar || s.kind == SK::where ||
                                 s.kind == SK::safe_div || s.kind == SK::cast;
        if (elementwise)
            for (int o : {s.a, s.b, s.c})
                if (o >= 0 && is_reduction(o) && shape(id) != reduced_input(o)) diff = true;
        if ((s.kind == SK::binary && s.op == Op::div) || (s.kind == SK::scalar && s.op == Op::div) || s.kind == SK::safe_div)
            for (int o : {s.a, s.b})
                if (o >= 0 && cat(st.vals[static_cast<std::size_t>(o)].dt) < 2) idiv = true;
        if (s.kind == SK::write) {
            const RV& t = st.vals[static_cast<std::size_t>(id)];
            if (!s.chain.empty() || (s.a >= nin && p.steps[static_cast<std::size_t>(s.a - nin)].kind == SK::view)) wv = true;
            if (t.store < nin) wi = true;
        }
    }
    bool strided = false, zero = false;
    for (const InputSpec& in : p.inputs) {
        strided = strided || in.outer != Outer::none;
        zero = zero || in.dims.empty();
    }
    c.full_reduce += full;
    c.reduce_diff += diff;
    c.strided += strided;
    c.zero_d += zero;
    c.int_div += idiv;
    c.dynamic += p.calls() >= 3;
    c.write_view += wv;
    c.write_input += wi;
    c.multi += p.outputs.size() >= 2;
}

// =========================================================================== shrinking
/// p without step i and every step and output that depends on it; false when nothing is left.
bool drop_step(const Program& p, int i, Program& out) {
    const int nin = p.nin();
    std::vector<int> map(static_cast<std::size_t>(nin + static_cast<int>(p.steps.size())), -1);
    for (int v = 0; v < nin; ++v) map[static_cast<std::size_t>(v)] = v;
    out = p;
    out.steps.clear();
    for (std::size_t j = 0; j < p.steps.size(); ++j) {
        const Step& s = p.steps[j];
        if (static_cast<int>(j) == i) continue;
        bool dead = false;
        for (int o : {s.a, s.b, s.c})
            if (o >= 0 && map[static_cast<std::size_t>(o)] < 0) dead = true;
        if (dead) continue;
        Step t = s;
        if (t.a >= 0) t.a = map[static_cast<std::size_t>(s.a)];
        if (t.b >= 0) t.b = map[static_cast<std::size_t>(s.b)];
        if (t.c >= 0) t.c = map[static_cast<std::size_t>(s.c)];
        map[static_cast<std::size_t>(nin) + j] = nin + static_cast<int>(out.steps.size());
        out.steps.push_back(t);
    }
    out.outputs.clear();
    for (int o : p.outputs)
        if (map[static_cast<std::size_t>(o)] >= 0) out.outputs.push_back(map[static_cast<std::size_t>(o)]);
    if (out.outputs.size() != 2) out.tuple_result = false;
    return !out.outputs.empty() && !out.steps.empty();
}

/// p without input i (unused by every step).
bool drop_input(const Program& p, int i, Program& out) {
    for (const Step& s : p.steps)
        if (s.a == i || s.b == i || s.c == i) return false;
    out = p;
    out.inputs.erase(out.inputs.begin() + i);
    for (auto& d : out.data) d.erase(d.begin() + i);
    auto fix = [i](int& v) { if (v > i) --v; };
    for (Step& s : out.steps) {
        fix(s.a);
        fix(s.b);
        fix(s.c);
    }
    for (int& o : out.outputs) fix(o);
    return true;
}

bool references(const Program& p, std::vector<RefState>& refs) {
    refs.assign(static_cast<std::size_t>(p.calls()), {});
    for (int k = 0; k < p.calls(); ++k)
        if (!ref_run(p, k, refs[static_cast<std::size_t>(k)])) return false;
    return true;
}

/// Failure keys without their "(first call)" / "(re-call ...)" suffix are equal: a nondeterministic
/// kiln result may show up on another call of the shrunk program.
bool same_class(const std::string& a, const std::string& b) {
    auto base = [](const std::string& k) {
        for (const char* suffix : {" (first call)", " (re-call with new shapes)"})
            if (k.size() >= std::strlen(suffix) && k.compare(k.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
                return k.substr(0, k.size() - std::strlen(suffix));
        return k;
    };
    return base(a) == base(b);
}

/// Greedily removes steps, outputs, calls and inputs while the same failure remains.
Program shrink(Program p, const std::string& key, bool eager, const Env& env, bool fork, int timeout_s, int budget = 250) {
    auto still = [&](const Program& c) {
        if (budget-- <= 0) return false;
        std::vector<RefState> refs;
        if (!references(c, refs)) return false;
        return same_class(checks(c, refs, env, {eager}, fork, timeout_s)[0].key, key);
    };
    // one output, as early a value as still fails (so the steps after it can go)
    for (int v = p.nin(); v < p.nin() + static_cast<int>(p.steps.size()); ++v) {
        Program c = p;
        c.outputs = {v};
        c.tuple_result = false;
        if (c.outputs != p.outputs && still(c)) {
            p = c;
            break;
        }
    }
    for (bool changed = true; changed && budget > 0;) {
        changed = false;
        for (int i = static_cast<int>(p.steps.size()) - 1; i >= 0; --i) {
            Program c;
            if (i < static_cast<int>(p.steps.size()) && drop_step(p, i, c) && still(c)) {
                p = c;
                changed = true;
            }
        }
        for (std::size_t j = 0; p.outputs.size() > 1 && j < p.outputs.size(); ++j) {
            Program c = p;
            c.outputs.erase(c.outputs.begin() + static_cast<std::ptrdiff_t>(j));
            if (c.outputs.size() != 2) c.tuple_result = false;
            if (still(c)) {
                p = c;
                changed = true;
                --j;
            }
        }
        for (int k = p.calls() - 1; k >= 0 && p.calls() > 1; --k) {
            Program c = p;
            c.vars.erase(c.vars.begin() + k);
            c.data.erase(c.data.begin() + k);
            if (still(c)) {
                p = c;
                changed = true;
            }
        }
        for (int i = p.nin() - 1; i >= 0; --i) {
            Program c;
            if (drop_input(p, i, c) && still(c)) {
                p = c;
                changed = true;
            }
        }
        // drop trailing steps nothing returns
        for (int i = static_cast<int>(p.steps.size()) - 1; i >= 0; --i) {
            const int id = p.nin() + i;
            bool needed = std::find(p.outputs.begin(), p.outputs.end(), id) != p.outputs.end();
            for (const Step& s : p.steps) needed = needed || s.a == id || s.b == id || s.c == id;
            Program c;
            if (!needed && drop_step(p, i, c) && still(c)) {
                p = c;
                changed = true;
            }
        }
    }
    return p;
}

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

struct Category {
    int count = 0;
    std::vector<Program> samples;  // the first few failing programs
    bool eager = false;
};

/// What a (shrunk) program is made of, to tell apart the bugs behind one failure class.
std::string signature(const Program& p) {
    static const char* sk[] = {"unary", "binary", "scalar", "where", "safe_div", "cast", "reduce", "reduce_mul",
                               "reduce_where", "view", "clone", "write"};
    static const char* wk[] = {"assign(expr)", "assign(scalar expr)", "assign(tensor)", "copy_", "fill_"};
    std::string s = p.calls() > 1 ? "re-called;" : "";
    for (const InputSpec& in : p.inputs)
        s += std::string(dt_name(in.dt)) + (in.dims.empty() ? " 0-d" : "") + (in.outer != Outer::none ? " view" : "") + ";";
    s += " |";
    for (const Step& t : p.steps) {
        s += std::string(" ") + sk[static_cast<int>(t.kind)];
        if (t.kind == SK::unary || t.kind == SK::binary || t.kind == SK::scalar) s += std::string(":") + op_name(t.op);
        if (t.kind == SK::reduce || t.kind == SK::reduce_mul) s += std::string(":") + rk_name(t.rk) + (t.axes.empty() ? "(all)" : "");
        if (t.kind == SK::write) s += std::string(":") + wk[static_cast<int>(t.wk)] + (t.chain.empty() ? "" : "(view)");
    }
    return s;
}


/// What one seed gave: a program (or not), its size and coverage, and the compiled and eager verdicts.
struct Outcome {
    std::uint64_t seed = 0;
    int status = 0;  // 0 checked, 1 not generated, 2 the reference rejects its own program
    int steps = 0;
    Coverage cov;    // this program's categories, 0 or 1 each
    Verdict v[2];    // compiled, eager
};

int* cov_fields(Coverage& c, int i) {
    int* f[] = {&c.full_reduce, &c.reduce_diff, &c.strided, &c.zero_d, &c.int_div, &c.dynamic, &c.write_view, &c.write_input, &c.multi};
    return f[i];
}
constexpr int kCovFields = 9;

/// Generates seed's program and checks it compiled and eagerly; mark(mode) is called before each
/// check (mode -1: generation), so that a crash is blamed on the right one.
template <class Mark>
Outcome run_seed(std::uint64_t seed, const Env& env, bool verbose, Mark&& mark) {
    Outcome o;
    o.seed = seed;
    mark(-1);
    Gen g(seed);
    if (!g.build()) {
        o.status = 1;
        return o;
    }
    std::vector<RefState> refs;
    if (!references(g.p, refs)) {  // a replay of the reference must accept what the generator accepted
        o.status = 2;
        return o;
    }
    o.steps = static_cast<int>(g.p.steps.size());
    cover(g.p, refs[0], o.cov);
    if (verbose) std::cout << program_str(g.p) << std::endl;
    static const int crash_seed = env_int("KILN_FUZZ_CRASH_SEED", -1);  // a self-check of the crash handling
    for (int mode = 0; mode < 2; ++mode) {
        mark(mode);
        if (static_cast<int>(seed) == crash_seed && mode == 0) std::raise(SIGSEGV);
        o.v[mode] = run_check(g.p, refs, mode == 1, env);
    }
    return o;
}

std::string serialize(const Outcome& o) {
    std::string r = "R" + std::to_string(o.seed) + '\x1f' + std::to_string(o.status) + '\x1f' + std::to_string(o.steps);
    Coverage c = o.cov;
    for (int i = 0; i < kCovFields; ++i) r += '\x1f' + std::to_string(*cov_fields(c, i));
    for (const Verdict& v : o.v) r += '\x1f' + std::to_string(v.kind) + '\x1f' + v.key + '\x1f' + v.detail;
    return r + '\x1e';
}
Outcome deserialize(const std::string& rec) {
    std::vector<std::string> f;
    std::size_t pos = 1;
    for (;;) {
        const std::size_t e = rec.find('\x1f', pos);
        f.push_back(rec.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
        if (e == std::string::npos) break;
        pos = e + 1;
    }
    Outcome o;
    if (f.size() != static_cast<std::size_t>(3 + kCovFields + 6)) throw std::runtime_error("fuzz: bad record from a child");
    o.seed = std::stoull(f[0]);
    o.status = std::stoi(f[1]);
    o.steps = std::stoi(f[2]);
    for (int i = 0; i < kCovFields; ++i) *cov_fields(o.cov, i) = std::stoi(f[static_cast<std::size_t>(3 + i)]);
    for (int m = 0; m < 2; ++m) {
        const std::size_t b = static_cast<std::size_t>(3 + kCovFields + 3 * m);
        o.v[m] = {std::stoi(f[b]), f[b + 1], f[b + 2]};
    }
    return o;
}

/// Runs seeds [first, end): in this process, or (fork) in child processes that each run the
/// remaining seeds and stream their outcomes, so that a crash or a hang in kiln costs one new
/// child and is reported for the seed and check it happened in. The parent never runs kiln.
std::vector<Outcome> run_seeds(std::uint64_t first, std::uint64_t end, const Env& env, bool verbose, bool fork, int timeout_s) {
    std::vector<Outcome> out;
#ifdef KILN_FUZZ_CAN_FORK
    if (fork) {
        for (std::uint64_t next = first; next < end;) {
            std::cout.flush();
            std::fflush(nullptr);
            int fds[2];
            if (pipe(fds) != 0) throw std::runtime_error("fuzz: pipe failed");
            const pid_t pid = ::fork();
            if (pid < 0) throw std::runtime_error("fuzz: fork failed");
            if (pid == 0) {
                close(fds[0]);
                for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
                auto send = [&](const std::string& msg) {
                    for (std::size_t done = 0; done < msg.size();) {
                        const ssize_t n = ::write(fds[1], msg.data() + done, msg.size() - done);
                        if (n <= 0) _exit(3);
                        done += static_cast<std::size_t>(n);
                    }
                };
                for (std::uint64_t seed = next; seed < end; ++seed) {
                    const Outcome o = run_seed(seed, env, verbose, [&](int mode) {
                        send("M" + std::to_string(seed) + '\x1f' + std::to_string(mode) + '\x1e');
                    });
                    send(serialize(o));
                }
                _exit(0);
            }
            close(fds[1]);
            std::string buf;
            std::uint64_t cur_seed = next;
            int cur_mode = -1;
            bool hung = false;
            for (;;) {
                pollfd pfd{fds[0], POLLIN, 0};
                if (poll(&pfd, 1, timeout_s * 1000) == 0) {  // no word from the child for timeout_s
                    hung = true;
                    kill(pid, SIGKILL);
                    break;
                }
                char chunk[65536];
                const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
                if (n <= 0) break;
                buf.append(chunk, static_cast<std::size_t>(n));
                std::size_t pos = 0;
                for (std::size_t e; (e = buf.find('\x1e', pos)) != std::string::npos; pos = e + 1) {
                    const std::string rec = buf.substr(pos, e - pos);
                    if (rec[0] == 'M') {
                        const std::size_t a = rec.find('\x1f');
                        cur_seed = std::stoull(rec.substr(1, a - 1));
                        cur_mode = std::stoi(rec.substr(a + 1));
                    } else {
                        out.push_back(deserialize(rec));
                        next = out.back().seed + 1;
                    }
                }
                buf.erase(0, pos);
            }
            close(fds[0]);
            int status = 0;
            waitpid(pid, &status, 0);
            if (next >= end) break;
            // the child died (or hung) in cur_seed: that seed's outcome says where and how
            const std::string what = hung ? "hang (no progress for " + std::to_string(timeout_s) + " s)"
                                     : WIFSIGNALED(status) ? std::string("crash: ") + strsignal(WTERMSIG(status))
                                                           : "child exited with status " + std::to_string(WEXITSTATUS(status));
            Outcome o;
            o.seed = cur_seed;
            Gen g(cur_seed);
            std::vector<RefState> refs;
            if (cur_mode < 0 || !g.build() || !references(g.p, refs)) {
                o.status = 1;
                o.v[0] = {4, "fuzz harness: " + what + " while generating", what};
            } else {
                o.steps = static_cast<int>(g.p.steps.size());
                cover(g.p, refs[0], o.cov);
                o.v[cur_mode] = {4, std::string(cur_mode ? "eager" : "compile") + ": " + what, what};
            }
            out.push_back(o);
            next = cur_seed + 1;
        }
        return out;
    }
#endif
    (void)fork;
    (void)timeout_s;
    for (std::uint64_t seed = first; seed < end; ++seed) out.push_back(run_seed(seed, env, verbose, [](int) {}));
    return out;
}

}  // namespace

TEST_CASE("fuzz: random programs (reductions then reshaped work, strided/0-d/int inputs, dynamic re-calls, writes into views) compiled and eager vs a float64 interpreter") {
    Env env;
    const char* dev = std::getenv("KILN_FUZZ_DEVICE");
    const bool cuda = dev && std::string(dev) == "cuda";
    if (cuda) {
        if (!kiln::cuda::is_available()) {
            MESSAGE("KILN_FUZZ_DEVICE=cuda but no CUDA device is available (kiln::cuda::is_available() is false): "
                    "SKIPPING the CUDA fuzz run");
            WARN_MESSAGE(false, "CUDA fuzz run skipped: no GPU");
            return;
        }
        env.dev = kiln::Device::cuda();
    }
    if (const char* lim = std::getenv("KILN_FUZZ_LIMITS")) env.cuda_limits = std::string(lim) == "cuda";
    const int only = env_int("KILN_FUZZ_SEED", -1);
    const int graphs = only >= 0 ? 1 : env_int("KILN_FUZZ_GRAPHS", 2000);
    const int seed0 = only >= 0 ? only : env_int("KILN_FUZZ_SEED0", 0);
    const bool verbose = only >= 0 || env_int("KILN_FUZZ_VERBOSE", 0) != 0;
    const int shrink_n = env_int("KILN_FUZZ_SHRINK", 3);  // programs shrunk per failure class
    const int print_max = env_int("KILN_FUZZ_PRINT", 12);
    // kiln runs in child processes (CPU only: a CUDA context does not survive fork)
    const bool fork_mode = !cuda && env_int("KILN_FUZZ_FORK", 1) != 0;
    const int timeout_s = env_int("KILN_FUZZ_TIMEOUT", 120);

    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Outcome> outcomes =
        run_seeds(static_cast<std::uint64_t>(seed0), static_cast<std::uint64_t>(seed0 + graphs), env, verbose, fork_mode, timeout_s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    int programs = 0, gen_failed = 0, mismatches = 0, internal_errors = 0, errors = 0;
    int eager_mismatches = 0, eager_errors = 0, printed = 0, steps_total = 0, crashes = 0, eager_crashes = 0;
    Coverage cov;
    std::map<std::string, Category> cats;
    for (const Outcome& o : outcomes) {
        if (o.status) {
            ++gen_failed;
            if (o.status == 2) FAIL_CHECK("seed " << o.seed << ": the reference rejects its own program");
            if (o.v[0].kind) FAIL_CHECK("seed " << o.seed << ": " << o.v[0].key);
            continue;
        }
        ++programs;
        steps_total += o.steps;
        Coverage c = o.cov;
        for (int i = 0; i < kCovFields; ++i) *cov_fields(cov, i) += *cov_fields(c, i);
        for (const bool eager : {false, true}) {
            const Verdict& v = o.v[eager ? 1 : 0];
            if (!v.kind) continue;
            if (v.kind == 4) (eager ? eager_crashes : crashes) += 1;
            else if (eager) (v.kind == 3 ? eager_mismatches : eager_errors) += 1;
            else (v.kind == 1 ? internal_errors : v.kind == 2 ? errors : mismatches) += 1;
            Category& cat = cats[v.key];
            ++cat.count;
            cat.eager = eager;
            const bool sample = static_cast<int>(cat.samples.size()) < std::max(1, shrink_n);
            if (!sample && (printed >= print_max || verbose)) continue;
            Gen g(o.seed);  // the program again (generation is deterministic)
            g.build();
            if (sample) cat.samples.push_back(g.p);
            if (printed < print_max || verbose) {
                ++printed;
                std::cout << "---- " << (eager ? "EAGER" : "COMPILE") << " FAILURE, " << program_str(g.p) << "\n  => " << v.key
                          << "\n     " << v.detail << std::endl;
            }
        }
    }

    // each failure class with its first few programs shrunk; distinct shrunk programs shown once
    std::ostringstream summary;
    summary << programs << " programs (seeds " << seed0 << ".." << seed0 + graphs - 1 << ", " << steps_total << " steps, "
            << (cuda ? "cuda" : "cpu") << (env.cuda_limits ? ", CUDA's fusion limits" : "") << (fork_mode ? ", kiln in child processes" : "") << ") in " << secs
            << " s; compile: " << mismatches << " wrong results, " << internal_errors << " InternalError, " << errors
            << " other errors, " << crashes << " crashes/hangs; eager: " << eager_mismatches << " wrong results, "
            << eager_errors << " errors, " << eager_crashes << " crashes/hangs\n";
    for (auto& [key, c] : cats) {
        summary << "\n[" << c.count << "x] " << key << "\n";
        std::map<std::string, std::pair<int, std::string>> distinct;  // signature -> (samples, text)
        std::vector<std::string> order;
        for (const Program& sample : c.samples) {
            const Program small = shrink_n > 0 ? shrink(sample, key, c.eager, env, fork_mode, timeout_s) : sample;
            std::vector<RefState> refs;
            std::string detail = "(the shrunk program no longer replays)";
            if (references(small, refs)) detail = checks(small, refs, env, {c.eager}, fork_mode, timeout_s)[0].detail;
            if (detail.empty()) detail = "(passed when run once more: this failure is nondeterministic)";
            const std::string sig = signature(small);
            if (!distinct.count(sig)) order.push_back(sig);
            auto& d = distinct[sig];
            if (d.first++ == 0) d.second = program_str(small) + "\n  => " + detail;
        }
        for (const std::string& sig : order)
            summary << "  (" << distinct[sig].first << " of " << c.samples.size() << " samples shrink to this) " << distinct[sig].second << "\n";
    }
    MESSAGE(summary.str());
    MESSAGE("coverage (programs of " << programs << "): full reductions " << cov.full_reduce << ", reductions then differently "
            "shaped elementwise work " << cov.reduce_diff << ", strided/step/transposed/selected inputs " << cov.strided
            << ", 0-d inputs " << cov.zero_d << ", int-into-float division " << cov.int_div << ", dynamic re-calls (3+ shapes) "
            << cov.dynamic << ", writes into views " << cov.write_view << ", writes into inputs " << cov.write_input
            << ", several outputs " << cov.multi << "; not generated: " << gen_failed);
    CHECK(gen_failed == 0);
    CHECK(mismatches == 0);
    CHECK(internal_errors == 0);
    CHECK(errors == 0);
    CHECK(eager_mismatches == 0);
    CHECK(eager_errors == 0);
    CHECK(crashes == 0);
    CHECK(eager_crashes == 0);
    if (only < 0 && programs >= 100) {  // the generator keeps covering every pattern
        const int min = programs / 20;
        CHECK(cov.full_reduce >= min);
        CHECK(cov.reduce_diff >= min);
        CHECK(cov.strided >= min);
        CHECK(cov.zero_d >= min);
        CHECK(cov.int_div >= min);
        CHECK(cov.dynamic >= min);
        CHECK(cov.write_view >= min);
        CHECK(cov.write_input >= min);
        CHECK(cov.multi >= min);
    }
}
