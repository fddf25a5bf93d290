// The CPU worker pool: parallel_for over index ranges; every wait spins briefly, then sleeps.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <utility>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

/// CPUs the calling thread may run on: its affinity mask on Linux (`taskset`, cgroup cpusets),
/// else the machine's count. More threads than that would only take turns on the same cores.
inline int available_cpus() {
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

/// A fixed set of workers. Between jobs each worker spins for a while before it blocks, because
/// back-to-back kernels are the common case and waking a sleeping thread costs tens of
/// microseconds (a sleeping OpenMP worker made 2 threads slower than 1 on a 2-core VM).
///
/// The caller never waits for a worker to start. It claims tasks like the workers do, and once
/// every task is claimed it closes the job and waits only for the workers that joined it to finish
/// theirs (spinning, then sleeping). So a worker that has no core to run on (more kiln threads
/// than free CPUs, or a CPU busy with other processes) does not hold the caller up: the caller
/// runs the tasks itself, as with one thread.
///
/// Where the pool has more threads than the CPUs it may run on, a waiting thread pauses only
/// briefly (`oversubscribed_pause`) and then yields its core until it sleeps.
class ThreadPool {
public:
    /// How long an idle worker spins before it sleeps.
    static constexpr std::chrono::microseconds spin_time{2000};
    /// How long the caller spins for joined workers to finish their tasks before it sleeps.
    static constexpr std::chrono::microseconds caller_spin_time{500};
    /// How long a waiting thread pauses before it yields its core, when oversubscribed.
    static constexpr std::chrono::microseconds oversubscribed_pause{50};

    explicit ThreadPool(int threads) { start(threads); }
    ~ThreadPool() { stop(); }
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
    /// Whether the threads outnumber the CPUs the pool's creator could run on (when it started).
    bool oversubscribed() const { return oversubscribed_; }

    /// Restarts the pool with n threads in total (the caller counts as one).
    void resize(int n) {
        std::lock_guard lock(run_mutex_);
        stop();
        start(n);
    }

    /// Runs f(task) for task in [0, tasks) across the caller and the workers; returns when all are
    /// done. Nested or concurrent calls run serially on the calling thread.
    void run(std::int64_t tasks, const std::function<void(std::int64_t)>& f) {
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

private:
    void drain() {
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
    // `seen` is the generation current when the worker was created, read by the creating thread:
    // a worker that read it itself could start after the first job was posted and sleep through it.
    void worker_loop(std::uint64_t seen) {
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
    std::chrono::microseconds pause_for(std::chrono::microseconds spin) const {
        return oversubscribed_ ? std::min(spin, oversubscribed_pause) : spin;
    }
    void start(int threads) {
        quit_.store(false);
        oversubscribed_ = std::max(threads, 1) > available_cpus();  // read by the workers made below
        const std::uint64_t now = generation_.load(std::memory_order_acquire);
        for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, now] { worker_loop(now); });
    }
    void stop() {
        quit_.store(true, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        for (auto& w : workers_) w.join();
        workers_.clear();
    }

    std::vector<std::thread> workers_;
    std::mutex run_mutex_;
    const std::function<void(std::int64_t)>* job_ = nullptr;
    std::int64_t job_tasks_ = 0;
    std::atomic<std::int64_t> next_task_{0};
    std::atomic<bool> open_{false};  ///< whether joining workers may claim tasks
    std::atomic<int> active_{0};     ///< workers that joined and have not left
    std::atomic<std::uint64_t> generation_{0};
    std::atomic<bool> quit_{false};
    bool oversubscribed_ = false;
    std::mutex error_mutex_;
    std::exception_ptr error_;
    static inline thread_local bool in_worker_ = false;
};

/// KILN_NUM_THREADS when set to a positive number, else the CPUs this process may run on.
inline int default_thread_count() {
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
        const int n = std::atoi(env);
        if (n > 0) return n;
    }
    return available_cpus();
}

inline ThreadPool& thread_pool() {
    static ThreadPool pool(default_thread_count());
    return pool;
}

/// Splits [0, n) into chunks of at least `grain` elements and runs f(begin, end) on each, in
/// parallel when there is more than one chunk.
inline void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& f) {
    if (n <= 0) return;
    ThreadPool& pool = thread_pool();
    const std::int64_t threads = pool.num_threads();
    const std::int64_t chunks = std::min<std::int64_t>(threads, std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1)));
    if (chunks <= 1) {
        f(0, n);
        return;
    }
    pool.run(chunks, [&](std::int64_t c) { f(n * c / chunks, n * (c + 1) / chunks); });
}

}  // namespace kiln::detail

namespace kiln {
/// Threads kiln's CPU kernels use (the caller included); by default the CPUs the process may run on.
inline int num_threads() { return detail::thread_pool().num_threads(); }
/// Sets the number of CPU threads (>= 1). Also settable with the KILN_NUM_THREADS variable.
inline void set_num_threads(int n) { detail::thread_pool().resize(std::max(n, 1)); }

namespace detail {

/// Elements per tile: small enough that a few tiles of every operand stay in L1.
inline constexpr std::int64_t tile_elems = 256;
/// Below this many elements a loop runs on one thread.
inline constexpr std::int64_t parallel_grain = 32768;

/// Runs body(start, len) over [0, n) in tiles, threads taking contiguous runs of tiles. Tiles
/// start at multiples of tile_elems whatever the thread count, so a kernel's full-vector loop and
/// its tail (which the compiler may contract into FMAs differently) always cover the same
/// elements: results are bitwise the same on any number of threads.
template <class Body>
inline void for_each_tile(std::int64_t n, Body&& body) {
    const std::int64_t tiles = (n + tile_elems - 1) / tile_elems;
    parallel_for(tiles, parallel_grain / tile_elems, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t t = b; t < e; ++t) body(t * tile_elems, std::min(tile_elems, n - t * tile_elems));
    });
}

}  // namespace detail

}  // namespace kiln
