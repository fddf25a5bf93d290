// One rank of the multi-process tests (tests/test_dist.cpp starts N of these through tools/kilnrun).
//
//   kiln_dist_worker collectives --device cpu|cuda
//   kiln_dist_worker train --model mlp|bert --mode eager|compiled|reduce_overhead --device cpu|cuda [--steps N]
//   kiln_dist_worker die --at STEP --mode ... --device ...   (rank 1 exits at STEP; the others must raise DistError)
//                        [--stall S]                        (rank 1 sleeps S seconds at STEP instead: the others time out)
//   kiln_dist_worker no_sync --device cpu|cuda                (DataParallel's no_sync and buffers)
//   kiln_dist_worker mismatch                                 (rank 1 claims world_size + 1)
//   kiln_dist_worker duplicate                                (the last rank claims rank 1 as well)
//
// Every rank prints what it checked; a check that fails prints "FAILED: ..." and exits 1. The
// expected failures (die, mismatch, duplicate) print "EXPECTED DistError: <message>" and exit 0.
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>

#include <kiln/dist.hpp>

using kiln::Tensor;
namespace dist = kiln::dist;

namespace {

std::map<std::string, std::string> args;

std::string arg(const std::string& k, const std::string& d) {
    auto it = args.find(k);
    return it == args.end() ? d : it->second;
}

[[noreturn]] void failed(const std::string& what) {
    std::printf("rank %d FAILED: %s\n", dist::rank(), what.c_str());
    std::fflush(stdout);
    std::exit(1);
}

kiln::Device device() { return arg("device", "cpu") == "cuda" ? kiln::Device::cuda(dist::local_rank()) : kiln::Device::cpu(); }

dist::InitOptions init_options() {
    dist::InitOptions o;
    o.device = arg("device", "cpu") == "cuda" ? kiln::Device::cuda(std::atoi(std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0"))
                                              : kiln::Device::cpu();
    o.timeout_s = std::atof(arg("timeout", "60").c_str());
    return o;
}

/// max |a - b| / max(1, max |b|), on the host in f64.
double rel_diff(const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(kiln::DType::f64).cpu(), y = b.to(kiln::DType::f64).cpu();
    double d = 0, m = 1;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
        d = std::max(d, std::abs(x.item<double>(i) - y.item<double>(i)));
        m = std::max(m, std::abs(y.item<double>(i)));
    }
    return d / m;
}

/// Rank r's input of case c: small integers (products of a few stay exact in every dtype), with a
/// sign and an offset that differ between ranks and cases.
Tensor input(int r, int c, const kiln::Shape& s, kiln::DType dt) {
    const Tensor i = kiln::arange(0, s.numel(), 1, kiln::DType::f64).reshape(s);
    return Tensor((i % 5 + ((r + c) % 3) + 1) * (r % 2 == 0 ? 1.0 : -1.0)).to(dt);
}

void collectives() {
    const int R = dist::world_size(), me = dist::rank();
    const kiln::Device dev = device();
    const kiln::Shape s{6, 5};
    int c = 0;
    for (kiln::DType dt : {kiln::DType::f32, kiln::DType::f64, kiln::DType::bf16, kiln::DType::f16, kiln::DType::i32, kiln::DType::i64}) {
        for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max, dist::ReduceOp::min, dist::ReduceOp::prod}) {
            if (op == dist::ReduceOp::avg && !kiln::is_floating(dt)) continue;
            ++c;
            Tensor t = input(me, c, s, dt).to(dev);
            dist::all_reduce(t, op);
            Tensor ref = input(0, c, s, kiln::DType::f64);  // the reduction in f64 of every rank's input
            for (int r = 1; r < R; ++r) {
                const Tensor x = input(r, c, s, kiln::DType::f64);
                if (op == dist::ReduceOp::sum || op == dist::ReduceOp::avg) ref = Tensor(ref + x);
                if (op == dist::ReduceOp::prod) ref = Tensor(ref * x);
                if (op == dist::ReduceOp::max) ref = Tensor(kiln::maximum(ref, x));
                if (op == dist::ReduceOp::min) ref = Tensor(kiln::minimum(ref, x));
            }
            if (op == dist::ReduceOp::avg) ref = Tensor(ref / static_cast<double>(R));
            const double tol = dt == kiln::DType::bf16 ? 1e-2 : dt == kiln::DType::f16 ? 2e-3 : kiln::is_floating(dt) ? 1e-6 : 0;
            if (const double d = rel_diff(t, ref); !(d <= tol))
                failed(std::string("all_reduce ") + dist::reduce_op_name(op) + " " + std::string(kiln::dtype_name(dt)) + ": off by " + std::to_string(d));
        }
        // broadcast from the last rank, all_gather, reduce_scatter
        Tensor b = input(me, 100, s, dt).to(dev);
        dist::broadcast(b, R - 1);
        if (rel_diff(b, input(R - 1, 100, s, kiln::DType::f64)) != 0) failed("broadcast " + std::string(kiln::dtype_name(dt)));
        const Tensor g = dist::all_gather(input(me, 200, s, dt).to(dev));
        if (!(g.shape() == kiln::Shape{R, 6, 5})) failed("all_gather shape " + g.shape().str());
        for (int r = 0; r < R; ++r)
            if (rel_diff(g.select(0, r), input(r, 200, s, kiln::DType::f64)) != 0) failed("all_gather part " + std::to_string(r));
        const kiln::Shape big{2 * R, 3};
        const Tensor rs = dist::reduce_scatter(input(me, 300, big, dt).to(dev), dist::ReduceOp::sum);
        Tensor full = input(0, 300, big, kiln::DType::f64);
        for (int r = 1; r < R; ++r) full = Tensor(full + input(r, 300, big, kiln::DType::f64));
        if (rel_diff(rs, full.slice(0, 2 * me, 2 * me + 2)) > (dt == kiln::DType::bf16 ? 1e-2 : dt == kiln::DType::f16 ? 2e-3 : 0))
            failed("reduce_scatter " + std::string(kiln::dtype_name(dt)));
    }
    // a non-contiguous tensor, in place
    Tensor m = input(me, 400, kiln::Shape{4, 6}, kiln::DType::f32).to(dev);
    Tensor mt = m.t();
    dist::all_reduce(mt, dist::ReduceOp::sum);
    Tensor mref = input(0, 400, kiln::Shape{4, 6}, kiln::DType::f64);
    for (int r = 1; r < R; ++r) mref = Tensor(mref + input(r, 400, kiln::Shape{4, 6}, kiln::DType::f64));
    if (rel_diff(m, mref) > 1e-6) failed("all_reduce of a transposed view");
    // bool: max is any, min is all
    Tensor flag = Tensor(kiln::full({3}, me == 0 ? 1 : 0, kiln::DType::i32) > 0).to(dev);
    dist::all_reduce(flag, dist::ReduceOp::max);
    if (!flag.cpu().item<bool>(0)) failed("all_reduce max of bool");
    // inside kiln::compile: the collective is a node that runs on every call
    auto f = kiln::compile([](const Tensor& x) {
        Tensor y = x * 2;
        dist::all_reduce(y, dist::ReduceOp::sum);
        return Tensor(y + 1);
    });
    for (int call = 0; call < 3; ++call) {
        const Tensor x = input(me, 500 + call, s, kiln::DType::f32).to(dev);
        Tensor ref = input(0, 500 + call, s, kiln::DType::f64);
        for (int r = 1; r < R; ++r) ref = Tensor(ref + input(r, 500 + call, s, kiln::DType::f64));
        if (rel_diff(f(x), Tensor(ref * 2 + 1)) > 1e-6) failed("all_reduce inside kiln::compile, call " + std::to_string(call));
    }
    dist::barrier();
    // bad input: a typed error naming the op and this file's line
    try {
        Tensor ints = kiln::zeros({2}, kiln::DType::i32, dev);
        dist::all_reduce(ints, dist::ReduceOp::avg);
        failed("avg of an int tensor did not throw");
    } catch (const kiln::DTypeError& e) {
        if (std::string(e.what()).find("kiln::all_reduce: avg needs a floating tensor") == std::string::npos ||
            std::string(e.what()).find("dist_worker.cpp") == std::string::npos)
            failed(std::string("the avg error says: ") + e.what());
    }
    if (dev.is_cuda()) try {
            Tensor host = kiln::zeros({2});
            dist::all_reduce(host);
            failed("a host tensor on a CUDA group did not throw");
        } catch (const kiln::DeviceError& e) {
            if (std::string(e.what()).find("is on cpu but this rank's process group is on cuda") == std::string::npos)
                failed(std::string("the device error says: ") + e.what());
        }
    std::printf("rank %d: collectives ok (%s, %d ranks)\n", me, dist::backend().c_str(), R);
}

// ---------------------------------------------------------------- training
struct Model {
    std::shared_ptr<void> m;
    std::function<Tensor(const Tensor&)> forward;  // through DataParallel where there is one
    std::function<std::vector<Tensor>()> params;
    std::function<std::string()> buckets;  // DataParallel's: "k of n buckets in symmetric windows"
};

/// The model of `name` with weights from seed 1 (the same on every rank and for the reference).
template <class M>
Model make(std::shared_ptr<M> m, bool ddp) {
    Model out;
    out.m = m;
    out.params = [m] { return kiln::nn::parameters(*m); };
    if (ddp) {
        dist::DDPOptions o;
        o.symmetric_memory = arg("symmetric", "0") == "1";  // every bucket in a symmetric window
        o.symmetric_min_mb = 0;
        auto d = std::make_shared<dist::DataParallel<M>>(*m, o);
        out.m = std::shared_ptr<void>(d, d.get());
        auto keep = m;
        out.forward = [d, keep](const Tensor& x) { return (*d)(x); };
        out.buckets = [d] {
            const int k = d->reducer().window_buckets(), n = static_cast<int>(d->reducer().bucket_params().size());
            return std::to_string(k) + " of " + std::to_string(n) + " buckets in symmetric windows" + (k == n ? " (all)" : "");
        };
    } else {
        out.forward = [m](const Tensor& x) { return (*m)(x); };
    }
    return out;
}

Model model(const std::string& name, kiln::Device dev, bool ddp) {
    kiln::manual_seed(1);
    const kiln::nn::Init init{kiln::DType::f32, dev};
    const bool big = dev.is_cuda();
    if (name == "mlp") return make(std::make_shared<kiln::nn::Mlp>(big ? 64 : 16, big ? 256 : 32, big ? 64 : 8, init), ddp);
    return make(std::make_shared<kiln::nn::BertLayer>(big ? 256 : 32, 4, big ? 1024 : 64, 1e-5, init), ddp);
}

/// The global batch of step s (the same on every rank): x and a target a fixed map of x gives
/// (so the loss can go down).
std::pair<Tensor, Tensor> batch(const std::string& name, int s, int world, kiln::Device dev) {
    const bool big = dev.is_cuda();
    const std::int64_t per = name == "mlp" ? (big ? 32 : 8) : 2, in = name == "mlp" ? (big ? 64 : 16) : (big ? 256 : 32),
                       out = name == "mlp" ? (big ? 64 : 8) : in, S = big ? 64 : 6;
    kiln::manual_seed(999);
    const Tensor teacher = Tensor(kiln::randn({in, out}) / std::sqrt(static_cast<double>(in)));
    kiln::manual_seed(1000 + static_cast<std::uint64_t>(s));
    const Tensor x = name == "mlp" ? kiln::randn({per * world, in}) : kiln::randn({per * world, S, in});
    return {x.to(dev), Tensor(kiln::tanh(kiln::matmul(x, teacher))).to(dev)};
}

/// Trains `steps` steps with AdamW and MSE; each rank takes its rows of every global batch
/// (the reference, world = 1, takes them all). Returns the final parameters and losses.
std::pair<std::vector<Tensor>, std::vector<float>> train(const std::string& name, const std::string& mode, int steps, bool ddp, int die_at) {
    const kiln::Device dev = device();
    const int world = ddp ? dist::world_size() : 1, me = ddp ? dist::rank() : 0;
    Model m = model(name, dev, ddp);
    // AdamW for the MLP; SGD with momentum for the BERT layer, whose attention key bias has a
    // gradient of exactly zero in exact arithmetic (softmax ignores a constant per query): Adam
    // scales the rounding noise in it up to steps of size lr, which differ between any two
    // summation orders, DDP's or not
    std::unique_ptr<kiln::nn::Optimizer> opt;
    if (name == "mlp") opt = std::make_unique<kiln::nn::AdamW>(m.params(), kiln::nn::AdamW::Options{.lr = 1e-3});
    else opt = std::make_unique<kiln::nn::SGD>(m.params(), kiln::nn::SGD::Options{.lr = 0.05, .momentum = 0.9});
    auto step = [&](const Tensor& x, const Tensor& y) {
        opt->zero_grad();
        Tensor loss = kiln::nn::mse_loss(m.forward(x), y);
        loss.backward();
        opt->step();
        return loss.detach();
    };
    std::function<Tensor(const Tensor&, const Tensor&)> run = step;
    if (mode != "eager") {
        kiln::Options o;
        if (mode == "reduce_overhead") o.mode = kiln::Mode::reduce_overhead;
        auto c = std::make_shared<kiln::Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>>(
            kiln::compile(std::function<Tensor(const Tensor&, const Tensor&)>(step), o));
        run = [c](const Tensor& x, const Tensor& y) { return (*c)(x, y); };
    }
    std::vector<float> losses;
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
        if (s == die_at && me == 1) {
            if (const double stall = std::atof(arg("stall", "0").c_str()); stall > 0) {  // alive, but late: the others time out
                std::printf("rank 1: stalling %.1f s at step %d\n", stall, s);
                std::fflush(stdout);
                std::this_thread::sleep_for(std::chrono::duration<double>(stall));
            } else {
                std::printf("rank 1: exiting at step %d without a goodbye\n", s);
                std::fflush(stdout);
                ::_exit(3);
            }
        }
        auto [x, y] = batch(name, s, dist::world_size(), dev);  // the global batch (the reference takes all of it)
        const std::int64_t per = x.size(0) / world;
        const Tensor xs = x.slice(0, me * per, (me + 1) * per).contiguous(), ys = y.slice(0, me * per, (me + 1) * per).contiguous();
        losses.push_back(run(xs, ys).item<float>());
    }
    if (die_at >= 0) failed("no DistError in " + std::to_string(steps) + " steps after rank 1 exited");
    if (ddp) std::printf("rank %d: %s\n", me, m.buckets().c_str());
    (void)t0;
    std::vector<Tensor> ps;
    for (const Tensor& p : m.params()) ps.push_back(p.detach().cpu());
    return {ps, losses};
}

void train_check() {
    const std::string name = arg("model", "mlp"), mode = arg("mode", "eager");
    const int steps = std::atoi(arg("steps", "20").c_str());
    auto [ps, losses] = train(name, mode, steps, true, -1);
    // every rank holds the same parameters: their sum over the ranks is world_size times this rank's
    for (std::size_t i = 0; i < ps.size(); ++i) {
        Tensor mine = ps[i].to(dist::device()), sum = mine.clone();
        dist::all_reduce(sum, dist::ReduceOp::sum);
        if (rel_diff(sum, Tensor(mine * static_cast<double>(dist::world_size()))) > 1e-6)
            failed("parameter " + std::to_string(i) + " differs between ranks");
    }
    if (dist::rank() == 0) {
        auto [ref, ref_losses] = train(name, mode, steps, false, -1);
        double worst = 0;
        std::size_t worst_i = 0;
        for (std::size_t i = 0; i < ps.size(); ++i)
            if (const double d = rel_diff(ps[i], ref[i]); d > worst) {
                worst = d;
                worst_i = i;
            }
        std::printf("rank 0: the largest difference is in parameter %zu of %zu, shape %s\n", worst_i, ps.size(), ps[worst_i].shape().str().c_str());
        const double tol = std::atof(arg("tol", "1e-4").c_str());
        std::printf("rank 0: %s %s, %d ranks, %d steps: loss %.6f -> %.6f; parameters vs one process on the global batch: %.3g (tolerance %.g)\n",
                    name.c_str(), mode.c_str(), dist::world_size(), steps, losses.front(), losses.back(), worst, tol);
        if (!(worst <= tol)) failed("DDP parameters differ from the single-process reference by " + std::to_string(worst));
        if (!(losses.back() < losses.front())) failed("the loss did not go down");
    }
    std::printf("rank %d: train ok\n", dist::rank());
}

void die() {
    const auto t0 = std::chrono::steady_clock::now();
    try {
        train(arg("model", "mlp"), arg("mode", "eager"), 1000000, true, std::atoi(arg("at", "3").c_str()));
    } catch (const kiln::DistError& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("rank %d EXPECTED DistError after %.2f s: %s\n", dist::rank(), s, e.what());
        std::fflush(stdout);
        std::exit(0);
    }
}

/// no_sync accumulates locally and the next backward averages the sum; before_forward brings rank
/// 0's buffers to every rank.
void no_sync_and_buffers() {
    const kiln::Device dev = device();
    const int me = dist::rank();
    auto batch_of = [&](int micro) {
        kiln::manual_seed(50 + 10 * static_cast<std::uint64_t>(me) + static_cast<std::uint64_t>(micro));  // different on every rank
        return std::pair{kiln::randn({4, 16}).to(dev), kiln::randn({4, 8}).to(dev)};
    };
    kiln::manual_seed(1);
    kiln::nn::Mlp m(16, 32, 8, {kiln::DType::f32, dev}), local = m;
    local.fc1.weight = m.fc1.weight.clone();
    local.fc1.bias = m.fc1.bias.clone();
    local.fc2.weight = m.fc2.weight.clone();
    local.fc2.bias = m.fc2.bias.clone();
    dist::DataParallel ddp(m);
    (void)kiln::nn::parameters(local);
    auto grads_equal_on_every_rank = [&](const Tensor& g) {
        const Tensor all = dist::all_gather(g);
        for (int r = 1; r < dist::world_size(); ++r)
            if (rel_diff(all.select(0, r), all.select(0, 0)) > 0) return false;
        return true;
    };
    {
        auto off = ddp.no_sync();
        auto [x, y] = batch_of(0);
        kiln::nn::mse_loss(ddp(x), y).backward();
        if (grads_equal_on_every_rank(m.fc1.weight.grad())) failed("no_sync: the gradients were averaged");
    }
    auto [x1, y1] = batch_of(1);
    kiln::nn::mse_loss(ddp(x1), y1).backward();
    // the expected gradient: this rank's two micro-batches accumulated, averaged over the ranks
    for (int micro : {0, 1}) {
        auto [x, y] = batch_of(micro);
        kiln::nn::mse_loss(local(x), y).backward();
    }
    for (auto [got, mine] : {std::pair{m.fc1.weight.grad(), local.fc1.weight.grad()}, std::pair{m.fc2.bias.grad(), local.fc2.bias.grad()}}) {
        Tensor expected = mine.clone();
        dist::all_reduce(expected, dist::ReduceOp::avg);
        if (rel_diff(got, expected) > 1e-6) failed("no_sync then a synced backward: off by " + std::to_string(rel_diff(got, expected)));
    }
    // buffers: every rank gets rank 0's at construction and before each forward
    kiln::nn::BatchNorm2d bn(3, {kiln::DType::f32, dev});
    bn.running_mean.fill_(static_cast<double>(me + 1));
    dist::DataParallel dbn(bn);
    if (bn.running_mean.cpu().item<float>(0) != 1.0f) failed("buffers after construction are not rank 0's");
    bn.running_var.fill_(static_cast<double>(10 + me));
    dbn.before_forward();
    if (bn.running_var.cpu().item<float>(2) != 10.0f) failed("buffers before a forward are not rank 0's");
    std::printf("rank %d: no_sync and buffers ok\n", me);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: kiln_dist_worker collectives|train|die|mismatch|duplicate [--key value]...\n");
        return 2;
    }
    const std::string cmd = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) args[std::string(argv[i]).substr(2)] = argv[i + 1];
    try {
        if (cmd == "mismatch" || cmd == "duplicate") {
            int rank = std::atoi(std::getenv("RANK")), world = std::atoi(std::getenv("WORLD_SIZE"));
            if (cmd == "mismatch" && rank == 1) world += 1;
            if (cmd == "duplicate" && rank == world - 1) rank = 1;
            try {
                dist::init(rank, world, init_options());
            } catch (const kiln::DistError& e) {
                std::printf("rank %d EXPECTED DistError: %s\n", rank, e.what());
                return 0;
            }
            std::printf("rank %d FAILED: init succeeded\n", rank);
            return 1;
        }
        dist::init_from_env(init_options());
        if (cmd == "collectives") collectives();
        else if (cmd == "train") train_check();
        else if (cmd == "die") die();
        else if (cmd == "no_sync") no_sync_and_buffers();
        else failed("unknown command " + cmd);
        dist::destroy();
    } catch (const std::exception& e) {
        std::printf("rank %d FAILED: %s\n", dist::rank(), e.what());
        return 1;
    }
    return 0;
}
