// The thread pool's bodies (core/thread_pool.hpp), compiled once in separate mode.
#pragma once
// Included at the end of kiln/core/thread_pool.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <utility>
#if defined(_MSC_VER) && defined(_M_X64)
#include <intrin.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace kiln::detail {

inline void cpu_relax() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_ia32_pause();  // _mm_pause without <immintrin.h> (tens of thousands of lines)
#elif defined(_M_X64)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

KILN_DECL int available_cpus() {
#if defined(__linux__) && defined(CPU_ALLOC)
    for (int n = 1024; n <= (1 << 20); n *= 2) {  // a mask large enough for the kernel's CPU count
        cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(n));
        if (!set) break;
        const std::size_t size = CPU_ALLOC_SIZE(static_cast<std::size_t>(n));
        const int rc = sched_getaffinity(0, size, set);
        const int count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (rc == 0 && count > 0) return count;
        if (rc != 0 && errno != EINVAL) break;  // EINVAL: the mask is smaller than the kernel's
    }
#endif
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

/// Waits until done(a.load()) holds and returns that value: pause instructions until `pause` has
/// passed, then yields of the core until `spin` has passed, then a futex sleep on `a` (woken by
/// a.notify_*). Yielding matters when threads outnumber cores (a process pinned to one CPU): a
/// waiter that only paused would hold the core that the thread it waits for needs until the
/// scheduler's tick (about 4 ms). Pausing answers sooner where a yield gives the core to another
/// process.
template <class T, class Done>
T spin_then_wait(const std::atomic<T>& a, Done done, std::chrono::microseconds pause, std::chrono::microseconds spin) {
    using clock = std::chrono::steady_clock;
    T v;
    auto spun_for = [start = clock::now()] { return clock::now() - start; };
    do {  // the clock is read once per 64 pauses (about 1-8 us)
        for (int i = 0; i < 64; ++i) {
            if (done(v = a.load(std::memory_order_acquire))) return v;
            cpu_relax();
        }
    } while (spun_for() < pause);
    for (;;) {
        if (done(v = a.load(std::memory_order_acquire))) return v;
        if (spun_for() < spin)
            std::this_thread::yield();
        else
            a.wait(v, std::memory_order_acquire);  // returns once a changes (or spuriously): done is checked again
    }
}

KILN_DECL ThreadPool::ThreadPool(int threads) { start(threads); }

KILN_DECL ThreadPool::~ThreadPool() { stop(); }

KILN_DECL void ThreadPool::resize(int n) {
        std::lock_guard lock(run_mutex_);
        stop();
        start(n);
    }

KILN_DECL void ThreadPool::run(std::int64_t tasks, const std::function<void(std::int64_t)>& f) {
        if (tasks <= 0) return;
        std::unique_lock lock(run_mutex_, std::try_to_lock);
        if (tasks == 1 || workers_.empty() || in_worker_ || !lock.owns_lock()) {
            for (std::int64_t t = 0; t < tasks; ++t) f(t);
            return;
        }
        job_ = &f;
        job_tasks_ = tasks;
        next_task_.store(0, std::memory_order_relaxed);
        open_.store(true, std::memory_order_seq_cst);  // publishes the job to the workers that join
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();  // a syscall only when a worker sleeps
        in_worker_ = true;
        drain();
        in_worker_ = false;
        // Every task is claimed. A worker that joins from now on sees the job closed; one that
        // joined before (its active_ increment precedes its read of open_, both seq_cst) is
        // counted, and finishes the tasks it claimed.
        open_.store(false, std::memory_order_seq_cst);
        // the waits below load active_ with acquire only: the fence keeps that load after the store
        // above (a store-load pair; without it ARM's acquire loads may see active_ early)
        std::atomic_thread_fence(std::memory_order_seq_cst);
        spin_then_wait(active_, [](int a) { return a == 0; }, pause_for(caller_spin_time), caller_spin_time);
        job_ = nullptr;
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

KILN_DECL void ThreadPool::drain() {
        for (;;) {
            const std::int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
            if (t >= job_tasks_) return;
            try {
                (*job_)(t);
            } catch (...) {  // handed to the caller: a throwing task must not terminate a worker
                std::lock_guard lock(error_mutex_);
                if (!error_) error_ = std::current_exception();
            }
        }
    }

KILN_DECL void ThreadPool::worker_loop(std::uint64_t seen) {
        in_worker_ = true;
        for (;;) {
            seen = spin_then_wait(generation_, [seen](std::uint64_t g) { return g != seen; }, pause_for(spin_time),
                                  spin_time);
            if (quit_.load(std::memory_order_acquire)) return;
            active_.fetch_add(1, std::memory_order_seq_cst);
            if (open_.load(std::memory_order_seq_cst)) drain();  // the job, or the next one: both wait for us
            // the last one out wakes the caller if it went to sleep (notify is no syscall otherwise)
            if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) active_.notify_one();
        }
    }

KILN_DECL void ThreadPool::start(int threads) {
        quit_.store(false);
        oversubscribed_ = std::max(threads, 1) > available_cpus();  // read by the workers made below
        const std::uint64_t now = generation_.load(std::memory_order_acquire);
        for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, now] { worker_loop(now); });
    }

KILN_DECL void ThreadPool::stop() {
        quit_.store(true, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        for (auto& w : workers_) w.join();
        workers_.clear();
    }

KILN_DECL int default_thread_count() {
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
        const int n = std::atoi(env);
        if (n > 0) return n;
    }
    return available_cpus();
}

KILN_DECL ThreadPool& thread_pool() {
    static ThreadPool pool(default_thread_count());
    return pool;
}

KILN_DECL void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& f) {
    if (n <= 0) return;
    ThreadPool& pool = thread_pool();
    const std::int64_t threads = pool.num_threads();
    // More chunks than threads, claimed one at a time (ThreadPool::run): a thread whose vCPU is
    // slow or taken by another process does fewer, instead of setting the pace for all.
    const std::int64_t chunks =
        threads == 1 ? 1 : std::min<std::int64_t>(threads * chunks_per_thread, std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1)));
    if (chunks <= 1) {
        f(0, n);
        return;
    }
    pool.run(chunks, [&](std::int64_t c) { f(n * c / chunks, n * (c + 1) / chunks); });
}

}  // namespace kiln::detail

namespace kiln {
KILN_DECL int num_threads() { return detail::thread_pool().num_threads(); }

KILN_DECL void set_num_threads(int n) { detail::thread_pool().resize(std::max(n, 1)); }
}  // namespace kiln
