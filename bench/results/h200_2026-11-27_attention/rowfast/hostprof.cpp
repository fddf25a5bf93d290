// Host time per call of compiled CUDA programs, split per executor step (no synchronize inside):
// built header-only against a copy of fuse/execute.hpp that accumulates each step's host time.
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>
#include <kiln/compile.hpp>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <execinfo.h>
#include <unistd.h>
#include "../../bench/train_workloads.hpp"
using namespace kiln;
using clk = std::chrono::steady_clock;
static double since(clk::time_point t) { return std::chrono::duration<double, std::micro>(clk::now() - t).count(); }

template <class F> void report(const char* name, F&& f, int n = 300) {
    for (int i = 0; i < 30; ++i) (void)f();
    cuda::synchronize(0);
    auto& hp = fuse::host_prof();
    hp = fuse::HostProf{};
    hp.on = true;
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) (void)f();
    const double host = since(t0) / n;
    cuda::synchronize(0);
    const double all = since(t0) / n;
    hp.on = false;
    double sum = 0;
    for (double u : hp.us) sum += u;
    std::printf("== %s: host %.1f us/call, back to back %.1f us/call; execute() %.1f us (%ld top calls/iter), steps %.1f us, nested executes %.1f us (%.1f per iter)\n",
                name, host, all, hp.total / n, hp.calls / n, sum / n, hp.nested / n, double(hp.nested_n) / n);
    for (std::size_t k = 0; k < hp.us.size(); ++k) std::printf("   %3zu %7.2f us  %s\n", k, hp.us[k] / n, hp.what[k].c_str());
}
template <class F> void micro(const char* name, F&& f, int n = 2000) {
    for (int i = 0; i < 50; ++i) (void)f();
    cuda::synchronize(0);
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) (void)f();
    const double host = since(t0) / n;
    cuda::synchronize(0);
    std::printf("-- %s: host %.2f us/call, back to back %.2f\n", name, host, since(t0) / n);
}

static void on_segv(int) { void* b[64]; int n = backtrace(b, 64); backtrace_symbols_fd(b, n, 2); _exit(3); }
int main() {
    std::signal(SIGSEGV, on_segv);
    std::fprintf(stderr, "start\n");
    manual_seed(7);
    const Device dev = Device::cuda();
    for (auto [dt, b, s] : {std::tuple{DType::bf16, 8, 128}, std::tuple{DType::bf16, 1, 8}, std::tuple{DType::f32, 1, 8}}) {
        auto mod = std::make_shared<nn::BertLayer>(768, 12, 3072, 1e-5, nn::Init{dt, dev});
        Tensor x = randn({b, s, 768}).to(dt).to(dev);
        auto c = compile(std::function<Tensor(const Tensor&)>([mod](const Tensor& t) { return (*mod)(t); }));
        char nm[96];
        std::snprintf(nm, sizeof nm, "bert_layer %s %dx%d compiled", std::string(dtype_name(dt)).c_str(), b, s);
        report(nm, [&] { return c(x); });
    }
    {
        kiln_bench::Trainer t = kiln_bench::make_trainer("mlp_train", dev);
        auto c = kiln::compile(std::function<Tensor(const Tensor&, const Tensor&)>([&t](const Tensor& x, const Tensor& y) { return t.step(x, y); }));
        report("mlp_train compiled", [&] { return c(t.x, t.y); }, 200);
    }
    {
        Tensor a = randn({1024, 768}).to(DType::bf16).to(dev), w = randn({768, 768}).to(DType::bf16).to(dev);
        micro("cuda matmul bf16 1024x768x768 (eager)", [&] { return matmul(a, w); });
        Tensor q = randn({8, 128, 2304}).to(DType::bf16).to(dev);
        Tensor v = q.slice(2, 0, 768).view({8, 128, 12, 64}).permute({0, 2, 1, 3});
        micro("contiguous of q's head view (eager)", [&] { return v.contiguous(); });
        Tensor e = randn({8, 128, 768}).to(dev);
        micro("eager a + a (f32 8x128x768)", [&] { return Tensor(e + e); });
        micro("eager empty (8x128x768) alloc", [&] { return Tensor({8, 128, 768}, DType::f32, dev); });
    }
}
