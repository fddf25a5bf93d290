// NVRTC compile-only tests of every generated CUDA kernel family: elementwise (every table op x
// dtype x operand layout x vector width x index width), row (softmax, layer_norm, logsumexp,
// column reductions), reduce (every reduction and arg-reduction, split and whole) and combine.
// They need no GPU, so they run in CI.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <unistd.h>
#include <kiln/kiln.hpp>
#include <kiln/passes/pipeline.hpp>  // the passes, run directly
#include <kiln/backends/cuda/index_ops.hpp>
#include <kiln/backends/cuda/library_kernels.hpp>
#include <kiln/backends/cuda/kernel_cache.hpp>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace kiln;
using cuda::detail::Access;

#if defined(KILN_WITH_CUDA)

/// Traces fn over CPU tensors of the given dtypes and shapes into an optimized graph and its plan.
template <class F>
std::pair<ir::Graph, fuse::Plan> trace_plan(const std::vector<Tensor>& args, F&& fn, const fuse::Limits& lim = {}) {
    trace::Tracer tr(nullptr, true);
    trace::ActiveScope scope(&tr);
    std::vector<Tensor> in;
    for (const Tensor& a : args) in.push_back(tr.input(a));
    const std::vector<Tensor> outs = fn(in);
    ir::Graph g = tr.graph();
    for (const Tensor& o : outs) g.outputs.push_back(tr.node_of(o));
    ir::Graph opt = passes::run_pipeline(g, {});
    fuse::Plan plan = fuse::plan(opt, lim);
    return {std::move(opt), std::move(plan)};
}

/// Kernel sources for every kernel group of a plan, over several launch signatures each. An
/// elementwise group has four signatures (contiguous vec 4; mixed layouts, rank 3; 64-bit
/// indices, strided; a strided output); pick >= 0 keeps only signature pick % 4, so that a sweep
/// over ops x dtypes can rotate the signatures and cover every (signature, dtype) pair and every
/// (op, dtype) pair without compiling their full product.
std::vector<cache::KernelSource> sources_for(const ir::Graph& g, const fuse::Plan& plan, int pick = -1) {
    std::vector<cache::KernelSource> out;
    auto add = [&](const cuda::detail::KernelText& k) { out.push_back({k.source, k.name, {}}); };
    for (const fuse::Group& G : plan.groups) {
        const std::size_t nl = G.leaves.size();
        if (G.kind == fuse::Group::Kind::elementwise) {
            const int only = pick < 0 ? -1 : (pick % 4 == 3 && G.outputs.size() != 1) ? 0 : pick % 4;
            for (int variant : {0, 1, 3}) {
                if (only >= 0 && only != (variant == 3 ? 2 : variant)) continue;
                cuda::detail::EwSignature sig;
                sig.rank = variant == 0 ? 1 : 3;
                sig.vec = variant < 2 ? 4 : 1;
                sig.idx64 = variant == 3;
                sig.unroll = variant == 0 ? 4 : variant == 1 ? 2 : 1;
                for (std::size_t k = 0; k < nl; ++k) {
                    const Access pick[4][4] = {{Access::contig, Access::scalar, Access::contig, Access::scalar},
                                               {Access::inner, Access::strided, Access::contig, Access::scalar},
                                               {Access::strided, Access::contig, Access::scalar, Access::strided},
                                               {Access::strided, Access::strided, Access::contig, Access::scalar}};
                    sig.leaves.push_back(pick[variant][k % 4]);
                    sig.leaf_dtypes.push_back(g[G.leaves[k]].dtype);
                }
                add(cuda::detail::elementwise_kernel(g, G, sig));
                if (variant == 0 && pick < 0) {  // its multi form (a combo launch's kernel)
                    REQUIRE(sig.combinable());
                    sig.multi = true;
                    add(cuda::detail::elementwise_kernel(g, G, sig));
                }
            }
            if (G.outputs.size() == 1 && (only < 0 || only == 3)) {  // written into a strided view
                cuda::detail::EwSignature sig;
                sig.rank = 2;
                sig.out_strided = true;
                for (std::size_t k = 0; k < nl; ++k) {
                    sig.leaves.push_back(k % 2 ? Access::strided : Access::contig);
                    sig.leaf_dtypes.push_back(g[G.leaves[k]].dtype);
                }
                add(cuda::detail::elementwise_kernel(g, G, sig));
            }
        } else if (G.kind == fuse::Group::Kind::row) {
            for (int variant = 0; variant < 3; ++variant) {
                cuda::detail::RowSignature sig;
                sig.outer_rank = variant == 2 ? 2 : 1;
                sig.inner_rank = variant == 2 ? 2 : 1;
                sig.vec = variant == 0 ? 4 : 1;
                sig.threads = variant == 2 ? 32 : 256;
                sig.items = variant == 0 ? 4 : 3;
                sig.lanes = variant == 1 ? 4 : 0;  // short rows: 4 lanes per row, 64 rows per block
                sig.idx64 = variant == 1;
                for (std::size_t k = 0; k < nl + G.outputs.size(); ++k) {
                    const int node = k < nl ? G.leaves[k] : G.outputs[k - nl];
                    const bool per_row = !cuda::detail::row_varies(g, node, G.space, G.mask);
                    sig.inner_access.push_back(per_row ? Access::scalar : variant == 2 ? Access::strided : Access::contig);
                    sig.outer_zero.push_back(0);
                    sig.dtypes.push_back(g[node].dtype);
                }
                add(cuda::detail::row_kernel(g, G, G.outputs, sig));
            }
        } else if (G.kind == fuse::Group::Kind::reduce) {
            for (int variant = 0; variant < 5; ++variant) {
                const bool is_reduce = g[G.outputs[0]].kind == ir::Kind::reduce;
                if (variant >= 3 && !is_reduce) continue;  // the column layout (variants 3, 4) is for reductions only
                cuda::detail::ReduceSignature sig;
                sig.outer_rank = variant == 2 ? 0 : variant == 3 ? 2 : 1;
                sig.inner_rank = variant == 2 ? 2 : 1;
                sig.idx64 = variant == 1 || variant == 4;
                sig.lanes = variant == 1 ? 8 : 0;  // short rows: 8 lanes per row, 32 rows per block
                sig.partial = (variant == 2 || variant == 3) && is_reduce;
                sig.columns = variant >= 3;
                for (std::size_t k = 0; k < nl; ++k) {
                    sig.inner_access.push_back(variant == 0 ? Access::contig : Access::strided);
                    sig.dtypes.push_back(g[G.leaves[k]].dtype);
                }
                add(cuda::detail::reduce_kernel(g, G, sig));
                if (sig.partial) {  // the same, finished by its last block (one launch)
                    cuda::detail::ReduceSignature one = sig;
                    one.finish = true;
                    add(cuda::detail::reduce_kernel(g, G, one));
                }
                for (int o : G.outputs) {  // each output's partials combined by a second launch
                    const ir::Node& r = g[o];
                    if (sig.partial)
                        add(cuda::detail::combine_kernel(r.rkind, compute_dtype(r.dtype) == DType::boolean ? DType::f32 : compute_dtype(r.dtype),
                                                         r.dtype, r.correction));
                }
            }
        }
    }
    return out;
}

/// A fresh cache directory for the test's compiles, set as KILN_CACHE_DIR for its lifetime.
struct TempCache {
    std::filesystem::path dir;
    TempCache() {
        dir = std::filesystem::temp_directory_path() / ("kiln-codegen-test-" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir);
        ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    }
    ~TempCache() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        ::unsetenv("KILN_CACHE_DIR");
    }
};

/// Compiles every source for the given architectures, as the runtime would (with the PDL entry on
/// sm_90 and later); returns how many compiled. Sources made by
/// finish_kernel (prelude() + one kernel's text) are compiled in batches: the prelude once, then
/// each kernel's text in a namespace of its own (its extern "C" kernel keeps its name), so NVRTC's
/// per-program cost is paid once per batch, not once per kernel. A batch that fails is compiled
/// kernel by kernel, so the failure names its kernel; the first source is always compiled alone,
/// as the runtime compiles it. The batches compile in parallel, like the runtime's.
/// To cubins (ptxas too, as the runtime) where a GPU is present or KILN_TEST_CUDA_SASS=1
/// (tests/gpu.sh sets it); elsewhere (CI) to PTX: NVRTC's front end and optimizer, where what
/// kiln's code generation gets wrong shows, without ptxas (this test in CI: 55-58 s against 164 s).
/// The architectures a kernel family compiles for where a test case names none: sm_90 (Hopper, what
/// the GPU machine runs), and sm_80 as well with KILN_TEST_CUDA_ARCHS=80,90 (tests/gpu.sh sets it).
/// CI compiles each family once: the second architecture doubled this test's time (about 250 s of
/// CI's 2-vCPU machine) and catches what the GPU machine's run of the suite catches.
std::vector<int> test_archs() {
    std::vector<int> archs;
    const char* env = std::getenv("KILN_TEST_CUDA_ARCHS");
    for (const char* p = env ? env : ""; *p;) {
        char* end = nullptr;
        const long a = std::strtol(p, &end, 10);
        if (end == p) break;
        archs.push_back(static_cast<int>(a));
        p = *end == ',' ? end + 1 : end;
    }
    if (archs.empty()) archs = {90};
    return archs;
}

bool test_sass() {
    const char* env = std::getenv("KILN_TEST_CUDA_SASS");
    return env && *env ? std::string(env) != "0" : cuda::is_available();
}

/// The sources' cubins for sm_<arch> through the kernel cache (`sass`: test_sass()), or their PTX.
std::vector<std::string> compile_sources(const std::vector<cache::KernelSource>& src, int arch, bool sass) {
    if (sass) return cache::cubins_for(src, arch);
    std::vector<std::string> out(src.size());
    cache::detail::parallel_each(src.size(), [&](std::size_t i) { out[i] = cuda::compile_to_ptx(src[i].source, src[i].name, arch, src[i].flags); });
    return out;
}

std::size_t compile_all(const std::vector<cache::KernelSource>& src, std::vector<int> archs = test_archs()) {
    const std::string& pre = cuda::detail::prelude();
    const bool sass = test_sass();
    MESSAGE("compiling " << src.size() << " sources to " << std::string(sass ? "cubins" : "PTX (KILN_TEST_CUDA_SASS=1: cubins)"));
    std::size_t covered = 0;
    for (int arch : archs) {
        // the text the runtime compiles for the architecture (kernel_cache.hpp's device_kernel_text):
        // on sm_90 and later each kernel begins with its PDL entry
        std::vector<cache::KernelSource> text = src;
        if (arch >= 90)
            for (cache::KernelSource& s : text) s.source = cuda::detail::with_pdl_entry(s.source, 135168);
        std::vector<cache::KernelSource> units;
        std::vector<std::vector<std::size_t>> members;  // per unit, the sources it holds
        std::set<std::string> seen;
        std::size_t duplicates = 0;
        constexpr std::size_t batch = 48;
        for (std::size_t i = 0; i < text.size(); ++i) {
            const bool alone = i == 0 || text[i].source.compare(0, pre.size(), pre) != 0 || !text[i].flags.empty();
            if (alone) {
                units.push_back(text[i]);
                members.push_back({i});
                continue;
            }
            if (!seen.insert(text[i].name).second) {  // the same kernel twice (same text, same name)
                ++duplicates;
                continue;
            }
            if (members.empty() || members.back().size() >= batch || units.back().name.rfind("batch_", 0) != 0) {
                units.push_back({pre, "batch_" + std::to_string(units.size()), {}});
                members.emplace_back();
            }
            units.back().source += "\nnamespace k" + std::to_string(i) + " {\n" + text[i].source.substr(pre.size()) + "\n}\n";
            members.back().push_back(i);
        }
        std::vector<std::string> out;
        try {
            out = compile_sources(units, arch, sass);
        } catch (const CompileError&) {  // find the kernel: each source alone
            out = compile_sources(text, arch, sass);
        }
        REQUIRE(out.size() == units.size());
        const std::string target = ".target sm_" + std::to_string(arch);
        for (const auto& c : out) CHECK((sass ? c.rfind("\x7f" "ELF", 0) == 0 : c.find(target) != std::string::npos));
        covered = duplicates;  // every source compiled, alone or in a batch, or a duplicate of one that was
        for (const auto& m : members) covered += m.size();
    }
    return covered;
}

#endif

}  // namespace

#if defined(KILN_WITH_CUDA)

TEST_CASE("every table op in every dtype it accepts compiles as an elementwise kernel") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    int graphs = 0;
    int op_index = 0;
    ops::for_each_op([&](auto tag) {
        ++op_index;
        using Op = typename decltype(tag)::type;
        for (DType dt : all_dtypes) {
            if constexpr (Op::rule == ops::DTypeRule::cast) {
                for (DType to : all_dtypes) {
                    auto [g, p] = trace_plan({zeros({4, 8}, dt)}, [&](auto& in) {
                        return std::vector<Tensor>{Tensor(expr::make<Op>(to, in[0]))};
                    });
                    auto s = sources_for(g, p, op_index + static_cast<int>(dt) + static_cast<int>(to));
                    src.insert(src.end(), s.begin(), s.end());
                    ++graphs;
                }
            } else if constexpr (Op::rule == ops::DTypeRule::where) {
                auto [g, p] = trace_plan({zeros({4, 8}, DType::boolean), zeros({4, 8}, dt), zeros({8}, dt)}, [&](auto& in) {
                    return std::vector<Tensor>{Tensor(expr::make<Op>(DType::f32, in[0], in[1], in[2]))};
                });
                auto s = sources_for(g, p, op_index + static_cast<int>(dt));
                src.insert(src.end(), s.begin(), s.end());
                ++graphs;
            } else {
                if (!(Op::allowed_categories & (1u << dtype_category(dt)))) continue;
                auto [g, p] = trace_plan({zeros({4, 8}, dt), zeros({8}, dt)}, [&](auto& in) {
                    if constexpr (Op::arity == 1) return std::vector<Tensor>{Tensor(expr::make<Op>(DType::f32, in[0]))};
                    else return std::vector<Tensor>{Tensor(expr::make<Op>(DType::f32, in[0], in[1])),
                                                    Tensor(expr::make<Op>(DType::f32, in[0], 3))};
                });
                auto s = sources_for(g, p, op_index + static_cast<int>(dt));
                src.insert(src.end(), s.begin(), s.end());
                ++graphs;
            }
        }
    });
    CHECK(graphs > 200);
    CHECK(compile_all(src, {90}) == src.size());
}

TEST_CASE("row kernels (softmax, log_softmax, layer_norm, logsumexp, column sums) compile in every float dtype") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    fuse::Limits column_rows;  // the column sums as row kernels too (both backends' limits make them reduce kernels)
    column_rows.column_rows = true;
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
        auto [g, p] = trace_plan({zeros({16, 64}, dt), zeros({64}, dt), zeros({64}, dt)}, [&](auto& in) {
            return std::vector<Tensor>{softmax(in[0], -1), log_softmax(in[0], -1), layer_norm(in[0], 1, in[1], in[2]),
                                       logsumexp(in[0], 1), sum(in[0] * in[0], 0), mean(in[0], 0, true)};
        }, column_rows);
        int rows = 0;
        for (const auto& G : p.groups) rows += G.kind == fuse::Group::Kind::row ? 1 : 0;
        CHECK(rows >= 3);
        auto s = sources_for(g, p);
        src.insert(src.end(), s.begin(), s.end());
    }
    CHECK(compile_all(src) == src.size());
}

TEST_CASE("kernels with several outputs, reductions to a scalar and work after them compile in every float dtype") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    int multi = 0;
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
        auto [g, p] = trace_plan({zeros({16, 8}, dt), zeros({8}, dt)}, [&](auto& in) {
            const Tensor d = Tensor(kiln::log(in[0] * in[0] + 1) / (in[1] + 2));  // shared by both outputs
            std::vector<Tensor> outs{Tensor(d * 2 - in[1]), Tensor(kiln::exp(-d) + in[0]), kiln::mean(in[0])};
            outs.push_back(Tensor(kiln::tan(kiln::min(in[0]))));
            outs.push_back(Tensor(kiln::max(in[0], 0) * 2));
            outs.push_back(Tensor(kiln::sum(in[0], kiln::Axes{}, true) - in[0].slice(0, 0, 1)));
            return outs;
        });
        for (const auto& G : p.groups) multi += G.outputs.size() > 1 ? 1 : 0;
        auto s = sources_for(g, p);
        src.insert(src.end(), s.begin(), s.end());
    }
    CHECK(multi == 4);
    CHECK(compile_all(src) == src.size());
}

TEST_CASE("reduce kernels: every reduction and arg-reduction over every dtype, whole and split") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    fuse::Limits lim;
    lim.max_row = 0;  // no row groups: every reduction is a reduce group
    for (DType dt : all_dtypes) {
        trace::Tracer tr(nullptr, true);
        trace::ActiveScope scope(&tr);
        const Tensor x = tr.input(zeros({8, 32}, dt));
        std::vector<Tensor> outs{sum(x, 1), prod(x, {0, 1}), max(x, 0), min(x, 1), argmax(x, 1), argmin(x)};
        if (is_floating(dt)) outs.push_back(mean(x * 2, 1));
        ir::Graph g = tr.graph();
        for (const Tensor& o : outs) g.outputs.push_back(tr.node_of(o));
        ir::Graph opt = passes::run_pipeline(g, {});
        const fuse::Plan plan = fuse::plan(opt, lim);
        int reduces = 0;
        for (const auto& G : plan.groups) reduces += G.kind == fuse::Group::Kind::reduce ? 1 : 0;
        CHECK(reduces >= 6);
        auto s = sources_for(opt, plan);
        src.insert(src.end(), s.begin(), s.end());
    }
    CHECK(compile_all(src) == src.size());
}

TEST_CASE("reduce kernels with several outputs (CUDA's limits: sibling reductions joined, producers recomputed) compile in every float dtype") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    fuse::Limits lim;
    lim.column_rows = false;
    lim.merge_reductions = lim.recompute = true;
    int multi = 0;
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
        trace::Tracer tr(nullptr, true);
        trace::ActiveScope scope(&tr);
        // BatchNorm's backward over channels-last values, and sums of other kinds over the same rows
        const Tensor dy = tr.input(zeros({4, 6, 6, 8}, dt)), y = tr.input(zeros({4, 6, 6, 8}, dt)), x = tr.input(zeros({4, 6, 6, 8}, dt));
        const Tensor mu = tr.input(zeros({8}, dt)), var = tr.input(zeros({8}, dt));
        const Tensor gr = Tensor(kiln::where(y > 0, dy, 0.0)), xhat = Tensor((x - mu) * kiln::rsqrt(var + 1e-5));
        std::vector<Tensor> outs{sum(gr, {0, 1, 2}), sum(Tensor(gr * xhat), {0, 1, 2}), Tensor(gr - xhat * 0.5)};
        outs.push_back(max(Tensor(kiln::abs(x)), {0, 1, 2}));
        outs.push_back(kiln::var(x, {0, 1, 2}));  // a mean with a correction, after the mean it reads
        ir::Graph g = tr.graph();
        for (const Tensor& o : outs) g.outputs.push_back(tr.node_of(o));
        ir::Graph opt = passes::run_pipeline(g, {});
        const fuse::Plan plan = fuse::plan(opt, lim);
        for (const auto& G : plan.groups) multi += G.kind == fuse::Group::Kind::reduce && G.outputs.size() > 1 ? 1 : 0;
        auto s = sources_for(opt, plan);
        src.insert(src.end(), s.begin(), s.end());
    }
    CHECK(multi >= 4);
    CHECK(compile_all(src) == src.size());
}

TEST_CASE("kernel text comes from the op table: a changed op changes the source and its name") {
    auto [g1, p1] = trace_plan({zeros({4}, DType::f32)}, [](auto& in) { return std::vector<Tensor>{Tensor(kiln::exp(in[0]))}; });
    auto [g2, p2] = trace_plan({zeros({4}, DType::f32)}, [](auto& in) { return std::vector<Tensor>{Tensor(kiln::log(in[0]))}; });
    const auto s1 = sources_for(g1, p1), s2 = sources_for(g2, p2);
    REQUIRE(!s1.empty());
    CHECK(s1[0].source.find("exp(") != std::string::npos);
    CHECK(s2[0].source.find("log(") != std::string::npos);
    CHECK(s1[0].name != s2[0].name);
    // the same graph and signature give the same text (so caches hit)
    CHECK(sources_for(g1, p1)[0].source == s1[0].source);
}

TEST_CASE("groups computing the same thing at different places in a graph give one kernel text") {
    // an optimizer's update per parameter: one text per signature, compiled once (variables are
    // named by their place in the group, not by node id)
    auto [g, p] = trace_plan({zeros({32}), zeros({32}), zeros({16}), zeros({16})}, [](auto& in) {
        return std::vector<Tensor>{Tensor(kiln::exp(in[0]) * 2 + in[1]), Tensor(kiln::exp(in[2]) * 2 + in[3])};
    });
    int ew = 0;
    for (const auto& G : p.groups) ew += G.kind == fuse::Group::Kind::elementwise ? 1 : 0;
    REQUIRE(ew == 2);
    const auto s = sources_for(g, p);
    REQUIRE(s.size() % 2 == 0);
    for (std::size_t i = 0; i < s.size() / 2; ++i) {
        CAPTURE(i);
        CHECK(s[i].source == s[i + s.size() / 2].source);
    }
    // a different computation still gives another text
    auto [g2, p2] = trace_plan({zeros({32}), zeros({32})}, [](auto& in) { return std::vector<Tensor>{Tensor(kiln::exp(in[0]) * 3 + in[1])}; });
    CHECK(sources_for(g2, p2)[0].source != s[0].source);
}

TEST_CASE("a broken kernel surfaces as CompileError with the NVRTC log and the saved source") {
    TempCache tc;
    const std::string broken = "extern \"C\" __global__ void k() { undefined_thing(); }";
    const std::string m = kiln_test::message_of<CompileError>([&] { (void)cache::cubin_for(broken, "kiln_broken", 90); });
    CHECK(m.find("undefined_thing") != std::string::npos);
    CHECK(m.find(".cu") != std::string::npos);
    // to PTX: the same error, naming compile_to_ptx and the virtual architecture
    const std::string mp = kiln_test::message_of<CompileError>([&] { (void)cuda::compile_to_ptx(broken, "kiln_broken", 90); });
    CHECK(mp.find("kiln::cuda::compile_to_ptx: kernel 'kiln_broken' failed to compile for compute_90") != std::string::npos);
    CHECK(mp.find("undefined_thing") != std::string::npos);
    const std::string ptx = cuda::compile_to_ptx("extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.f; }", "kiln_ok", 90);
    CHECK(ptx.find(".target sm_90") != std::string::npos);
    CHECK(ptx.find(".entry k(") != std::string::npos);
    CHECK(ptx.back() != '\0');  // no terminator kept
}

TEST_CASE("gather / scatter / scatter_add kernels compile for every mode, dtype, index dtype, rank and dim") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    using cuda::detail::IndexMode;
    for (IndexMode m : {IndexMode::gather, IndexMode::scatter, IndexMode::scatter_value, IndexMode::scatter_add})
        for (DType dt : all_dtypes) {
            if (m == IndexMode::scatter_add && !cuda::detail::has_atomic_add(dt)) continue;  // those run on the host
            for (DType it : {DType::i32, DType::i64})
                for (auto [rank, dim] : {std::pair{1, 0}, std::pair{3, 0}, std::pair{3, 2}}) {
                    const cuda::detail::KernelText k = cuda::detail::index_kernel({m, dt, it, rank, dim});
                    src.push_back({k.source, k.name, {}});
                }
        }
    CHECK(src.size() == 150);
    CHECK(compile_all(src, {90}) == src.size());
}

TEST_CASE("every variant of the library kernel registry (im2col, max_pool and its gradient, gather_rows, scale, attention, small GEMM) compiles") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    std::set<std::string> names;
    for (const cuda::detail::KernelText& k : cuda::detail::library_kernel_sources()) {
        src.push_back({k.source, k.name, {}});
        names.insert(k.name);
    }
    // im2col 8, gather_rows 4, max_pool 8, col2im 4, max_pool_argmax 4, max_pool_backward 4, scale 4, dropout_mask,
    // rng_advance, attention 21, small_gemm 20, act_pass 4, and argmax and backward with a baked geometry 8
    CHECK(src.size() == 91);
    CHECK(names.size() == src.size());  // each variant its own kernel name (the cache keys on the text, logs on the name)
    CHECK(compile_all(src) == src.size());
}

TEST_CASE("PDL entries (sm_90): library and generated kernels begin with griddepcontrol.wait and compile so") {
    TempCache tc;
    std::vector<cache::KernelSource> src;
    for (const cuda::detail::KernelText& k : cuda::detail::library_kernel_sources())
        src.push_back({cuda::detail::with_pdl_entry(k.source, 135168), k.name, {}});
    auto [g, p] = trace_plan({zeros({16, 64}), zeros({64})}, [&](auto& in) {
        return std::vector<kiln::Tensor>{kiln::softmax(in[0], -1), kiln::Tensor(kiln::exp(in[0]) + in[1]), kiln::sum(in[0], 0)};
    });
    for (cache::KernelSource s : sources_for(g, p, 7)) {
        s.source = cuda::detail::with_pdl_entry(s.source, 135168);
        src.push_back(s);
    }
    for (const cache::KernelSource& s : src) {
        CAPTURE(s.name);
        CHECK(s.source.find("griddepcontrol.wait") != std::string::npos);
    }
    // (compile_all gives sm_90 this text itself: the library kernels compile so in the registry's
    // test; the generated ones here)
    src.erase(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(cuda::detail::library_kernel_sources().size()));
    CHECK(compile_all(src, {90}) == src.size());
    // a kernel that places its own wait (the small GEMM's weight prefetch comes first) is left alone
    const cuda::detail::SmallGemmSignature sg{};
    const std::string own = cuda::detail::small_gemm_source(sg, cuda::detail::small_gemm_name(sg));
    CHECK(cuda::detail::with_pdl_entry(own, 1) == own);
}

#else

TEST_CASE("without the CUDA toolkit there is no NVRTC to test") { CHECK(!cuda::nvrtc_available()); }

#endif
