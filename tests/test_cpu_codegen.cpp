// Generated C++ for compiled CPU programs (backends/cpu/cpp_codegen.hpp, cpp_build.hpp): every
// table op in every dtype it takes, over contiguous, broadcast and strided layouts, against
// eager; the disk cache (hits, corrupt and foreign entries rebuilt); async builds; no compiler; a
// prelude that does not compile.
#include "test_util.hpp"

#include "kiln/backends/cpu/cpp_codegen.hpp"
#include "kiln/backends/cpu/gemm.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

using kiln::DType;
using kiln::Tensor;
using kiln_test::maxdiff;

namespace {

/// Values for an input of dtype d: small integers (nonzero when `divisor`) or normal floats.
Tensor input(const kiln::Shape& shape, DType d, bool divisor) {
    Tensor x = kiln::randn(shape) * 3.0;
    if (d == DType::boolean) return kiln::eager(x > 0.0);
    if (d == DType::i32 || d == DType::i64) {
        Tensor r = kiln::eager(kiln::floor(x));
        if (divisor) r = kiln::eager(kiln::where(r == 0.0, 1.0, r));
        return r.to(d);
    }
    return x.to(d);
}

bool allowed(unsigned categories, DType d) { return (categories >> kiln::dtype_category(d) & 1u) != 0; }

std::string read(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Replaces a file (a new inode: the library this process mapped from the old one stays intact).
void write(const std::filesystem::path& p, const std::string& s) {
    const std::filesystem::path tmp = p.string() + ".test";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << s;
    }
    std::filesystem::rename(tmp, p);
}

/// Its arguments (tensors or expressions) as a vector of tensors.
template <class... X> std::vector<Tensor> tensors(const X&... t) { return std::vector<Tensor>{Tensor(t)...}; }

struct ModeScope {
    kiln::CpuCodegen prev = kiln::cpu_codegen();
    explicit ModeScope(kiln::CpuCodegen m) { kiln::set_cpu_codegen(m); }
    ~ModeScope() { kiln::set_cpu_codegen(prev); }
};

/// fn(a, b) one of three ways: 0 as written (expression templates), 1 compiled on the tile
/// interpreter, 2 compiled with generated C++ (built before it runs).
template <class F>
std::vector<Tensor> run_way(int how, F fn, const Tensor& a, const Tensor& b) {
    if (how == 0) return fn(a, b);
    ModeScope mode(how == 1 ? kiln::CpuCodegen::off : kiln::CpuCodegen::sync);
    return kiln::compile(fn)(a, b);
}

}  // namespace

TEST_CASE("cpu codegen: every table op in every dtype it takes, contiguous + row broadcast and strided + column broadcast, matches eager") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::async);
    kiln::manual_seed(7);
    const kiln::CpuCodegenStats before = kiln::cpu_codegen_stats();
    // One compiled program per input dtype, every op of that dtype (or every cast from it) one of
    // its outputs: a few kernels, each with many ops, instead of a kernel per op and dtype (298
    // builds from a cold cache took 196 s of compiler time under CI's sanitizer stage, 2026-11-29).
    struct Program {
        std::string dtype;
        std::vector<std::string> names;  // what each output is
        std::function<std::vector<Tensor>()> run;
        std::vector<Tensor> expect;
    };
    std::vector<Program> programs;
    // compiles fn over its inputs in async mode (the interpreter runs meanwhile) and keeps eager's answer
    auto add = [&](std::string dtype, std::vector<std::string> names, auto fn, auto... in) {
        auto compiled = kiln::compile(fn);
        std::vector<Tensor> expect;
        for (const Tensor& t : fn(in...)) expect.push_back(kiln::eager(t));
        programs.push_back({std::move(dtype), std::move(names), [compiled, in...]() mutable { return compiled(in...); }, expect});
    };
    // shapes with tails: 37 is no multiple of any SIMD width
    for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::boolean}) {
        const Tensor x = input({7, 37}, d, false), xt = input({37, 7}, d, false).transpose(0, 1);
        // the ops in the four compute types (bf16 and bool compute as f32: their loads, stores and
        // conversions are the casts' cases below)
        if (d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64) {
            const Tensor y = input({37}, d, true), yc = input({7, 1}, d, true);
            const Tensor c = input({7, 37}, DType::boolean, false);
            // the strided + column-broadcast layout in the float types (f32 for 32-bit lanes, f64 for
            // two batches per chunk); the integers take the first layout twice
            const bool both_layouts = d == DType::f32 || d == DType::f64;
            std::vector<std::string> names;
            std::vector<std::function<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, std::vector<Tensor>&)>> ops;
            kiln::ops::for_each_op([&](auto tag) {
                using Op = typename decltype(tag)::type;
                if constexpr (Op::rule != kiln::ops::DTypeRule::cast) {
                    if (!allowed(Op::allowed_categories, d)) return;
                    if (Op::rule == kiln::ops::DTypeRule::where && d == DType::boolean) return;
                    names.push_back(std::string(Op::name));
                    names.push_back(std::string(Op::name) + (both_layouts ? " (strided, column broadcast)" : " (again)"));
                    ops.push_back([c, both_layouts](const Tensor& a, const Tensor& b, const Tensor& at0, const Tensor& bc0, std::vector<Tensor>& out) {
                        const kiln::detail::OpFn<Op> f{};
                        const Tensor& at = both_layouts ? at0 : a;
                        const Tensor& bc = both_layouts ? bc0 : b;
                        if constexpr (Op::arity == 1) out.insert(out.end(), {f(a), f(at)});
                        else if constexpr (Op::arity == 2) out.insert(out.end(), {f(a, b), f(at, bc)});
                        else out.insert(out.end(), {f(c, a, b), f(c, at, bc)});
                    });
                }
            });
            add(std::string(kiln::dtype_name(d)), names, [ops](const Tensor& a, const Tensor& b, const Tensor& at, const Tensor& bc) {
                std::vector<Tensor> out;
                for (const auto& op : ops) op(a, b, at, bc, out);
                return out;
            }, x, y, xt, yc);
        }
        // casts to every dtype and back: the strided input converted to `to`, computed there, stored as d
        std::vector<std::string> names;
        const std::vector<DType> targets{DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16, DType::boolean};
        for (DType to : targets) names.push_back("cast " + std::string(kiln::dtype_name(d)) + " -> " + std::string(kiln::dtype_name(to)));
        add(std::string(kiln::dtype_name(d)) + " casts", names, [targets, d](const Tensor& at) {
            std::vector<Tensor> out;
            for (DType to : targets) out.push_back(kiln::cast(kiln::cast(at, to) * 3, d));
            return out;
        }, xt);
    }
    std::size_t outputs = 0;
    for (Program& p : programs) p.run();  // queues every kernel's build (the interpreter runs meanwhile)
    kiln::cpu_codegen_wait();
    for (Program& p : programs) {
        const std::vector<Tensor> got = p.run();
        REQUIRE(got.size() == p.expect.size());
        REQUIRE(got.size() == p.names.size());
        for (std::size_t i = 0; i < got.size(); ++i, ++outputs) {
            CAPTURE(p.dtype);
            CAPTURE(p.names[i]);
            CHECK(got[i].dtype() == p.expect[i].dtype());
            CHECK(maxdiff(got[i], p.expect[i]) <= 2e-6);
        }
    }
    CHECK(outputs > 360);
    const kiln::CpuCodegenStats after = kiln::cpu_codegen_stats();
    MESSAGE(programs.size() << " programs, " << outputs << " outputs: " << after.builds - before.builds << " kernels built in "
                            << after.build_ms - before.build_ms << " ms, " << after.disk_hits - before.disk_hits << " read from disk");
    CHECK(after.build_failures == before.build_failures);
    // every program ran kernels: built, or read from this cache dir's disk entries
    CHECK(after.builds + after.disk_hits + after.memory_hits - before.builds - before.disk_hits - before.memory_hits >= programs.size());
}

namespace {

/// A compiled program with one elementwise group, and its eager result.
struct Sample {
    Tensor x = kiln::randn({9, 130});
    Tensor b = kiln::randn({130});
    static Tensor fn(const Tensor& x, const Tensor& b) { return kiln::sigmoid(x * 1.75 - b) + kiln::tanh(x); }
    Tensor expect = kiln::eager(fn(x, b));
};

}  // namespace

TEST_CASE("cpu codegen: a kernel's disk entry is read by a new program; corrupt and foreign entries are rebuilt, never loaded") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::sync);
    namespace fs = std::filesystem;
    Sample s;
    auto fn = [](const Tensor& x, const Tensor& b) { return Sample::fn(x, b); };
    kiln::detail::cppgen::forget_loaded();  // the source is logged where this process first asks for it
    kiln_test::LogCapture logs("output_code");
    auto c1 = kiln::compile(fn);
    CHECK(maxdiff(c1(s.x, s.b), s.expect) <= 1e-6);
    // the generated source is in the log, and its entry on disk
    std::string source;
    for (const std::string& line : logs.lines)
        if (line.find("cpu kernel") != std::string::npos) source = line.substr(line.find('\n') + 1);
    REQUIRE(source.find("extern \"C\" void kiln_kernel") != std::string::npos);
    CHECK(source.find("// sigmoid") != std::string::npos);
    const std::string stem = kiln::detail::cppgen::entry_stem(source);
    REQUIRE(fs::is_regular_file(stem + ".so"));
    REQUIRE(fs::is_regular_file(stem + ".meta"));
    CHECK(read(stem + ".cpp") == source);

    auto fresh_call = [&] {
        kiln::detail::cppgen::forget_loaded();
        auto c = kiln::compile(fn);
        return maxdiff(c(s.x, s.b), s.expect);
    };
    SUBCASE("a valid entry is loaded, not built") {
        const auto before = kiln::cpu_codegen_stats();
        CHECK(fresh_call() <= 1e-6);
        const auto after = kiln::cpu_codegen_stats();
        CHECK(after.disk_hits == before.disk_hits + 1);
        CHECK(after.builds == before.builds);
    }
    SUBCASE("a truncated library is rejected and rebuilt") {
        const std::string so = read(stem + ".so");
        write(stem + ".so", so.substr(0, so.size() / 2));
        const auto before = kiln::cpu_codegen_stats();
        CHECK(fresh_call() <= 1e-6);
        const auto after = kiln::cpu_codegen_stats();
        CHECK(after.disk_rejected == before.disk_rejected + 1);
        CHECK(after.builds == before.builds + 1);
        CHECK(read(stem + ".so").size() == so.size());
    }
    SUBCASE("a flipped byte in the library is rejected and rebuilt") {
        std::string so = read(stem + ".so");
        so[so.size() / 2] = static_cast<char>(so[so.size() / 2] ^ 0x5a);
        write(stem + ".so", so);
        const auto before = kiln::cpu_codegen_stats();
        CHECK(fresh_call() <= 1e-6);
        CHECK(kiln::cpu_codegen_stats().disk_rejected == before.disk_rejected + 1);
    }
    SUBCASE("an entry whose key text differs (another compiler, CPU or source) is rebuilt") {
        std::string meta = read(stem + ".meta");
        meta += " ";
        write(stem + ".meta", meta);
        const auto before = kiln::cpu_codegen_stats();
        CHECK(fresh_call() <= 1e-6);
        const auto after = kiln::cpu_codegen_stats();
        CHECK(after.disk_rejected == before.disk_rejected + 1);
        CHECK(after.builds == before.builds + 1);
    }
    SUBCASE("a missing meta file is a miss: rebuilt") {
        fs::remove(stem + ".meta");
        const auto before = kiln::cpu_codegen_stats();
        CHECK(fresh_call() <= 1e-6);
        CHECK(kiln::cpu_codegen_stats().builds == before.builds + 1);
        CHECK(fs::is_regular_file(stem + ".meta"));
    }
}

TEST_CASE("cpu codegen: in async mode the first calls run on the interpreter while the kernel builds, then the kernel runs") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::async);
    kiln::detail::cppgen::forget_loaded();
    // a layout no other case uses (f64 with a strided operand), so its kernel is new to this process
    const Tensor x = kiln::randn({40, 33}, DType::f64).transpose(0, 1);
    const Tensor b = kiln::randn({33, 1}, DType::f64);
    auto fn = [](const Tensor& x, const Tensor& b) { return kiln::exp(-x * x) * b + 0.25; };
    const Tensor expect = kiln::eager(fn(x, b));
    auto c = kiln::compile(fn);
    const auto s0 = kiln::cpu_codegen_stats();
    CHECK(maxdiff(c(x, b), expect) <= 1e-12);  // the interpreter, unless the disk had the kernel
    kiln::cpu_codegen_wait();
    const auto s1 = kiln::cpu_codegen_stats();
    CHECK(s1.disk_hits - s0.disk_hits + s1.builds - s0.builds == 1);
    CHECK(maxdiff(c(x, b), expect) <= 1e-12);
    CHECK(maxdiff(c(x, b), expect) <= 1e-12);
    const auto s2 = kiln::cpu_codegen_stats();
    // built in the background: the next call asks once more and the program remembers the kernel
    CHECK(s2.memory_hits - s1.memory_hits == s1.builds - s0.builds);
    CHECK(s2.build_failures == s0.build_failures);
}

TEST_CASE("cpu codegen: without a compiler, compiled programs run on the interpreter and say why") {
    if (std::getenv("KILN_CODEGEN_TEST_CHILD")) {
        CHECK(kiln::cpu_codegen_unavailable().find("no C++ compiler") != std::string::npos);
        Sample s;
        auto c = kiln::compile(Sample::fn);
        ModeScope mode(kiln::CpuCodegen::sync);
        CHECK(maxdiff(c(s.x, s.b), s.expect) <= 1e-6);
        CHECK(kiln::cpu_codegen_stats().builds == 0);
        return;
    }
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string cmd = "KILN_CODEGEN_TEST_CHILD=1 KILN_CXX=/nonexistent/c++ '" + self + "' -tc='cpu codegen: without a compiler*'";
    CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("cpu codegen: where kiln's prelude does not compile (its headers missing), one build fails and no other is tried") {
    if (std::getenv("KILN_CODEGEN_TEST_CHILD")) {
        REQUIRE(kiln::cpu_codegen_unavailable() == "");  // a compiler and kiln's headers are there
        ModeScope mode(kiln::CpuCodegen::sync);
        Sample s;
        auto c = kiln::compile(Sample::fn);
        CHECK(maxdiff(c(s.x, s.b), s.expect) <= 1e-6);  // on the interpreter
        auto d = kiln::compile([](const Tensor& x, const Tensor& b) { return kiln::exp(x) * 0.5 + b; });
        CHECK(maxdiff(d(s.x, s.b), kiln::eager(kiln::exp(s.x) * 0.5 + s.b)) <= 1e-5);
        const kiln::CpuCodegenStats st = kiln::cpu_codegen_stats();
        CHECK(st.builds == 1);  // the second program's kernels were not tried
        CHECK(st.build_failures == 1);
        CHECK(kiln::cpu_codegen_unavailable().find("prelude does not compile") != std::string::npos);
        return;
    }
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string dir = (std::filesystem::temp_directory_path() / ("kiln_prelude_test_" + std::to_string(::getpid()))).string();
    // a header every build includes, missing: as where xsimd's headers are not installed
    const std::string cmd = "KILN_CODEGEN_TEST_CHILD=1 KILN_CACHE_DIR='" + dir + "' KILN_CXXFLAGS='-include /nonexistent/kiln_missing.hpp' '" + self +
                            "' -tc='cpu codegen: where kiln*'";
    CHECK(std::system(cmd.c_str()) == 0);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

TEST_CASE("cpu codegen: row groups (softmax, masked softmax, log_softmax, layer_norm, var, row scalars, int sums) at every row length match eager") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::async);
    kiln::manual_seed(11);
    using Outs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
    struct Case {
        std::string name;
        std::function<Outs()> run;
        Outs expect;
    };
    std::vector<Case> cases;
    for (DType d : {DType::f32, DType::f64, DType::bf16}) {
        for (std::int64_t n : {1, 7, 37, 300, 1000, 3000}) {
            // outer rank 2 (5 x 3 rows); a mask row of -inf on every other element
            const Tensor x = kiln::eager(kiln::randn({5, 3, n}) * 2.0).to(d);
            const Tensor w = kiln::randn({n}).to(d), b = kiln::randn({n}).to(d);
            const Tensor mask = kiln::eager(kiln::where(kiln::arange(n, DType::f32) % 2.0 == 0.0, 0.0, -INFINITY)).to(d);
            auto fn = [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& mask) {
                return Outs{kiln::softmax(x, -1), kiln::softmax(x + mask, -1) * 2.0, kiln::log_softmax(x, -1),
                            kiln::layer_norm(x, 1, w, b), Tensor(kiln::var(x, {-1}) + kiln::max(x, {-1}) * kiln::mean(x, {-1}))};
            };
            auto compiled = kiln::compile(fn);
            const Outs e = fn(x, w, b, mask);  // eager: each op on its own
            cases.push_back({std::string(kiln::dtype_name(d)) + " rows of " + std::to_string(n),
                             [compiled, x, w, b, mask]() mutable { return compiled(x, w, b, mask); }, e});
        }
    }
    for (std::int64_t n : {5, 300}) {  // integer rows: sums accumulate in int64
        const Tensor x = kiln::eager(kiln::floor(kiln::randn({9, n}) * 50.0)).to(DType::i32);
        auto fn = [](const Tensor& x, const Tensor&, const Tensor&, const Tensor&) {
            return Outs{Tensor(x - kiln::sum(x, {-1}, true)), kiln::sum(x * x, {-1}), kiln::max(x, {-1}), kiln::min(x, {-1}),
                        kiln::prod(kiln::sign(x), {-1})};
        };
        auto compiled = kiln::compile(fn);
        const Tensor none = kiln::zeros({1});
        cases.push_back({"int32 rows of " + std::to_string(n), [compiled, x, none]() mutable { return compiled(x, none, none, none); },
                         fn(x, none, none, none)});
    }
    // bf16: eager rounds every intermediate to bf16, compiled keeps f32 between ops: the reference
    // is the same program on the tile interpreter
    for (Case& c : cases)
        if (c.name.rfind("bfloat16", 0) == 0) {
            ModeScope interpreter(kiln::CpuCodegen::off);
            c.expect = c.run();
        }
    const kiln::CpuCodegenStats before = kiln::cpu_codegen_stats();
    for (Case& c : cases) c.run();
    kiln::cpu_codegen_wait();
    for (Case& c : cases) {
        CAPTURE(c.name);
        const Outs got = c.run();
        const double tol = c.name.rfind("bfloat16", 0) == 0 ? 1e-2 : c.name.rfind("float64", 0) == 0 ? 1e-12 : 2e-5;
        CHECK(maxdiff(std::get<0>(got), std::get<0>(c.expect)) <= tol);
        CHECK(maxdiff(std::get<1>(got), std::get<1>(c.expect)) <= tol);
        CHECK(maxdiff(std::get<2>(got), std::get<2>(c.expect)) <= tol);
        CHECK(maxdiff(std::get<3>(got), std::get<3>(c.expect)) <= tol * 10);
        CHECK(maxdiff(std::get<4>(got), std::get<4>(c.expect)) <= tol * 10);
    }
    const kiln::CpuCodegenStats after = kiln::cpu_codegen_stats();
    MESSAGE(cases.size() << " programs: " << after.builds - before.builds << " kernels built, " << after.disk_hits - before.disk_hits
                         << " read from disk");
    CHECK(after.build_failures == before.build_failures);
    CHECK(after.builds + after.disk_hits > before.builds + before.disk_hits);
}

TEST_CASE("cpu codegen: a matmul's elementwise epilogue runs inside kiln's GEMM, block by block, and matches eager") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::sync);
    const int threads_before = kiln::num_threads();
    kiln::manual_seed(21);
    const bool gemm = kiln::detail::gemm::enabled;  // kiln's GEMM (AVX-512 builds); Eigen's has no hook
    struct Case {
        std::string name;
        std::function<std::vector<Tensor>()> compiled, eager;
        bool epilogue;  ///< whether the epilogue may run inside the GEMM
    };
    std::vector<Case> cases;
    auto add = [&](std::string name, auto fn, std::vector<Tensor> in, bool epilogue) {
        auto c = kiln::compile(fn);
        constexpr bool two = std::is_invocable_v<decltype(fn)&, const Tensor&, const Tensor&>;
        auto call = [in](auto& f) {
            if constexpr (two) return f(in[0], in[1]);
            else return f(in[0], in[1], in[2]);
        };
        cases.push_back({std::move(name), [c, call]() mutable { return call(c); }, [fn, call]() mutable { return call(fn); }, epilogue});
    };
    for (DType d : {DType::f32, DType::f64}) {
        const std::string dn(kiln::dtype_name(d));
        // edge tiles in every direction (37 rows, 45 columns), a bias row, gelu
        add(dn + " gelu(x @ w + b)", [](const Tensor& x, const Tensor& w, const Tensor& b) { return tensors(kiln::gelu_tanh(kiln::matmul(x, w) + b)); },
            {kiln::randn({37, 300}).to(d), kiln::randn({300, 45}).to(d), kiln::randn({45}).to(d)}, true);
        // a batch folded into one product, a transposed weight
        add(dn + " relu(x3 @ w.T + b)",
            [](const Tensor& x, const Tensor& w, const Tensor& b) { return tensors(kiln::relu(kiln::matmul(x, w.transpose(0, 1)) + b)); },
            {kiln::randn({2, 33, 64}).to(d), kiln::randn({50, 64}).to(d), kiln::randn({50}).to(d)}, true);
    }
    // batched operands on both sides
    add("bmm * 2 - 1", [](const Tensor& a, const Tensor& c) { return tensors(kiln::matmul(a, c) * 2.0 - 1.0); },
        {kiln::randn({3, 20, 30}), kiln::randn({3, 30, 17})}, true);
    // the product is an output too, and read by the epilogue
    add("mm and sigmoid(mm) * mm", [](const Tensor& a, const Tensor& b) {
            const Tensor mm = kiln::matmul(a, b);
            return tensors(mm, kiln::sigmoid(mm) * mm);
        },
        {kiln::randn({64, 96}), kiln::randn({96, 70})}, true);
    // the epilogue reads the product transposed: (i, j) needs (j, i), not computed yet: refused
    add("mm + mm.T", [](const Tensor& a, const Tensor& b) {
            const Tensor mm = kiln::matmul(a, b);
            return tensors(mm + mm.transpose(0, 1));
        },
        {kiln::randn({40, 40}), kiln::randn({40, 40})}, false);
    // large enough to split over threads (blocks of rows and columns)
    add("threaded tanh(x @ w + b)", [](const Tensor& x, const Tensor& w, const Tensor& b) { return tensors(kiln::tanh(kiln::matmul(x, w) + b)); },
        {kiln::randn({256, 512}), kiln::randn({512, 384}) * 0.05, kiln::randn({384})}, true);
    for (int threads : {1, 2, 3}) {
        kiln::set_num_threads(threads);
        for (Case& c : cases) {
            CAPTURE(c.name);
            CAPTURE(threads);
            (void)c.compiled();  // builds the kernels (sync mode)
            const std::size_t before = kiln::cpu_codegen_stats().matmul_epilogues;
            const std::vector<Tensor> got = c.compiled(), want = c.eager();
            const std::size_t ran = kiln::cpu_codegen_stats().matmul_epilogues - before;
            CHECK(ran == (c.epilogue && gemm ? 1u : 0u));
            REQUIRE(got.size() == want.size());
            for (std::size_t k = 0; k < got.size(); ++k) {
                const double tol = got[k].dtype() == DType::f64 ? 1e-12 : 1e-5;
                CHECK(maxdiff(got[k], want[k]) <= tol);
            }
        }
    }
    kiln::set_num_threads(threads_before);
}

TEST_CASE("cpu codegen: a row kernel keeps softmax's exp in the output row, and in a row buffer where the output is written over its input") {
    // softmax(x) + x: x is read again in the pass that reads exp back, so in place (output over
    // input) exp cannot go to the output row
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::sync);
    namespace cg = kiln::detail::cppgen;
    namespace ops = kiln::ops;
    // max(x), x - max, exp, sum, exp / sum, + x (leaf 0; members are values 1..6)
    cg::RowProgram p;
    p.leaves.push_back({DType::f32, true});
    auto member = [](bool reduce, ops::OpId op, kiln::ir::ReduceKind rk, int a, int b = -1) {
        cg::RowProgram::Member m;
        m.reduce = reduce;
        m.vec = !reduce;
        m.op = op;
        m.rid = static_cast<ops::ReduceId>(rk);
        m.in[0] = a;
        m.in[1] = b;
        return m;
    };
    p.members = {member(true, 0, kiln::ir::ReduceKind::max, 0), member(false, ops::op_id<ops::Sub>, {}, 0, 1),
                 member(false, ops::op_id<ops::Exp>, {}, 2), member(true, 0, kiln::ir::ReduceKind::sum, 3),
                 member(false, ops::op_id<ops::Div>, {}, 3, 4), member(false, ops::op_id<ops::Add>, {}, 5, 0)};
    p.outs = {{5, DType::f32}};
    const std::string src = cg::row_source(p);
    CAPTURE(src);
    REQUIRE(src.find("3 passes") != std::string::npos);
    CHECK(src.find("overlaps(p0, p1, inner)") != std::string::npos);  // exp kept in the output row
    void* const loaded = cg::kernel_for(src);
    REQUIRE(loaded != nullptr);
    const auto fn = reinterpret_cast<cg::RowsFn>(loaded);
    kiln::manual_seed(5);
    for (std::int64_t n : {1, 13, 1000, 2500}) {
        CAPTURE(n);
        const Tensor x = kiln::eager(kiln::randn({6, n}) * 3.0);
        const Tensor expect = kiln::eager(kiln::softmax(x, -1) + x);
        const std::int64_t oshape[1] = {6}, ostr[2] = {n, n};
        const Tensor y = kiln::empty({6, n}), inplace = x.clone();
        void* apart[2] = {x.data_ptr(), y.data_ptr()};
        fn(apart, oshape, ostr, nullptr, n, 0, 6);
        CHECK(maxdiff(y, expect) <= 1e-5);
        void* same[2] = {inplace.data_ptr(), inplace.data_ptr()};  // the output row over the input row
        fn(same, oshape, ostr, nullptr, n, 0, 6);
        CHECK(maxdiff(inplace, expect) <= 1e-5);
    }
}

TEST_CASE("cpu codegen: outputs of 16 MiB and more are written with streaming stores from their first aligned element, and match eager") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    ModeScope mode(kiln::CpuCodegen::sync);
    namespace cg = kiln::detail::cppgen;
    const int saved_threads = kiln::num_threads();
    kiln::manual_seed(11);
    // (4099, 1023) f32 is 16.01 MiB: segments start anywhere (rows of 1023, thread chunks), so the
    // head before the first aligned element runs first; (1000, 1000) is 3.8 MiB: plain stores
    const Tensor big = kiln::eager(kiln::randn({4099, 1023}) * 2.0), bias = kiln::randn({1023}), small = kiln::randn({1000, 1000});
    const Tensor w = kiln::randn({1023}), b = kiln::randn({1023});
    const Tensor big64 = big.slice(0, 0, 2100).to(DType::f64);
    // streamed: plain arithmetic; chain computes float math (exp), so it stores normally
    auto light = [](const Tensor& x) { return Tensor(x * x * -0.5 + x); };
    auto chain = [](const Tensor& x) { return Tensor(kiln::exp(x * -0.5) * 2.0 + x); };
    auto row_bias = [&](const Tensor& x) { return Tensor(kiln::maximum(x + bias, 0.0) * 0.5); };
    auto two_out = [](const Tensor& x) { return std::vector<Tensor>{Tensor(x * 3.0), Tensor(x * x + 1.0)}; };
    auto ln = [&](const Tensor& x) { return kiln::layer_norm(x, 1, w, b); };
    auto sm = [](const Tensor& x) { return kiln::softmax(x, -1); };
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        kiln::set_num_threads(threads);
        for (const Tensor* x : {&big, &small, &big64}) {
            CHECK(maxdiff(kiln::compile(light)(*x), kiln::eager(light(*x))) <= 1e-4);  // |values| < 200, an FMA
            CHECK(maxdiff(kiln::compile(chain)(*x), kiln::eager(chain(*x))) <= 1e-6);
        }
        CHECK(maxdiff(kiln::compile(light)(big.slice(1, 1, 1023)), kiln::eager(light(big.slice(1, 1, 1023)))) <= 1e-4);
        CHECK(maxdiff(kiln::compile(row_bias)(big), kiln::eager(row_bias(big))) == 0);
        const std::vector<Tensor> got = kiln::compile(two_out)(big), want = two_out(big);
        REQUIRE(got.size() == 2);
        CHECK(maxdiff(got[0], want[0]) == 0);
        CHECK(maxdiff(got[1], want[1]) <= 1e-4);
        CHECK(maxdiff(kiln::compile(ln)(big), kiln::eager(ln(big))) <= 1e-5);
        CHECK(maxdiff(kiln::compile(sm)(big), kiln::eager(sm(big))) <= 1e-6);
        // the expression templates' fused loops: into a fresh output, and into views of a buffer
        // starting 0 and 3 floats past a 64-byte boundary
        const Tensor flat = big.reshape({4099 * 1023});
        const Tensor want_flat = kiln::eager(light(flat));
        CHECK(maxdiff(Tensor(flat * flat * -0.5 + flat), want_flat) <= 1e-4);
        const Tensor buf = kiln::zeros({flat.numel() + 16});
        for (std::int64_t shift : {0, 3}) {
            Tensor dst = buf.slice(0, shift, shift + flat.numel());
            dst.assign(flat * flat * -0.5 + flat);
            CHECK(maxdiff(dst, want_flat) <= 1e-4);
        }
    }
    kiln::set_num_threads(saved_threads);

    // the kernels' text: streaming stores for an output in its compute type, contiguous along the
    // row, and a fence; a row kernel called on an output row that is not aligned stores normally
    namespace ops = kiln::ops;
    cg::RowProgram p;  // x - mean(x) over rows: leaf 0 (value 0), member 0 mean (value 1), member 1 sub
    p.leaves.push_back({DType::f32, true});
    cg::RowProgram::Member mean, sub;
    mean.reduce = true;
    mean.mean = true;
    mean.rid = static_cast<ops::ReduceId>(kiln::ir::ReduceKind::sum);
    mean.in[0] = 0;
    sub.vec = true;
    sub.op = ops::op_id<ops::Sub>;
    sub.in[0] = 0;
    sub.in[1] = 1;
    p.members = {mean, sub};
    p.outs = {{1, DType::f32}};
    const std::string src = cg::row_source(p);
    CAPTURE(src);
    CHECK(src.find("sto<Full, NT>(p1") != std::string::npos);
    CHECK(src.find("stream_fence()") != std::string::npos);
    void* const loaded = cg::kernel_for(src);
    REQUIRE(loaded != nullptr);
    const auto fn = reinterpret_cast<cg::RowsFn>(loaded);
    const std::int64_t rows = 4100, n = 1024;  // 16.02 MiB of output
    const Tensor x = kiln::randn({rows, n});
    const Tensor expect = kiln::eager(x - kiln::mean(x, {-1}, true));
    for (int shift : {0, 1, 3}) {  // floats the output starts past a 64-byte boundary
        CAPTURE(shift);
        const Tensor out = kiln::zeros({rows * n + 16});
        const std::int64_t oshape[1] = {rows}, ostr[2] = {n, n};
        void* ptrs[2] = {x.data_ptr(), out.data<float>() + shift};
        fn(ptrs, oshape, ostr, nullptr, n, 0, rows);
        CHECK(maxdiff(out.slice(0, shift, shift + rows * n).reshape({rows, n}), expect) <= 1e-6);
    }
    p.outs = {{1, DType::bf16}};  // stored through a conversion: never streamed
    CHECK(cg::row_source(p).find("sto<") == std::string::npos);
}

TEST_CASE("column reductions (a leading or middle axis, the innermost kept) match a float64 loop: fused, compiled on the interpreter and generated, 1-3 threads") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    const int saved_threads = kiln::num_threads();
    kiln::manual_seed(21);
    struct Shape3 {
        std::int64_t a, b, c;  // (a, b, c), reduced over b, or over a and b
    };
    // c: exactly the column minimum, a column block and a few more (two blocks), a ragged tile;
    // b long enough that 2-3 threads split it
    for (const Shape3 sh : {Shape3{1, 300, 16}, Shape3{1, 130, 8200}, Shape3{7, 33, 40}, Shape3{3, 2000, 17}}) {
        const Tensor x = kiln::randn({sh.a, sh.b, sh.c});
        const Tensor xi = kiln::eager(kiln::floor(x * 10.0)).to(DType::i32);
        // the float64 reference: out[i][k] over j (and over i too when both)
        auto ref = [&](bool both, auto f, auto comb, double init, bool mean) {
            const Tensor xd = x.to(DType::f64);
            const double* p = xd.data<double>();
            const std::int64_t rows = both ? 1 : sh.a;
            std::vector<double> r(static_cast<std::size_t>(rows * sh.c), init);
            for (std::int64_t i = 0; i < sh.a; ++i)
                for (std::int64_t j = 0; j < sh.b; ++j)
                    for (std::int64_t k = 0; k < sh.c; ++k) {
                        double& o = r[static_cast<std::size_t>((both ? 0 : i) * sh.c + k)];
                        o = comb(o, f(p[(i * sh.b + j) * sh.c + k]));
                    }
            if (mean)
                for (double& v : r) v /= static_cast<double>(both ? sh.a * sh.b : sh.b);
            Tensor t = kiln::empty({rows * sh.c}, DType::f64);
            std::copy(r.begin(), r.end(), t.data<double>());
            return t;
        };
        auto add = [](double a, double b) { return a + b; };
        auto mx = [](double a, double b) { return std::max(a, b); };
        auto mn = [](double a, double b) { return std::min(a, b); };
        auto mul = [](double a, double b) { return a * b; };
        for (const bool both : {false, true}) {
            const std::vector<std::int64_t> ax = both ? std::vector<std::int64_t>{0, 1} : std::vector<std::int64_t>{1};
            const std::vector<Tensor> want{ref(both, [](double v) { return std::exp(v * 0.5); }, add, 0.0, false),
                                           ref(both, [](double v) { return v * v; }, add, 0.0, true),
                                           ref(both, [](double v) { return v; }, mx, -INFINITY, false),
                                           ref(both, [](double v) { return 1.0 - v; }, mn, INFINITY, false),
                                           ref(both, [](double v) { return 1.0 + v * 0.001; }, mul, 1.0, false),
                                           ref(both, [](double v) { return v > 0 ? 1.0 : 0.0; }, add, 0.0, false)};
            auto fn = [ax](const Tensor& v, const Tensor& vi) {
                return std::vector<Tensor>{kiln::sum(kiln::exp(v * 0.5), ax), kiln::mean(v * v, ax), kiln::max(v, ax),
                                           kiln::min(1.0 - v, ax), kiln::prod(1.0 + v * 0.001, ax), kiln::sum(v > 0.0, ax),
                                           kiln::sum(vi * 2, ax)};
            };
            // the int32 sum's reference: exact
            const Tensor xid = xi.to(DType::f64);
            Tensor int_want = kiln::sum(xid, ax) * 2.0;
            for (int threads : {1, 2, 3}) {
                kiln::set_num_threads(threads);
                for (const int how : {0, 1, 2}) {  // fused (expression templates), compiled: interpreter, generated
                    CAPTURE(sh.a);
                    CAPTURE(sh.b);
                    CAPTURE(sh.c);
                    CAPTURE(both);
                    CAPTURE(threads);
                    CAPTURE(how);
                    const std::vector<Tensor> got = run_way(how, fn, x, xi);
                    REQUIRE(got.size() == 7);
                    for (std::size_t k = 0; k < want.size(); ++k) {
                        CAPTURE(k);
                        const Tensor g = got[k].reshape({-1}).to(DType::f64);
                        const double scale = k == 0 || k == 4 ? 1e-5 : 2e-5;  // relative to the values' size
                        CHECK(maxdiff(g, want[k]) <= scale * (1.0 + static_cast<double>(kiln::max(kiln::abs(want[k])).item<double>())));
                    }
                    CHECK(got[5].dtype() == DType::i64);
                    CHECK(maxdiff(got[6].reshape({-1}).to(DType::f64), int_want.reshape({-1})) == 0.0);
                }
            }
            kiln::set_num_threads(saved_threads);
        }
    }
    // sibling reductions joined into one reduce group (CUDA's limits, on the CPU): each output's
    // prologue its own generated kernel, though their layouts are alike
    kiln::Options opt;
    opt.limits.merge_reductions = true;
    const Tensor x = kiln::randn({300, 40});
    auto fn = [](const Tensor& v) {
        return std::vector<Tensor>{kiln::sum(kiln::exp(v * 0.5), {0}), kiln::sum(v * v, {0}), kiln::sum(v, {0})};
    };
    const std::vector<Tensor> want = fn(x);
    ModeScope mode(kiln::CpuCodegen::sync);
    const std::vector<Tensor> got = kiln::compile(fn, opt)(x);
    for (std::size_t k = 0; k < 3; ++k) CHECK(maxdiff(got[k], want[k]) <= 1e-4);
}

TEST_CASE("argmax / argmin pick the first extreme, or the first NaN, at every row length: fused, compiled on the interpreter and generated") {
    REQUIRE(kiln::cpu_codegen_unavailable() == "");
    kiln::manual_seed(23);
    // the reference: a scalar scan, the first extreme; NaN wins at its first index
    auto first = [](const Tensor& row, bool mx) {
        const Tensor d = row.to(DType::f64);
        const double* p = d.data<double>();
        std::int64_t at = 0;
        for (std::int64_t k = 0; k < d.numel(); ++k) {
            if (std::isnan(p[k])) return k;
            if (mx ? p[k] > p[at] : p[k] < p[at]) at = k;
        }
        return at;
    };
    for (const std::int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 70000}) {
        // rows: random, coarse (many ties), constant, a NaN late, a NaN early and another later,
        // NaN first, -inf everywhere, ints with ties
        Tensor x = kiln::eager(kiln::floor(kiln::randn({8, n}) * 3.0));
        x = Tensor(x);
        float* p = x.data<float>();
        for (std::int64_t k = 0; k < n; ++k) {
            p[0 * n + k] = static_cast<float>(std::sin(static_cast<double>(k) * 12.9898) * 43758.5453);
            p[2 * n + k] = 1.5f;
            p[6 * n + k] = -INFINITY;
        }
        p[3 * n + n - 1] = NAN;
        p[4 * n + n / 2] = NAN;
        p[4 * n + n - 1] = NAN;
        p[5 * n + 0] = NAN;
        const Tensor xi = kiln::eager(x * 0.0 + kiln::floor(kiln::randn({8, n}) * 2.0)).to(DType::i32);
        for (const int how : {0, 1, 2}) {
            CAPTURE(n);
            CAPTURE(how);
            auto fn = [](const Tensor& v, const Tensor& vi) {
                return std::vector<Tensor>{kiln::argmax(v, 1), kiln::argmin(v, 1), kiln::argmax(v * 2.0, 1), kiln::argmax(vi, 1),
                                           kiln::argmin(vi, 1)};
            };
            const std::vector<Tensor> got = run_way(how, fn, x, xi);
            for (std::int64_t r = 0; r < 8; ++r) {
                CAPTURE(r);
                const Tensor row = x.select(0, r), rowi = xi.select(0, r);
                CHECK(got[0].at<std::int64_t>({r}) == first(row, true));
                CHECK(got[1].at<std::int64_t>({r}) == first(row, false));
                CHECK(got[2].at<std::int64_t>({r}) == first(row, true));
                CHECK(got[3].at<std::int64_t>({r}) == first(rowi, true));
                CHECK(got[4].at<std::int64_t>({r}) == first(rowi, false));
            }
        }
    }
}
