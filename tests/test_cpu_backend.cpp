// CPU backend: the thread pool (every task once, exceptions reach the caller, restarts, nesting,
// concurrent callers), parallel_for coverage, collapsing of iteration spaces, strided / broadcast /
// converting gathers and scatters, and results that do not depend on the thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <kiln/kiln.hpp>

#if defined(__linux__)
#include <sched.h>
#endif

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Strides;
using kiln::Tensor;
using kiln::detail::Access;
using kiln::detail::IterSpace;

/// Turns a hang into a failure: if the guarded scope does not finish in time, the test binary
/// prints what hung and exits (a deadlocked pool would otherwise block ctest until its timeout).
class Watchdog {
public:
    explicit Watchdog(std::string what, std::chrono::seconds limit = std::chrono::seconds(60))
        : what_(std::move(what)), thread_([this, limit] {
              std::unique_lock lock(m_);
              if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
                  std::fprintf(stderr, "\ntest_cpu_backend: HANG: \"%s\" did not finish within %lld s\n", what_.c_str(),
                               static_cast<long long>(limit.count()));
                  std::fflush(stderr);
                  std::_Exit(3);
              }
          }) {}
    ~Watchdog() {
        {
            std::lock_guard lock(m_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

private:
    std::string what_;
    std::mutex m_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;  // last: starts once the members it uses exist
};

/// Restores the thread count a test changed.
struct ThreadCountGuard {
    int saved = kiln::num_threads();
    ~ThreadCountGuard() { kiln::set_num_threads(saved); }
};

kiln::detail::ThreadPool& pool() { return kiln::detail::thread_pool(); }

/// Runs `tasks` tasks on the pool and checks that each ran exactly once.
void check_each_task_once(std::int64_t tasks) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
    pool().run(tasks, [&](std::int64_t t) { hits[static_cast<std::size_t>(t)].fetch_add(1, std::memory_order_relaxed); });
    int wrong = 0;
    for (auto& h : hits) wrong += h.load() != 1;
    CHECK_MESSAGE(wrong == 0, tasks << " tasks on " << kiln::num_threads() << " threads: " << wrong << " not run exactly once");
}

struct TaskError : std::runtime_error {
    std::int64_t task;
    explicit TaskError(std::int64_t t) : std::runtime_error("task " + std::to_string(t) + " failed"), task(t) {}
};

/// Fresh random floats in [-4, 4) away from zero.
Tensor random_tensor(const Shape& s, DType d = DType::f32) {
    const Tensor u = kiln::rand(s, DType::f64);
    return Tensor(kiln::cast(kiln::where(u < 0.5, -0.25 - 7.5 * u, 0.25 + 7.5 * (u - 0.5)), d));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() &&
           std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

// ============================================================================ thread pool

TEST_CASE("a pool that was just (re)started runs its first job at once (no lost wake-up)") {
    Watchdog dog("run() right after set_num_threads()", std::chrono::seconds(30));
    ThreadCountGuard guard;
    for (int rep = 0; rep < 100; ++rep) {
        kiln::set_num_threads(2 + rep % 3);
        check_each_task_once(4);  // immediately: the new workers may not have started yet
    }
    for (int rep = 0; rep < 50; ++rep) {
        kiln::detail::ThreadPool local(3);  // constructed and destroyed at once, or used at once
        if (rep % 2) {
            std::atomic<int> n{0};
            local.run(6, [&](std::int64_t) { ++n; });
            CHECK(n.load() == 6);
        }
    }
}

TEST_CASE("a pool whose workers went to sleep wakes up for the next job") {
    Watchdog dog("run() after the workers slept", std::chrono::seconds(30));
    ThreadCountGuard guard;
    kiln::set_num_threads(3);
    for (int rep = 0; rep < 40; ++rep) {
        // longer than the workers spin before they block (ThreadPool::spin_time)
        std::this_thread::sleep_for(kiln::detail::ThreadPool::spin_time * 2 + std::chrono::microseconds(rep * 50));
        check_each_task_once(3 + rep % 5);
    }
}

TEST_CASE("run: every task exactly once, for any task count and thread count") {
    Watchdog dog("run() task counts");
    ThreadCountGuard guard;
    for (int threads : {1, 2, 3, 4}) {
        kiln::set_num_threads(threads);
        CHECK(kiln::num_threads() == threads);
        CHECK(pool().num_threads() == threads);
        for (std::int64_t tasks : {0, 1, 2, 3, 5, 16, 17, 100, 1000, 4099}) check_each_task_once(tasks);
        for (int rep = 0; rep < 50; ++rep) check_each_task_once(rep % 9 + 1);  // back-to-back jobs
    }
    kiln::set_num_threads(0);  // clamped to 1
    CHECK(kiln::num_threads() == 1);
    check_each_task_once(10);
}

TEST_CASE("run: the work is shared by the workers, and runs on the caller alone with one thread") {
    Watchdog dog("run() thread ids");
    ThreadCountGuard guard;
    auto thread_ids = [](std::int64_t tasks) {
        std::mutex m;
        std::set<std::thread::id> ids;
        pool().run(tasks, [&](std::int64_t) {
            std::this_thread::sleep_for(std::chrono::microseconds(500));
            std::lock_guard lock(m);
            ids.insert(std::this_thread::get_id());
        });
        return ids;
    };
    kiln::set_num_threads(1);
    const auto one = thread_ids(20);
    CHECK(one.size() == 1);
    CHECK(one.count(std::this_thread::get_id()) == 1);
    kiln::set_num_threads(3);
    const auto three = thread_ids(200);  // 100 ms of sleeping tasks: every worker gets some
    CHECK(three.size() >= 2);
    CHECK(three.size() <= 3);
}

TEST_CASE("run: an exception in a task reaches the caller with its type, and the pool keeps working") {
    Watchdog dog("exceptions in tasks");
    ThreadCountGuard guard;
    for (int threads : {1, 2, 4}) {
        INFO(threads << " threads");
        kiln::set_num_threads(threads);
        for (std::int64_t bad : {0, 37, 99}) {  // the caller's first task, a middle one, the last
            bool caught = false;
            try {
                pool().run(100, [&](std::int64_t t) {
                    if (t == bad) throw TaskError(t);
                });
            } catch (const TaskError& e) {
                caught = true;
                CHECK(e.task == bad);
                CHECK(std::string(e.what()) == "task " + std::to_string(bad) + " failed");
            }
            CHECK(caught);
            check_each_task_once(100);
        }
        CHECK_THROWS_AS(pool().run(64, [](std::int64_t) { throw std::out_of_range("every task"); }), std::out_of_range);
        CHECK_THROWS_AS(pool().run(64, [](std::int64_t t) {
                            if (t % 2) throw kiln::ShapeError("kiln::test: odd task");
                        }),
                        kiln::ShapeError);
        CHECK_THROWS_AS(pool().run(8, [](std::int64_t t) {
                            if (t == 5) throw 42;  // not even a std::exception
                        }),
                        int);
        CHECK_THROWS_AS(kiln::detail::parallel_for(1 << 20, 1000,
                                                   [](std::int64_t b, std::int64_t) {
                                                       if (b > 0) throw std::logic_error("chunk");
                                                       if (kiln::num_threads() == 1) throw std::logic_error("chunk");
                                                   }),
                        std::logic_error);
        check_each_task_once(1000);
        // kernels still run correctly on the same pool
        const Tensor x = random_tensor({300, 301});
        const Tensor y = x * 2.0 + 1.0;
        for (std::int64_t f = 0; f < y.numel(); f += 1013) REQUIRE(y.item<float>(f) == x.item<float>(f) * 2.0f + 1.0f);
    }
}

TEST_CASE("run: nested calls run inline; concurrent callers from other threads all complete") {
    Watchdog dog("nested and concurrent run()");
    ThreadCountGuard guard;
    kiln::set_num_threads(3);
    std::vector<std::atomic<int>> hits(8 * 10);
    pool().run(8, [&](std::int64_t o) {
        pool().run(10, [&](std::int64_t i) { hits[static_cast<std::size_t>(o * 10 + i)].fetch_add(1); });
    });
    for (auto& h : hits) CHECK(h.load() == 1);

    std::atomic<std::int64_t> total{0};
    auto caller = [&] {
        for (int rep = 0; rep < 100; ++rep) pool().run(16, [&](std::int64_t t) { total.fetch_add(t + 1); });
    };
    std::thread t1(caller), t2(caller);
    caller();
    t1.join();
    t2.join();
    CHECK(total.load() == 3 * 100 * (16 * 17 / 2));
}

TEST_CASE("parallel_for covers [0, n) exactly once in at most chunks_per_thread chunks a thread, of at least grain elements") {
    Watchdog dog("parallel_for coverage");
    ThreadCountGuard guard;
    for (int threads : {1, 2, 3}) {
        kiln::set_num_threads(threads);
        for (std::int64_t n : {0, 1, 7, 1000, 32767, 32768, 100000, 1000003}) {
            for (std::int64_t grain : {1, 100, 32768}) {
                if (n > 100000 && grain != 100) continue;
                INFO("threads " << threads << ", n " << n << ", grain " << grain);
                std::vector<std::atomic<std::uint8_t>> hits(static_cast<std::size_t>(n));
                std::mutex m;
                std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
                kiln::detail::parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
                    for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
                    std::lock_guard lock(m);
                    chunks.emplace_back(b, e);
                });
                std::int64_t wrong = 0;
                for (auto& h : hits) wrong += h.load() != 1;
                CHECK(wrong == 0);
                CHECK(static_cast<std::int64_t>(chunks.size()) <= threads * kiln::detail::chunks_per_thread);
                CHECK(static_cast<std::int64_t>(chunks.size()) <= std::max<std::int64_t>(1, n / grain));
                if (threads == 1) CHECK(chunks.size() <= 1);  // one thread: one call, no splitting
                if (threads > 1 && n / grain >= threads * kiln::detail::chunks_per_thread)  // enough work: more chunks than threads
                    CHECK(static_cast<std::int64_t>(chunks.size()) == threads * kiln::detail::chunks_per_thread);
                CHECK((n == 0) == chunks.empty());
                for (const auto& [b, e] : chunks) CHECK(b < e);
            }
        }
    }
}

// ============================================================================ more threads than CPUs

namespace {

/// Pins the calling thread to one of its CPUs (workers started afterwards inherit the mask) and
/// restores its mask at the end of the scope. Declare it after a ThreadCountGuard, so the guard's
/// restart of the pool comes after the mask is restored and the new workers run unpinned.
class PinToOneCpu {
public:
    PinToOneCpu() {
#if defined(__linux__)
        CPU_ZERO(&saved_);
        if (sched_getaffinity(0, sizeof saved_, &saved_) != 0) {
            why_ = std::string("sched_getaffinity failed: ") + std::strerror(errno);
            return;
        }
        allowed_ = CPU_COUNT(&saved_);
        while (cpu_ < CPU_SETSIZE && !CPU_ISSET(cpu_, &saved_)) ++cpu_;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu_, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) {
            why_ = std::string("sched_setaffinity to CPU ") + std::to_string(cpu_) + " failed: " + std::strerror(errno);
            return;
        }
        pinned_ = true;
#else
        why_ = "thread affinity is only set on Linux";
#endif
    }
    ~PinToOneCpu() {
#if defined(__linux__)
        if (pinned_) sched_setaffinity(0, sizeof saved_, &saved_);
#endif
    }
    PinToOneCpu(const PinToOneCpu&) = delete;
    PinToOneCpu& operator=(const PinToOneCpu&) = delete;

    bool pinned() const { return pinned_; }
    int cpu() const { return cpu_; }
    int allowed_before() const { return allowed_; }  ///< CPUs the thread could use before (0: unknown)
    const std::string& why_not() const { return why_; }

private:
#if defined(__linux__)
    cpu_set_t saved_;
#endif
    bool pinned_ = false;
    int cpu_ = 0, allowed_ = 0;
    std::string why_;
};

/// CPUs in the calling thread's affinity mask, or 0 where it cannot be read.
int affinity_cpus() {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    return 0;
}

/// Restores (or removes) an environment variable at the end of the scope.
class EnvGuard {
public:
    explicit EnvGuard(const char* name) : name_(name) {
        if (const char* v = std::getenv(name)) saved_ = v;
    }
    ~EnvGuard() {
        if (saved_) setenv(name_, saved_->c_str(), 1);
        else unsetenv(name_);
    }
    EnvGuard(const EnvGuard&) = delete;
    EnvGuard& operator=(const EnvGuard&) = delete;

private:
    const char* name_;
    std::optional<std::string> saved_;
};

}  // namespace

TEST_CASE("by default kiln uses as many threads as the CPUs the process may run on") {
    ThreadCountGuard guard;
    const int cpus = affinity_cpus();
    if (cpus == 0) {
        MESSAGE("sched_getaffinity is not available: only the KILN_NUM_THREADS override is checked");
    } else {
        INFO(cpus << " CPUs in the affinity mask, std::thread::hardware_concurrency() = "
                  << std::thread::hardware_concurrency());
        CHECK(kiln::detail::available_cpus() == cpus);
        if (const char* env = std::getenv("KILN_NUM_THREADS"); env && std::atoi(env) > 0) {
            MESSAGE("KILN_NUM_THREADS=" << env << " is set: the pool's size is checked against it");
            CHECK(kiln::num_threads() == std::atoi(env));
        } else {
            // the pool was made with the default size; every test restores a count it changes
            CHECK(kiln::num_threads() == cpus);
            CHECK(kiln::detail::default_thread_count() == cpus);
        }
    }
    {
        EnvGuard env("KILN_NUM_THREADS");
        setenv("KILN_NUM_THREADS", "3", 1);
        CHECK(kiln::detail::default_thread_count() == 3);
        setenv("KILN_NUM_THREADS", "0", 1);  // not a thread count: ignored
        CHECK(kiln::detail::default_thread_count() == kiln::detail::available_cpus());
        unsetenv("KILN_NUM_THREADS");
        PinToOneCpu pin;  // a narrower mask (taskset -c 0) means fewer threads
        if (pin.pinned()) {
            CHECK(kiln::detail::available_cpus() == 1);
            CHECK(kiln::detail::default_thread_count() == 1);
            kiln::detail::ThreadPool fresh(kiln::detail::default_thread_count());
            CHECK(fresh.num_threads() == 1);
        } else {
            MESSAGE("could not pin to one CPU (" << pin.why_not() << "): the narrower mask is not checked");
        }
    }
    kiln::set_num_threads(5);  // set_num_threads still overrides the default
    CHECK(kiln::num_threads() == 5);
    if (cpus > 0) CHECK(pool().oversubscribed() == (5 > cpus));
    kiln::set_num_threads(1);
    CHECK_FALSE(pool().oversubscribed());
}

TEST_CASE("with 4 threads pinned to one CPU, every job completes with every task run once and results right") {
    Watchdog dog("4 threads on one CPU", std::chrono::seconds(120));
    ThreadCountGuard guard;
    kiln::set_num_threads(1);  // expected values, computed before pinning
    const Tensor x = random_tensor({257, 1031});
    const Tensor expect_y = x * 2.0 + 1.0;
    const Tensor expect_rows = kiln::sum(x * x, 1);

    PinToOneCpu pin;
    if (!pin.pinned())
        MESSAGE("could not pin to one CPU (" << pin.why_not() << "): the checks run on the CPUs the process has");
    else if (pin.allowed_before() == 1)
        MESSAGE("the process could already use only one CPU: it is oversubscribed with any thread count above 1");
    kiln::set_num_threads(4);  // the workers start now, with the calling thread's (one-CPU) mask
    REQUIRE(kiln::num_threads() == 4);
    if (pin.pinned()) CHECK(pool().oversubscribed());  // so waiting threads yield their core
#if defined(__linux__)
    if (pin.pinned()) {  // the oversubscription is real: every task runs on the one CPU
        std::atomic<int> elsewhere{0};
        pool().run(64, [&](std::int64_t) { elsewhere += sched_getcpu() != pin.cpu(); });
        CHECK(elsewhere.load() == 0);
    }
#endif

    // ~200 small back-to-back jobs, each waiting on workers that share the caller's CPU
    for (int rep = 0; rep < 200; ++rep) {
        const std::int64_t n = 1000 + rep * 37;
        std::vector<std::atomic<std::uint8_t>> hits(static_cast<std::size_t>(n));
        std::atomic<int> chunks{0};
        kiln::detail::parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
            chunks.fetch_add(1);
        });
        std::int64_t wrong = 0;
        for (auto& h : hits) wrong += h.load() != 1;
        REQUIRE_MESSAGE(wrong == 0, "job " << rep << ": " << wrong << " of " << n << " indices not covered exactly once");
        REQUIRE(chunks.load() == 4 * kiln::detail::chunks_per_thread);
    }
    for (int rep = 0; rep < 50; ++rep) check_each_task_once(rep % 13 + 2);
    // workers that went to sleep (longer than they spin) still wake for the next job
    for (int rep = 0; rep < 5; ++rep) {
        std::this_thread::sleep_for(kiln::detail::ThreadPool::spin_time * 2);
        check_each_task_once(9);
    }
    // an exception still reaches the caller
    CHECK_THROWS_AS(pool().run(16, [](std::int64_t t) {
                        if (t == 11) throw TaskError(t);
                    }),
                    TaskError);
    // kernels: elementwise results bitwise equal to one thread's, reductions within rounding
    for (int rep = 0; rep < 20; ++rep) {
        const Tensor y = x * 2.0 + 1.0;
        REQUIRE(bitwise_equal(y, expect_y));
        const Tensor rows = kiln::sum(x * x, 1);
        REQUIRE(rows.shape() == expect_rows.shape());
        const double diff = kiln::max(kiln::abs(rows - expect_rows) / expect_rows).item<double>();
        REQUIRE(diff < 1e-6);
    }
}

// ============================================================================ iteration spaces

namespace {

struct Collapsed {
    Shape shape;
    std::vector<Strides> strides;
};

Collapsed collapse_of(const Shape& shape, const std::vector<Strides>& strides) {
    IterSpace space{shape};
    std::vector<Access> accs(strides.size());
    std::vector<Access*> ptrs;
    for (std::size_t a = 0; a < strides.size(); ++a) {
        accs[a].strides = strides[a];
        ptrs.push_back(&accs[a]);
    }
    kiln::detail::collapse(space, ptrs);
    Collapsed c{space.shape, {}};
    for (const auto& a : accs) c.strides.push_back(a.strides);
    return c;
}

/// Offsets of every element in row-major order.
std::vector<std::int64_t> offsets(const Shape& shape, const Strides& st) {
    std::vector<std::int64_t> out;
    const std::int64_t n = shape.numel();
    for (std::int64_t f = 0; f < n; ++f) {
        std::int64_t rem = f, off = 0;
        for (int d = shape.rank() - 1; d >= 0; --d) {
            off += rem % shape[d] * st[d];
            rem /= shape[d];
        }
        out.push_back(off);
    }
    return out;
}

}  // namespace

TEST_CASE("collapse merges dims every access walks contiguously and keeps broadcast dims") {
    auto check = [](const Shape& s, const std::vector<Strides>& st, const char* want_shape,
                    const std::vector<const char*>& want_strides) {
        const Collapsed c = collapse_of(s, st);
        INFO("shape " << s.str());
        CHECK(c.shape.str() == want_shape);
        for (std::size_t a = 0; a < st.size(); ++a) CHECK(c.strides[a].str() == want_strides[a]);
    };
    check({2, 3, 4}, {{12, 4, 1}}, "(24,)", {"(1,)"});                               // contiguous
    check({2, 3, 4}, {{12, 4, 1}, {12, 4, 1}}, "(24,)", {"(1,)", "(1,)"});           // two contiguous
    check({3, 4}, {{4, 1}, {0, 1}}, "(3, 4)", {"(4, 1)", "(0, 1)"});                 // row broadcast
    check({3, 4}, {{4, 1}, {1, 0}}, "(3, 4)", {"(4, 1)", "(1, 0)"});                 // column broadcast
    check({3, 4}, {{4, 1}, {0, 0}}, "(12,)", {"(1,)", "(0,)"});                      // scalar broadcast
    check({2, 3, 4}, {{12, 4, 1}, {0, 4, 1}}, "(2, 12)", {"(12, 1)", "(0, 1)"});    // broadcast outer dim
    check({2, 3, 4}, {{12, 4, 1}, {4, 0, 1}}, "(2, 3, 4)", {"(12, 4, 1)", "(4, 0, 1)"});  // broadcast middle
    check({1, 3, 1, 4}, {{12, 4, 4, 1}}, "(12,)", {"(1,)"});                          // unit dims dropped
    check({3, 4}, {{4, 1}, {1, 3}}, "(3, 4)", {"(4, 1)", "(1, 3)"});                 // a transposed operand
    check({3, 4}, {{8, 1}}, "(3, 4)", {"(8, 1)"});                                    // rows of a wider tensor
    check({3, 4, 2}, {{16, 2, 1}}, "(3, 8)", {"(16, 1)"});                           // sliced outer dim
    check({4, 3}, {{1, 4}}, "(4, 3)", {"(1, 4)"});                                    // column-major: no merge
    check({1, 1}, {{1, 1}, {0, 0}}, "()", {"()", "()"});                              // one element
    check({}, {{}}, "()", {"()"});                                                    // rank 0
    check({3, 0, 2}, {{0, 2, 1}}, "(0,)", {"(1,)"});                                  // empty
}

TEST_CASE("collapse keeps every access's element offsets (random shapes and layouts)") {
    std::mt19937 rng(std::random_device{}());
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    for (int iter = 0; iter < 3000; ++iter) {
        const int rank = pick(6);
        Shape s;
        for (int d = 0; d < rank; ++d) s.push_back(1 + pick(4));
        std::vector<Strides> st;
        const int naccs = 1 + pick(3);
        for (int a = 0; a < naccs; ++a) {
            Strides c = kiln::contiguous_strides(s);
            switch (pick(5)) {
                case 0: break;  // contiguous
                case 1:         // broadcast some dims
                    for (int d = 0; d < rank; ++d)
                        if (pick(2)) c[d] = 0;
                    break;
                case 2:  // a slice with a step, or rows of a wider parent
                    if (rank) {
                        c[pick(rank)] *= 2 + pick(2);
                        const int outer = pick(rank + 1);
                        for (int d = 0; d < outer; ++d) c[d] *= 3;
                    }
                    break;
                case 3:  // reversed dim order (a transpose)
                    for (int d = 0; d < rank; ++d) {
                        std::int64_t acc = 1;
                        for (int e = 0; e < d; ++e) acc *= s[e];
                        c[d] = acc;
                    }
                    break;
                default:  // anything
                    for (int d = 0; d < rank; ++d) c[d] = pick(30);
            }
            st.push_back(c);
        }
        const Collapsed col = collapse_of(s, st);
        INFO("shape " << s.str() << " -> " << col.shape.str());
        REQUIRE(col.shape.numel() == s.numel());
        REQUIRE(col.shape.rank() <= std::max(1, s.rank()));
        for (std::int64_t d : col.shape) REQUIRE(d != 1);
        for (std::size_t a = 0; a < st.size(); ++a) {
            INFO("access " << a << " strides " << st[a].str() << " -> " << col.strides[a].str());
            REQUIRE(col.strides[a].rank() == col.shape.rank());
            REQUIRE(offsets(col.shape, col.strides[a]) == offsets(s, st[a]));
        }
    }
}

// ============================================================================ gather and scatter

namespace {

/// gather<T> of the whole view in pieces of `piece` elements, against item<double>() converted to T.
template <class T>
void check_gather(const Tensor& view, std::int64_t piece) {
    const IterSpace space{view.shape()};
    const Access a = kiln::detail::access_of(view, view.shape());
    std::vector<T> got(static_cast<std::size_t>(view.numel()));
    const T poison = std::numeric_limits<T>::has_quiet_NaN ? std::numeric_limits<T>::quiet_NaN() : T(-12345);
    std::fill(got.begin(), got.end(), poison);
    for (std::int64_t start = 0; start < view.numel(); start += piece)
        kiln::detail::gather(space, a, start, std::min(piece, view.numel() - start), got.data() + start);
    for (std::int64_t f = 0; f < view.numel(); ++f) {
        const double v = view.item<double>(f);
        T want;
        if (view.dtype() == DType::boolean) want = T(v != 0);
        else want = static_cast<T>(v);  // f16/bf16 widen to float exactly, so through double is the same
        INFO(kiln::dtype_name(view.dtype()) << " flat " << f << " of shape " << view.shape().str());
        REQUIRE(got[static_cast<std::size_t>(f)] == want);
    }
}

}  // namespace

TEST_CASE("gather: strided, broadcast (stride 0) and converting reads against scalar references") {
    const Tensor base = random_tensor({5, 7});
    check_gather<double>(base, 35);                          // contiguous, same as memcpy
    check_gather<float>(base, 35);
    check_gather<double>(base.t(), 3);                       // transposed, pieces cross rows
    check_gather<float>(base.t(), 9);
    check_gather<float>(base.slice(1, 1, 7, 2), 4);          // stepped
    const Tensor cube = random_tensor({4, 5, 6});
    check_gather<float>(cube.permute({2, 0, 1}).slice(2, 1, 5, 3), 7);  // rank 3: carries over two dims
    check_gather<double>(cube.permute({1, 2, 0}), 11);

    const Tensor row = random_tensor({6}, DType::f64);
    check_gather<float>(row.expand({4, 6}), 5);               // strides (0, 1)
    const Tensor col = random_tensor({4, 1}, DType::i32);
    check_gather<double>(col.expand({4, 6}), 5);              // strides (1, 0): inner stride 0
    check_gather<std::int64_t>(col.expand({2, 4, 6}), 13);
    const Tensor scalar = kiln::full({}, 2.75, DType::f16);
    check_gather<float>(scalar.expand({3, 5}), 4);            // strides (0, 0)
    CHECK(kiln::detail::access_of(row, {4, 6}).strides.str() == "(0, 1)");
    CHECK(kiln::detail::access_of(col, {2, 4, 6}).strides.str() == "(0, 1, 0)");

    // converting loads: integers, half types and bool into every compute type
    check_gather<float>(random_tensor({3, 9}, DType::f16).t(), 8);
    check_gather<double>(random_tensor({3, 9}, DType::bf16), 27);
    check_gather<float>(Tensor(random_tensor({40}) * 1000.0).to(DType::i32), 40);
    check_gather<double>(kiln::randint(-(std::int64_t{1} << 40), std::int64_t{1} << 40, {50}), 16);
    check_gather<std::int32_t>(Tensor(random_tensor({8, 8}) > 0.0).t(), 10);
    check_gather<float>(Tensor(random_tensor({8, 8}) > 0.0).slice(0, 1, 8, 3), 10);
    check_gather<float>(random_tensor({64}, DType::f64), 64);  // f64 -> f32 rounds
    // a rank-0 space reads its one element
    const IterSpace space0{Shape{}};
    const Access a0 = kiln::detail::access_of(scalar, Shape{});
    float one = 0;
    kiln::detail::gather(space0, a0, 0, 1, &one);
    CHECK(one == 2.75f);
}

TEST_CASE("scatter: strided and converting writes touch exactly their elements") {
    // f64 compute values into a transposed int64 view: truncation, every element of a range, nothing else
    Tensor dest = kiln::full({6, 4}, -999, DType::i64);
    const Tensor view = dest.t();  // (4, 6), strides (1, 4)
    const IterSpace space{view.shape()};
    const Access a = kiln::detail::access_of(view, view.shape());
    std::vector<double> src(24);
    for (std::size_t k = 0; k < src.size(); ++k) src[k] = (k % 2 ? -1.0 : 1.0) * (static_cast<double>(k) + 0.75);
    kiln::detail::scatter(space, a, 5, 11, src.data() + 5);  // flat 5..15 of the view
    for (std::int64_t f = 0; f < 24; ++f) {
        const std::int64_t got = view.item<std::int64_t>(f);
        INFO("flat " << f);
        if (f >= 5 && f < 16) CHECK(got == static_cast<std::int64_t>(src[static_cast<std::size_t>(f)]));
        else CHECK(got == -999);
    }

    // float values into f16, bf16 and bool, through a stepped slice that leaves other columns alone
    const std::vector<float> vals = {1.0f / 3, -2.5f, 0.0f, 65519.0f, std::numeric_limits<float>::quiet_NaN(), -0.0f, 1e-8f, 7.0f, -1e6f};
    for (DType d : {DType::f16, DType::bf16, DType::boolean, DType::i32}) {
        INFO(kiln::dtype_name(d));
        Tensor m = kiln::full({3, 7}, 5, d);
        const Tensor v = m.slice(1, 1, 7, 2);  // columns 1, 3, 5
        const IterSpace sp{v.shape()};
        std::vector<float> in(vals.begin(), vals.end());
        if (d == DType::i32) in[4] = 12.5f;  // NaN has no int value
        kiln::detail::scatter(sp, kiln::detail::access_of(v, v.shape()), 0, 9, in.data());
        for (std::int64_t i = 0; i < 3; ++i)
            for (std::int64_t j = 0; j < 7; ++j) {
                INFO("(" << i << ", " << j << ")");
                const double got = m.item<double>(i * 7 + j);
                if (j % 2 == 0) {
                    CHECK(got == 5.0 - (d == DType::boolean ? 4.0 : 0.0));  // untouched (bool: true)
                    continue;
                }
                const float x = in[static_cast<std::size_t>(i * 3 + j / 2)];
                double want = 0;
                switch (d) {
                    case DType::f16: want = static_cast<float>(kiln::half(x)); break;
                    case DType::bf16: want = static_cast<float>(kiln::bfloat16(x)); break;
                    case DType::boolean: want = x != 0.0f ? 1.0 : 0.0; break;
                    default: want = static_cast<std::int32_t>(x);
                }
                if (std::isnan(want)) CHECK(std::isnan(got));
                else CHECK(got == want);
            }
    }
}

// ============================================================================ thread-count invariance

TEST_CASE("large elementwise expressions give bitwise identical results with 1, 2 and 3 threads") {
    Watchdog dog("thread-count invariance");
    ThreadCountGuard guard;
    const Tensor x = random_tensor({1024, 1031});  // ~1M elements: many tiles, a ragged last one
    const Tensor y = random_tensor({1031});
    const Tensor z = random_tensor({1024, 1}, DType::f64);
    const Tensor w = random_tensor({1031, 1024}).t();  // strided operand
    auto fused = [&] { return Tensor(kiln::exp(x * 0.25) + kiln::sin(x) * y - kiln::sqrt(kiln::abs(w)) / (1.0 + y * y)); };
    auto mixed = [&] { return Tensor(x * z + kiln::cast(w * 3.0, DType::i32) - kiln::cast(y, DType::f16)); };  // tile interpreter
    auto into_view = [&] {  // writing through a strided output
        Tensor out = kiln::full({1031, 1024}, -1.0);
        out.t().assign(kiln::tanh(x) * y);
        return out;
    };
    kiln::set_num_threads(1);
    const Tensor f1 = fused(), m1 = mixed(), v1 = into_view();
    for (int threads : {2, 3}) {
        INFO(threads << " threads");
        kiln::set_num_threads(threads);
        CHECK(bitwise_equal(f1, fused()));
        CHECK(bitwise_equal(m1, mixed()));
        CHECK(bitwise_equal(v1, into_view()));
    }
    // and the values are right, not merely stable
    CHECK(kiln::dtype_name(m1.dtype()) == std::string("float64"));
    for (std::int64_t f = 0; f < f1.numel(); f += 4099) {
        const std::int64_t i = f / 1031, j = f % 1031;
        const double xv = x.at<float>({i, j}), yv = y.at<float>({j}), wv = w.at<float>({i, j});
        const double ref = std::exp(xv * 0.25) + std::sin(xv) * yv - std::sqrt(std::fabs(wv)) / (1.0 + yv * yv);
        CHECK(f1.at<float>({i, j}) == doctest::Approx(ref).epsilon(1e-5).scale(10));
        const double mref = xv * z.at<double>({i, 0}) + static_cast<std::int32_t>(static_cast<float>(wv * 3.0)) -
                            static_cast<float>(kiln::half(static_cast<float>(yv)));
        CHECK(m1.at<double>({i, j}) == doctest::Approx(mref).epsilon(1e-12));
        CHECK(v1.at<float>({j, i}) == doctest::Approx(std::tanh(xv) * yv).epsilon(1e-6));
    }
}

// ============================================================================ the tile interpreter

TEST_CASE("tile programs: a long chain shares a few scratch tiles, takes runs of any length, reads scalar operands "
          "as one value and converts between compute types, matching a per-element reference bitwise") {
    using kiln::detail::TileProgram;
    namespace ops = kiln::ops;
    using ops::OpId;
    constexpr OpId mul = ops::op_id<ops::Mul>, add_ = ops::op_id<ops::Add>, sub = ops::op_id<ops::Sub>,
                   maximum = ops::op_id<ops::Maximum>, where = ops::op_id<ops::Where>;
    const std::int64_t n = 3 * 256 + 77;  // ragged last tile
    const Tensor x = random_tensor({n});
    const Tensor w = random_tensor({n, 2}, DType::f64);  // read with stride 2: gathered
    TileProgram p;
    p.space.shape = Shape{n};
    p.leaves.push_back(kiln::detail::access_of(x, Shape{n}));
    p.leaves.push_back({static_cast<char*>(w.data_ptr()), DType::f64, Strides{2}});
    p.scalars = {1.5, -0.25, 3.0, 0.0};
    const int X = p.leaf_value(0), W = p.leaf_value(1);
    auto S = [&](int i) { return p.scalar_value(i); };
    auto add = [&](OpId op, DType ct, int a, int b = -1, int c = -1) {
        TileProgram::Instr in{op, ct};
        in.in[0] = a, in.in[1] = b, in.in[2] = c;
        p.instrs.push_back(in);
        return p.instr_value(static_cast<int>(p.instrs.size() - 1));
    };
    // v0 stays live to the end; scalars on either side of binary ops; f64 steps convert
    const int v0 = add(mul, DType::f32, X, S(0));
    int v = add(sub, DType::f32, S(1), v0);
    for (int k = 0; k < 10; ++k) {
        v = add(k % 3 == 0 ? mul : add_, k % 2 ? DType::f64 : DType::f32, v, k % 4 == 1 ? W : S(2));
        v = add(maximum, DType::f32, S(3), v);
        v = add(sub, DType::f32, v, v0);
    }
    v = add(where, DType::f32, v, v0, S(1));  // a ternary op with a scalar operand
    const kiln::detail::ProgramRunner runner(p);
    CHECK(runner.result_ct() == DType::f32);
    CHECK(p.instrs.size() == 33);
    // five scalar fills (four f32, one f64), v0, and a few in flight; one tile per slot would be 60
    CHECK(runner.scratch_tiles() <= 10);

    // the reference: each instruction per element in its compute type
    std::vector<float> ref(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        std::vector<double> val(static_cast<std::size_t>(p.instr_value(static_cast<int>(p.instrs.size()))));
        val[static_cast<std::size_t>(X)] = x.data<float>()[i];
        val[static_cast<std::size_t>(W)] = w.data<double>()[2 * i];
        for (std::size_t s = 0; s < p.scalars.size(); ++s) val[static_cast<std::size_t>(S(static_cast<int>(s)))] = p.scalars[s];
        for (std::size_t k = 0; k < p.instrs.size(); ++k) {
            const auto& in = p.instrs[k];
            auto get = [&](int j) { return val[static_cast<std::size_t>(in.in[j])]; };
            double r = 0;
            if (in.ct == DType::f32) {
                const float a = static_cast<float>(get(0)), b = in.in[1] >= 0 ? static_cast<float>(get(1)) : 0.0f;
                switch (in.op) {
                    case mul: r = a * b; break;
                    case add_: r = a + b; break;
                    case sub: r = a - b; break;
                    case maximum: r = std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); break;
                    case where: r = a != 0.0f ? b : static_cast<float>(get(2)); break;
                    default: FAIL("op");
                }
            } else {
                const double a = get(0), b = get(1);
                r = in.op == mul ? a * b : a + b;
            }
            val[static_cast<std::size_t>(p.instr_value(static_cast<int>(k)))] = r;
        }
        ref[static_cast<std::size_t>(i)] = static_cast<float>(val.back());
    }
    // one run over everything, and runs of odd lengths (each a fresh set-up)
    for (std::int64_t piece : {n, std::int64_t{1}, std::int64_t{255}, std::int64_t{257}, std::int64_t{600}}) {
        INFO("runs of " << piece);
        std::vector<float> got(static_cast<std::size_t>(n), -7.0f);
        for (std::int64_t b = 0; b < n; b += piece) runner.tile(b, std::min(piece, n - b), got.data() + b);
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < n; ++i)
            if (std::memcmp(&got[static_cast<std::size_t>(i)], &ref[static_cast<std::size_t>(i)], sizeof(float)) != 0) ++bad;
        CHECK(bad == 0);
    }
}
