// The op-table sweep: every table op x every dtype x contiguous/strided/broadcast operands,
// fused (expression templates) vs eager (one kernel per op) vs kiln::compile vs a float64 reference.
#include <doctest/doctest.h>

#include <cmath>
#include <kiln/kiln.hpp>

#include "test_util.hpp"
#include <limits>
#include <numbers>
#include <optional>
#include <string>

namespace {

using namespace kiln;
using ops::DTypeRule;

enum class Layout { contiguous, transposed, strided, broadcast };
constexpr Layout layouts[] = {Layout::contiguous, Layout::transposed, Layout::strided, Layout::broadcast};
const char* layout_name(Layout l) {
    switch (l) {
        case Layout::contiguous: return "contiguous";
        case Layout::transposed: return "transposed";
        case Layout::strided: return "strided";
        case Layout::broadcast: return "broadcast";
    }
    return "?";
}

/// When set, the sweep builds each op from CUDA copies of its operands (same layouts) and checks
/// the CUDA results (fused and eager) against the same float64 reference.
bool g_cuda = false;

/// t on the GPU with the same view of a copy of its whole storage (keeps transposed, strided and
/// broadcast layouts), or t itself when the sweep runs on the CPU.
Tensor on_device(const Tensor& t) {
    if (!g_cuda) return t;
    const auto& st = t.storage();
    const Tensor bytes(st, 0, Shape{static_cast<std::int64_t>(st->nbytes())}, Strides{1}, DType::boolean);
    const Tensor dev = bytes.to(Device::cuda());
    return Tensor(dev.storage(), t.offset(), t.shape(), t.strides(), t.dtype());
}

// 37 x 53 = 1961 elements: two tiles and a ragged SIMD tail.
constexpr std::int64_t rows = 37, cols = 53;

struct Range {
    double lo, hi;
    bool nonzero = false;  // keep |x| >= lo by drawing a random sign over [lo, hi]
};

/// Ops whose second operand is a divisor (kept away from zero; zero divisors have their own tests).
bool is_division(std::string_view n) { return n == "div" || n == "remainder" || n == "fmod" || n == "floor_divide"; }

/// The input range op Op wants for operand k, for float or integer dtypes.
template <class Op>
Range range_for(int k, bool integral) {
    const std::string_view n = Op::name;
    if (integral) {
        if (n == "pow") return k == 0 ? Range{-3, 3} : Range{0, 5};
        if (is_division(n) && k == 1) return {1, 6, true};
        if (n == "log" || n == "sqrt" || n == "rsqrt" || n == "log1p" || n == "reciprocal") return {1, 20};
        return {-10, 10};
    }
    if (n == "log" || n == "sqrt" || n == "rsqrt") return {0.05, 20};
    if (n == "log1p") return {-0.9, 20};
    if (n == "reciprocal" || (is_division(n) && k == 1)) return {0.25, 4, true};
    if (n == "pow") return k == 0 ? Range{0.1, 4} : Range{-3, 3};
    if (n == "exp" || n == "expm1") return {-20, 20};
    if (n == "sin" || n == "cos") return {-7, 7};
    if (n == "tan") return {-1.4, 1.4};
    if (n == "tanh" || n == "erf" || n == "sigmoid") return {-9, 9};
    return {-6, 6};
}

/// A tensor of `dtype` and shape (rows, cols) laid out as asked, with values in r.
Tensor make_input(DType dtype, Layout layout, Range r, Generator& g, bool specials = false) {
    const Shape storage_shape = layout == Layout::transposed ? Shape{cols, rows}
                                : layout == Layout::strided  ? Shape{rows, 2 * cols}
                                : layout == Layout::broadcast ? Shape{1, cols}
                                                              : Shape{rows, cols};
    Tensor v = rand(storage_shape, DType::f64, g);
    Tensor sgn = rand(storage_shape, DType::f64, g);
    v = Tensor(v * (r.hi - r.lo) + r.lo);
    if (r.nonzero) v = Tensor(where(sgn < 0.5, -v, v));
    if (!is_floating(dtype)) v = Tensor(kiln::round(v));
    if (dtype == DType::boolean) v = Tensor(sgn < 0.5);
    if (specials && is_floating(dtype)) {
        const double sp[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY, -0.0, 0.0};
        for (int i = 0; i < 5; ++i) v.at<double>({0, 3 * i + 1}) = sp[i];
    }
    Tensor t = v.to(dtype);
    switch (layout) {
        case Layout::transposed: return t.t();
        case Layout::strided: return t.slice(1, 0, 2 * cols, 2);
        case Layout::broadcast: return t.expand({rows, cols});
        default: return t;
    }
}

/// Rounds a float64 value the way storing it in dtype does.
double store_round(double v, DType dtype) {
    switch (dtype) {
        case DType::boolean: return v != 0 ? 1 : 0;
        case DType::i32: return static_cast<double>(static_cast<std::int32_t>(v));
        case DType::i64: return static_cast<double>(static_cast<std::int64_t>(v));
        case DType::f16: return static_cast<float>(kiln::half(static_cast<float>(v)));
        case DType::bf16: return static_cast<float>(kiln::bfloat16(static_cast<float>(v)));
        case DType::f32: return static_cast<float>(v);
        case DType::f64: return v;
    }
    return v;
}

/// Relative tolerance for a result of dtype computed in compute type ct (the float64 reference
/// differs from f32 math by the few ULP of the SIMD math functions).
double rtol_for(DType out) {
    switch (out) {
        case DType::f16: return 2e-3;
        case DType::bf16: return 1.6e-2;
        case DType::f32: return 2e-6;
        case DType::f64: return 1e-13;
        default: return 0;
    }
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b || (a == 0 && b == 0); }

bool close(double actual, double expected, DType out, double scale) {
    if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
    if (std::isinf(expected) || std::isinf(actual)) return actual == expected;
    const double tol = rtol_for(out) * std::max(std::fabs(expected), scale);
    return std::fabs(actual - expected) <= tol;
}

/// References written without the op table for the ops whose table entry is the only other spelling
/// of their semantics: Python's % and // (through the IEEE remainder and an exact floor search) and
/// C's fmod. Empty for every other op.
std::optional<double> independent_reference(std::string_view n, bool int_ct, double a, double b) {
    if (n != "remainder" && n != "fmod" && n != "floor_divide") return std::nullopt;
    if (int_ct) {
        const auto x = static_cast<std::int64_t>(a), y = static_cast<std::int64_t>(b);
        if (y == 0) return 0.0;  // kiln's documented choice for integer division by zero
        const std::int64_t py_mod = ((x % y) + y) % y;  // Python's x % y
        if (n == "fmod") return static_cast<double>(x % y);
        if (n == "remainder") return static_cast<double>(py_mod);
        return static_cast<double>((x - py_mod) / y);
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (n == "fmod") return std::fmod(a, b);
    if (n == "remainder") {
        double r = std::remainder(a, b);  // a - nearest(a / b) * b, exact
        if (r != 0 && std::signbit(r) != std::signbit(b)) r += b;
        return r;
    }
    // floor_divide: the floor of the exact quotient, as Python's float //
    if (std::isnan(a) || std::isnan(b)) return nan;
    if (b == 0) return a / b;
    if (std::isinf(a)) return nan;
    if (std::isinf(b)) return (a == 0 || std::signbit(a) == std::signbit(b)) ? 0.0 : -1.0;
    long double f = std::floor(static_cast<long double>(a) / b);
    // f is the largest integer with f * b <= a (b > 0) or f * b >= a (b < 0); the products are exact here
    auto fits = [&](long double k) { return b > 0 ? k * b <= a : k * b >= a; };
    while (!fits(f)) f -= 1;
    while (fits(f + 1)) f += 1;
    return static_cast<double>(f);
}

/// The test domain of every op: an independent float64 (long double where it matters) or int64
/// implementation from the C++ standard library, written here and not taken from the op's own
/// `eval` (so a wrong formula in the table cannot agree with itself). An op missing here fails the
/// sweep: adding an op to the table means adding its line here (and its input range above).
std::optional<double> independent_value(std::string_view n, bool int_ct, DType attr, const double* v) {
    using LD = long double;
    const double a = v[0], b = v[1], c = v[2];
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (int_ct) {  // integer compute type: exact int64 arithmetic (and C++'s rules where torch's agree)
        const auto x = static_cast<std::int64_t>(a), y = static_cast<std::int64_t>(b);
        if (n == "neg") return static_cast<double>(-x);
        if (n == "abs") return static_cast<double>(x < 0 ? -x : x);
        if (n == "relu") return static_cast<double>(x < 0 ? 0 : x);
        if (n == "floor" || n == "ceil" || n == "round") return static_cast<double>(x);
        if (n == "sign") return static_cast<double>((x > 0) - (x < 0));
        if (n == "add") return static_cast<double>(x + y);
        if (n == "sub") return static_cast<double>(x - y);
        if (n == "mul") return static_cast<double>(x * y);
        if (n == "maximum") return static_cast<double>(std::max(x, y));
        if (n == "minimum") return static_cast<double>(std::min(x, y));
        if (n == "copy") return static_cast<double>(x);
    }
    if (n == "neg") return -a;
    if (n == "abs") return std::fabs(a);
    if (n == "exp") return static_cast<double>(std::exp(static_cast<LD>(a)));
    if (n == "expm1") return static_cast<double>(std::expm1(static_cast<LD>(a)));
    if (n == "log") return static_cast<double>(std::log(static_cast<LD>(a)));
    if (n == "log1p") return static_cast<double>(std::log1p(static_cast<LD>(a)));
    if (n == "sqrt") return static_cast<double>(std::sqrt(static_cast<LD>(a)));
    if (n == "rsqrt") return static_cast<double>(1 / std::sqrt(static_cast<LD>(a)));
    if (n == "sin") return static_cast<double>(std::sin(static_cast<LD>(a)));
    if (n == "cos") return static_cast<double>(std::cos(static_cast<LD>(a)));
    if (n == "tan") return static_cast<double>(std::tan(static_cast<LD>(a)));
    if (n == "tanh") return static_cast<double>(std::tanh(static_cast<LD>(a)));
    if (n == "erf") return static_cast<double>(std::erf(static_cast<LD>(a)));
    if (n == "sigmoid") return static_cast<double>(1 / (1 + std::exp(-static_cast<LD>(a))));
    if (n == "gelu_tanh") {  // torch's approximate='tanh' formula, as written in its docs
        const LD x = a;
        return static_cast<double>(x / 2 * (1 + std::tanh(std::sqrt(2 / std::numbers::pi_v<LD>) * (x + 0.044715L * x * x * x))));
    }
    if (n == "hardswish") {  // torch.nn.Hardswish: x * relu6(x + 3) / 6
        const LD x = a;
        return static_cast<double>(x * std::min<LD>(std::max<LD>(x + 3, 0), 6) / 6);
    }
    if (n == "relu") return std::isnan(a) ? a : (a < 0 ? 0.0 : a);
    if (n == "floor") return std::floor(a);
    if (n == "ceil") return std::ceil(a);
    if (n == "round") return std::nearbyint(a);  // half to even in the default rounding mode
    if (n == "sign") return std::isnan(a) ? a : a > 0 ? 1.0 : a < 0 ? -1.0 : a;
    if (n == "reciprocal") return static_cast<double>(1 / static_cast<LD>(a));
    if (n == "logical_not") return a == 0 ? 1 : 0;
    if (n == "copy") return a;
    if (n == "cast") {
        if (attr == DType::boolean) return a != 0 ? 1 : 0;
        if (is_integral(attr)) return std::trunc(a);
        return a;  // the sweep casts to float types of at least the compute precision
    }
    if (n == "add") return a + b;
    if (n == "sub") return a - b;
    if (n == "mul") return static_cast<double>(static_cast<LD>(a) * b);
    if (n == "div") return static_cast<double>(static_cast<LD>(a) / b);
    if (n == "pow") return static_cast<double>(std::pow(static_cast<LD>(a), static_cast<LD>(b)));
    if (n == "maximum") return std::isnan(a) || std::isnan(b) ? nan : std::max(a, b);
    if (n == "minimum") return std::isnan(a) || std::isnan(b) ? nan : std::min(a, b);
    if (n == "eq") return a == b;
    if (n == "ne") return a != b;
    if (n == "lt") return a < b;
    if (n == "le") return a <= b;
    if (n == "gt") return a > b;
    if (n == "ge") return a >= b;
    if (n == "logical_and") return (a != 0) && (b != 0);
    if (n == "logical_or") return (a != 0) || (b != 0);
    if (n == "where") return a != 0 ? b : c;
    return std::nullopt;
}

/// Float64 (or int64) reference for one element of Op over the given operand values.
template <class Op>
double reference(const expr::Info& info, DType attr, const double* v) {
    const bool int_ct = !info.agnostic && is_integral(info.ct);
    if constexpr (Op::arity == 2)
        if (auto r = independent_reference(Op::name, int_ct, v[0], v[1])) return *r;
    const double in[3] = {v[0], Op::arity > 1 ? v[1] : 0.0, Op::arity > 2 ? v[2] : 0.0};
    if (auto r = independent_value(Op::name, int_ct && Op::rule != DTypeRule::float_math, attr, in)) return *r;
    FAIL("the op sweep has no independent reference for op '" << Op::name << "': add it to independent_value");
    return 0;
}

/// Builds the op over operands a[0..arity) (each a Tensor or a scalar).
template <class Op, class... X>
auto build(DType attr, const X&... x) {
    return expr::make<Op>(attr, x...);
}

struct Case {
    std::string label;
    int checked = 0;
};

/// A copy of expression e with its tensor leaves replaced, in order, by ts[k], ts[k + 1], ...
template <class E>
E rebind(const E& e, const std::vector<Tensor>& ts, std::size_t& k) {
    if constexpr (std::is_same_v<E, expr::TensorLeaf>) {
        return expr::TensorLeaf{ts[k++]};
    } else if constexpr (std::is_same_v<E, expr::ScalarLeaf>) {
        return e;
    } else {
        E n = e;
        n.args = std::apply([&](const auto&... a) { return decltype(e.args){rebind(a, ts, k)...}; }, e.args);
        n.info = expr::infer<typename E::op>(n.args, n.attr);
        return n;
    }
}

/// Runs one op over tensors `in` (already laid out), checking fused vs eager (bitwise) and both
/// vs the reference. Returns false (with doctest failures recorded) on mismatch.
template <class Op, class Node>
void check_node(const Node& node, const std::vector<Tensor>& in, DType attr, const std::string& label) {
    INFO(label);
    const Tensor fused = Tensor(node).cpu();
    const Tensor eag = eager(node).cpu();
    // kiln::compile over the same op: traced from the leaves, optimized, fused and run
    std::vector<const Tensor*> leaf_ptrs;
    std::vector<double> scalars;
    expr::collect(expr::flatten(node), leaf_ptrs, scalars);
    std::vector<Tensor> leaves;
    for (const Tensor* t : leaf_ptrs) leaves.push_back(*t);
    auto compiled_fn = kiln::compile([&node](const std::vector<Tensor>& ts) {
        std::size_t k = 0;
        return Tensor(rebind(node, ts, k));
    });
    const Tensor comp = compiled_fn(leaves).cpu();
    REQUIRE(comp.dtype() == node.info.dtype);
    REQUIRE(comp.shape() == Shape{rows, cols});
    REQUIRE(fused.shape() == Shape{rows, cols});
    REQUIRE(fused.dtype() == node.info.dtype);
    REQUIRE(eag.dtype() == node.info.dtype);
    double scale = 0;  // magnitude of the reference values, for the absolute part of the tolerance
    std::vector<double> ref(static_cast<std::size_t>(rows * cols));
    for (std::int64_t i = 0; i < rows * cols; ++i) {
        double v[3] = {};
        for (std::size_t k = 0; k < in.size(); ++k) v[k] = in[k].item<double>(i);
        ref[static_cast<std::size_t>(i)] = store_round(reference<Op>(node.info, attr, v), node.info.dtype);
        if (std::isfinite(ref[static_cast<std::size_t>(i)])) scale = std::max(scale, std::fabs(ref[static_cast<std::size_t>(i)]));
    }
    scale *= 1e-6;  // values far below the largest one only need to be right to the largest one's ULP-ish
    int bad_eager = 0, bad_ref = 0, bad_compiled = 0;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
        const double f = fused.item<double>(i), e = eag.item<double>(i), r = ref[static_cast<std::size_t>(i)];
        if (!same_value(f, e) && bad_eager++ < 3) FAIL_CHECK("fused " << f << " != eager " << e << " at " << i);
        if (const double c = comp.item<double>(i); !close(c, r, node.info.dtype, scale) && bad_compiled++ < 3)
            FAIL_CHECK("compiled " << c << " vs reference " << r << " at " << i);
        if (!close(f, r, node.info.dtype, scale) && bad_ref++ < 3) {
            std::string args;
            for (const auto& t : in) args += std::to_string(t.item<double>(i)) + " ";
            FAIL_CHECK("fused " << f << " vs reference " << r << " at " << i << " for operands " << args);
        }
    }
    CHECK(bad_eager == 0);
    CHECK(bad_ref == 0);
    CHECK(bad_compiled == 0);
}

template <class Op>
bool dtype_allowed(DType promoted) {
    return Op::allowed_categories & (1u << dtype_category(promoted));
}

template <class Op>
void sweep_op(bool specials) {
    Generator g(1234 + ops::op_id<Op>);
    for (DType dt : all_dtypes) {
        for (Layout lay : layouts) {
            const std::string label = std::string(Op::name) + " " + std::string(dtype_name(dt)) + " " + layout_name(lay) +
                                      (specials ? " with nan/inf" : "");
            const bool integral = !is_floating(dt);
            if constexpr (Op::rule == DTypeRule::cast) {
                const Tensor a = make_input(dt, lay, range_for<Op>(0, integral), g, specials);
                for (DType to : all_dtypes) {
                    if (specials && !is_floating(to)) continue;  // nan/inf -> int is undefined, as in C++ and torch
                    check_node<Op>(build<Op>(to, on_device(a)), {a}, to, label + " -> " + std::string(dtype_name(to)));
                }
            } else if constexpr (Op::rule == DTypeRule::where) {
                const Tensor c = make_input(DType::boolean, lay, {0, 1}, g);
                const Tensor a = make_input(dt, Layout::contiguous, range_for<Op>(1, integral), g, specials);
                const Tensor b = make_input(dt, lay, range_for<Op>(2, integral), g, specials);
                check_node<Op>(build<Op>(DType::f32, on_device(c), on_device(a), on_device(b)), {c, a, b}, DType::f32, label);
            } else {
                std::vector<Tensor> in;
                for (int k = 0; k < Op::arity; ++k)
                    in.push_back(make_input(dt, k == 0 ? lay : Layout::contiguous, range_for<Op>(k, integral), g, specials));
                if (!dtype_allowed<Op>(dt)) {
                    // unsupported dtypes raise DTypeError through both front doors
                    if constexpr (Op::arity == 1) {
                        CHECK_THROWS_AS(Tensor(build<Op>(DType::f32, on_device(in[0]))), DTypeError);
                        CHECK_THROWS_AS(eager(build<Op>(DType::f32, on_device(in[0]))), DTypeError);
                    } else {
                        CHECK_THROWS_AS(Tensor(build<Op>(DType::f32, on_device(in[0]), on_device(in[1]))), DTypeError);
                    }
                    continue;
                }
                if constexpr (Op::arity == 1) {
                    check_node<Op>(build<Op>(DType::f32, on_device(in[0])), in, DType::f32, label);
                } else {
                    check_node<Op>(build<Op>(DType::f32, on_device(in[0]), on_device(in[1])), in, DType::f32, label);
                    // broadcast the other way round, and against a C++ number
                    const Tensor row = make_input(dt, Layout::broadcast, range_for<Op>(1, integral), g);
                    check_node<Op>(build<Op>(DType::f32, on_device(in[0]), on_device(row)), {in[0], row}, DType::f32, label + " (x, row)");
                    const double s = row.item<double>(0);
                    if (is_floating(dt)) {
                        const Tensor st = full({rows, cols}, s, dt);
                        check_node<Op>(build<Op>(DType::f32, on_device(in[0]), s), {in[0], st}, DType::f32, label + " (x, scalar)");
                    } else {
                        const auto si = static_cast<std::int64_t>(s);
                        const Tensor st = full({rows, cols}, si, dt);
                        check_node<Op>(build<Op>(DType::f32, on_device(in[0]), si), {in[0], st}, DType::f32, label + " (x, int scalar)");
                    }
                }
            }
        }
    }
}

}  // namespace

TEST_CASE("every table op, every dtype and layout: fused == eager, both match float64") {
    ops::for_each_op([](auto tag) {
        using Op = typename decltype(tag)::type;
        SUBCASE(std::string(Op::name).c_str()) { sweep_op<Op>(false); }
    });
}

TEST_CASE("nan, inf and signed zeros behave the same fused, eager and in the reference") {
    ops::for_each_op([](auto tag) {
        using Op = typename decltype(tag)::type;
        SUBCASE(std::string(Op::name).c_str()) { sweep_op<Op>(true); }
    });
}

TEST_CASE("on CUDA: every table op, every dtype and layout, fused == eager, both match float64" * doctest::skip(kiln_test::no_cuda())) {
    g_cuda = true;
    for (bool specials : {false, true})
        ops::for_each_op([&](auto tag) {
            using Op = typename decltype(tag)::type;
            SUBCASE((std::string(Op::name) + (specials ? " specials" : "")).c_str()) { sweep_op<Op>(specials); }
        });
    g_cuda = false;
}

TEST_CASE("large operands run on several threads and agree with the single-op kernel") {
    const Tensor x = randn({1000, 257});
    const Tensor y = randn({257});
    const Tensor fused = Tensor(kiln::exp(x) * y + kiln::tanh(x));
    const Tensor eag = eager(kiln::exp(x) * y + kiln::tanh(x));
    for (std::int64_t i = 0; i < fused.numel(); i += 7) {
        const double a = fused.item<double>(i), b = eag.item<double>(i);
        REQUIRE(std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b)));
    }
}

TEST_CASE("remainder, fmod and floor_divide: Python's and C's values, hard cases, integer edge cases") {
    // (a, b, a % b as Python, fmod, a // b as Python): signs of both operands, and floats whose
    // quotient rounds up to an integer (1 / 0.1 is 10.000000000000000555 rounded, 9.99... exactly)
    struct Row { double a, b, rem, fm, fdiv; };
    const Row rows[] = {{7, 3, 1, 1, 2},       {-7, 3, 2, -1, -3},   {7, -3, -2, 1, -3},  {-7, -3, -1, -1, 2},
                        {6, 3, 0, 0, 2},       {-6, 3, 0, -0.0, -2}, {5.5, 2, 1.5, 1.5, 2}, {-5.5, 2, 0.5, -1.5, -3},
                        {1.0, 0.1, 0.09999999999999995, 0.09999999999999995, 9}};
    for (DType dt : {DType::f64, DType::f32, DType::i64, DType::i32}) {
        for (const Row& r : rows) {
            const bool integral = !is_floating(dt);
            if (integral && (r.a != std::floor(r.a) || r.b != std::floor(r.b))) continue;
            if (dt == DType::f32 && r.b == 0.1) continue;  // the value is a float64 one
            INFO(dtype_name(dt) << " " << r.a << " and " << r.b);
            const Tensor a = full({3}, r.a, dt), b = full({3}, r.b, dt);
            const Tensor rem = a % b, fm = kiln::fmod(a, b), fd = kiln::floor_divide(a, b);
            CHECK(rem.dtype() == dt);
            CHECK(rem.item<double>(1) == r.rem);
            CHECK(fm.item<double>(1) == r.fm);
            CHECK(fd.item<double>(1) == r.fdiv);
            CHECK(eager(kiln::floor_divide(a, b)).item<double>(2) == r.fdiv);
        }
    }
    // Python-scalar promotion: an int tensor % a float is float; % an int stays int32
    const Tensor i = arange(-4, 5, 1, DType::i32);
    CHECK(Tensor(i % 3).dtype() == DType::i32);
    CHECK(Tensor(i % 2.5).dtype() == DType::f32);
    CHECK(Tensor(i % 2.5).item<double>(0) == 1.0);  // -4 % 2.5 = 1.0 in Python
    CHECK(Tensor(kiln::floor_divide(-7.0, full({1}, 2.0))).item<double>(0) == -4);
    // integer division by zero is 0 (torch raises), INT_MIN by -1 wraps (never traps)
    const std::int64_t lo = std::numeric_limits<std::int64_t>::min();
    const Tensor m = full({2}, lo, DType::i64);
    CHECK(Tensor(kiln::floor_divide(m, -1)).item<std::int64_t>(0) == lo);
    CHECK(Tensor(m % -1).item<std::int64_t>(1) == 0);
    CHECK(Tensor(kiln::fmod(m, full({2}, -1, DType::i64))).item<std::int64_t>(0) == 0);
    const Tensor i32min = full({2}, std::numeric_limits<std::int32_t>::min(), DType::i32);
    CHECK(eager(kiln::floor_divide(i32min, -1)).item<std::int32_t>(0) == std::numeric_limits<std::int32_t>::min());
    const Tensor z = zeros({9}, DType::i32);
    for (std::int64_t k = 0; k < 9; ++k) {
        CHECK(Tensor(i % z).item<std::int32_t>(k) == 0);
        CHECK(Tensor(kiln::floor_divide(i, z)).item<std::int32_t>(k) == 0);
        CHECK(eager(kiln::fmod(i, z)).item<std::int32_t>(k) == 0);
    }
    // floats by zero: IEEE (inf with the quotient's sign, or nan), as torch
    const Tensor f = Tensor(kiln::floor_divide(full({1}, -3.0), 0.0));
    CHECK(f.item<double>(0) == -INFINITY);
    CHECK(std::isnan(Tensor(full({1}, 3.0) % 0.0).item<double>(0)));
}

TEST_CASE("on CUDA: remainder, fmod and floor_divide by zero and INT_MIN / -1 match the CPU" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor a = Tensor(arange(-20, 20, 1, DType::i64) * 7919), b = Tensor(arange(-20, 20, 1, DType::i64) % 7);
    const Tensor da = a.cuda(), db = b.cuda();
    for (int op = 0; op < 3; ++op) {
        const Tensor cpu = op == 0 ? Tensor(a % b) : op == 1 ? Tensor(kiln::fmod(a, b)) : Tensor(kiln::floor_divide(a, b));
        const Tensor gpu = (op == 0 ? Tensor(da % db) : op == 1 ? Tensor(kiln::fmod(da, db)) : Tensor(kiln::floor_divide(da, db))).cpu();
        for (std::int64_t k = 0; k < 40; ++k) CHECK(gpu.item<std::int64_t>(k) == cpu.item<std::int64_t>(k));
    }
    const std::int64_t lo = std::numeric_limits<std::int64_t>::min();
    CHECK(Tensor(kiln::floor_divide(full({1}, lo, DType::i64).cuda(), -1)).item<std::int64_t>(0) == lo);
    const Tensor x = Tensor(randn({1000}, DType::f64) * 10.0), y = Tensor(randn({1000}, DType::f64) * 3.0);
    const Tensor fd = Tensor(kiln::floor_divide(x.cuda(), y.cuda())).cpu(), fr = Tensor(x.cuda() % y.cuda()).cpu();
    const Tensor cd = kiln::floor_divide(x, y), cr = x % y;
    for (std::int64_t k = 0; k < 1000; ++k) {
        CHECK(fd.item<double>(k) == cd.item<double>(k));
        CHECK(fr.item<double>(k) == cr.item<double>(k));
    }
}
