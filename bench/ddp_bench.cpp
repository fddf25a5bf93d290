// kiln_ddp_bench: training-step throughput of bench/train_workloads.hpp's workloads on one GPU
// and, started through tools/kilnrun, data-parallel (kiln::dist::DataParallel over NCCL) on
// several; the per-GPU batch stays the bench's, so N GPUs train N times the samples per step.
//
//   build/.../bench/kiln_ddp_bench --json one.json                       (one process: no DataParallel)
//   tools/kilnrun --nproc 2 build/.../bench/kiln_ddp_bench --json two.json
//   python3 bench/ddp_report.py --kiln one.json two.json --torch t1.json t2.json   (scaling, kiln vs torch)
//
// Options: --workloads mlp_train,bert_layer_train,resnet18_train  --methods compiled,reduce_overhead
// (eager too)  --min-time 0.3 (seconds per throughput run)  --ddp (DataParallel also for one process)
// --bucket-mb 25 --first-bucket-mb 1 --broadcast-buffers 1 --symmetric 0 (DDPOptions; --symmetric 1:
// buckets in NCCL symmetric windows)  --batch N (per-GPU batch; default: the
// workload's, bench/train_workloads.hpp).
// Timing, the same on every rank (collectives need every rank to take the same steps): latency =
// CUDA events around each step, synchronized after each (20 steps, median); throughput = n steps
// back to back between two events after a barrier, n fixed by rank 0 from the latency so a run
// lasts >= min-time, median of 5 runs, per step. Rank 0 writes the JSON: per row the step time,
// samples per second over all ranks, peak device memory and the first step (trace and compile).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/backends/cuda/nccl.hpp>
#include <kiln/dist.hpp>

#include "train_workloads.hpp"

namespace {

using kiln::Tensor;
namespace dist = kiln::dist;
using kiln_bench::Trainer;

/// The forward through a DataParallel over the module.
struct DataParallelWrap {
    dist::DDPOptions options;
    template <class M, class F>
    std::function<Tensor(const Tensor&)> operator()(const std::shared_ptr<M>& m, F forward, std::shared_ptr<void>& keep) const {
        auto d = std::make_shared<dist::DataParallel<M>>(*m, options);
        keep = d;
        return [m, d, forward](const Tensor& x) {
            d->before_forward();
            return forward(*m, x);
        };
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');)
        if (!x.empty()) out.push_back(x);
    return out;
}

struct Row {
    std::string workload, method, math;
    int world = 1;
    std::int64_t batch = 0;  // per GPU
    double step_us = 0, latency_us = 0, samples_per_s = 0, peak_mib = 0, first_ms = 0, tflops = 0;
    float loss_first = 0, loss_last = 0;
};

Row run(const std::string& name, const std::string& method, bool ddp, double min_time, const dist::DDPOptions& options, std::int64_t batch) {
    const kiln::Device dev = dist::device();
    const int dv = dev.index;
    kiln::cuda::set_allow_tf32(name == "resnet18_train");
    Trainer t = ddp ? kiln_bench::make_trainer(name, dev, DataParallelWrap{options}, batch)
                    : kiln_bench::make_trainer(name, dev, kiln_bench::Plain{}, batch);
    std::function<Tensor()> step;
    std::shared_ptr<kiln::Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>> c;
    if (method == "eager") {
        step = [&t] { return t.step(t.x, t.y); };
    } else {
        kiln::Options o;
        if (method == "reduce_overhead") o.mode = kiln::Mode::reduce_overhead;
        c = std::make_shared<kiln::Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>>(kiln::compile(
            std::function<Tensor(const Tensor&, const Tensor&)>([&t](const Tensor& x, const Tensor& y) { return t.step(x, y); }), o));
        step = [&t, c] { return (*c)(t.x, t.y); };
    }
    Row r;
    r.workload = name;
    r.method = method;
    r.math = t.math;
    r.world = dist::world_size();
    r.batch = t.x.size(0);
    dist::barrier();
    const auto t0 = std::chrono::steady_clock::now();
    r.loss_first = step().item<float>();
    r.first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < 3; ++i) step();
    kiln::cuda::synchronize(dv);
    kiln::cuda::reset_peak_memory_stats(dv);
    const kiln::cuda::CUstream s = kiln::cuda::current_stream(dv);
    kiln::cuda::Event e0(dv), e1(dv);
    std::vector<double> lat;
    dist::barrier();
    for (int i = 0; i < 20; ++i) {
        e0.record(s);
        step();
        e1.record(s);
        lat.push_back(1e3 * e1.elapsed_ms(e0));
    }
    r.latency_us = median(lat);
    // n from rank 0's latency, the same on every rank
    Tensor n = kiln::full({1}, std::ceil(min_time * 1e6 / std::max(1.0, r.latency_us)), kiln::DType::f64, dev);
    dist::broadcast(n, 0);
    const int steps = std::max(3, static_cast<int>(n.item<double>()));
    std::vector<double> per;
    Tensor loss;
    for (int k = 0; k < 5; ++k) {
        dist::barrier();
        e0.record(s);
        for (int i = 0; i < steps; ++i) loss = step();
        e1.record(s);
        per.push_back(1e3 * e1.elapsed_ms(e0) / steps);
    }
    r.step_us = median(per);
    r.loss_last = loss.item<float>();
    r.samples_per_s = static_cast<double>(r.batch) * r.world / (r.step_us * 1e-6);
    r.tflops = t.flops / (r.step_us * 1e6);
    r.peak_mib = static_cast<double>(kiln::cuda::memory_stats(dv).peak_bytes_in_use) / (1 << 20);
    if (!std::isfinite(r.loss_last)) throw std::runtime_error("kiln_ddp_bench: " + name + " " + method + ": the loss is not finite");
    if (method == "reduce_overhead" && dist::rank() == 0) {
        const kiln::cuda::GraphStats gs = kiln::cuda::graph_stats();
        std::printf("  CUDA graphs so far: %zu captured, %zu replays, %zu calls without a graph; %d kernels per step\n", gs.captures, gs.replays,
                    gs.fallbacks, c ? c->kernels() : 0);
    }
    kiln::cuda::set_allow_tf32(false);
    return r;
}

std::string json_row(const Row& r) {
    std::ostringstream o;
    o << "{\"workload\": \"" << r.workload << "\", \"method\": \"" << r.method << "\", \"math\": \"" << r.math << "\", \"world_size\": " << r.world
      << ", \"batch_per_gpu\": " << r.batch << ", \"step_us\": " << r.step_us << ", \"latency_us\": " << r.latency_us
      << ", \"samples_per_s\": " << r.samples_per_s << ", \"tflops_per_gpu\": " << r.tflops << ", \"peak_mem_mib\": " << r.peak_mib
      << ", \"first_step_ms\": " << r.first_ms << ", \"loss_first\": " << r.loss_first << ", \"loss_last\": " << r.loss_last << "}";
    return o.str();
}

}  // namespace

int main(int argc, char** argv) {
    std::map<std::string, std::string> a{{"workloads", "mlp_train,bert_layer_train,resnet18_train"},
                                         {"methods", "compiled,reduce_overhead"},
                                         {"min-time", "0.3"},
                                         {"bucket-mb", "25"},
                                         {"first-bucket-mb", "1"},
                                         {"batch", "0"},
                                         {"broadcast-buffers", "1"},
                                         {"symmetric", "0"},
                                         {"json", ""}};
    bool force_ddp = false;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (k == "--ddp") force_ddp = true;
        else if (k.rfind("--", 0) == 0 && i + 1 < argc) a[k.substr(2)] = argv[++i];
        else {
            std::fprintf(stderr, "kiln_ddp_bench: unknown argument %s\n", k.c_str());
            return 2;
        }
    }
    try {
        if (kiln::cuda::device_count() == 0) {
            std::printf("kiln_ddp_bench: no CUDA device; nothing to measure\n");
            return 0;
        }
        dist::init_from_env();
        const bool ddp = force_ddp || dist::world_size() > 1;
        dist::DDPOptions options;
        options.bucket_cap_mb = std::atof(a["bucket-mb"].c_str());
        options.first_bucket_mb = std::atof(a["first-bucket-mb"].c_str());
        options.broadcast_buffers = a["broadcast-buffers"] != "0";
        options.symmetric_memory = a["symmetric"] != "0";
        std::vector<Row> rows;
        for (const std::string& w : split(a["workloads"]))
            for (const std::string& m : split(a["methods"])) {
                rows.push_back(run(w, m, ddp, std::atof(a["min-time"].c_str()), options, std::atoll(a["batch"].c_str())));
                const Row& r = rows.back();
                if (dist::rank() == 0)
                    std::printf("%-17s %-16s %d GPU%s %s: step %9.1f us (latency %9.1f), %9.0f samples/s, %6.1f TFLOP/s per GPU, peak %7.1f MiB, "
                                "first step %7.0f ms, loss %.4f -> %.4f\n",
                                r.workload.c_str(), r.method.c_str(), r.world, r.world > 1 ? "s" : " ", ddp ? "DataParallel" : "plain",
                                r.step_us, r.latency_us, r.samples_per_s, r.tflops, r.peak_mib, r.first_ms, r.loss_first, r.loss_last);
                std::fflush(stdout);
            }
        if (dist::rank() == 0 && !a["json"].empty()) {
            std::ofstream f(a["json"]);
            const kiln::cuda::DeviceProperties& p = kiln::cuda::properties(dist::device().index);
            f << "{\"meta\": {\"tool\": \"kiln_ddp_bench\", \"gpu\": \"" << p.name << "\", \"world_size\": " << dist::world_size()
              << ", \"data_parallel\": " << (ddp ? "true" : "false") << ", \"nccl\": " << kiln::cuda::nccl::version() << "},\n \"rows\": [\n";
            for (std::size_t i = 0; i < rows.size(); ++i) f << "  " << json_row(rows[i]) << (i + 1 < rows.size() ? ",\n" : "\n");
            f << " ]}\n";
        }
        dist::destroy();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln_ddp_bench (rank %d): %s\n", dist::rank(), e.what());
        return 1;
    }
    return 0;
}
