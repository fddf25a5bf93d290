// max_autotune for GEMMs (declared in blas.hpp, which includes this file at its end where the
// definitions are wanted): time cuBLASLt's candidate algorithms for a problem, keep the fastest,
// remember it on disk. Compiled once in separate mode.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/cache/files.hpp"
#include "kiln/debug/logs.hpp"

namespace kiln::cuda::detail {

KILN_DECL std::string gemm_tune_key_text(const GemmKey& key, int device) {
    const GemmProblem& p = key.problem;
    const DeviceProperties& props = properties(device);
    std::ostringstream s;
    s << "kiln gemm autotune v1; " << props.name << " sm_" << props.arch() << "; cuBLASLt " << cublasLtGetVersion() << "; "
      << describe(p) << "; m " << p.m << " n " << p.n << " k " << p.k << " batch " << p.batch << "; A " << p.a.transposed << "/"
      << p.a.ld << "/" << p.a.batch_stride << " B " << p.b.transposed << "/" << p.b.ld << "/" << p.b.batch_stride << " C "
      << p.c.ld << "/" << p.c.batch_stride << "; align " << key.align_a << " " << key.align_b << " " << key.align_c << " "
      << key.align_bias << "; for " << (key.tuned == kiln::detail::Autotune::launches ? "launches" : "graphs");
    return s.str();
}

/// "id 21 tile 18 split-k 4 stages 9": what an algorithm is, for KILN_LOGS=autotune.
inline std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
    return "id " + std::to_string(algo_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
           std::to_string(algo_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " split-k " +
           std::to_string(algo_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " stages " +
           std::to_string(algo_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
}

KILN_DECL std::string tuned_gemm_file(const std::string& key_text) {
    return (std::filesystem::path(cache::cache_dir()) / "autotune" / ("gemm-" + cache::to_hex(cache::hash64(key_text)) + ".txt")).string();
}

KILN_DECL std::optional<cublasLtMatmulAlgo_t> read_tuned_algo(const std::string& file, const std::string& text) {
    std::ifstream in(file);
    if (!in) return std::nullopt;
    std::string line;
    if (!std::getline(in, line) || line != text) return std::nullopt;
    if (!std::getline(in, line)) return std::nullopt;
    cublasLtMatmulAlgo_t algo{};
    std::istringstream words(line);
    for (auto& w : algo.data) {
        std::string hex;
        if (!(words >> hex) || hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
        w = std::stoull(hex, nullptr, 16);
    }
    return algo;
}

KILN_DECL std::unique_ptr<GemmPlan> tune_gemm_plan(cublasLtHandle_t handle, const GemmKey& key, const void* a, const void* b, void* c,
                                                   const void* bias, int device, CUstream stream, GemmWorkspace& workspace) {
    std::unique_ptr<GemmPlan> plan = gemm_layouts(key);  // a disk entry needs no heuristic query
    const GemmProblem& p = key.problem;
    const std::string text = gemm_tune_key_text(key, device);
    const std::string file = tuned_gemm_file(text);
    cublasLtMatmulDescOpaque_t desc;
    init_matmul_desc(desc, p, plan->op_a, plan->op_b, bias);
    if (const auto cached = read_tuned_algo(file, text)) {
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(handle, &desc, &plan->lt_a, &plan->lt_b, &plan->lt_d, &plan->lt_d, &*cached, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= gemm_workspace_bytes()) {
            plan->algo = *cached;
            if (debug::log_on("autotune"))
                debug::log("autotune", "gemm " + describe(p) + ": " + describe_algo(plan->algo) + " (from " + file + ")");
            return plan;
        }
    }
    // the heuristic's ranking, its first choice first (what the untuned plan uses)
    const std::vector<cublasLtMatmulHeuristicResult_t> cands = gemm_heuristic(handle, key, *plan, bias, 16, gemm_workspace_bytes());
    auto run = [&](const cublasLtMatmulAlgo_t& algo) { return run_gemm(handle, desc, p, *plan, algo, a, b, c, workspace.ptr, stream); };
    // Each timed run starts with L2 holding none of its operands (a scratch buffer twice the L2
    // size is written first): timed back to back, a candidate would read its weights from L2, as
    // it never does in a model whose weights do not fit there (measured on the H100: choices
    // timed with a warm L2 made bert-base at batch 1 16% slower than the heuristic's).
    const std::size_t flush_bytes = 2 * static_cast<std::size_t>(std::max(properties(device).l2_cache_bytes, 1 << 20));
    CUdeviceptr flush = 0;  // stays 0 where the memory is not there: timed without flushing (logged)
    if (driver().mem_alloc(&flush, flush_bytes) != cuda_success) {
        flush = 0;
        debug::log("autotune", "no memory for the L2 flush buffer: candidates timed with a warm L2");
    }
    struct FlushGuard {
        CUdeviceptr p;
        ~FlushGuard() {
            if (p) (void)driver_state().mem_free(p);
        }
    } flush_guard{flush};
    Event e0(device), e1(device);
    // per candidate: the median of 15 runs each from a cold L2 (flushed first), and of 15 runs back
    // to back (a warm L2, as for a small model replayed in a loop); -1 where it failed to run
    std::vector<double> cold(cands.size(), -1), warm(cands.size(), -1);
    const bool launches = key.tuned == kiln::detail::Autotune::launches;
    {
        std::lock_guard<std::mutex> launch(workspace.launch);
        auto median_of_runs = [&](const cublasLtMatmulAlgo_t& algo, bool flushed) {
            std::vector<double> runs;
            for (int r = 0; r < 15; ++r) {
                if (flushed && flush)
                    check(driver().memset_d8_async(flush, static_cast<unsigned char>(r), flush_bytes, stream), "cuMemsetD8Async");
                e0.record(stream);
                const auto h0 = std::chrono::steady_clock::now();
                (void)run(algo);
                const double host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
                e1.record(stream);
                const double gpu = 1e3 * static_cast<double>(e1.elapsed_ms(e0));
                runs.push_back(launches ? std::max(gpu, host) : gpu);
            }
            std::nth_element(runs.begin(), runs.begin() + 7, runs.end());
            return runs[7];
        };
        for (std::size_t i = 0; i < cands.size(); ++i) {
            if (cands[i].workspaceSize > gemm_workspace_bytes() || run(cands[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
            cold[i] = median_of_runs(cands[i].algo, true);
            warm[i] = median_of_runs(cands[i].algo, false);
        }
    }
    // the heuristic's first, unless another is no slower with a cold or a warm L2 and at least 3%
    // faster in one of them (timing noise never trades it); among those, the least cold + warm time
    std::size_t pick = 0;
    if (cold[0] > 0) {
        for (std::size_t i = 1; i < cands.size(); ++i) {
            if (cold[i] < 0 || cold[i] > cold[0] || warm[i] > warm[0]) continue;
            if (cold[i] > 0.97 * cold[0] && warm[i] > 0.97 * warm[0]) continue;
            if (pick == 0 || cold[i] + warm[i] < cold[pick] + warm[pick]) pick = i;
        }
    } else {
        for (std::size_t i = 1; i < cands.size(); ++i)
            if (cold[i] > 0 && (cold[pick] < 0 || cold[i] + warm[i] < cold[pick] + warm[pick])) pick = i;
    }
    if (cold[pick] < 0) throw DeviceError("kiln::cuda::gemm: max_autotune: no candidate algorithm ran for " + describe(p));
    plan->algo = cands[pick].algo;
    if (debug::log_on("autotune")) {
        std::string line = "gemm " + describe(p) + ": " + std::to_string(cands.size()) + " candidates";
        for (std::size_t i = 0; i < cands.size(); ++i) {
            char t[64];
            std::snprintf(t, sizeof t, "%.2f us cold, %.2f us warm", cold[i], warm[i]);
            line += "\n  " + std::string(i == pick ? "* " : "  ") + "#" + std::to_string(i) + " " + describe_algo(cands[i].algo) + ": " +
                    (cold[i] < 0 ? std::string("did not run") : std::string(t));
        }
        debug::log("autotune", line);
    }
    std::ostringstream entry;
    entry << text << "\n";
    for (std::size_t w = 0; w < 8; ++w) entry << (w ? " " : "") << cache::to_hex(plan->algo.data[w]);
    entry << "\n" << cold[pick] << " us cold, " << warm[pick] << " us warm (heuristic's first: " << cold[0] << " / " << warm[0] << " us)\n";
    std::string why;
    if (!cache::detail::write_file_atomically(file, entry.str(), why) && debug::log_on("autotune"))
        debug::log("autotune", "not remembered: " + why);
    return plan;
}

}  // namespace kiln::cuda::detail
