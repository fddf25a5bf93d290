// kiln_simd_probe: issue 18's item 3, "SIMD math at full speed over the whole input domain". Times
// every float op of the op table (tables/op_table.hpp: the formulas the fused loops, the tile
// interpreter and the generated C++ all run) on SIMD batches of ordinary inputs and of each class
// of special value: denormals, zeros, values whose result underflows or overflows, +-inf, NaN,
// huge arguments, and the masked-softmax mix of finite values and -inf. A class that runs more than
// `--limit` times slower than ordinary inputs is a slow path, printed with a '!' and counted in the
// exit status.
//
// CMake builds it twice from this one file, so both instruction sets are measured on the same CPU:
//   kiln_simd_probe_avx2    -march=x86-64-v3 (AVX2 + FMA: the 8-lane path of every formula)
//   kiln_simd_probe_avx512  -march=x86-64-v4 (AVX-512: 16 lanes, scalef, masks)
//   kiln_simd_probe_avx2 [--filter NAME[,NAME...]] [--limit RATIO] [--json FILE]
#include "kiln/tables/op_table.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using B = kiln::detail::simd::Batch<float>;
constexpr std::size_t W = B::size;
constexpr std::size_t N = 4096;  // floats per input array: 16 KiB, in L1 with its output

struct InputClass {
    const char* name;
    float (*make)(std::mt19937&, std::size_t);  // the i-th value
};

float uniform(std::mt19937& g, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
float sign(std::mt19937& g) { return (g() & 1) ? 1.0f : -1.0f; }
constexpr float inf = std::numeric_limits<float>::infinity();

const InputClass classes[] = {
    {"ordinary", [](std::mt19937& g, std::size_t) { return uniform(g, -4.0f, 4.0f); }},
    {"denormal", [](std::mt19937& g, std::size_t) { return sign(g) * uniform(g, 1e-45f, 1e-38f); }},
    {"zero", [](std::mt19937& g, std::size_t) { return sign(g) * 0.0f; }},
    {"underflow", [](std::mt19937& g, std::size_t) { return -uniform(g, 88.0f, 200.0f); }},   // exp, sigmoid... reach denormals or 0
    {"overflow", [](std::mt19937& g, std::size_t) { return uniform(g, 89.0f, 200.0f); }},     // exp reaches inf
    {"large", [](std::mt19937& g, std::size_t) { return sign(g) * uniform(g, 300.0f, 8e5f); }},  // trig: positions, phases
    {"huge", [](std::mt19937& g, std::size_t) { return sign(g) * uniform(g, 1e6f, 3e38f); }},   // trig: exact reduction
    {"+inf", [](std::mt19937&, std::size_t) { return inf; }},
    {"-inf", [](std::mt19937&, std::size_t) { return -inf; }},
    {"nan", [](std::mt19937&, std::size_t) { return std::numeric_limits<float>::quiet_NaN(); }},
    {"masked", [](std::mt19937& g, std::size_t i) { return (i / 8) % 2 ? -inf : uniform(g, -4.0f, 4.0f); }},  // masked softmax rows
};

struct Result {
    std::string op, operand, cls;
    double ns_per_elem = 0, ratio = 0;
};

/// Nanoseconds per element of f over x: the fastest of 15 runs of 40 passes (the least disturbed
/// by other processes; the same inputs every pass, so the runs differ only by interference).
template <class F> double time_ns(F f, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& y) {
    std::vector<double> t;
    for (int r = 0; r < 15; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int pass = 0; pass < 40; ++pass) {
            for (std::size_t i = 0; i < N; i += W) f(a.data() + i, b.data() + i, y.data() + i);
            asm volatile("" : : "r"(y.data()) : "memory");
        }
        t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (40.0 * N));
    }
    return *std::min_element(t.begin(), t.end());
}

struct Probe {
    std::vector<std::string> filter;
    double limit = 1.5;
    std::vector<Result> results;
    int slow = 0;

    bool wanted(std::string_view name) const {
        if (filter.empty()) return true;
        for (const auto& f : filter)
            if (name.find(f) != std::string_view::npos) return true;
        return false;
    }

    /// Times op on every input class for operand `k` (the other operand, if any, ordinary: 1.7).
    template <class Op> void op(int k) {
        if (!wanted(Op::name)) return;
        std::mt19937 g(7);
        const std::vector<float> other(N, 1.7f);
        std::vector<float> y(N);
        double base = 0;
        for (const InputClass& c : classes) {
            std::vector<float> x(N);
            for (std::size_t i = 0; i < N; ++i) x[i] = c.make(g, i);
            const std::vector<float>& a = k == 0 ? x : other;
            const std::vector<float>& b = k == 0 ? other : x;
            const double ns = time_ns(
                [](const float* pa, const float* pb, float* py) {
                    if constexpr (Op::arity == 1) Op::eval(B::load_unaligned(pa)).store_unaligned(py);
                    else Op::eval(B::load_unaligned(pa), B::load_unaligned(pb)).store_unaligned(py);
                    (void)pb;
                },
                a, b, y);
            if (base == 0) base = ns;
            Result r{std::string(Op::name), Op::arity == 1 ? "x" : (k == 0 ? "a" : "b"), c.name, ns, ns / base};
            if (r.ratio > limit) ++slow;
            results.push_back(r);
        }
    }

    void print() const {
        std::printf("%-13s %-3s", "op", "arg");
        for (const InputClass& c : classes) std::printf(" %10s", c.name);
        std::printf("\n");
        for (std::size_t i = 0; i < results.size(); i += std::size(classes)) {
            std::printf("%-13s %-3s", results[i].op.c_str(), results[i].operand.c_str());
            for (std::size_t c = 0; c < std::size(classes); ++c) {
                const Result& r = results[i + c];
                if (c == 0) std::printf(" %8.3fns", r.ns_per_elem);
                else std::printf(" %8.2fx%s", r.ratio, r.ratio > limit ? "!" : " ");
            }
            std::printf("\n");
        }
    }

    void write_json(const std::string& path) const {
        std::ofstream f(path);
        f << "[\n";
        for (std::size_t i = 0; i < results.size(); ++i) {
            const Result& r = results[i];
            f << "  {\"op\": \"" << r.op << "\", \"operand\": \"" << r.operand << "\", \"class\": \"" << r.cls
              << "\", \"ns_per_elem\": " << r.ns_per_elem << ", \"vs_ordinary\": " << r.ratio << "}" << (i + 1 < results.size() ? "," : "")
              << "\n";
        }
        f << "]\n";
    }
};

/// Every op of the list that takes floats: unary ones on x, binary ones on each operand in turn.
template <class... Ops> void probe_all(Probe& p, kiln::ops::OpList<Ops...>) {
    auto one = [&]<class Op>() {
        constexpr bool floats = (Op::allowed_categories & 0b100) != 0;
        constexpr bool value_op = Op::rule != kiln::ops::DTypeRule::compare && Op::rule != kiln::ops::DTypeRule::logical &&
                                  Op::rule != kiln::ops::DTypeRule::cast && Op::rule != kiln::ops::DTypeRule::where;
        if constexpr (floats && value_op && Op::arity == 1) p.op<Op>(0);
        if constexpr (floats && value_op && Op::arity == 2) {
            p.op<Op>(0);
            p.op<Op>(1);
        }
    };
    (one.template operator()<Ops>(), ...);
}

}  // namespace

int main(int argc, char** argv) {
    Probe p;
    std::string json;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--filter" && i + 1 < argc) {
            const std::string f = argv[++i];
            for (std::size_t at = 0; at <= f.size();) {
                const std::size_t comma = std::min(f.find(',', at), f.size());
                if (comma > at) p.filter.push_back(f.substr(at, comma - at));
                at = comma + 1;
            }
        } else if (a == "--limit" && i + 1 < argc) {
            p.limit = std::stod(argv[++i]);
        } else if (a == "--json" && i + 1 < argc) {
            json = argv[++i];
        } else {
            std::fprintf(stderr, "usage: %s [--filter NAME[,NAME...]] [--limit RATIO] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    std::printf("kiln_simd_probe: %zu float lanes per batch (%s); ns per element on ordinary inputs in [-4, 4], then each\n"
                "class's time as a multiple of that; '!' marks more than %.2fx. Binary ops: arg a or b special, the other 1.7.\n\n",
                W, W == 16 ? "AVX-512" : W == 8 ? "AVX2" : "narrower", p.limit);
    probe_all(p, kiln::ops::ElementwiseOps{});
    p.print();
    if (!json.empty()) p.write_json(json);
    std::printf("\n%d op/class pairs slower than %.2fx their ordinary inputs\n", p.slow, p.limit);
    return p.slow == 0 ? 0 : 1;
}
