// The CPU worker pool: parallel_for over index ranges, with workers that spin before they sleep.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <utility>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace kiln::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

/// A fixed set of workers. Between jobs each worker spins for a while before it blocks, because
/// back-to-back kernels are the common case and waking a sleeping thread costs tens of
/// microseconds (a sleeping OpenMP worker made 2 threads slower than 1 on a 2-core VM).
class ThreadPool {
public:
    /// How long an idle worker spins before it sleeps.
    static constexpr std::chrono::microseconds spin_time{2000};

    explicit ThreadPool(int threads) { start(threads); }
    ~ThreadPool() { stop(); }
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

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
        pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        in_worker_ = true;
        drain();
        in_worker_ = false;
        while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
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
    // a worker that read it itself could start after the first job was posted and miss it.
    void worker_loop(std::uint64_t seen) {
        in_worker_ = true;
        for (;;) {
            const auto deadline = std::chrono::steady_clock::now() + spin_time;
            std::uint64_t g;
            int spins = 0;
            while ((g = generation_.load(std::memory_order_acquire)) == seen) {
                cpu_relax();
                if ((++spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
                    generation_.wait(seen, std::memory_order_acquire);
                }
            }
            seen = g;
            if (quit_.load(std::memory_order_acquire)) return;
            drain();
            pending_.fetch_sub(1, std::memory_order_acq_rel);
        }
    }
    void start(int threads) {
        quit_.store(false);
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
    std::atomic<int> pending_{0};
    std::atomic<std::uint64_t> generation_{0};
    std::atomic<bool> quit_{false};
    std::mutex error_mutex_;
    std::exception_ptr error_;
    static inline thread_local bool in_worker_ = false;
};

inline int default_thread_count() {
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
        const int n = std::atoi(env);
        if (n > 0) return n;
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
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
/// Threads kiln's CPU kernels use (the caller included).
inline int num_threads() { return detail::thread_pool().num_threads(); }
/// Sets the number of CPU threads (>= 1). Also settable with the KILN_NUM_THREADS variable.
inline void set_num_threads(int n) { detail::thread_pool().resize(std::max(n, 1)); }
}  // namespace kiln
