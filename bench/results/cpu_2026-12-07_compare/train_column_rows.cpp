// compiled training steps of the bench's workloads on the CPU with the fuser's column_rows on and off, alternating
#include "/work/main/bench/train_workloads.hpp"
#include <chrono>
#include <algorithm>
#include <cstdio>
using kiln::Tensor;
int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "mlp_train";
    const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
    struct Side { kiln_bench::Trainer t; std::function<Tensor(const Tensor&, const Tensor&)> step; std::vector<double> ms; };
    std::vector<Side> sides(2);
    for (int k = 0; k < 2; ++k) {
        Side& s = sides[k];
        s.t = kiln_bench::make_trainer(name, kiln::Device::cpu());
        kiln::Options o;
        o.limits.column_rows = k == 0;
        auto* tp = &s.t;
        s.step = kiln::compile([tp](const Tensor& x, const Tensor& y) { return tp->step(x, y); }, o);
    }
    for (auto& s : sides) { s.step(s.t.x, s.t.y); kiln::cpu_codegen_wait(); s.step(s.t.x, s.t.y); }
    for (int i = 0; i < reps; ++i)
        for (auto& s : sides) {
            auto t0 = std::chrono::steady_clock::now();
            s.step(s.t.x, s.t.y);
            s.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
    for (std::size_t k = 0; k < 2; ++k) {
        auto& v = sides[k].ms;
        std::sort(v.begin(), v.end());
        std::printf("%s column_rows=%d: median %.2f ms (min %.2f)\n", name.c_str(), k == 0, v[v.size() / 2], v[0]);
    }
}
