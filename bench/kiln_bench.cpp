// kiln_bench: the workloads of the README, each timed per method (eager, fused, peers) and thread
// count, reported as medians, GB/s, % of the measured copy bandwidth and speedup over kiln eager.
//
//   kiln_bench [--filter SUBSTRING] [--json FILE] [--threads N] [--min-time SECONDS]
//
// Every row is checked against eager before it is timed. Later issues add rows through
// `Bench::row`; keep one lambda per (workload, method).
#include <kiln/kiln.hpp>
#include <kiln/interop/eigen.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
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
    int min_repeats = 7;
};

struct Row {
    std::string workload, method, device = "cpu";
    int threads = 1;
    double median_us = 0, min_us = 0, first_call_us = 0, bytes = 0;
    int repeats = 0;
    double gbps() const { return bytes / (median_us * 1e3); }
};

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

class Bench {
public:
    explicit Bench(Options o) : opt_(std::move(o)) {}
    const Options& options() const { return opt_; }

    bool wanted(const std::string& name) const { return opt_.filter.empty() || name.find(opt_.filter) != std::string::npos; }
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
        fn();  // warm-up: caches, page faults, pool spin-up
        std::vector<double> times;
        const auto start = Clock::now();
        while (static_cast<int>(times.size()) < min_repeats || (seconds_since(start) < opt_.min_time && min_repeats > 1)) {
            t0 = Clock::now();
            fn();
            times.push_back(seconds_since(t0));
            if (times.size() >= 2000) break;
        }
        std::sort(times.begin(), times.end());
        Row r;
        r.workload = workload;
        r.method = method;
        r.threads = threads;
        r.bytes = bytes;
        r.repeats = static_cast<int>(times.size());
        r.median_us = times[times.size() / 2] * 1e6;
        r.min_us = times.front() * 1e6;
        r.first_call_us = first * 1e6;
        rows_.push_back(r);
        print(r);
    }

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
        std::printf("%-22s %-8s %3s %12s %12s %9s %8s %10s\n", "workload", "method", "thr", "median_us", "first_us",
                    "GB/s", "%copy", "vs eager");
    }

    void print(const Row& r) const {
        const double copy = copy_bandwidth(r.threads);
        const double eager = eager_us(r.workload, r.threads);
        char pct[16] = "-", sp[16] = "-";
        if (copy > 0) std::snprintf(pct, sizeof pct, "%.0f%%", 100 * r.gbps() / copy);
        if (eager > 0) std::snprintf(sp, sizeof sp, "%.2fx", eager / r.median_us);
        std::printf("%-22s %-8s %3d %12.1f %12.1f %9.2f %8s %10s\n", r.workload.c_str(), r.method.c_str(), r.threads,
                    r.median_us, r.first_call_us, r.gbps(), pct, sp);
        std::fflush(stdout);
    }

    double eager_us(const std::string& workload, int threads) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.method == "eager" && r.threads == threads) return r.median_us;
        return 0;
    }
    double median_us(const std::string& workload, const std::string& method, int threads) const {
        for (const Row& r : rows_)
            if (r.workload == workload && r.method == method && r.threads == threads) return r.median_us;
        return 0;
    }

    void summary() const {
        std::printf("\nsummary\n");
        for (const char* w : {"chain16M", "chain1M", "bias_gelu", "softmax", "layernorm", "numpy_fn", "sincos_scalar"}) {
            for (int t : thread_counts()) {
                const double e = median_us(w, "eager", t), f = median_us(w, "fused", t), c = median_us(w, "compiled", t);
                if (e > 0 && f > 0) std::printf("  %-13s %d thr: fused %.2fx faster than eager", w, t, e / f);
                if (e > 0 && c > 0) std::printf(", compiled %.2fx faster than eager, compiled/fused time %.2f", e / c, c / f);
                if (e > 0 && f > 0) std::printf("\n");
            }
        }
        const auto tc = thread_counts();
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

    void write_json(const std::string& path) const {
        std::ofstream f(path);
        if (!f) throw std::runtime_error("kiln_bench: cannot write " + path);
        f << "[\n";
        for (std::size_t i = 0; i < rows_.size(); ++i) {
            const Row& r = rows_[i];
            const double copy = copy_bandwidth(r.threads), eager = eager_us(r.workload, r.threads);
            f << "  {\"workload\": \"" << r.workload << "\", \"method\": \"" << r.method << "\", \"device\": \"" << r.device
              << "\", \"threads\": " << r.threads << ", \"median_us\": " << r.median_us << ", \"min_us\": " << r.min_us
              << ", \"first_call_us\": " << r.first_call_us << ", \"repeats\": " << r.repeats << ", \"bytes\": " << r.bytes
              << ", \"gbps\": " << r.gbps();
            if (copy > 0) f << ", \"pct_copy\": " << 100 * r.gbps() / copy;
            if (eager > 0) f << ", \"speedup_vs_eager\": " << eager / r.median_us;
            f << "}" << (i + 1 < rows_.size() ? "," : "") << "\n";
        }
        f << "]\n";
        std::printf("\nwrote %zu rows to %s\n", rows_.size(), path.c_str());
    }

private:
    Options opt_;
    std::vector<Row> rows_;
    std::map<int, double> copy_gbps_;
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
    for (int t : b.thread_counts()) {
        b.row(name, "eager", t, bytes, [&] { y = kiln::eager(chain_expr(x)); });
        b.row(name, "fused", t, bytes, [&] { y.assign(chain_expr(x)); });
        auto compiled = kiln::compile([](const Tensor& v) { return Tensor(chain_expr(v)); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
        // The Eigen peer: the same chain as an Eigen array expression, split into contiguous
        // chunks over the same pool (Eigen does not thread coefficient-wise expressions itself).
        b.row(name, "eigen", t, bytes, [&] {
            const float* px = x.data<float>();
            float* py = y.data<float>();
            kiln::detail::parallel_for(n, 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
                Eigen::Map<const Eigen::ArrayXf> ex(px + lo, hi - lo);
                Eigen::Map<Eigen::ArrayXf> ey(py + lo, hi - lo);
                ey = (ex * 1.5f + 0.5f).max(0.0f) * ex.logistic() - (ex * 0.1f).tanh() + (-ex * ex).exp();
            });
        });
    }
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
        b.row(name, "fused", t, bytes, [&] { y.assign(kiln::gelu_tanh(x + bias)); });
        auto compiled = kiln::compile([&](const Tensor& v) { return Tensor(kiln::gelu_tanh(v + bias)); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
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
        b.row(name, "fused", t, bytes, [&] { y = kiln::softmax(x); });
        auto compiled = kiln::compile([](const Tensor& v) { return kiln::softmax(v); });
        b.row(name, "compiled", t, bytes, [&] { y = compiled(x); });
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
        b.row(name, "fused", t, bytes, [&] { y = kiln::layer_norm(x, 1, w, bias); });
        auto compiled = kiln::compile([&](const Tensor& v) { return kiln::layer_norm(v, 1, w, bias); });
        b.row(name, "compiled", t, bytes, [&] {
            y = compiled(x);
        });
        check_close(name + " compiled", y, layernorm_eager(x, w, bias), 1e-5);
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
        else if (a == "--help" || a == "-h") {
            std::printf("usage: kiln_bench [--filter SUBSTRING] [--json FILE] [--threads N] [--min-time SECONDS]\n");
            std::exit(0);
        } else throw std::invalid_argument("kiln_bench: unknown argument " + a + " (try --help)");
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        Bench b(parse(argc, argv));
        b.header();
        bench_copy(b);  // always: the other rows are reported against it
        bench_chain(b, "chain16M", 16 << 20);
        bench_chain(b, "chain1M", 1 << 20);
        bench_bias_gelu(b);
        bench_softmax(b);
        bench_layernorm(b);
        bench_numpy_fn(b);
        bench_sincos_scalar(b);
        b.summary();
        if (!b.options().json.empty()) b.write_json(b.options().json);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
