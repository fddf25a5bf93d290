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

#include "kiln/core/config.hpp"

namespace kiln::detail {

/// CPUs the calling thread may run on: its affinity mask on Linux (`taskset`, cgroup cpusets),
/// else the machine's count. More threads than that would only take turns on the same cores.
KILN_DECL int available_cpus();

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

    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
    /// Whether the threads outnumber the CPUs the pool's creator could run on (when it started).
    bool oversubscribed() const { return oversubscribed_; }

    /// Restarts the pool with n threads in total (the caller counts as one).
    void resize(int n);

    /// Runs f(task) for task in [0, tasks) across the caller and the workers; returns when all are
    /// done. Nested or concurrent calls run serially on the calling thread.
    void run(std::int64_t tasks, const std::function<void(std::int64_t)>& f);

private:
    void drain();
    // `seen` is the generation current when the worker was created, read by the creating thread:
    // a worker that read it itself could start after the first job was posted and sleep through it.
    void worker_loop(std::uint64_t seen);
    std::chrono::microseconds pause_for(std::chrono::microseconds spin) const {
        return oversubscribed_ ? std::min(spin, oversubscribed_pause) : spin;
    }
    void start(int threads);
    void stop();

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
KILN_DECL int default_thread_count();

KILN_DECL ThreadPool& thread_pool();

/// Chunks parallel_for makes per thread (at most): claimed dynamically, so uneven threads even out.
inline constexpr std::int64_t chunks_per_thread = 4;

/// Splits [0, n) into chunks of at least `grain` elements (up to chunks_per_thread per thread) and
/// runs f(begin, end) on each, in parallel when there is more than one chunk. Which chunks a
/// thread gets is decided at run time: f must not depend on it.
KILN_DECL void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& f);

}  // namespace kiln::detail

namespace kiln {
/// Threads kiln's CPU kernels use (the caller included); by default the CPUs the process may run on.
KILN_DECL int num_threads();
/// Sets the number of CPU threads (>= 1). Also settable with the KILN_NUM_THREADS variable.
KILN_DECL void set_num_threads(int n);

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

#if KILN_HEADER_ONLY
#include "kiln/core/thread_pool_impl.hpp"
#endif
