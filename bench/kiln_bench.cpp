// kiln_bench: the workloads of the README, each timed per method (eager, fused, peers) and thread
// count, reported as medians, GB/s, % of the measured copy bandwidth and speedup over kiln eager.
//
//   kiln_bench [--filter SUBSTRING[,SUBSTRING...]] [--json FILE] [--threads N] [--min-time SECONDS] [--throughput-time SECONDS]
//              [--no-cpu] [--no-gpu]
//
// With a CUDA device, GPU rows follow the CPU rows, each timed three ways: latency (CUDA events
// around each synchronized call), throughput (calls back to back, one synchronize, >= 100 ms a
// run, median of 5) and the host's time inside a call; plus the cold compile into a fresh cache
// dir and the warm disk-cache start measured by a child process run with --first-call NAME.
//
// Every row is checked against eager before it is timed. Later issues add rows through
// `Bench::row`; keep one lambda per (workload, method). CPU rows return a fresh output per call,
// the hand-written loops included (`y = f(x)`: the previous output is freed after the call, as
// with kiln::compile and torch), so every method has the same memory footprint: a hand loop
// writing into one reused buffer had 2/3 of it (64 instead of 96 MiB on layernorm, against a 32 MiB
// L3), and 20% less time for it on Zen 4 (2026-12-07).
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/export.hpp>
#if KILN_BENCH_ONNX
#include <kiln/export/onnx.hpp>
#include <kiln/export/onnx_import.hpp>
#endif
#include <kiln/interop/eigen.hpp>
#include <kiln/nn/bert.hpp>
#include <kiln/nn/tokenizer.hpp>
#include <kiln/backends/cuda/small_gemm.hpp>

#include "hand_cpu.hpp"
#include "train_workloads.hpp"

#include <Eigen/Core>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using kiln::Tensor;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
    std::string filter;
    std::string json;
    int max_threads = kiln::num_threads();
    double min_time = 0.4;  // seconds of timed repeats per row (at least min_repeats)
    double throughput_time = 0.1;  // seconds of back-to-back calls per throughput run of a GPU row
    int min_repeats = 7;
    std::string first_call;  ///< child mode: time the first call of this compiled GPU workload
    bool first_call_autotune = false;  ///< child mode: compiled with Mode::max_autotune
    bool gpu = true, cpu = true;
};

struct Row {
    std::string workload, method, device = "cpu";
    int threads = 1;
    double median_us = 0, min_us = 0, first_call_us = 0, bytes = 0;
    /// GPU rows: median_us is the latency (events around each synchronized call); throughput_us
    /// the time per call of back-to-back calls with one synchronize (median of 5 runs of at least
    /// 100 ms); host_us the host's wall time inside one call (median over the latency repeats).
    double throughput_us = 0, host_us = 0;
    /// GPU training rows: the most device memory in use while the row was timed (MiB): in the
    /// allocator's blocks (whole size classes), and as the tensors' requested bytes (torch's
    /// requested_bytes; its max_memory_allocated counts its own blocks).
    double peak_mib = 0, peak_requested_mib = 0;
    int repeats = 0;
    /// GB/s by throughput where measured (GPU rows), else by the median.
    double gbps() const { return bytes / ((throughput_us > 0 ? throughput_us : median_us) * 1e3); }
};

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

/// The CPU workloads the summary reports on (a line only where their rows ran).
const char* const cpu_workloads[] = {"chain16M", "chain1M", "bias_gelu", "colsum", "softmax", "layernorm", "numpy_fn", "blackscholes", "sincos_scalar"};

std::string fixed2(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", v);
    return b;
}

class Bench {
public:
    explicit Bench(Options o) : opt_(std::move(o)) {}
    const Options& options() const { return opt_; }

    /// The filter is one substring or several, comma-separated: a row is wanted when its name has one.
    bool wanted(const std::string& name) const {
        if (opt_.filter.empty()) return true;
        std::size_t at = 0;
        while (at <= opt_.filter.size()) {
            const std::size_t comma = std::min(opt_.filter.find(',', at), opt_.filter.size());
            const std::string part = opt_.filter.substr(at, comma - at);
            if (!part.empty() && name.find(part) != std::string::npos) return true;
            at = comma + 1;
        }
        return false;
    }
    std::vector<int> thread_counts() const {
        std::vector<int> t{1};
        if (opt_.max_threads > 1) t.push_back(opt_.max_threads);
        return t;
    }

    /// Times fn (one call = one run of the workload) after a first call and a warm-up; `bytes` is
    /// the least memory traffic the workload needs (inputs read once, outputs written once).
    void row(const std::string& workload, const std::string& method, int threads, double bytes,
             const std::function<void()>& fn, int min_repeats = -1) {
        if (min_repeats < 0) min_repeats = opt_.min_repeats;
        kiln::set_num_threads(threads);
        auto t0 = Clock::now();
        fn();
        const double first = seconds_since(t0);
        kiln::cpu_codegen_wait();  // compiled rows: the generated C++ the first call queued (not timed)
        fn();  // warm-up: caches, page faults, pool spin-up
        if (interleaving_) {  // timed with the scope's other rows (Interleaved)
            queued_.push_back({workload, method, threads, bytes, fn, min_repeats, first});
            return;
        }
        std::vector<double> times;
        const auto start = Clock::now();
        while (static_cast<int>(times.size()) < min_repeats || (seconds_since(start) < opt_.min_time && min_repeats > 1)) {
            t0 = Clock::now();
            fn();
            times.push_back(seconds_since(t0));
            if (times.size() >= 2000) break;
        }
        record(workload, method, "cpu", threads, bytes, std::move(times), first);
    }

    /// While one lives, row() makes each row's first call and warm-up at once and leaves its timing
    /// to the end of the scope, where the rows are timed in alternation: each round calls every
    /// row's fn once, in turn, until every row has min_time of repeats (and its min_repeats), so
    /// the rows compared against each other (kiln fused, compiled, the hand-written anchors) see the
    /// same machine: on a VM whose speed drifts within seconds, rows timed one after another do not.
    /// Everything the fns use must be declared before the scope (it outlives them otherwise: they
    /// are called in its destructor). Scopes do not nest.
    class Interleaved {
    public:
        explicit Interleaved(Bench& b) : b_(b), unwinding_(std::uncaught_exceptions()) {
            if (b_.interleaving_) throw std::logic_error("kiln_bench: Bench::Interleaved scopes do not nest");
            b_.interleaving_ = true;
        }
        Interleaved(const Interleaved&) = delete;
        Interleaved& operator=(const Interleaved&) = delete;
        ~Interleaved() noexcept(false) {
            b_.interleaving_ = false;
            std::vector<Queued> q;
            q.swap(b_.queued_);  // nothing queued outlives the scope, whatever happens below
            if (std::uncaught_exceptions() == unwinding_) b_.time_queued(q);
        }

    private:
        Bench& b_;
        int unwinding_;
    };

    /// Adds the row of one timed workload: times of the repeats and of the first call, in seconds.
    void record(const std::string& workload, const std::string& method, const std::string& device, int threads, double bytes,
                std::vector<double> times, double first) {
        std::sort(times.begin(), times.end());
        Row r;
        r.workload = workload;
        r.method = method;
        r.device = device;
        r.threads = threads;
        r.bytes = bytes;
        r.repeats = static_cast<int>(times.size());
        r.median_us = times[times.size() / 2] * 1e6;
        r.min_us = times.front() * 1e6;
        r.first_call_us = first * 1e6;
        rows_.push_back(r);
        if (device == "cpu") print(r);
    }

    /// Times fn on the GPU (after a first call and a warm-up) two ways, as the PyTorch anchor does:
    /// latency (each repeat is record, fn, record, synchronize, so host launch cost shows where the
    /// GPU waits for it; the host's wall time inside fn is taken in the same repeats) and
    /// throughput (n calls back to back between two events, one synchronize, n chosen from the
    /// latency so that a run lasts at least 100 ms; the median of 5 runs, per call).
    void gpu_row(const std::string& workload, const std::string& method, double bytes, const std::function<void()>& fn,
                 int min_repeats = 20) {
        const auto stream = kiln::cuda::current_stream(0);
        auto t0 = Clock::now();
        fn();
        kiln::cuda::synchronize(0);
        const double first = seconds_since(t0);
        fn();
        kiln::cuda::synchronize(0);
        std::vector<double> times, host;
        kiln::cuda::Event e0, e1;
        const auto start = Clock::now();
        while (static_cast<int>(times.size()) < min_repeats || seconds_since(start) < opt_.min_time) {
            e0.record(stream);
            t0 = Clock::now();
            fn();
            host.push_back(seconds_since(t0));
            e1.record(stream);
            times.push_back(e1.elapsed_ms(e0) * 1e-3);
            if (times.size() >= 5000) break;
        }
        const double latency = median_of(times);
        const auto n = static_cast<int>(std::clamp(std::ceil(opt_.throughput_time / std::max(latency, 1e-7)), 3.0, 200000.0));
        std::vector<double> per_call;
        for (int rep = 0; rep < 5; ++rep) {
            kiln::cuda::synchronize(0);
            e0.record(stream);
            for (int i = 0; i < n; ++i) fn();
            e1.record(stream);
            per_call.push_back(e1.elapsed_ms(e0) * 1e-3 / n);
        }
        record(workload, method, "cuda:0", gpu, bytes, std::move(times), first);
        rows_.back().throughput_us = median_of(per_call) * 1e6;
        rows_.back().host_us = median_of(host) * 1e6;
        print(rows_.back());
    }
    static double median_of(std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0 : v[v.size() / 2];
    }
    /// The last row added (to annotate it).
    Row& last_row() { return rows_.back(); }
    /// Adds a row measured elsewhere (warm-start times from a child process).
    void add_row(const Row& r) {
        rows_.push_back(r);
        print(r);
    }
    static constexpr int gpu = 0;  ///< the `threads` value of GPU rows

    /// The floating-point work of one run of a workload and its math mode ("f32 (no TF32)", "bf16"),
    /// written to the JSON rows of that workload (GEMM-bound rows are judged by FLOP/s).
    void set_meta(const std::string& workload, double flops, const std::string& math) { meta_[workload] = {flops, math}; }

    /// The measured copy bandwidth for a thread count (GB/s, read + write).
    void set_copy_bandwidth(int threads, double gbps) { copy_gbps_[threads] = gbps; }
    double copy_bandwidth(int threads) const {
        auto it = copy_gbps_.find(threads);
        return it == copy_gbps_.end() ? 0 : it->second;
    }

    void header() const {
        std::printf("kiln_bench  device: cpu (%s), %d threads available\n", cpu_model().c_str(), opt_.max_threads);
        std::printf("medians of >= %d repeats (>= %.1f s) after a warm-up; GB/s counts the least traffic "
                    "(inputs read once, outputs written once)\n\n",
                    opt_.min_repeats, opt_.min_time);
        std::printf("GPU rows: median_us is the latency (events around each synchronized call), thru_us the time per "
                    "call back to back (one synchronize), host_us the host's time inside a call; GB/s and %%copy by throughput\n\n");
        std::printf("%-22s %-8s %3s %12s %12s %9s %8s %10s %10s %9s\n", "workload", "method", "thr", "median_us", "first_us",
                    "GB/s", "%copy", "vs eager", "thru_us", "host_us");
    }

    void print(const Row& r) const {
        const double copy = copy_bandwidth(r.threads);
        const double eager = eager_us(r.workload, r.threads);
        char pct[16] = "-", sp[16] = "-";
        if (copy > 0) std::snprintf(pct, sizeof pct, "%.0f%%", 100 * r.gbps() / copy);
        if (eager > 0) std::snprintf(sp, sizeof sp, "%.2fx", eager / r.median_us);
        char thr[8];
        std::snprintf(thr, sizeof thr, "%s", r.threads == gpu ? "gpu" : std::to_string(r.threads).c_str());
        char thru[24] = "-", host[24] = "-";
        if (r.throughput_us > 0) std::snprintf(thru, sizeof thru, "%.1f", r.throughput_us);
        if (r.host_us > 0) std::snprintf(host, sizeof host, "%.1f", r.host_us);
        std::printf("%-22s %-8s %3s %12.1f %12.1f %9.2f %8s %10s %10s %9s\n", r.workload.c_str(), r.method.c_str(), thr,
                    r.median_us, r.first_call_us, r.gbps(), pct, sp, thru, host);
        std::fflush(stdout);
    }

    double eager_us(const std::string& workload, int threads) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.method == "eager" && r.threads == threads) return r.median_us;
        return 0;
    }
    /// The least traffic recorded for a workload's rows (0 where none has it).
    double bytes_of(const std::string& workload) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.bytes > 0) return r.bytes;
        return 0;
    }
    double throughput_us(const std::string& workload, const std::string& method, int threads) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.method == method && r.threads == threads) return r.throughput_us;
        return 0;
    }
    double median_us(const std::string& workload, const std::string& method, int threads) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.method == method && r.threads == threads) return r.median_us;
        return 0;
    }

    void summary() const {
        std::printf("\nsummary\n");
        for (const char* w : cpu_workloads) {
            for (int t : thread_counts()) {
                const double e = median_us(w, "eager", t), f = median_us(w, "fused", t), c = median_us(w, "compiled", t);
                if (e > 0 && f > 0) std::printf("  %-13s %d thr: fused %.2fx faster than eager", w, t, e / f);
                if (e > 0 && c > 0) std::printf(", compiled %.2fx faster than eager, compiled/fused time %.2f", e / c, c / f);
                if (e > 0 && f > 0) std::printf("\n");
            }
        }
        for (const char* w : cpu_workloads)  // those with hand-written anchors
            for (int t : thread_counts()) {
                const double h = median_us(w, "hand", t), f = median_us(w, "fused", t), c = median_us(w, "compiled", t);
                if (h > 0 && f > 0 && c > 0)
                    std::printf("  %-13s %d thr: time / the hand-written xsimd loop's: fused %.2f, compiled %.2f\n", w, t, f / h, c / h);
            }
        const auto tc = thread_counts();
        if (tc.size() > 1)  // scaling of every CPU row that ran at both thread counts
            for (const char* w : cpu_workloads) {
                std::string line;
                for (const char* m : {"eager", "fused", "compiled", "hand"}) {
                    const double one = median_us(w, m, 1), all = median_us(w, m, tc.back());
                    if (one > 0 && all > 0) line += std::string(line.empty() ? "" : ", ") + m + " " + fixed2(one / all) + "x";
                }
                if (!line.empty()) std::printf("  %-13s %d threads vs 1: %s\n", w, tc.back(), line.c_str());
            }
        for (int t : tc) {
            const double f = median_us("chain16M", "fused", t), g = median_us("chain16M", "eigen", t);
            if (f > 0 && g > 0) std::printf("  chain16M   %d thr: fused is %.2fx faster than the Eigen array expression\n", t, g / f);
        }
        if (tc.size() > 1) {
            const double one = median_us("chain16M", "fused", 1), all = median_us("chain16M", "fused", tc.back());
            if (one > 0 && all > 0)
                std::printf("  chain16M   fused: %d threads are %.2fx faster than 1\n", tc.back(), one / all);
        }
    }

    /// A JSON number, or null where v is not finite (JSON has no NaN or infinity; warm-start rows
    /// have no rate).
    static std::string json_number(double v) {
        if (!std::isfinite(v)) return "null";
        std::ostringstream s;
        s << v;
        return s.str();
    }

    void write_json(const std::string& path) const {
        std::ofstream f(path);
        if (!f) throw std::runtime_error("kiln_bench: cannot write " + path);
        f << "[\n";
        for (std::size_t i = 0; i < rows_.size(); ++i) {
            const Row& r = rows_[i];
            const double copy = copy_bandwidth(r.threads), eager = eager_us(r.workload, r.threads);
            f << "  {\"workload\": \"" << r.workload << "\", \"method\": \"" << r.method << "\", \"device\": \"" << r.device
              << "\", \"threads\": " << r.threads << ", \"median_us\": " << json_number(r.median_us) << ", \"min_us\": "
              << json_number(r.min_us) << ", \"first_call_us\": " << json_number(r.first_call_us) << ", \"repeats\": " << r.repeats
              << ", \"bytes\": " << json_number(r.bytes) << ", \"gbps\": " << json_number(r.gbps());
            if (r.throughput_us > 0)
                f << ", \"latency_us\": " << json_number(r.median_us) << ", \"throughput_us\": " << json_number(r.throughput_us)
                  << ", \"host_us\": " << json_number(r.host_us);
            if (r.peak_mib > 0) f << ", \"peak_mem_mib\": " << json_number(r.peak_mib);
            if (r.peak_requested_mib > 0) f << ", \"peak_requested_mib\": " << json_number(r.peak_requested_mib);
            if (copy > 0) f << ", \"pct_copy\": " << json_number(100 * r.gbps() / copy);
            if (eager > 0) f << ", \"speedup_vs_eager\": " << json_number(eager / r.median_us);
            if (const double et = throughput_us(r.workload, "eager", r.threads); et > 0 && r.throughput_us > 0)
                f << ", \"throughput_speedup_vs_eager\": " << json_number(et / r.throughput_us);
            if (auto m = meta_.find(r.workload); m != meta_.end()) {
                f << ", \"flops\": " << json_number(m->second.first) << ", \"math\": \"" << m->second.second << "\"";
                const double us = r.throughput_us > 0 ? r.throughput_us : r.median_us;
                if (us > 0 && m->second.first > 0) f << ", \"tflops\": " << json_number(m->second.first / (us * 1e6));
            }
            f << "}" << (i + 1 < rows_.size() ? "," : "") << "\n";
        }
        f << "]\n";
        std::printf("\nwrote %zu rows to %s\n", rows_.size(), path.c_str());
    }

private:
    Options opt_;
    struct Queued {
        std::string workload, method;
        int threads;
        double bytes;
        std::function<void()> fn;
        int min_repeats;
        double first;
    };
    bool interleaving_ = false;
    std::vector<Queued> queued_;
    /// Times the queued rows in alternation (Interleaved) and records them in queue order.
    /// Every round calls each row once (rows already done too, so the alternation holds to the
    /// end), until each has min_time of repeats and its min_repeats, or 2000 rounds.
    void time_queued(std::vector<Queued>& queued) {
        std::vector<std::vector<double>> times(queued.size());
        std::vector<double> spent(queued.size(), 0);
        auto done = [&](std::size_t i) { return static_cast<int>(times[i].size()) >= queued[i].min_repeats && spent[i] >= opt_.min_time; };
        for (int round = 0; round < 2000; ++round) {
            bool all = true;
            for (std::size_t i = 0; i < queued.size(); ++i) all = all && done(i);
            if (all) break;
            for (std::size_t i = 0; i < queued.size(); ++i) {
                kiln::set_num_threads(queued[i].threads);
                const auto t0 = Clock::now();
                queued[i].fn();
                times[i].push_back(seconds_since(t0));
                spent[i] += times[i].back();
            }
        }
        for (std::size_t i = 0; i < queued.size(); ++i)
            record(queued[i].workload, queued[i].method, "cpu", queued[i].threads, queued[i].bytes, std::move(times[i]), queued[i].first);
    }
    std::vector<Row> rows_;
    std::map<int, double> copy_gbps_;
    std::map<std::string, std::pair<double, std::string>> meta_;
};

/// Largest |a - b| relative to max(1, |b|) over all elements (both read as f64).
double max_rel_diff(const Tensor& a, const Tensor& b) {
    const Tensor da = a.to(kiln::DType::f64).contiguous(), db = b.to(kiln::DType::f64).contiguous();
    const double* pa = da.data<double>();
    const double* pb = db.data<double>();
    double m = 0;
    for (std::int64_t i = 0; i < da.numel(); ++i) m = std::max(m, std::abs(pa[i] - pb[i]) / std::max(1.0, std::abs(pb[i])));
    return m;
}

void check_close(const std::string& what, const Tensor& got, const Tensor& want, double tol) {
    const double d = max_rel_diff(got, want);
    if (!(d <= tol)) {
        std::ostringstream s;
        s << "kiln_bench: " << what << " differs from eager by " << d << " (tolerance " << tol << ")";
        throw std::runtime_error(s.str());
    }
}

// ---------------------------------------------------------------------------------------------
// copy bandwidth: a parallel memcpy of 64 MiB on the kiln pool, read + write counted

void bench_copy(Bench& b) {
    const std::int64_t n = 16 << 20;
    const Tensor src = kiln::rand({n}), dst = kiln::empty({n});
    for (int t : b.thread_counts()) {
        b.row("copy", "memcpy", t, 2.0 * 4 * static_cast<double>(n), [&] {
            const char* s = static_cast<const char*>(src.data_ptr());
            char* d = static_cast<char*>(dst.data_ptr());
            kiln::detail::parallel_for(n * 4, 1 << 20, [&](std::int64_t lo, std::int64_t hi) {
                std::memcpy(d + lo, s + lo, static_cast<std::size_t>(hi - lo));
            });
        });
        // the row just added is the copy row for t threads
        const double us = b.median_us("copy", "memcpy", t);
        b.set_copy_bandwidth(t, 2.0 * 4 * static_cast<double>(n) / (us * 1e3));
    }
}

// ---------------------------------------------------------------------------------------------
// gemm_f32 on the CPU: one 2048 x 2048 x 2048 f32 product (kiln's GEMM on AVX-512, Eigen's
// elsewhere), the GEMM rate the model rows are read against

void bench_gemm_cpu(Bench& b) {
    if (!b.wanted("gemm_f32")) return;
    const std::int64_t n = 2048;
    const Tensor a = kiln::randn({n, n}), c = kiln::randn({n, n});
    b.set_meta("gemm_f32", 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n), "f32");
    Tensor y;
    for (int t : b.thread_counts()) b.row("gemm_f32", "matmul", t, 0, [&] { y = kiln::matmul(a, c); }, 3);
}

// ---------------------------------------------------------------------------------------------
// chain: y = relu(x*1.5+0.5)*sigmoid(x) - tanh(x*0.1) + exp(-x*x)

template <class X> auto chain_expr(const X& x) {
    return kiln::relu(x * 1.5 + 0.5) * kiln::sigmoid(x) - kiln::tanh(x * 0.1) + kiln::exp(-x * x);
}

void bench_chain(Bench& b, const std::string& name, std::int64_t n) {
    if (!b.wanted(name)) return;
    kiln::manual_seed(1);
    const Tensor x = Tensor(kiln::randn({n}) * 2.0);
    Tensor y = kiln::empty({n});
    const double bytes = 2.0 * 4 * static_cast<double>(n);
    const Tensor ref = kiln::eager(chain_expr(x));
    {
        Tensor fused = kiln::empty({n});
        fused.assign(chain_expr(x));
        check_close(name + " fused", fused, ref, 1e-5);
        Tensor eig = kiln::empty({n});
        Eigen::Map<const Eigen::ArrayXf> ex(x.data<float>(), n);
        Eigen::Map<Eigen::ArrayXf> ey(eig.data<float>(), n);
        ey = (ex * 1.5f + 0.5f).max(0.0f) * ex.logistic() - (ex * 0.1f).tanh() + (-ex * ex).exp();
        check_close(name + " eigen", eig, ref, 1e-5);
    }
    Tensor h;  // the hand-written row's result
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = kiln::eager(chain_expr(x)); });
        auto compiled = kiln::compile([](const Tensor& v) { return Tensor(chain_expr(v)); });
        const Bench::Interleaved together(b);  // the rows below timed in alternation
        b.row(name, "fused", t, bytes, [&] { y = Tensor(chain_expr(x)); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        // The Eigen peer: the same chain as an Eigen array expression, split into contiguous
        // chunks over the same pool (Eigen does not thread coefficient-wise expressions itself).
        b.row(name, "eigen", t, bytes, [&] {
            const Tensor o = kiln::empty({n});
            const float* px = x.data<float>();
            float* py = o.data<float>();
            kiln::detail::parallel_for(n, 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
                Eigen::Map<const Eigen::ArrayXf> ex(px + lo, hi - lo);
                Eigen::Map<Eigen::ArrayXf> ey(py + lo, hi - lo);
                ey = (ex * 1.5f + 0.5f).max(0.0f) * ex.logistic() - (ex * 0.1f).tanh() + (-ex * ex).exp();
            });
        });
        b.row(name, "hand", t, bytes, [&] {  // bench/hand_cpu.hpp: an xsimd loop written for this chain
            const Tensor o = kiln::empty({n});
            const float* px = x.data<float>();
            float* py = o.data<float>();
            kiln::detail::parallel_for(n, 1 << 16, [&](std::int64_t lo, std::int64_t hi) { kiln_bench_hand::chain_range(px, py, lo, hi); });
            h = o;
        });
    }
    check_close(name + " hand", h, ref, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// bias_gelu: gelu_tanh(x + b), x (8192, 1024), b (1024,)

void bench_bias_gelu(Bench& b) {
    const std::string name = "bias_gelu";
    if (!b.wanted(name)) return;
    const std::int64_t rows = 8192, cols = 1024;
    kiln::manual_seed(2);
    const Tensor x = kiln::randn({rows, cols}), bias = kiln::randn({cols});
    Tensor y = kiln::empty({rows, cols});
    const double bytes = 4.0 * static_cast<double>(2 * rows * cols + cols);
    check_close(name + " fused", Tensor(kiln::gelu_tanh(x + bias)), kiln::eager(kiln::gelu_tanh(x + bias)), 1e-5);
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = kiln::eager(kiln::gelu_tanh(x + bias)); });
        auto compiled = kiln::compile([&](const Tensor& v) { return Tensor(kiln::gelu_tanh(v + bias)); });
        Tensor hs[2];  // the hand-written rows' results (declared before the scope: its rows use them)
        const Bench::Interleaved together(b);  // the rows below timed in alternation
        b.row(name, "fused", t, bytes, [&] { y = Tensor(kiln::gelu_tanh(x + bias)); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        // the hand-written anchors (bench/hand_cpu.hpp): an xsimd loop and an Eigen loop per row
        for (const bool eigen : {false, true}) {
            Tensor* const h = &hs[eigen ? 1 : 0];  // (the fn outlives this iteration: timed at the scope's end)
            b.row(name, eigen ? "eigen_rows" : "hand", t, bytes, [&, h, eigen] {
                const Tensor o = kiln::empty({rows, cols});
                kiln::detail::parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
                    (eigen ? kiln_bench_hand::bias_gelu_rows_eigen : kiln_bench_hand::bias_gelu_rows)(
                        x.data<float>(), bias.data<float>(), o.data<float>(), cols, r0, r1);
                });
                *h = o;
            });
            check_close(name + (eigen ? " eigen_rows" : " hand"), *h, y, 1e-5);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// colsum: sum(x * x, 0) over x (8192, 2048): a reduction that keeps the innermost dim (column
// statistics, a bias gradient's shape)

void bench_colsum(Bench& b) {
    const std::string name = "colsum";
    if (!b.wanted(name)) return;
    const std::int64_t rows = 8192, cols = 2048;
    kiln::manual_seed(13);
    const Tensor x = kiln::randn({rows, cols});
    Tensor y;
    const double bytes = 4.0 * static_cast<double>(rows * cols + cols);
    const Tensor ref = kiln::sum(kiln::eager(x * x), {0});
    check_close(name + " fused", kiln::sum(x * x, {0}), ref, 1e-5);
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = kiln::sum(kiln::eager(x * x), {0}); });
        auto compiled = kiln::compile([](const Tensor& v) { return kiln::sum(v * v, {0}); });
        Tensor h;
        std::vector<float> part(static_cast<std::size_t>(t * cols));
        const Bench::Interleaved together(b);  // the rows below timed in alternation
        b.row(name, "fused", t, bytes, [&] { y = kiln::sum(x * x, {0}); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        check_close(name + " compiled", y, ref, 1e-5);
        // bench/hand_cpu.hpp: each of `t` parts of the rows into its own row of partials, then summed
        b.row(name, "hand", t, bytes, [&] {
            h = kiln::empty({cols});
            std::fill(part.begin(), part.end(), 0.0f);
            kiln::detail::thread_pool().run(t, [&](std::int64_t p) {
                kiln_bench_hand::colsum_sq_rows(x.data<float>(), part.data() + p * cols, cols, rows * p / t, rows * (p + 1) / t);
            });
            float* o = h.data<float>();
            for (std::int64_t j = 0; j < cols; ++j) {
                float s = 0;
                for (int p = 0; p < t; ++p) s += part[static_cast<std::size_t>(p * cols + j)];
                o[j] = s;
            }
        });
        check_close(name + " hand", h, ref, 1e-4);
    }
}

// ---------------------------------------------------------------------------------------------
// softmax over rows of (4096, 1024)

Tensor softmax_eager(const Tensor& x) {
    const Tensor m = kiln::max(x, -1, true);
    const Tensor e = kiln::eager(kiln::exp(x - m));
    const Tensor s = kiln::sum(e, -1, true);
    return kiln::eager(e / s);
}

void bench_softmax(Bench& b) {
    const std::string name = "softmax";
    if (!b.wanted(name)) return;
    const std::int64_t rows = 4096, cols = 1024;
    kiln::manual_seed(3);
    const Tensor x = Tensor(kiln::randn({rows, cols}) * 3.0);
    Tensor y;
    const double bytes = 4.0 * static_cast<double>(2 * rows * cols);
    check_close(name + " fused", kiln::softmax(x), softmax_eager(x), 1e-6);
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = softmax_eager(x); });
        auto compiled = kiln::compile([](const Tensor& v) { return kiln::softmax(v); });
        Tensor h;
        const Bench::Interleaved together(b);  // the rows below timed in alternation
        b.row(name, "fused", t, bytes, [&] { y = kiln::softmax(x); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        b.row(name, "hand", t, bytes, [&] {  // bench/hand_cpu.hpp
            const Tensor o = kiln::empty({rows, cols});
            kiln::detail::parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
                kiln_bench_hand::softmax_rows(x.data<float>(), o.data<float>(), cols, r0, r1);
            });
            h = o;
        });
        // 1e-5 as the other hand rows: the hand loop's xsimd exp and its sum over 1024 columns run at
        // the width the bench was built for (SSE2 without KILN_NATIVE), kiln's at the CPU's; with
        // KILN_NATIVE=OFF on an AVX-512 Xeon they differed by 1.07e-6 (2026-11-29)
        check_close(name + " hand", h, y, 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------
// layernorm over rows of (8192, 1024) with weight and bias

Tensor layernorm_eager(const Tensor& x, const Tensor& w, const Tensor& bias) {
    const Tensor mu = Tensor(kiln::sum(x, -1, true) / static_cast<double>(x.size(-1)));
    const Tensor d = kiln::eager(x - mu);
    const Tensor var = Tensor(kiln::sum(kiln::eager(d * d), -1, true) / static_cast<double>(x.size(-1)));
    const Tensor rstd = kiln::eager(kiln::rsqrt(var + 1e-5));
    return kiln::eager(d * rstd * w + bias);
}

void bench_layernorm(Bench& b) {
    const std::string name = "layernorm";
    if (!b.wanted(name)) return;
    const std::int64_t rows = 8192, cols = 1024;
    kiln::manual_seed(4);
    const Tensor x = kiln::randn({rows, cols}), w = kiln::randn({cols}), bias = kiln::randn({cols});
    Tensor y;
    const double bytes = 4.0 * static_cast<double>(2 * rows * cols + 2 * cols);
    check_close(name + " fused", kiln::layer_norm(x, 1, w, bias), layernorm_eager(x, w, bias), 1e-5);
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = layernorm_eager(x, w, bias); });
        auto compiled = kiln::compile([&](const Tensor& v) { return kiln::layer_norm(v, 1, w, bias); });
        Tensor h;
        const Bench::Interleaved together(b);  // the rows below timed in alternation
        b.row(name, "fused", t, bytes, [&] { y = kiln::layer_norm(x, 1, w, bias); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        check_close(name + " compiled", y, layernorm_eager(x, w, bias), 1e-5);
        b.row(name, "hand", t, bytes, [&] {  // bench/hand_cpu.hpp
            const Tensor o = kiln::empty({rows, cols});
            kiln::detail::parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
                kiln_bench_hand::layernorm_rows(x.data<float>(), w.data<float>(), bias.data<float>(), o.data<float>(), cols, r0, r1);
            });
            h = o;
        });
        check_close(name + " hand", h, y, 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------
// numpy_fn (the seed's definition), X, Y of shape (1024, 640) f32:
//   normalise columns by mean and std (population std; zero std replaced by 1);
//   r = sum over the outer product Xn[:, :, None] * Yn[:, None, :] per row; clip(r, -1, 1); exp;
//   plus 0.001 * sum(Xn^2 + Yn^2, axis 1)

template <class Eval>
Tensor numpy_fn(const Tensor& X, const Tensor& Y, Eval ev) {
    auto norm = [&](const Tensor& A) {
        const Tensor mu = kiln::mean(A, 0, true);
        const Tensor sd = kiln::std(A, 0, true, 0.0);
        const Tensor sd1 = ev(kiln::where(sd == 0.0, 1.0, sd));
        return ev((A - mu) / sd1);
    };
    const Tensor Xn = norm(X), Yn = norm(Y);
    const Tensor prod = ev(Xn.unsqueeze(2) * Yn.unsqueeze(1));  // (1024, 640, 640) unless fused away
    const Tensor r = kiln::sum(prod, {1, 2});
    const Tensor e = ev(kiln::exp(kiln::clamp(r, -1.0, 1.0)));
    const Tensor s = kiln::sum(ev(Xn * Xn + Yn * Yn), 1);
    return ev(e + s * 0.001);
}

/// numpy_fn with expression templates: every statement fused, the outer product reduced without
/// being stored (but still computed: 1024 x 640 x 640 products).
Tensor numpy_fn_fused(const Tensor& X, const Tensor& Y) {
    auto norm = [&](const Tensor& A) {
        const Tensor mu = kiln::mean(A, 0, true);
        const Tensor sd = kiln::std(A, 0, true, 0.0);
        return Tensor((A - mu) / kiln::where(sd == 0.0, 1.0, sd));
    };
    const Tensor Xn = norm(X), Yn = norm(Y);
    const Tensor r = kiln::sum(Xn.unsqueeze(2) * Yn.unsqueeze(1), {1, 2});
    return Tensor(kiln::exp(kiln::clamp(r, -1.0, 1.0)) + kiln::sum(Xn * Xn + Yn * Yn, 1) * 0.001);
}

void bench_numpy_fn(Bench& b) {
    const std::string name = "numpy_fn";
    if (!b.wanted(name)) return;
    const std::int64_t n = 1024, m = 640;
    kiln::manual_seed(5);
    const Tensor X = kiln::randn({n, m}), Y = Tensor(kiln::randn({n, m}) * 0.1);
    const double bytes = 4.0 * static_cast<double>(2 * n * m + n);
    auto eager_fn = [](const Tensor& x, const Tensor& y) { return numpy_fn(x, y, [](const auto& e) { return kiln::eager(e); }); };
    const Tensor ref = eager_fn(X, Y);
    check_close(name + " fused", numpy_fn_fused(X, Y), ref, 1e-3);
    Tensor out;
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { out = eager_fn(X, Y); }, 3);
        b.row(name, "fused", t, bytes, [&] { out = numpy_fn_fused(X, Y); }, 3);
        auto compiled = kiln::compile([](const Tensor& x, const Tensor& y) {
            return numpy_fn(x, y, [](const auto& e) { return Tensor(e); });
        });
        b.row(name, "compiled", t, bytes, [&] { out = compiled(X, Y); });
        check_close(name + " compiled", out, ref, 1e-3);
    }
}

// ---------------------------------------------------------------------------------------------
// blackscholes: a European call and put priced from one formula (two outputs sharing d1, d2 and
// the discount): S, K, T of n options, r = 0.02, vol = 0.3. Fused: two statements (each output
// one kernel, the shared values computed twice); compiled: one kernel writing both outputs.

const double bs_r = 0.02, bs_vol = 0.3;
template <class X> auto bs_ncdf(const X& z) { return 0.5 * (1.0 + kiln::erf(z * 0.7071067811865476)); }
template <class S, class K, class T> auto bs_d1(const S& s, const K& k, const T& t) {
    return (kiln::log(s / k) + t * (bs_r + 0.5 * bs_vol * bs_vol)) / (kiln::sqrt(t) * bs_vol);
}
/// The prices with each statement as `ev` evaluates it (eager: one kernel per op; Tensor(): fused).
template <class Eval>
std::pair<Tensor, Tensor> blackscholes(const Tensor& s, const Tensor& k, const Tensor& t, Eval ev) {
    const Tensor d1 = ev(bs_d1(s, k, t));
    const Tensor d2 = ev(d1 - kiln::sqrt(t) * bs_vol);
    const Tensor disc = ev(k * kiln::exp(t * -bs_r));
    return {ev(s * bs_ncdf(d1) - disc * bs_ncdf(d2)), ev(disc * bs_ncdf(-d2) - s * bs_ncdf(-d1))};
}
/// Expression templates: each price one fused statement (d1, d2 and the discount inlined in both).
std::pair<Tensor, Tensor> blackscholes_fused(const Tensor& s, const Tensor& k, const Tensor& t) {
    const auto d1 = bs_d1(s, k, t);
    const auto d2 = d1 - kiln::sqrt(t) * bs_vol;
    const auto disc = k * kiln::exp(t * -bs_r);
    return {Tensor(s * bs_ncdf(d1) - disc * bs_ncdf(d2)), Tensor(disc * bs_ncdf(-d2) - s * bs_ncdf(-d1))};
}
std::vector<Tensor> bs_inputs(std::int64_t n, kiln::Device dev) {
    kiln::manual_seed(7);
    return {Tensor(kiln::rand({n}) * 50 + 50).to(dev), Tensor(kiln::rand({n}) * 50 + 50).to(dev), Tensor(kiln::rand({n}) * 2 + 0.25).to(dev)};
}
auto bs_compiled(kiln::Mode mode = kiln::Mode::normal) {
    return kiln::compile([](const Tensor& s, const Tensor& k, const Tensor& t) { return blackscholes(s, k, t, [](const auto& e) { return Tensor(e); }); },
                         {.mode = mode});
}

void bench_blackscholes(Bench& b) {
    const std::string name = "blackscholes";
    if (!b.wanted(name)) return;
    const std::int64_t n = 4 << 20;
    const std::vector<Tensor> in = bs_inputs(n, kiln::Device::cpu());
    const double bytes = 5.0 * 4 * static_cast<double>(n);
    auto eager_fn = [&] { return blackscholes(in[0], in[1], in[2], [](const auto& e) { return kiln::eager(e); }); };
    const auto ref = eager_fn();
    std::pair<Tensor, Tensor> out;
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { out = eager_fn(); }, 3);
        b.row(name, "fused", t, bytes, [&] { out = blackscholes_fused(in[0], in[1], in[2]); });
        check_close(name + " fused", out.second, ref.second, 1e-4);
        auto compiled = bs_compiled();
        b.row(name, "compiled", t, bytes, [&] { out = compiled(in[0], in[1], in[2]); });
        check_close(name + " compiled call", out.first, ref.first, 1e-4);
        check_close(name + " compiled put", out.second, ref.second, 1e-4);
    }
}

// ---------------------------------------------------------------------------------------------
// sincos_scalar: sin(x) + cos(x) on one element: the fixed cost of a call

void bench_sincos_scalar(Bench& b) {
    const std::string name = "sincos_scalar";
    if (!b.wanted(name)) return;
    const Tensor x = kiln::full({1}, 0.5);
    Tensor y;
    auto compiled = kiln::compile([](const Tensor& v) { return Tensor(kiln::sin(v) + kiln::cos(v)); });
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, 8, [&] { y = kiln::eager(kiln::sin(x) + kiln::cos(x)); });
        b.row(name, "fused", t, 8, [&] { y = Tensor(kiln::sin(x) + kiln::cos(x)); });
        b.row(name, "compiled", t, 8, [&] { y = compiled(x); });
    }
}


// ---------------------------------------------------------------------------------------------
// Models: mlp (batch 64: 1024 -> 4096 GELU(tanh) -> 1024) and bert_layer (batch 8, seq 128,
// hidden 768, 12 heads, FFN 3072, post-norm, GELU(tanh)), in f32 (no TF32) and bf16. Methods:
// eager (the traced graph run one op per kernel), fused (the module called directly: one kernel
// per statement; on CUDA a Linear's bias and activation ride in the cuBLASLt epilogue), compiled
// (kiln::compile) and, on the GPU, reduce_overhead (compiled and replayed as CUDA graphs).

/// Groups of rows that failed without stopping the bench (each printed where it failed).
int& failed_rows() {
    static int n = 0;
    return n;
}

struct Model {
    std::string name, math;
    double flops = 0;
    Tensor x;
    std::function<Tensor(const Tensor&)> fn;  // the forward pass (holds the module)
};

Model make_model(const std::string& name, kiln::Device dev) {
    kiln::manual_seed(7);
    Model m;
    m.name = name;
    const bool bf16 = name.ends_with("bf16");
    const kiln::DType dt = bf16 ? kiln::DType::bf16 : kiln::DType::f32;
    m.math = bf16 ? "bf16 (f32 accumulate)" : "f32 (no TF32)";
    const kiln::nn::Init init{dt, dev};
    if (name.starts_with("mlp")) {
        auto mod = std::make_shared<kiln::nn::Mlp>(1024, 4096, 1024, init);
        m.x = kiln::randn({64, 1024}).to(dt).to(dev);
        m.flops = 2.0 * 64 * (1024.0 * 4096 * 2);
        m.fn = [mod](const Tensor& t) { return (*mod)(t); };
    } else if (name.starts_with("resnet18")) {
        // ResNet-18 at inference, BatchNorm folded into the convolutions, f32 without TF32
        auto mod = std::make_shared<kiln::nn::ResNet18>(1000, init);
        mod->fold();
        const std::int64_t batch = 16;  // the seed workload, on the CPU too
        m.x = kiln::randn({batch, 3, 224, 224}).to(dt).to(dev);
        // multiply-adds of every conv and the fc, from the shapes (the downsample 1x1 convs included)
        double macs = 112.0 * 112 * 64 * 3 * 49;
        const std::int64_t hw[] = {56, 28, 14, 7};
        for (int st = 0; st < 4; ++st) {
            const double c = 64 << st, s2 = static_cast<double>(hw[st]) * hw[st];
            macs += s2 * c * (st == 0 ? c : c / 2) * 9 + 3 * s2 * c * c * 9;
            if (st > 0) macs += s2 * c * (c / 2);
        }
        macs += 512.0 * 1000;
        m.flops = 2.0 * macs * static_cast<double>(batch);
        m.fn = [mod](const Tensor& t) { return (*mod)(t); };
    } else {
        const std::int64_t B = 8, S = 128, E = 768, H = 12, F = 3072;
        auto mod = std::make_shared<kiln::nn::BertLayer>(E, H, F, 1e-5, init);
        m.x = kiln::randn({B, S, E}).to(dt).to(dev);
        m.flops = 2.0 * B * S * (E * 3.0 * E + E * E + 2.0 * E * F) + 2.0 * 2 * B * H * S * S * (E / H);
        m.fn = [mod](const Tensor& t) { return (*mod)(t); };
    }
    return m;
}

/// The max_autotune rows of a compiled GPU workload: `make(mode)` compiles it and returns its call.
/// Each row's first call is where the GEMMs are timed (the kernels are already compiled by the
/// default mode's rows, in memory and on disk); the result is checked against eager after timing.
void autotune_rows(Bench& b, const std::string& name, const std::function<std::function<Tensor()>(kiln::Mode)>& make, const Tensor& want,
                   double tol) {
    for (const auto& [method, mode] : {std::pair{"max_autotune", kiln::Mode::max_autotune},
                                       std::pair{"max_autotune_no_cg", kiln::Mode::max_autotune_no_cudagraphs}}) {
        std::function<Tensor()> call = make(mode);
        Tensor y;
        b.gpu_row(name, method, b.bytes_of(name), [&] { y = call(); }, 20);
        check_close("gpu " + name + " " + method, y.cpu(), want.cpu(), tol);
    }
}

/// The rows of one model workload on the CPU (threads > 0) or the GPU (threads == Bench::gpu).
std::filesystem::path bench_data_dir();

void model_rows(Bench& b, const std::string& name, kiln::Device dev, int threads, bool gpu) {
    Model m = make_model(name, dev);
    // resnet18 on the GPU compares with torch's default there: TF32 convolutions
    const bool tf32 = gpu && name == "resnet18";
    if (tf32) m.math = "f32, TF32 GEMMs (as torch's default TF32 convolutions)";
    struct Tf32Scope {
        bool on;
        explicit Tf32Scope(bool o) : on(o) { if (on) kiln::cuda::set_allow_tf32(true); }
        ~Tf32Scope() { if (on) kiln::cuda::set_allow_tf32(false); }
    } tf32_scope(tf32);
    b.set_meta(name, m.flops, m.math);
    auto eager = kiln::compile(m.fn, {.backend = kiln::Backend::eager});
    auto compiled = kiln::compile(m.fn);
    auto ro = kiln::compile(m.fn, {.mode = kiln::Mode::reduce_overhead});
    const double tol = name.ends_with("bf16") ? 5e-2 : 1e-3;
    Tensor ye, yf, yc, yr;
    auto time = [&](const char* method, const std::function<void()>& fn, int reps) {
        if (gpu) b.gpu_row(name, method, 0, fn, reps);
        else b.row(name, method, threads, 0, fn, reps);
    };
    // every method checked against eager before it is timed
    ye = eager(m.x);
    check_close(name + " fused", m.fn(m.x).cpu(), ye.cpu(), tol);
    check_close(name + " compiled", compiled(m.x).cpu(), ye.cpu(), tol);
    time("eager", [&] { ye = eager(m.x); }, gpu ? 20 : 3);
    time("fused", [&] { yf = m.fn(m.x); }, gpu ? 20 : 3);
    time("compiled", [&] { yc = compiled(m.x); }, gpu ? 20 : 3);
    // the model exported with a dynamic batch, saved, loaded back (as another process would) and
    // run: the same passes, fuser and kernels as compiled; "export" (CPU runs) times
    // export_program itself: the traces (3 with one dynamic dim), the passes and the shape fits.
    // A failure here is reported (and makes the bench exit 1 at the end) without losing the rows
    // of the other methods and workloads.
    try {
        const kiln::DynamicShapes dyn{{{0, kiln::Dim("batch", 1, 4096)}}};
        const kiln::DynamicShapes none{};
        const kiln::DynamicShapes& d = m.x.size(0) >= 2 ? dyn : none;
        kiln::ExportedProgram ep = kiln::export_program(m.fn, std::make_tuple(m.x), d);
        if (!gpu) time("export", [&] { ep = kiln::export_program(m.fn, std::make_tuple(m.x), d); }, 5);
#if KILN_BENCH_ONNX
        // the ONNX file of that program: the model proto, ONNX's checker, serialized and written
        const std::string onnx_file = (bench_data_dir() / (name + ".onnx")).string();
        std::filesystem::create_directories(bench_data_dir());
        if (!gpu) time("onnx", [&] { kiln::onnx::export_model(ep, onnx_file); }, 5);
        else kiln::onnx::export_model(ep, onnx_file);
        // its input and eager's output, for peers that run the file (bench/anchors/ort_anchor.py,
        // which skips a model without them: NumPy has no bfloat16, so bf16 rows write none)
        const std::filesystem::path in_npy = bench_data_dir() / (name + ".input.npy"), out_npy = bench_data_dir() / (name + ".output.npy");
        if (m.x.dtype() != kiln::DType::bf16 && ye.dtype() != kiln::DType::bf16) {
            kiln::nn::save_npy(in_npy, m.x.cpu());
            kiln::nn::save_npy(out_npy, ye.cpu());
        } else {
            std::filesystem::remove(in_npy);
            std::filesystem::remove(out_npy);
        }
        // that ONNX file imported back (kiln::onnx::load) and run: an ONNX model through kiln's
        // fuser; its dynamic batch (dim_param) becomes a Dim again
        {
            const kiln::ExportedProgram imported = kiln::onnx::load(onnx_file);
            Tensor yi;
            check_close(name + " onnx_import", imported(m.x)[0].cpu(), ye.cpu(), tol);
            time("onnx_import", [&] { yi = imported(m.x)[0]; }, gpu ? 20 : 3);
        }
#endif
        const std::filesystem::path file = bench_data_dir() / (name + ".kiln");
        std::filesystem::create_directories(bench_data_dir());
        ep.save(file.string());
        const kiln::ExportedProgram loaded = kiln::load_program(file.string());
        Tensor yl;
        check_close(name + " loaded", loaded(m.x)[0].cpu(), ye.cpu(), tol);
        time("loaded", [&] { yl = loaded(m.x)[0]; }, gpu ? 20 : 3);
    } catch (const kiln::Error& e) {
        std::fprintf(stderr, "%s export / onnx / loaded rows FAILED: %s\n", name.c_str(), e.what());
        ++failed_rows();
    }
    if (gpu) {
        check_close(name + " reduce_overhead", ro(m.x).cpu(), ye.cpu(), tol);
        time("reduce_overhead", [&] { yr = ro(m.x); }, 20);
        check_close(name + " reduce_overhead (timed)", yr.cpu(), ye.cpu(), tol);
        autotune_rows(b, name, [&](kiln::Mode mode) {
            auto c = kiln::compile(m.fn, {.mode = mode});
            return std::function<Tensor()>([c, x = m.x]() mutable { return c(x); });
        }, ye, tol);
    }
}

// ---------------------------------------------------------------------------------------------
// Training rows: one training step each (forward, loss, backward, optimizer step) of the workloads
// in bench/train_workloads.hpp.
// Methods: eager (the step called directly: ops recorded, one kernel per op and per gradient rule),
// compiled (kiln::compile of the whole step: forward, backward and optimizer in one program) and,
// on the GPU, reduce_overhead (that program replayed as a CUDA graph). Each method trains its own
// copy of the model from the same seed; their first losses are checked against each other.
using kiln_bench::Trainer;
using kiln_bench::make_trainer;

void train_rows(Bench& b, const std::string& name, kiln::Device dev, int threads, bool gpu) {
    const bool tf32 = gpu && name == "resnet18_train";
    if (tf32) kiln::cuda::set_allow_tf32(true);
    float loss0 = 0;
    // one method at a time, each with its own model from the same seed (peak memory per method)
    for (const char* method : {"eager", "compiled", "reduce_overhead"}) {
        if (!gpu && std::string(method) == "reduce_overhead") continue;
        Trainer t = make_trainer(name, dev);
        b.set_meta(name, t.flops, t.math);
        std::function<Tensor()> step;
        std::shared_ptr<kiln::Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>> c;
        if (std::string(method) == "eager") {
            step = [&t] { return t.step(t.x, t.y); };
        } else {
            kiln::Options o;
            if (std::string(method) == "reduce_overhead") o.mode = kiln::Mode::reduce_overhead;
            c = std::make_shared<kiln::Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>>(
                kiln::compile(std::function<Tensor(const Tensor&, const Tensor&)>(
                                  [&t](const Tensor& x, const Tensor& y) { return t.step(x, y); }),
                              o));
            step = [&t, c] { return (*c)(t.x, t.y); };
        }
        const auto t0 = std::chrono::steady_clock::now();
        const float l = step().item<float>();  // the first step (trace, compile, run): every method starts from the same loss
        const double first_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (std::string(method) == "eager") loss0 = l;
        else if (!(std::abs(l - loss0) <= t.tol * std::max(1.0f, std::abs(loss0))))
            throw std::runtime_error("kiln_bench: " + name + " " + method + ": first loss " + std::to_string(l) + " but eager's is " +
                                     std::to_string(loss0));
        if (gpu) kiln::cuda::reset_peak_memory_stats(0);
        Tensor loss;
        if (gpu) b.gpu_row(name, method, 0, [&] { loss = step(); }, 20);
        else b.row(name, method, threads, 0, [&] { loss = step(); }, 3);
        if (!std::isfinite(loss.item<float>()))
            throw std::runtime_error("kiln_bench: " + name + " " + method + ": the loss is not finite after the timed steps");
        if (gpu) {
            const kiln::cuda::DeviceMemoryStats ms = kiln::cuda::memory_stats(0);
            b.last_row().peak_mib = static_cast<double>(ms.peak_bytes_in_use) / (1 << 20);
            b.last_row().peak_requested_mib = static_cast<double>(ms.peak_bytes_requested) / (1 << 20);
        }
        b.last_row().first_call_us = first_us;  // the row's first call is the model's first step, compile included
        std::printf("  %s %s: first step (trace, compile, run) %.1f ms; %d kernels per step; peak device memory %.1f MiB in blocks, %.1f MiB "
                    "requested\n", name.c_str(), method, first_us / 1e3, c ? c->kernels() : 0, b.last_row().peak_mib, b.last_row().peak_requested_mib);
        if (std::string(method) == "reduce_overhead") {
            const kiln::cuda::GraphStats gs = kiln::cuda::graph_stats();
            std::printf("  %s reduce_overhead: CUDA graphs so far in this process: %zu captured, %zu replays, %zu calls without a graph\n",
                        name.c_str(), gs.captures, gs.replays, gs.fallbacks);
        }
    }
    if (tf32) kiln::cuda::set_allow_tf32(false);
}

const char* const train_workloads[] = {"mlp_train", "bert_layer_train", "resnet18_train"};

void bench_models(Bench& b) {
    for (const char* name : {"mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18"})
        if (b.wanted(name)) model_rows(b, name, kiln::Device::cpu(), b.options().max_threads, false);
    for (const char* name : train_workloads)
        if (b.wanted(name)) train_rows(b, name, kiln::Device::cpu(), b.options().max_threads, false);
}

// ---------------------------------------------------------------------------------------------
// Whole models: BERT-base (bert-base-uncased's architecture: 12 layers, hidden 768) with seeded
// random weights written once to safetensors in the data dir, so that the PyTorch anchor loads
// the same ones (Hugging Face's BertModel), on the seed's sentence (batch 1, tokenized by kiln's
// BertTokenizer) and on batch 8 x 128; and all-MiniLM-L6-v2 (the real model, KILN_MINILM_DIR)
// embedding 32 sentences of up to 64 tokens on the CPU. The inputs and kiln's compiled output go
// to the data dir too: the anchor checks its output against kiln's before timing.

std::filesystem::path bench_data_dir() {
    const char* d = std::getenv("KILN_BENCH_DATA");
    return d ? d : "/tmp/kiln-bench-data";
}

/// bert-base with seeded random weights: written once to DIR/bert_base (config.json,
/// model.safetensors, vocab.txt), read back from there by kiln and by the anchor.
std::filesystem::path bert_base_dir() {
    namespace fs = std::filesystem;
    const fs::path dir = bench_data_dir() / "bert_base";
    if (fs::exists(dir / "model.safetensors")) return dir;
    fs::create_directories(dir);
    kiln::manual_seed(11);
    kiln::nn::BertModel m(kiln::nn::BertConfig{});
    kiln::nn::save_safetensors(dir / "model.safetensors", kiln::nn::state_dict(m));
    std::ofstream(dir / "config.json") << R"({"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522,
 "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
 "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute"})";
    fs::copy_file(KILN_SOURCE_DIR "/tests/data/bert/vocab.txt", dir / "vocab.txt", fs::copy_options::overwrite_existing);
    return dir;
}

/// The seed's sentence as a batch of one, or batch 8 x 128 of random ids (full attention mask).
kiln::nn::BatchEncoding bert_inputs(const std::filesystem::path& dir, bool seed_sentence) {
    if (seed_sentence) return kiln::nn::BertTokenizer::from_file(dir / "vocab.txt")({"Here is some text to encode"});
    kiln::manual_seed(12);
    const Tensor ids = Tensor(kiln::floor(kiln::rand({8, 128}) * 29000.0) + 1000.0).to(kiln::DType::i64);
    return {ids, kiln::ones({8, 128}, kiln::DType::i64), kiln::zeros({8, 128}, kiln::DType::i64)};
}

void bench_bert_base(Bench& b, kiln::Device dev, bool gpu) {
    namespace fs = std::filesystem;
    for (const bool b1 : {true, false})
        for (const kiln::DType dt : {kiln::DType::f32, kiln::DType::bf16}) {
            const bool bf16 = dt == kiln::DType::bf16;
            const std::string shape = b1 ? "b1" : "b8x128", name = "bert_base_" + shape + (bf16 ? "_bf16" : "_f32");
            if (!b.wanted(name)) continue;
            const fs::path dir = bert_base_dir();
            const kiln::nn::BatchEncoding in = bert_inputs(dir, b1);
            kiln::nn::save_safetensors(dir / ("inputs_" + shape + ".safetensors"),
                                       {{"input_ids", in.input_ids}, {"attention_mask", in.attention_mask}, {"token_type_ids", in.token_type_ids}});
            const auto model = std::make_shared<kiln::nn::BertModel>(
                kiln::nn::BertModel::from_pretrained(dir, {.dtype = dt, .device = dev, .add_pooling_layer = false}));  // as the anchor loads it
            const Tensor ids = in.input_ids.to(dev), mask = in.attention_mask.to(dev);
            const std::int64_t B = ids.size(0), S = ids.size(1), E = 768, F = 3072, L = 12;
            b.set_meta(name, L * (2.0 * B * S * (4.0 * E * E + 2.0 * E * F) + 4.0 * B * S * S * E),
                       bf16 ? "bf16 (f32 accumulate)" : "f32 (no TF32)");
            const auto fn = [model](const Tensor& i, const Tensor& m) { return (*model)(i, m).last_hidden_state; };
            auto eager = kiln::compile(fn, {.backend = kiln::Backend::eager});
            auto compiled = kiln::compile(fn);
            auto ro = kiln::compile(fn, {.mode = kiln::Mode::reduce_overhead});
            const double tol = bf16 ? 0.125 : 1e-3;  // bf16 through 12 layers: two ulps at 16
            Tensor y;
            const Tensor ye = eager(ids, mask).cpu();
            check_close(name + " fused", fn(ids, mask).cpu(), ye, tol);
            const Tensor yc = compiled(ids, mask).cpu();
            check_close(name + " compiled", yc, ye, tol);
            kiln::nn::save_safetensors(dir / ("kiln_" + name + ".safetensors"), {{"last_hidden_state", yc.to(kiln::DType::f32)}});
            const auto time = [&](const char* method, const std::function<void()>& f) {
                if (gpu) b.gpu_row(name, method, 0, f, 20);
                else b.row(name, method, b.options().max_threads, 0, f, 3);
            };
            time("eager", [&] { y = eager(ids, mask); });
            time("fused", [&] { y = fn(ids, mask); });
            time("compiled", [&] { y = compiled(ids, mask); });
            if (gpu) {
                check_close(name + " reduce_overhead", ro(ids, mask).cpu(), ye, tol);
                time("reduce_overhead", [&] { y = ro(ids, mask); });
                autotune_rows(b, name, [&](kiln::Mode mode) {
                    auto c = kiln::compile(fn, {.mode = mode});
                    return std::function<Tensor()>([c, ids, mask]() mutable { return c(ids, mask); });
                }, ye, tol);
            }
        }
}

/// all-MiniLM-L6-v2 embeddings (mean pooling, L2 normalization) of 32 sentences of up to 64
/// tokens, from KILN_MINILM_DIR; without it the rows are skipped with a line saying so.
void bench_minilm(Bench& b) {
    namespace fs = std::filesystem;
    if (!b.wanted("minilm_32x64")) return;
    const char* d = std::getenv("KILN_MINILM_DIR");
    if (!d || !fs::exists(fs::path(d) / "model.safetensors")) {
        std::printf("minilm_32x64: SKIPPED: set KILN_MINILM_DIR to all-MiniLM-L6-v2's folder (bash tests/fetch_minilm.sh DEST: DEST/model)\n");
        return;
    }
    const fs::path dir = d;
    std::vector<std::string> s;
    const char* base[] = {
        "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.",
        "A woman is playing violin.", "Two men pushed carts through the woods.", "A man is riding a white horse on an enclosed ground.",
        "A monkey is playing drums.",
        "Someone in a gorilla costume is playing a set of drums while a crowd of onlookers cheers and takes photographs of the performance in the park.",
        "The new movie is awesome, and everyone who saw it on the opening weekend said that the ending was the best part of the whole story."};
    for (int i = 0; i < 32; ++i) s.push_back(std::string(base[i % 10]) + (i >= 10 ? " And then sentence number " + std::to_string(i) + " follows." : ""));
    s[31] = s[30] + " " + s[29] + " " + s[28];  // longer than 64 tokens: truncated
    const auto tok = kiln::nn::BertTokenizer::from_pretrained(dir);
    kiln::nn::EncodeOptions o;
    o.max_length = 64;
    const kiln::nn::BatchEncoding in = tok(s, o);
    const fs::path out = bench_data_dir() / "minilm";
    fs::create_directories(out);
    kiln::nn::save_safetensors(out / "inputs.safetensors",
                               {{"input_ids", in.input_ids}, {"attention_mask", in.attention_mask}, {"token_type_ids", in.token_type_ids}});
    const auto model = std::make_shared<kiln::nn::BertModel>(kiln::nn::BertModel::from_pretrained(dir));
    const auto fn = [model](const Tensor& i, const Tensor& m, const Tensor& t) {
        return kiln::nn::l2_normalize(kiln::nn::mean_pooling((*model)(i, m, t).last_hidden_state, m));
    };
    auto eager = kiln::compile(fn, {.backend = kiln::Backend::eager});
    auto compiled = kiln::compile(fn);
    const Tensor ye = eager(in.input_ids, in.attention_mask, in.token_type_ids);
    const Tensor yc = compiled(in.input_ids, in.attention_mask, in.token_type_ids);
    check_close("minilm_32x64 compiled", yc, ye, 1e-4);
    kiln::nn::save_safetensors(out / "kiln_minilm_32x64.safetensors", {{"embeddings", yc}});
    Tensor y;
    const int t = b.options().max_threads;
    b.row("minilm_32x64", "eager", t, 0, [&] { y = eager(in.input_ids, in.attention_mask, in.token_type_ids); }, 3);
    b.row("minilm_32x64", "fused", t, 0, [&] { y = fn(in.input_ids, in.attention_mask, in.token_type_ids); }, 3);
    b.row("minilm_32x64", "compiled", t, 0, [&] { y = compiled(in.input_ids, in.attention_mask, in.token_type_ids); }, 3);
    const double us = b.median_us("minilm_32x64", "compiled", t);
    std::printf("  minilm_32x64 compiled, %d threads: %.0f sentences/s (%lld tokens after padding)\n", t, 32e6 / us,
                static_cast<long long>(in.input_ids.size(1)));
}

// ---------------------------------------------------------------------------------------------
// GPU rows (when a CUDA device is present): the same workloads at the issue's GPU sizes, timed
// with CUDA events; `compiled` runs first for each workload, so its first call is the cold
// compile (NVRTC, empty disk cache); a child process then measures the warm (disk-cache) start.

Tensor gpu(const Tensor& t) { return t.to(kiln::Device::cuda()); }

/// The compiled GPU workloads by name: (inputs on the GPU, the compiled function's call).
struct GpuWorkload {
    std::vector<Tensor> in;
    std::function<Tensor(const std::vector<Tensor>&)> call;
};
GpuWorkload gpu_workload(const std::string& name, kiln::Mode mode = kiln::Mode::normal) {
    GpuWorkload w;
    const kiln::Options opt{.mode = mode};
    if (name == "chain64M") {
        kiln::manual_seed(1);
        w.in = {gpu(Tensor(kiln::randn({64 << 20}) * 2.0))};
        auto c = kiln::compile([](const Tensor& v) { return Tensor(chain_expr(v)); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0]); };
    } else if (name == "bias_gelu") {
        kiln::manual_seed(2);
        w.in = {gpu(kiln::randn({8192, 4096})), gpu(kiln::randn({4096}))};
        auto c = kiln::compile([](const Tensor& v, const Tensor& b) { return Tensor(kiln::gelu_tanh(v + b)); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0], a[1]); };
    } else if (name == "softmax") {
        kiln::manual_seed(3);
        w.in = {gpu(Tensor(kiln::randn({8192, 4096}) * 3.0))};
        auto c = kiln::compile([](const Tensor& v) { return kiln::softmax(v); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0]); };
    } else if (name == "softmax_short" || name == "rowsum_short") {  // a million rows of 9
        kiln::manual_seed(12);
        w.in = {gpu(Tensor(kiln::randn({1 << 20, 9}) * 3.0))};
        const bool sm = name == "softmax_short";
        auto c = kiln::compile([sm](const Tensor& v) { return sm ? kiln::softmax(v) : Tensor(kiln::sum(v, {-1})); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0]); };
    } else if (name == "layernorm") {
        kiln::manual_seed(4);
        w.in = {gpu(kiln::randn({8192, 4096})), gpu(kiln::randn({4096})), gpu(kiln::randn({4096}))};
        auto c = kiln::compile([](const Tensor& v, const Tensor& wt, const Tensor& b) { return kiln::layer_norm(v, 1, wt, b); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0], a[1], a[2]); };
    } else if (name == "numpy_fn") {
        kiln::manual_seed(5);
        w.in = {gpu(kiln::randn({1024, 640})), gpu(Tensor(kiln::randn({1024, 640}) * 0.1))};
        auto c = kiln::compile([](const Tensor& x, const Tensor& y) { return numpy_fn(x, y, [](const auto& e) { return Tensor(e); }); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0], a[1]); };
    } else if (name == "blackscholes") {  // the call price (both prices are computed)
        w.in = bs_inputs(16 << 20, kiln::Device::cuda());
        auto c = bs_compiled(mode);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0], a[1], a[2]).first; };
    } else if (name == "sincos_scalar") {
        w.in = {gpu(kiln::full({1}, 0.5))};
        auto c = kiln::compile([](const Tensor& v) { return Tensor(kiln::sin(v) + kiln::cos(v)); }, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0]); };
    } else if (name.starts_with("mlp") || name.starts_with("bert_layer") || name == "resnet18") {
        if (name == "resnet18") kiln::cuda::set_allow_tf32(true);  // as its rows: torch's default TF32 convolutions
        Model m = make_model(name, kiln::Device::cuda());
        w.in = {m.x};
        auto c = kiln::compile(m.fn, opt);
        w.call = [c](const std::vector<Tensor>& a) mutable { return c(a[0]); };
    } else {
        throw std::invalid_argument("kiln_bench: no GPU workload " + name);
    }
    return w;
}
const char* const gpu_workloads[] = {"chain64M", "bias_gelu", "softmax", "softmax_short", "rowsum_short", "layernorm", "numpy_fn", "blackscholes", "sincos_scalar"};

/// Child-process mode: the first call of a compiled GPU workload, in microseconds (the CUDA
/// context is made first, so only kiln's trace, compile or disk load and the run are counted).
int first_call_probe(const std::string& name, kiln::Mode mode) {
    GpuWorkload w = gpu_workload(name, mode);
    if (std::getenv("KILN_BENCH_PREWARM_BLAS")) {
        // (a diagnosis, not a row: cuBLASLt's first use in a process (its handle, heuristics and
        // the lazy load of its kernels' module) before the clock starts, to see what is kiln's)
        for (kiln::DType dt : {kiln::DType::f32, kiln::DType::bf16}) {
            const Tensor a = gpu(kiln::randn({24, 40}).to(dt));
            (void)kiln::matmul(a, a.t());
        }
    }
    kiln::cuda::synchronize(0);
    const auto t0 = Clock::now();
    (void)w.call(w.in);
    kiln::cuda::synchronize(0);
    std::printf("first_call_us %.1f\n", seconds_since(t0) * 1e6);
    return 0;
}

/// Runs `self --first-call name [--mode max_autotune]` (with KILN_CACHE_DIR=cache_dir where given)
/// and returns the time it printed (0 on failure).
double warm_start_us(const std::string& self, const std::string& name, bool autotune = false, const std::string& cache_dir = "") {
    const std::string cmd = (cache_dir.empty() ? "" : "KILN_CACHE_DIR='" + cache_dir + "' ") + "'" + self + "' --first-call " + name +
                            (autotune ? " --mode max_autotune" : "");
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return 0;
    char line[256];
    double us = 0;
    while (std::fgets(line, sizeof line, p))
        if (std::sscanf(line, "first_call_us %lf", &us) == 1) break;
    ::pclose(p);
    return us;
}

void bench_gpu(Bench& b, const std::string& self) {
    if (!kiln::cuda::is_available()) {
        std::printf("\n(no CUDA device: GPU rows skipped)\n");
        return;
    }
    const auto& props = kiln::cuda::properties(0);
    std::printf("\nGPU: %s (sm_%d, %d SMs); kernels compiled by NVRTC into a fresh cache dir %s\n", props.name.c_str(),
                props.arch(), props.sm_count, kiln::cache::cache_dir().c_str());
    using kiln::cuda::detail::driver;
    // copy bandwidth: device-to-device memcpy of 1 GiB, read + write counted
    {
        const std::int64_t n = 256 << 20;
        const Tensor src = gpu(kiln::rand({1 << 20})).expand({256, 1 << 20}).contiguous().flatten(), dst = kiln::empty({n}, kiln::DType::f32, kiln::Device::cuda());
        const double bytes = 2.0 * 4 * static_cast<double>(n);
        b.gpu_row("copy", "memcpy", bytes, [&] {
            kiln::cuda::detail::check(driver().memcpy_dtod_async(reinterpret_cast<std::uintptr_t>(dst.data_ptr()),
                                                                reinterpret_cast<std::uintptr_t>(src.data_ptr()), static_cast<std::size_t>(n) * 4,
                                                                kiln::cuda::current_stream(0)),
                                      "memcpy");
        });
        b.set_copy_bandwidth(Bench::gpu, bytes / (b.throughput_us("copy", "memcpy", Bench::gpu) * 1e3));  // a rate: back to back
    }
    auto want = [&](const std::string& n) { return b.wanted(n); };
    auto compiled_rows = [&](const std::string& name, double bytes, GpuWorkload& w) {
        Tensor out;
        b.gpu_row(name, "compiled", bytes, [&] { out = w.call(w.in); });
        GpuWorkload ro = gpu_workload(name, kiln::Mode::reduce_overhead);
        Tensor out_ro;
        b.gpu_row(name, "reduce_overhead", bytes, [&] { out_ro = ro.call(ro.in); });
        // numpy_fn sums 640 x 640 products per output in f32: a tuned launch shape sums them in another
        // order (measured 2.8e-5 apart on the H100), so its rows agree to 1e-4; elementwise rows to 1e-5
        const double tol = name == "numpy_fn" ? 1e-4 : 1e-5;
        check_close("gpu " + name + " reduce_overhead", out_ro.cpu(), out.cpu(), tol);
        autotune_rows(b, name, [&](kiln::Mode mode) {
            auto tw = std::make_shared<GpuWorkload>(gpu_workload(name, mode));
            return std::function<Tensor()>([tw] { return tw->call(tw->in); });
        }, out, tol);
        Row warm;
        warm.workload = name;
        warm.method = "warmstart";
        warm.device = "cuda:0";
        warm.threads = Bench::gpu;
        warm.first_call_us = warm_start_us(self, name);
        b.add_row(warm);
        return out;
    };
    if (want("chain64M")) {
        GpuWorkload w = gpu_workload("chain64M");
        const Tensor& x = w.in[0];
        const double bytes = 2.0 * 4 * static_cast<double>(x.numel());
        const Tensor c = compiled_rows("chain64M", bytes, w);
        Tensor y = kiln::empty(x.shape(), kiln::DType::f32, kiln::Device::cuda());
        b.gpu_row("chain64M", "fused", bytes, [&] { y.assign(chain_expr(x)); });
        b.gpu_row("chain64M", "eager", bytes, [&] { y = kiln::eager(chain_expr(x)); }, 5);
        check_close("gpu chain64M compiled", c.cpu(), y.cpu(), 1e-5);
        check_close("gpu chain64M eager vs cpu", y.cpu().slice(0, 0, 1 << 20), kiln::eager(chain_expr(x.cpu().slice(0, 0, 1 << 20))), 1e-5);
    }
    if (want("scale64M")) {  // the lightest elementwise kernel: what the elementwise skeleton reaches
        const Tensor x = gpu(kiln::randn({64 << 20}));
        const double bytes = 2.0 * 4 * static_cast<double>(x.numel());
        Tensor y = kiln::empty(x.shape(), kiln::DType::f32, kiln::Device::cuda());
        b.gpu_row("scale64M", "fused", bytes, [&] { y.assign(x * 2.0f); });
    }
    if (want("bias_gelu")) {
        GpuWorkload w = gpu_workload("bias_gelu");
        const double bytes = 4.0 * static_cast<double>(2 * w.in[0].numel() + w.in[1].numel());
        const Tensor c = compiled_rows("bias_gelu", bytes, w);
        Tensor y;
        b.gpu_row("bias_gelu", "fused", bytes, [&] { y = Tensor(kiln::gelu_tanh(w.in[0] + w.in[1])); });
        b.gpu_row("bias_gelu", "eager", bytes, [&] { y = kiln::eager(kiln::gelu_tanh(w.in[0] + w.in[1])); }, 5);
        check_close("gpu bias_gelu", c.cpu(), y.cpu(), 1e-5);
    }
    if (want("softmax")) {
        GpuWorkload w = gpu_workload("softmax");
        const double bytes = 4.0 * static_cast<double>(2 * w.in[0].numel());
        const Tensor c = compiled_rows("softmax", bytes, w);
        Tensor y;
        b.gpu_row("softmax", "fused", bytes, [&] { y = kiln::softmax(w.in[0]); });
        b.gpu_row("softmax", "eager", bytes, [&] { y = softmax_eager(w.in[0]); }, 5);
        check_close("gpu softmax", c.cpu(), y.cpu(), 1e-6);
        check_close("gpu softmax vs cpu", c.cpu().slice(0, 0, 64), softmax_eager(w.in[0].cpu().slice(0, 0, 64)), 1e-6);
    }
    for (const char* name : {"softmax_short", "rowsum_short"}) {
        if (!want(name)) continue;
        const bool sm = std::string(name) == "softmax_short";
        GpuWorkload w = gpu_workload(name);
        const Tensor& x = w.in[0];
        const double bytes = 4.0 * static_cast<double>(x.numel() + (sm ? x.numel() : x.size(0)));
        const Tensor c = compiled_rows(name, bytes, w);
        Tensor y;
        b.gpu_row(name, "fused", bytes, [&] { y = sm ? kiln::softmax(x) : Tensor(kiln::sum(x, {-1})); });
        b.gpu_row(name, "eager", bytes, [&] { y = sm ? softmax_eager(x) : Tensor(kiln::sum(x, {-1})); }, 5);
        check_close(std::string("gpu ") + name, c.cpu(), y.cpu(), 1e-5);
        const Tensor xs = x.cpu().slice(0, 0, 4096);
        check_close(std::string("gpu ") + name + " vs cpu", c.cpu().slice(0, 0, 4096), sm ? softmax_eager(xs) : Tensor(kiln::sum(xs, {-1})), 1e-5);
    }
    if (want("layernorm")) {
        GpuWorkload w = gpu_workload("layernorm");
        const double bytes = 4.0 * static_cast<double>(2 * w.in[0].numel() + 2 * w.in[1].numel());
        const Tensor c = compiled_rows("layernorm", bytes, w);
        Tensor y;
        b.gpu_row("layernorm", "fused", bytes, [&] { y = kiln::layer_norm(w.in[0], 1, w.in[1], w.in[2]); });
        b.gpu_row("layernorm", "eager", bytes, [&] { y = layernorm_eager(w.in[0], w.in[1], w.in[2]); }, 5);
        check_close("gpu layernorm", c.cpu(), y.cpu(), 1e-4);
    }
    if (want("numpy_fn")) {
        GpuWorkload w = gpu_workload("numpy_fn");
        const double bytes = 4.0 * static_cast<double>(2 * w.in[0].numel() + w.in[0].size(0));
        const Tensor c = compiled_rows("numpy_fn", bytes, w);
        Tensor y;
        b.gpu_row("numpy_fn", "fused", bytes, [&] { y = numpy_fn_fused(w.in[0], w.in[1]); }, 3);
        b.gpu_row("numpy_fn", "eager", bytes, [&] { y = numpy_fn(w.in[0], w.in[1], [](const auto& e) { return kiln::eager(e); }); }, 3);
        check_close("gpu numpy_fn", c.cpu(), y.cpu(), 1e-3);
    }
    if (want("blackscholes")) {
        GpuWorkload w = gpu_workload("blackscholes");
        const double bytes = 5.0 * 4 * static_cast<double>(w.in[0].numel());
        const Tensor c = compiled_rows("blackscholes", bytes, w);
        std::pair<Tensor, Tensor> y;
        b.gpu_row("blackscholes", "fused", bytes, [&] { y = blackscholes_fused(w.in[0], w.in[1], w.in[2]); });
        b.gpu_row("blackscholes", "eager", bytes,
                  [&] { y = blackscholes(w.in[0], w.in[1], w.in[2], [](const auto& e) { return kiln::eager(e); }); }, 5);
        check_close("gpu blackscholes", c.cpu(), y.first.cpu(), 1e-4);
    }
    if (want("sincos_scalar")) {
        GpuWorkload w = gpu_workload("sincos_scalar");
        const Tensor c = compiled_rows("sincos_scalar", 8, w);
        Tensor y;
        b.gpu_row("sincos_scalar", "fused", 8, [&] { y = Tensor(kiln::sin(w.in[0]) + kiln::cos(w.in[0])); });
        b.gpu_row("sincos_scalar", "eager", 8, [&] { y = kiln::eager(kiln::sin(w.in[0]) + kiln::cos(w.in[0])); });
        check_close("gpu sincos", c.cpu(), y.cpu(), 1e-6);
    }
    // GEMM rate (the roofline of the model rows): 8192^3 through kiln::matmul (cuBLASLt)
    for (const auto& [gname, dt] : {std::pair{"gemm_bf16", kiln::DType::bf16}, std::pair{"gemm_f32", kiln::DType::f32}}) {
        if (!want(gname)) continue;
        const Tensor a = kiln::randn({8192, 8192}).to(dt).to(kiln::Device::cuda()), c = kiln::randn({8192, 8192}).to(dt).to(kiln::Device::cuda());
        b.set_meta(gname, 2.0 * 8192.0 * 8192.0 * 8192.0, dt == kiln::DType::bf16 ? "bf16 (f32 accumulate)" : "f32 (no TF32)");
        Tensor y;
        b.gpu_row(gname, "matmul", 0, [&] { y = kiln::matmul(a, c); }, 10);
    }
    // Products of few rows (batch-1 inference, decoding): bert-base's four weights (768 -> 2304, 768
    // -> 768, 768 -> 3072 with exact gelu, 3072 -> 768; each with a bias) applied to m rows in bf16,
    // compiled with reduce_overhead (one CUDA graph: the GPU's time, not the host's). The bytes are
    // the weights' (read once; the rows are small): %copy is the fraction of the copy bandwidth the
    // weights stream at. "small" is the default (small_gemm.hpp's kernel up to 16 rows),
    // "cublaslt" the same function compiled with that kernel off.
    for (const int m : {1, 8, 16, 32, 64}) {
        const std::string name = "linears_m" + std::to_string(m) + "_bf16";
        if (!want(name)) continue;
        kiln::manual_seed(20);
        const kiln::nn::Init o{.dtype = kiln::DType::bf16, .device = kiln::Device::cuda()};
        const kiln::nn::Linear qkv(768, 2304, true, kiln::Act::none, o), out(768, 768, true, kiln::Act::none, o),
            up(768, 3072, true, kiln::Act::gelu, o), down(3072, 768, true, kiln::Act::none, o);
        const Tensor x = kiln::randn({m, 768}).to(kiln::DType::bf16).to(kiln::Device::cuda());
        const double bytes = 2.0 * (768.0 * 2304 + 768.0 * 768 + 2.0 * 768 * 3072 + 2304 + 768 + 3072 + 768);
        b.set_meta(name, 2.0 * m * (768.0 * 2304 + 768.0 * 768 + 2.0 * 768 * 3072), "bf16 (f32 accumulate)");
        const auto fn = [&](const Tensor& t) { return std::tuple<Tensor, Tensor, Tensor>{qkv(t), out(t), down(up(t))}; };
        auto& limit = kiln::cuda::detail::small_gemm_limit();
        const std::int64_t keep = limit.load();
        std::tuple<Tensor, Tensor, Tensor> y;
        auto small = kiln::compile(fn, {.mode = kiln::Mode::reduce_overhead});
        y = small(x);
        const std::array<Tensor, 3> ys = {std::get<0>(y).cpu(), std::get<1>(y).cpu(), std::get<2>(y).cpu()};
        b.gpu_row(name, "small", bytes, [&] { y = small(x); });
        limit.store(0);  // captured with cuBLASLt: the graph keeps it
        auto lt = kiln::compile(fn, {.mode = kiln::Mode::reduce_overhead});
        for (int i = 0; i < 3; ++i) y = lt(x);  // traced, run, captured
        limit.store(keep);
        check_close(name + " small vs cublaslt", ys[0], std::get<0>(y).cpu(), 0.05);
        check_close(name + " small vs cublaslt", ys[1], std::get<1>(y).cpu(), 0.05);
        check_close(name + " small vs cublaslt", ys[2], std::get<2>(y).cpu(), 0.05);
        b.gpu_row(name, "cublaslt", bytes, [&] { y = lt(x); });
    }
    for (const char* name : {"mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18"})
        if (want(name)) model_rows(b, name, kiln::Device::cuda(), Bench::gpu, true);
    // max_autotune's whole first call in a new process: cold (an empty kernel cache: trace, NVRTC,
    // GEMM timing, run) and warm (a second process on that cache: nothing compiled or timed); then
    // the default mode's warm start on the same cache (what a warm first call costs without tuning)
    for (const char* name : {"mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18"}) {
        if (!want(name)) continue;
        char dir[] = "/tmp/kiln-bench-tune-XXXXXX";
        if (!::mkdtemp(dir)) continue;
        for (const char* method : {"autotune_cold", "autotune_warm", "warmstart"}) {  // warmstart: the default mode, same cache
            Row r;
            r.workload = name;
            r.method = method;
            r.device = "cuda:0";
            r.threads = Bench::gpu;
            r.first_call_us = warm_start_us(self, name, std::string(method) != "warmstart", dir);
            b.add_row(r);
        }
        std::filesystem::remove_all(dir);
    }
    bench_bert_base(b, kiln::Device::cuda(), true);
    for (const char* name : train_workloads)
        if (want(name)) train_rows(b, name, kiln::Device::cuda(), Bench::gpu, true);
    std::printf("\nGPU summary (%s)\n", props.name.c_str());
    std::vector<const char*> all(std::begin(gpu_workloads), std::end(gpu_workloads));
    for (const char* m : {"mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18", "bert_base_b1_f32", "bert_base_b1_bf16",
                          "bert_base_b8x128_f32", "bert_base_b8x128_bf16"})
        all.push_back(m);
    std::printf("  (throughput: back-to-back calls, one synchronize; latency: each call synchronized)\n");
    for (const char* wl : all) {
        const auto thru = [&](const char* m) { return b.throughput_us(wl, m, Bench::gpu); };
        const auto lat = [&](const char* m) { return b.median_us(wl, m, Bench::gpu); };
        if (thru("compiled") <= 0) continue;
        std::printf("  %-21s throughput us: compiled %.1f, reduce_overhead %.1f, max_autotune %.1f (no graphs %.1f), fused %.1f, "
                    "eager %.1f (compiled %.1fx faster than eager); latency us: compiled %.1f, reduce_overhead %.1f, max_autotune %.1f\n",
                    wl, thru("compiled"), thru("reduce_overhead"), thru("max_autotune"), thru("max_autotune_no_cg"), thru("fused"),
                    thru("eager"), thru("eager") / thru("compiled"), lat("compiled"), lat("reduce_overhead"), lat("max_autotune"));
    }
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument("kiln_bench: " + a + " needs a value");
            return argv[++i];
        };
        if (a == "--filter") o.filter = value();
        else if (a == "--json") o.json = value();
        else if (a == "--threads") o.max_threads = std::max(1, std::stoi(value()));
        else if (a == "--min-time") o.min_time = std::stod(value());
        else if (a == "--throughput-time") o.throughput_time = std::stod(value());
        else if (a == "--first-call") o.first_call = value();
        else if (a == "--mode") {
            const std::string m = value();
            if (m != "max_autotune" && m != "normal") throw std::invalid_argument("kiln_bench: --mode is normal or max_autotune");
            o.first_call_autotune = m == "max_autotune";
        }
        else if (a == "--no-gpu") o.gpu = false;
        else if (a == "--no-cpu") o.cpu = false;
        else if (a == "--help" || a == "-h") {
            std::printf("usage: kiln_bench [--filter SUBSTRING] [--json FILE] [--threads N] [--min-time SECONDS] [--throughput-time SECONDS] [--no-cpu] [--no-gpu]\n");
            std::exit(0);
        } else throw std::invalid_argument("kiln_bench: unknown argument " + a + " (try --help)");
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options opt = parse(argc, argv);
        if (!opt.first_call.empty())
            return first_call_probe(opt.first_call, opt.first_call_autotune ? kiln::Mode::max_autotune : kiln::Mode::normal);
        Bench b(opt);
        b.header();
        if (opt.cpu) {
            bench_copy(b);  // always: the other rows are reported against it
            bench_gemm_cpu(b);
            bench_chain(b, "chain16M", 16 << 20);
            bench_chain(b, "chain1M", 1 << 20);
            bench_bias_gelu(b);
            bench_colsum(b);
            bench_softmax(b);
            bench_layernorm(b);
            bench_numpy_fn(b);
            bench_blackscholes(b);
            bench_sincos_scalar(b);
            bench_models(b);
            bench_minilm(b);
            b.summary();
            const kiln::CpuCodegenStats cs = kiln::cpu_codegen_stats();
            std::printf("  CPU codegen: %zu kernels built (%.1f s), %zu loaded from disk, %zu matmul calls ran their epilogue inside the GEMM\n",
                        cs.builds, cs.build_ms / 1000.0, cs.disk_hits, cs.matmul_epilogues);
        }
        if (opt.gpu) {
            // a fresh kernel cache, so first calls measure cold compiles (the user's cache is untouched)
            char dir[] = "/tmp/kiln-bench-cache-XXXXXX";
            if (::mkdtemp(dir)) ::setenv("KILN_CACHE_DIR", dir, 1);
            bench_gpu(b, argv[0]);
        }
        if (!b.options().json.empty()) b.write_json(b.options().json);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    if (failed_rows() > 0) {
        std::fprintf(stderr, "kiln_bench: %d group(s) of rows FAILED (printed above)\n", failed_rows());
        return 1;
    }
    return 0;
}
