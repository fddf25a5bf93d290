// The process group's runtime (compiled once in separate compilation): init and the rendezvous,
// NCCL and store collectives, DDP's buckets, and the watchdog. Included at the end of
// kiln/dist/process_group.hpp (header-only mode, or by kiln/src.hpp), never on its own.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/graphs.hpp"
#include "kiln/backends/cuda/kernel_cache.hpp"
#include "kiln/backends/cuda/library_kernels.hpp"
#include "kiln/backends/cuda/nccl.hpp"
#include "kiln/core/factories.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/dist/store.hpp"
#include "kiln/ops/copy.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln::dist {

KILN_DECL const char* reduce_op_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum: return "sum";
        case ReduceOp::avg: return "avg";
        case ReduceOp::max: return "max";
        case ReduceOp::min: return "min";
        case ReduceOp::prod: return "prod";
    }
    return "?";
}

namespace detail {

using Clock = std::chrono::steady_clock;
namespace nccl = cuda::nccl::detail;

/// One process's membership of the group.
struct Group {
    int rank = 0, world = 1, local_rank = 0;
    Device device;
    double timeout_s = 300;
    std::string host;
    int port = 0;
    std::unique_ptr<StoreServer> server;  // rank 0
    std::unique_ptr<StoreClient> store;   // the calling thread's requests
    std::unique_ptr<StoreClient> watch;   // the watchdog's: answered when a rank dies
    std::uint64_t seq = 0;                // collectives through the store so far (their keys)

    bool nccl = false;
    nccl::Comm comm = nullptr;
    std::mutex comm_m;  // held while NCCL is called; an abort takes it too
    bool aborted = false;
    std::unique_ptr<cuda::Stream> comm_stream;  // DDP's buckets
    std::vector<cuda::CUevent> bucket_events;   // per bucket id: ready (on the compute stream), done (on comm_stream)
    std::vector<char> bucket_summed;            // per bucket id: its last start summed (a window): its wait scales by 1/world
    /// Memory from ncclMemAlloc registered as a symmetric window (DDP's buckets): NCCL releases the
    /// windows with the communicator, so memory freed before that waits here (`deferred`) and is
    /// given back once the communicator is gone.
    struct Windows {
        std::mutex m;
        bool comm_alive = true;
        std::vector<void*> deferred;
        std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;  // every window: address, bytes
        bool holds(const void* p, std::size_t bytes) {
            std::lock_guard l(m);
            const auto a = reinterpret_cast<std::uintptr_t>(p);
            for (const auto& [b, n] : ranges)
                if (a >= b && a + bytes <= b + n) return true;
            return false;
        }
    };
    std::shared_ptr<Windows> windows = std::make_shared<Windows>();

    std::mutex err_m;
    std::string error;
    std::atomic<bool> failed{false};

    struct Pending {
        cuda::CUevent ev;
        std::string what;
        Clock::time_point t0;
    };
    std::mutex pend_m;
    std::deque<Pending> pending;  // NCCL work queued, in order: the watchdog times it
    std::vector<cuda::CUevent> spare;
    std::thread watchdog;
    std::atomic<bool> stop{false};

    ~Group();
};

/// Leaves the group in order (destroy()); `at_exit`: a program that never called destroy() is
/// ending, so only the goodbye happens (the other ranks must not take the exit for a death), not
/// NCCL's teardown.
inline void leave(std::unique_ptr<Group>& slot, bool at_exit);
/// After a failure, how long rank 0 keeps its store up for the other ranks to hear the reason and
/// go (at most the group's timeout).
inline double failure_grace_s(const Group& g) { return std::min(g.timeout_s, 10.0); }

/// The process's group. A program that ends without destroy() still says goodbye.
struct GroupSlot {
    std::unique_ptr<Group> g;
    GroupSlot() = default;
    GroupSlot(const GroupSlot&) = delete;
    GroupSlot& operator=(const GroupSlot&) = delete;
    ~GroupSlot() { leave(g, true); }
};
inline std::unique_ptr<Group>& group_slot() {
    static GroupSlot s;
    return s.g;
}

/// With symmetric windows: how long a failed group's ncclCommAbort may take before the process ends
/// (fail_group), and the status it ends with (sysexits' EX_SOFTWARE).
inline constexpr double symmetric_abort_grace_s = 10;
inline constexpr int symmetric_abort_exit_status = 70;

/// The group's failure: the first reason sticks; NCCL's communicator is aborted, so kernels that
/// wait for a dead peer return and the stream moves on. `tell_others`: also fail the store, so
/// every rank learns it (for failures the store does not know of: a timeout here).
inline void fail_group(Group& g, const std::string& why, bool tell_others) {
    {
        std::lock_guard l(g.err_m);
        if (g.failed) return;
        g.error = why + " (seen by rank " + std::to_string(g.rank) + ")";
        g.failed = true;
    }
    debug::log("dist", "rank " + std::to_string(g.rank) + ": the process group failed: " + why);
    const auto tell = [&] {
        if (tell_others) try {
                StoreClient(g.host, g.port, 5).abort(why + " (seen by rank " + std::to_string(g.rank) + ")");
            } catch (const Error&) {
            }
    };
    if (g.nccl && g.comm) {
        std::unique_lock lk(g.comm_m, std::defer_lock);
        const auto until = Clock::now() + std::chrono::seconds(2);
        while (!lk.try_lock() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!g.aborted) {
            g.aborted = true;
            bool windows = false;
            {
                std::lock_guard w(g.windows->m);
                windows = !g.windows->ranges.empty();
            }
            if (!windows) {
                nccl::lib().comm_abort(g.comm);  // even without the lock: a thread stuck inside NCCL needs it
            } else {
                // NCCL's symmetric kernels do not see the abort (2.28.3 and 2.28.9): one in flight when
                // a peer died spins forever, ncclCommAbort waits for it in cuStreamSynchronize, and so
                // does every host wait behind it (a stack of such a process, 2 x H200, 2026-11-29). The
                // abort runs on a thread of its own; when it has not returned within the grace, the
                // process cannot raise DistError or go on, and it ends (as torch's default tear-down
                // of a failed NCCL group does) instead of hanging.
                auto done = std::make_shared<std::atomic<bool>>(false);
                std::thread([comm = g.comm, done] {
                    nccl::lib().comm_abort(comm);
                    done->store(true);
                }).detach();
                const auto grace = Clock::now() + std::chrono::duration<double>(symmetric_abort_grace_s);
                while (!done->load() && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(5));
                if (!done->load()) {
                    tell();
                    std::string msg;
                    {
                        std::lock_guard l(g.err_m);
                        msg = g.error;
                    }
                    msg = "kiln::dist: rank " + std::to_string(g.rank) + ": the process group failed: " + msg +
                          "; a symmetric all-reduce in flight (DDPOptions::symmetric_memory) cannot be stopped (ncclCommAbort "
                          "did not return within " + store_detail::seconds_text(symmetric_abort_grace_s) +
                          " s), so this process exits with status " + std::to_string(symmetric_abort_exit_status) +
                          " instead of hanging\n";
                    std::fputs(msg.c_str(), stderr);
                    std::fflush(stderr);
                    std::_Exit(symmetric_abort_exit_status);
                }
            }
            debug::log("dist", "rank " + std::to_string(g.rank) + ": NCCL's communicator aborted");
        }
    }
    tell();
}

/// The group, or DistError naming the user's op: not initialized, or failed.
inline Group& group(std::string_view op, const Loc& loc) {
    Group* g = group_slot().get();
    if (!g) kiln::detail::fail<DistError>(op, "no process group: call kiln::dist::init first", loc);
    if (g->failed) {
        std::lock_guard l(g->err_m);
        kiln::detail::fail<DistError>(op, "the process group failed: " + g->error, loc);
    }
    return *g;
}

/// Runs a store request for op; a failure (a rank died, a timeout) fails the group.
template <class F>
auto store_call(Group& g, std::string_view op, const Loc& loc, F&& f) {
    try {
        return f(*g.store);
    } catch (const DistError& e) {
        fail_group(g, e.what(), false);
        kiln::detail::fail<DistError>(op, e.what(), loc);
    }
}

/// Calls NCCL under the communicator's lock; an error fails the group.
template <class F>
void nccl_call(Group& g, std::string_view op, const Loc& loc, F&& f) {
    nccl::Result r = nccl::success;
    {
        std::lock_guard l(g.comm_m);
        if (g.failed || g.aborted) {
            std::lock_guard e(g.err_m);
            kiln::detail::fail<DistError>(op, "the process group failed: " + g.error, loc);
        }
        r = f(nccl::lib());
    }
    if (r != nccl::success && r != nccl::in_progress) {
        const std::string why = "NCCL failed: " + nccl::error_text(r, g.comm);
        fail_group(g, why, true);
        kiln::detail::fail<DistError>(op, why, loc);
    }
}

/// After NCCL work queued on s: the watchdog times it (not while s is captured into a CUDA graph:
/// nothing runs then).
inline void track(Group& g, cuda::CUstream s, std::string what) {
    if (cuda::capturing(s)) return;
    const cuda::detail::Driver& d = cuda::detail::driver();
    std::lock_guard l(g.pend_m);
    cuda::CUevent ev = nullptr;
    if (!g.spare.empty()) {
        ev = g.spare.back();
        g.spare.pop_back();
    } else {
        cuda::detail::check(d.event_create(&ev, /*CU_EVENT_DISABLE_TIMING*/ 0x2), "cuEventCreate");
    }
    cuda::detail::check(d.event_record(ev, s), "cuEventRecord");
    g.pending.push_back({ev, std::move(what), Clock::now()});
}

inline void watchdog_loop(Group* gp) {
    Group& g = *gp;
    if (g.nccl) cuda::detail::use_device(g.device.index);
    pollfd p{g.watch->fd(), POLLIN, 0};
    while (!g.stop) {
        const int r = ::poll(&p, 1, 20);
        if (g.stop) break;
        if (r > 0 && p.fd >= 0) {
            fail_group(g, g.watch->watch_result(), false);
            p.fd = -1;  // answered once; poll ignores it from now on
        }
        if (!g.nccl) continue;
        {
            const cuda::detail::Driver& d = cuda::detail::driver_state();
            std::unique_lock l(g.pend_m);
            while (!g.pending.empty()) {
                Group::Pending& f = g.pending.front();
                const cuda::CUresult q = d.event_query(f.ev);
                if (q == cuda::detail::cuda_success) {
                    g.spare.push_back(f.ev);
                    g.pending.pop_front();
                    continue;
                }
                if (q == cuda::detail::cuda_error_not_ready) {
                    const double waited = std::chrono::duration<double>(Clock::now() - f.t0).count();
                    if (waited > g.timeout_s && !g.failed) {
                        const std::string why = f.what + " did not finish within " + store_detail::seconds_text(g.timeout_s) +
                                                " s (a rank stopped calling collectives, or is stuck)";
                        l.unlock();
                        fail_group(g, why, true);
                    }
                } else if (!g.failed) {
                    const std::string why = "CUDA failed while " + f.what + " ran: " + cuda::detail::error_text(q);
                    l.unlock();
                    fail_group(g, why, true);
                }
                break;
            }
        }
        if (g.comm && !g.failed) {
            nccl::Result e = nccl::success;
            if (nccl::lib().comm_get_async_error(g.comm, &e) == nccl::success && e != nccl::success && e != nccl::in_progress)
                fail_group(g, "NCCL reported an error: " + nccl::error_text(e, g.comm), true);
        }
    }
}

inline Group::~Group() {
    stop = true;
    if (watchdog.joinable()) watchdog.join();
    if (cuda::detail::driver_state().ok()) {
        const cuda::detail::Driver& d = cuda::detail::driver_state();
        for (const Pending& p : pending) d.event_destroy(p.ev);
        for (cuda::CUevent e : spare) d.event_destroy(e);
        for (cuda::CUevent e : bucket_events) d.event_destroy(e);
    }
}

// ---------------------------------------------------------------- init
inline std::string env_str(const char* name, const std::string& dflt) {
    const char* v = std::getenv(name);
    return v && *v ? v : dflt;
}
inline int env_int(const char* name, int dflt, const Loc& loc) {
    const char* v = std::getenv(name);
    if (!v || !*v) return dflt;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0') kiln::detail::fail<DistError>("dist::init", std::string("$") + name + "='" + v + "' is not an integer", loc);
    return static_cast<int>(x);
}

/// Rank 0 publishes its store's port in the rendezvous folder (once: a second rank 0 fails here).
inline void publish_port(const std::string& dir, int port) {
    const std::string final_path = dir + "/store_port", tmp = final_path + "." + std::to_string(::getpid()) + ".tmp";
    {
        std::ofstream f(tmp);
        f << port << "\n";
        if (!f) throw DistError("cannot write " + tmp + " (is KILN_RDZV_DIR=" + dir + " a writable folder?)");
    }
    const int r = ::link(tmp.c_str(), final_path.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (r != 0) {
        if (err == EEXIST)
            throw DistError("another process already runs this job's store as rank 0 (" + final_path +
                            " exists): were two processes started with rank 0?");
        throw DistError("cannot publish the store's port in " + final_path + ": " + std::strerror(err));
    }
}

inline int read_port(const std::string& dir, double timeout_s) {
    const std::string path = dir + "/store_port";
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
        std::ifstream f(path);
        int port = -1;
        if (f >> port && port > 0) return port;
        if (Clock::now() > deadline)
            throw DistError("rank 0 did not publish its store's port in " + path + " within " + store_detail::seconds_text(timeout_s) + " s");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

/// "<world_size> <pid> <host> <device>": what a rank says of itself when it joins.
inline std::string member_text(const Group& g) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return std::to_string(g.world) + " " + std::to_string(::getpid()) + " " + host + " " + g.device.str();
}

/// Joins: claims the rank, checks every rank's world size against this one, and (NCCL) makes the
/// communicator. Throws DistError (without an op) after failing the store, so every rank stops.
inline void join(Group& g) {
    StoreClient& s = *g.store;
    auto refuse = [&](const std::string& why) {
        try {
            s.abort(why);
        } catch (const Error&) {
        }
        throw DistError(why);
    };
    std::string other;
    if (!s.set_if_absent("rank/" + std::to_string(g.rank), member_text(g), &other))
        refuse("rank " + std::to_string(g.rank) + " was started twice: another process (world_size, pid, host, device: " + other +
               ") holds it already");
    auto world_of = [&](int r) {
        std::string text;
        try {
            text = s.get("rank/" + std::to_string(r), g.timeout_s);
        } catch (const DistError& e) {
            if (std::string(e.what()).rfind("waited", 0) == 0)
                throw DistError("rank " + std::to_string(r) + " did not join within " + store_detail::seconds_text(g.timeout_s) + " s");
            throw;
        }
        return std::atoi(text.c_str());
    };
    const int world0 = g.rank == 0 ? g.world : world_of(0);
    if (world0 != g.world)
        refuse("world size mismatch: rank " + std::to_string(g.rank) + " was started with world_size " + std::to_string(g.world) +
               " but rank 0 with world_size " + std::to_string(world0));
    if (g.rank == 0)
        for (int r = 1; r < g.world; ++r)
            if (const int w = world_of(r); w != g.world)
                refuse("world size mismatch: rank " + std::to_string(r) + " was started with world_size " + std::to_string(w) +
                       " but rank 0 with world_size " + std::to_string(g.world));
    if (!g.nccl) {
        if (g.rank == 0) s.set("joined", "1");
        else s.get("joined", g.timeout_s);
        return;
    }
    // every rank checks what it needs before any enters NCCL's (blocking) init
    if (!cuda::nccl::available()) refuse("NCCL is not available on rank " + std::to_string(g.rank) + ": " + cuda::nccl::unavailable_reason());
    cuda::detail::use_device(g.device.index, "dist::init");
    nccl::UniqueId id{};
    if (g.rank == 0) {
        if (const nccl::Result r = nccl::lib().get_unique_id(&id); r != nccl::success)
            refuse("ncclGetUniqueId failed: " + nccl::error_text(r));
        s.set("nccl_id", std::string(id.internal, sizeof id.internal));
    } else {
        const std::string b = s.get("nccl_id", g.timeout_s);
        if (b.size() != sizeof id.internal) throw InternalError("kiln::dist::init: a malformed NCCL id in the store");
        std::memcpy(id.internal, b.data(), sizeof id.internal);
    }
    if (const nccl::Result r = nccl::lib().comm_init_rank(&g.comm, g.world, id, g.rank); r != nccl::success)
        refuse("ncclCommInitRank failed on rank " + std::to_string(g.rank) + ": " + nccl::error_text(r));
    g.comm_stream = std::make_unique<cuda::Stream>(g.device.index, cuda::Stream::Highest{});  // buckets start as soon as ready
}

/// Makes a replayed CUDA graph (reduce_overhead) check the group first: its collectives would run
/// on an aborted communicator.
inline void check_before_replay() {
    if (Group* g = group_slot().get(); g && g->failed) {
        std::lock_guard l(g->err_m);
        throw DistError("kiln::compile: the process group failed: " + g->error + " (a CUDA graph with collectives was about to replay)");
    }
}

}  // namespace detail

KILN_DECL void init(int rank, int world_size, InitOptions o, Loc loc) {
    using namespace detail;
    if (group_slot())
        kiln::detail::fail<DistError>("dist::init", "already initialized (rank " + std::to_string(group_slot()->rank) + " of " +
                                                        std::to_string(group_slot()->world) + "); call kiln::dist::destroy() first", loc);
    if (world_size < 1) kiln::detail::fail<DistError>("dist::init", "world_size must be at least 1, got " + std::to_string(world_size), loc);
    if (rank < 0 || rank >= world_size)
        kiln::detail::fail<DistError>("dist::init", "rank " + std::to_string(rank) + " is out of range for world_size " +
                                                        std::to_string(world_size) + " (ranks are 0.." + std::to_string(world_size - 1) + ")",
                                      loc);
    auto g = std::make_unique<Group>();
    g->rank = rank;
    g->world = world_size;
    g->local_rank = o.local_rank >= 0 ? o.local_rank : env_int("LOCAL_RANK", rank, loc);
    g->timeout_s = o.timeout_s > 0 ? o.timeout_s : std::atof(env_str("KILN_DIST_TIMEOUT", "300").c_str());
    if (!(g->timeout_s > 0)) kiln::detail::fail<DistError>("dist::init", "the timeout must be positive", loc);
    if (o.device) {
        g->device = *o.device;
    } else if (cuda::device_count() > 0) {
        if (g->local_rank >= cuda::device_count())
            kiln::detail::fail<DistError>("dist::init", "local rank " + std::to_string(g->local_rank) + " has no GPU (this machine has " +
                                                            std::to_string(cuda::device_count()) +
                                                            "); start one process per GPU, or pass InitOptions::device", loc);
        g->device = Device::cuda(g->local_rank);
    } else {
        g->device = Device::cpu();
    }
    g->nccl = g->device.is_cuda();
    g->host = !o.master_addr.empty() ? o.master_addr : env_str("MASTER_ADDR", "127.0.0.1");
    int port = o.master_port >= 0 ? o.master_port : env_int("MASTER_PORT", -1, loc);
    const std::string dir = !o.rendezvous_dir.empty() ? o.rendezvous_dir : env_str("KILN_RDZV_DIR", "");
    if (port < 0 && dir.empty() && world_size > 1)
        kiln::detail::fail<DistError>("dist::init", "no rendezvous for " + std::to_string(world_size) +
                                                        " ranks: set MASTER_ADDR and MASTER_PORT (torchrun's names) or KILN_RDZV_DIR, "
                                                        "or start the program with tools/kilnrun", loc);
    try {
        if (rank == 0) {
            const bool loopback = g->host == "127.0.0.1" || g->host == "localhost";
            g->server = std::make_unique<StoreServer>(loopback ? "127.0.0.1" : "0.0.0.0", port < 0 ? 0 : port);
            if (port < 0 && !dir.empty()) publish_port(dir, g->server->port());
            port = g->server->port();
        } else if (port < 0) {
            port = read_port(dir, g->timeout_s);
        }
        g->port = port;
        g->store = std::make_unique<StoreClient>(g->host, port, g->timeout_s);
        g->store->hello(rank);
        join(*g);
        g->watch = std::make_unique<StoreClient>(g->host, port, g->timeout_s);
        g->watch->hello(rank);
        g->watch->watch();
    } catch (const DistError& e) {
        // rank 0 keeps its store up until the other ranks have heard why (or a short while)
        if (g->server) {
            try {
                if (g->store) g->store->bye();
            } catch (const Error&) {
            }
            g->server->wait_for_ranks(failure_grace_s(*g));
        }
        kiln::detail::fail<DistError>("dist::init", std::string(e.what()) + " (rank " + std::to_string(rank) + " of " +
                                                        std::to_string(world_size) + ")", loc);
    }
    Group* gp = g.get();
    g->watchdog = std::thread([gp] { watchdog_loop(gp); });
    group_slot() = std::move(g);
    cuda::detail::before_replay_hook() = &check_before_replay;
    debug::log("dist", "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " joined on " +
                           group_slot()->device.str() + " (" + (group_slot()->nccl ? "nccl" : "store") + "), store at " +
                           group_slot()->host + ":" + std::to_string(port));
}

KILN_DECL void init_from_env(InitOptions o, Loc loc) {
    const int world = detail::env_int("WORLD_SIZE", 1, loc);
    init(detail::env_int("RANK", 0, loc), world, std::move(o), loc);
}

namespace detail {
/// After the communicator is gone: the symmetric windows' memory that nothing holds any more goes
/// back to NCCL, and what is still held goes back when its last tensor dies.
inline void release_windows(Group& g) {
    std::lock_guard l(g.windows->m);
    g.windows->comm_alive = false;
    for (void* p : g.windows->deferred) nccl::lib().mem_free(p);
    g.windows->deferred.clear();
}

inline void leave(std::unique_ptr<Group>& slot, bool at_exit) {
    if (!slot) return;
    Group& g = *slot;
    g.stop = true;
    if (g.watchdog.joinable()) g.watchdog.join();
    if (g.nccl && g.comm && !at_exit) {
        if (!g.failed) {
            try {
                cuda::synchronize(g.device.index);
                if (g.comm_stream) g.comm_stream->synchronize();
            } catch (const Error&) {
            }
            std::lock_guard l(g.comm_m);
            nccl::lib().comm_destroy(g.comm);
        } else if (!g.aborted) {
            nccl::lib().comm_abort(g.comm);
        }
        g.comm = nullptr;
        release_windows(g);
    }
    try {
        g.store->bye();
        g.watch->bye();
    } catch (const Error&) {
    }
    // rank 0's store stays up until every rank has said goodbye (or, after a failure, gone)
    if (g.server) g.server->wait_for_ranks(g.failed ? failure_grace_s(g) : g.timeout_s);
    if (!at_exit) cuda::detail::before_replay_hook() = nullptr;
    if (at_exit) g.comm = nullptr;  // the process ends: NCCL's resources go with it
    slot.reset();
}
}  // namespace detail

KILN_DECL void destroy() { detail::leave(detail::group_slot(), false); }

KILN_DECL bool is_initialized() { return detail::group_slot() != nullptr; }
KILN_DECL int rank() { return detail::group_slot() ? detail::group_slot()->rank : 0; }
KILN_DECL int world_size() { return detail::group_slot() ? detail::group_slot()->world : 1; }
KILN_DECL int local_rank() { return detail::group_slot() ? detail::group_slot()->local_rank : 0; }
KILN_DECL Device device() { return detail::group_slot() ? detail::group_slot()->device : Device::cpu(); }
KILN_DECL std::string backend() { return detail::group_slot() && detail::group_slot()->nccl ? "nccl" : "store"; }
KILN_DECL void check(Loc loc) { (void)detail::group("dist::check", loc); }

// ---------------------------------------------------------------- collectives
namespace detail {

inline int nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum: return nccl::sum;
        case ReduceOp::avg: return nccl::avg;
        case ReduceOp::max: return nccl::max;
        case ReduceOp::min: return nccl::min;
        case ReduceOp::prod: return nccl::prod;
    }
    return nccl::sum;
}

inline void check_tensor(const Group& g, std::string_view op, const Tensor& t, const Loc& loc) {
    if (!t.defined()) kiln::detail::fail<ValueError>(op, "the tensor is undefined", loc);
    if (t.device() != g.device)
        kiln::detail::fail<DeviceError>(op, "the tensor is on " + t.device().str() + " but this rank's process group is on " +
                                                g.device.str(), loc);
}
inline void check_reduce(std::string_view op, ReduceOp r, DType dt, const Loc& loc) {
    if (r == ReduceOp::avg && !is_floating(dt))
        kiln::detail::fail<DTypeError>(op, "avg needs a floating tensor, got " + std::string(dtype_name(dt)) + " (use sum)", loc);
    if (dt == DType::boolean && r != ReduceOp::max && r != ReduceOp::min)
        kiln::detail::fail<DTypeError>(op, std::string(reduce_op_name(r)) + " of a bool tensor: use max (any) or min (all), or cast it", loc);
}

/// The bytes of a contiguous host tensor.
inline std::string bytes_of(const Tensor& c) { return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes()); }
/// A host tensor of shape and dtype holding b.
inline Tensor from_bytes(const std::string& b, const Shape& shape, DType dt) {
    Tensor t(shape, dt, Device::cpu());
    if (b.size() != t.nbytes()) throw DistError("a rank sent " + std::to_string(b.size()) + " bytes where " + std::to_string(t.nbytes()) +
                                                " were expected (tensors of different shapes or dtypes on different ranks?)");
    if (!b.empty()) std::memcpy(t.data_ptr(), b.data(), b.size());
    return t;
}
inline Tensor combine(const Tensor& a, const Tensor& b, ReduceOp op) {
    if (a.dtype() == DType::boolean) {  // max: any, min: all
        const Tensor r = op == ReduceOp::max ? Tensor(maximum(a.to(DType::i32), b.to(DType::i32))) : Tensor(minimum(a.to(DType::i32), b.to(DType::i32)));
        return r.to(DType::boolean);
    }
    switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: return Tensor(a + b);
        case ReduceOp::prod: return Tensor(a * b);
        case ReduceOp::max: return Tensor(maximum(a, b));
        case ReduceOp::min: return Tensor(minimum(a, b));
    }
    return a;
}

/// Every rank's `mine` (bytes), in rank order, through the store; the keys are erased by the last
/// rank to read them.
inline std::vector<std::string> exchange(Group& g, const std::string& mine, std::string_view op, const Loc& loc) {
    const std::string key = "c/" + std::to_string(++g.seq) + "/";
    return store_call(g, op, loc, [&](StoreClient& s) {
        s.set(key + std::to_string(g.rank), mine);
        std::vector<std::string> all(static_cast<std::size_t>(g.world));
        for (int r = 0; r < g.world; ++r) all[static_cast<std::size_t>(r)] = r == g.rank ? mine : s.get(key + std::to_string(r), g.timeout_s);
        if (s.add(key + "read", 1) == g.world) {
            for (int r = 0; r < g.world; ++r) s.erase(key + std::to_string(r));
            s.erase(key + "read");
        }
        return all;
    });
}

/// t = op over the ranks, in place (t contiguous on the group's device).
inline void all_reduce_now(Group& g, Tensor& t, ReduceOp op, std::string_view what, const Loc& loc) {
    if (g.nccl) {
        const cuda::CUstream s = cuda::current_stream(g.device.index);
        nccl_call(g, what, loc, [&](const nccl::Lib& l) {
            return l.all_reduce(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), nccl::data_type(t.dtype()), nccl_op(op),
                                g.comm, s);
        });
        track(g, s, std::string(what) + " of " + t.shape().str());
        return;
    }
    const std::vector<std::string> all = exchange(g, bytes_of(t), what, loc);
    Tensor acc;
    try {
        for (const std::string& b : all) {
            const Tensor part = from_bytes(b, t.shape(), t.dtype());
            acc = acc.defined() ? combine(acc, part, op) : part;
        }
    } catch (const DistError& e) {
        kiln::detail::fail<DistError>(what, e.what(), loc);
    }
    if (op == ReduceOp::avg) acc = Tensor(acc / static_cast<double>(g.world));
    t.copy_(acc);
}

/// A library call under kiln::compile (every call runs it; two are never merged), else at once.
inline Tensor recorded_call(std::string key, std::function<Tensor(const std::vector<Tensor>&)> run, Shape out,
                            const std::vector<Tensor>& operands, DType dt, const Loc& loc, bool waits = false) {
    auto op = std::make_shared<ir::CallOp>();
    op->waits = waits;
    trace::Tracer* tr = trace::Tracer::active();
    op->key = std::move(key) + " #" + std::to_string(tr ? tr->graph().size() : 0);
    op->shape = [out](const std::vector<Shape>&) { return out; };
    op->run = std::move(run);
    return trace::call_op(std::move(op), operands, dt, loc, /*every_call=*/true);
}

/// An in-place collective on t: under kiln::compile a recorded call computing t's new value from
/// a copy (written back into t); otherwise on t's own memory (through a contiguous copy when t is
/// strided). now(c) runs the collective on a contiguous tensor c in place.
template <class Now>
void in_place_collective(Tensor& t, std::string key, Now now, const Loc& loc) {
    if (trace::Tracer::active()) {
        const Tensor r = recorded_call(
            std::move(key),
            [now](const std::vector<Tensor>& in) {
                Tensor c = in[0].clone();
                now(c);
                return c;
            },
            t.shape(), {t}, t.dtype(), loc);
        t.copy_(r, loc);
        return;
    }
    if (t.is_contiguous()) return now(t);
    Tensor c = t.contiguous();
    now(c);
    t.copy_(c, loc);
}

inline void broadcast_now(Group& g, Tensor& t, int src, std::string_view what, const Loc& loc) {
    if (g.nccl) {
        const cuda::CUstream s = cuda::current_stream(g.device.index);
        nccl_call(g, what, loc, [&](const nccl::Lib& l) {
            return l.broadcast(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), nccl::data_type(t.dtype()), src, g.comm, s);
        });
        track(g, s, std::string(what) + " of " + t.shape().str());
        return;
    }
    const std::string key = "c/" + std::to_string(++g.seq) + "/b";
    store_call(g, what, loc, [&](StoreClient& s) {
        if (g.rank == src) s.set(key, bytes_of(t));
        else t.copy_(from_bytes(s.get(key, g.timeout_s), t.shape(), t.dtype()));
        if (s.add(key + "/read", 1) == g.world) {
            s.erase(key);
            s.erase(key + "/read");
        }
        return 0;
    });
}

inline Tensor all_gather_now(Group& g, const Tensor& t, const Loc& loc) {
    std::vector<std::int64_t> dims{g.world};
    for (int d = 0; d < t.rank(); ++d) dims.push_back(t.shape()[d]);
    Tensor out(Shape(dims), t.dtype(), g.device, loc);
    const Tensor c = t.contiguous();
    if (g.nccl) {
        const cuda::CUstream s = cuda::current_stream(g.device.index);
        nccl_call(g, "all_gather", loc, [&](const nccl::Lib& l) {
            return l.all_gather(c.data_ptr(), out.data_ptr(), static_cast<std::size_t>(c.numel()), nccl::data_type(c.dtype()), g.comm, s);
        });
        track(g, s, "all_gather of " + t.shape().str());
        return out;
    }
    const std::vector<std::string> all = exchange(g, bytes_of(c), "all_gather", loc);
    for (int r = 0; r < g.world; ++r) {
        if (all[static_cast<std::size_t>(r)].size() != c.nbytes())
            kiln::detail::fail<DistError>("all_gather", "rank " + std::to_string(r) + " sent a tensor of another size", loc);
        std::memcpy(static_cast<char*>(out.data_ptr()) + static_cast<std::size_t>(r) * c.nbytes(), all[static_cast<std::size_t>(r)].data(),
                    c.nbytes());
    }
    return out;
}

inline Tensor reduce_scatter_now(Group& g, const Tensor& t, ReduceOp op, const Loc& loc) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < t.rank(); ++d) dims.push_back(t.shape()[d]);
    dims[0] /= g.world;
    Tensor out(Shape(dims), t.dtype(), g.device, loc);
    const Tensor c = t.contiguous();
    if (g.nccl) {
        const cuda::CUstream s = cuda::current_stream(g.device.index);
        nccl_call(g, "reduce_scatter", loc, [&](const nccl::Lib& l) {
            return l.reduce_scatter(c.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out.numel()), nccl::data_type(c.dtype()),
                                    nccl_op(op), g.comm, s);
        });
        track(g, s, "reduce_scatter of " + t.shape().str());
        return out;
    }
    Tensor all = c.clone();
    all_reduce_now(g, all, op, "reduce_scatter", loc);
    out.copy_(all.slice(0, g.rank * dims[0], (g.rank + 1) * dims[0]));
    return out;
}

}  // namespace detail

KILN_DECL void all_reduce(Tensor& t, ReduceOp op, Loc loc) {
    using namespace detail;
    Group& g = group("all_reduce", loc);
    check_tensor(g, "all_reduce", t, loc);
    check_reduce("all_reduce", op, t.dtype(), loc);
    in_place_collective(t, std::string("dist.all_reduce(") + reduce_op_name(op) + ")",
                        [op, loc](Tensor& c) { all_reduce_now(group("all_reduce", loc), c, op, "all_reduce", loc); }, loc);
}

KILN_DECL void broadcast(Tensor& t, int src, Loc loc) {
    using namespace detail;
    Group& g = group("broadcast", loc);
    check_tensor(g, "broadcast", t, loc);
    if (src < 0 || src >= g.world)
        kiln::detail::fail<ValueError>("broadcast", "src " + std::to_string(src) + " is not a rank (world_size " + std::to_string(g.world) + ")", loc);
    in_place_collective(t, "dist.broadcast(src=" + std::to_string(src) + ")",
                        [src, loc](Tensor& c) { broadcast_now(group("broadcast", loc), c, src, "broadcast", loc); }, loc);
}

KILN_DECL Tensor all_gather(const Tensor& t, Loc loc) {
    using namespace detail;
    Group& g = group("all_gather", loc);
    check_tensor(g, "all_gather", t, loc);
    std::vector<std::int64_t> dims{g.world};
    for (int d = 0; d < t.rank(); ++d) dims.push_back(t.shape()[d]);
    if (trace::Tracer::active())
        return recorded_call("dist.all_gather", [loc](const std::vector<Tensor>& in) { return all_gather_now(group("all_gather", loc), in[0], loc); },
                             Shape(dims), {t}, t.dtype(), loc);
    return all_gather_now(g, t, loc);
}

KILN_DECL Tensor reduce_scatter(const Tensor& t, ReduceOp op, Loc loc) {
    using namespace detail;
    Group& g = group("reduce_scatter", loc);
    check_tensor(g, "reduce_scatter", t, loc);
    check_reduce("reduce_scatter", op, t.dtype(), loc);
    if (t.rank() < 1 || t.shape()[0] % g.world != 0 || t.shape()[0] == 0)
        kiln::detail::fail<ShapeError>("reduce_scatter", "dim 0 of " + t.shape().str() + " does not split into " + std::to_string(g.world) +
                                                             " equal parts", loc);
    std::vector<std::int64_t> dims;
    for (int d = 0; d < t.rank(); ++d) dims.push_back(t.shape()[d]);
    dims[0] /= g.world;
    if (trace::Tracer::active())
        return recorded_call(std::string("dist.reduce_scatter(") + reduce_op_name(op) + ")",
                             [op, loc](const std::vector<Tensor>& in) { return reduce_scatter_now(group("reduce_scatter", loc), in[0], op, loc); },
                             Shape(dims), {t}, t.dtype(), loc);
    return reduce_scatter_now(g, t, op, loc);
}

KILN_DECL void barrier(Loc loc) {
    using namespace detail;
    Group& g = group("barrier", loc);
    if (trace::Tracer::active())
        kiln::detail::fail<DistError>("barrier", "cannot run inside kiln::compile (it waits on the host); call it between compiled calls", loc);
    if (g.nccl) {
        try {
            cuda::synchronize(g.device.index);
        } catch (const DeviceError& e) {
            kiln::detail::fail<DistError>("barrier", kiln::detail::strip_kiln_prefix(e.what()), loc);
        }
        (void)group("barrier", loc);  // the watchdog may have failed the group meanwhile
    }
    const std::string key = "b/" + std::to_string(++g.seq);
    store_call(g, "barrier", loc, [&](StoreClient& s) {
        if (s.add(key, 1) == g.world) s.set(key + "/go", "1");
        s.get(key + "/go", g.timeout_s);
        if (s.add(key + "/read", 1) == g.world) {
            s.erase(key);
            s.erase(key + "/go");
            s.erase(key + "/read");
        }
        return 0;
    });
}

// ---------------------------------------------------------------- DDP's buckets
namespace detail {

KILN_DECL int reserve_buckets(int n) {
    Group& g = group("DataParallel", Loc::current());
    const int first = static_cast<int>(g.bucket_events.size()) / 2;
    for (int i = 0; i < 2 * n; ++i) {
        cuda::CUevent e = nullptr;
        if (g.nccl) {
            cuda::detail::use_device(g.device.index);
            cuda::detail::check(cuda::detail::driver().event_create(&e, /*CU_EVENT_DISABLE_TIMING*/ 0x2), "cuEventCreate");
        }
        g.bucket_events.push_back(e);
    }
    return first;
}

/// t *= factor in place on stream `s` (t contiguous, floating, on a CUDA device).
inline void scale_in_place(const Tensor& t, double factor, cuda::CUstream s) {
    const int dev = t.device().index;
    void* x = t.data_ptr();
    std::int64_t n = t.numel();
    const std::int64_t per_vector = 16 / static_cast<std::int64_t>(t.element_size());
    std::int64_t nv = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 ? n / per_vector : 0;
    const std::int64_t work = nv + (n - nv * per_vector);
    const std::int64_t blocks = std::min<std::int64_t>((work + 255) / 256, 4 * std::max(1, cuda::properties(dev).sm_count));
    void* args[] = {&x, &n, &nv, &factor};
    cuda::detail::launch(cuda::detail::kernel_function(cuda::detail::scale_kernel(t.dtype()), dev), static_cast<unsigned>(blocks), 256, 0, s,
                         args);
}

KILN_DECL Tensor bucket_memory(std::int64_t numel, DType dt, Device dev, bool symmetric, const Loc& loc) {
    Group& g = group("DataParallel", loc);
    if (!g.nccl || g.world == 1 || numel == 0 || !symmetric || !nccl::lib().has_windows()) return zeros(Shape{numel}, dt, dev);
    const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(dt);
    cuda::detail::use_device(g.device.index);
    void* p = nullptr;
    nccl_call(g, "DataParallel", loc, [&](const nccl::Lib& l) { return l.mem_alloc(&p, bytes); });
    std::shared_ptr<Group::Windows> owner = g.windows;
    std::shared_ptr<void> keep(p, [owner](void* q) {
        std::lock_guard l(owner->m);
        if (owner->comm_alive) owner->deferred.push_back(q);
        else nccl::lib().mem_free(q);
    });
    void* win = nullptr;  // released with the communicator
    nccl_call(g, "DataParallel", loc, [&](const nccl::Lib& l) { return l.window_register(g.comm, p, bytes, &win, nccl::win_coll_symmetric); });
    {
        std::lock_guard l(owner->m);
        owner->ranges.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
    }
    if (debug::log_on("dist"))
        debug::log("dist", "DataParallel: a bucket of " + std::to_string(bytes) + " bytes in a symmetric window at " +
                               std::to_string(reinterpret_cast<std::uintptr_t>(p)));
    auto storage = std::make_shared<kiln::detail::Storage>(p, bytes, dev, std::move(keep));
    Tensor t(std::move(storage), 0, Shape{numel}, contiguous_strides(Shape{numel}), dt);
    cuda::detail::fill_dense(t, 0);  // zeroed, as zeros() would be
    return t;
}

KILN_DECL bool in_window(const Tensor& t) {
    const Group* g = group_slot().get();
    return g && t.defined() && t.numel() > 0 && g->windows->holds(t.data_ptr(), t.nbytes());
}

KILN_DECL Tensor bucket_start(const Tensor& flat, int id, const Loc& loc) {
    Group& g = group("DataParallel", loc);
    if (!flat.is_contiguous())
        kiln::detail::fail<ValueError>("DataParallel", "a bucket must be one contiguous tensor", loc);
    if (g.world == 1) return flat;  // the average over one rank: nothing to send
    if (!g.nccl) {
        Tensor f = flat;
        all_reduce_now(g, f, ReduceOp::avg, "DataParallel", loc);
        return flat;
    }
    const cuda::detail::Driver& d = cuda::detail::driver();
    const cuda::CUstream s = cuda::current_stream(g.device.index), comm = g.comm_stream->handle();
    const cuda::CUevent ready = g.bucket_events.at(2 * static_cast<std::size_t>(id)), done = g.bucket_events.at(2 * static_cast<std::size_t>(id) + 1);
    cuda::detail::check(d.event_record(ready, s), "cuEventRecord");
    cuda::detail::check(d.stream_wait_event(comm, ready, 0), "cuStreamWaitEvent");
    if (debug::log_on("dist"))
        debug::log("dist", "DataParallel: bucket " + std::to_string(id) + " all-reduced at " +
                               std::to_string(reinterpret_cast<std::uintptr_t>(flat.data_ptr())));
    // in a symmetric window: NCCL's symmetric kernels, which run sum (not avg); bucket_wait scales
    // by 1/world (2 H200s, the BERT layer: a step of 1052 -> 1016 us without the scale; avg or
    // ncclRedOpCreatePreMulSum in a window, or sum outside one, gained nothing)
    const bool window = g.windows->holds(flat.data_ptr(), flat.nbytes());
    if (g.bucket_summed.size() <= static_cast<std::size_t>(id)) g.bucket_summed.resize(static_cast<std::size_t>(id) + 1, 0);
    g.bucket_summed[static_cast<std::size_t>(id)] = window ? 1 : 0;
    if (flat.numel() > 0) {
        nccl_call(g, "DataParallel", loc, [&](const nccl::Lib& l) {
            return l.all_reduce(flat.data_ptr(), flat.data_ptr(), static_cast<std::size_t>(flat.numel()), nccl::data_type(flat.dtype()),
                                window ? nccl::sum : nccl::avg, g.comm, comm);
        });
    }
    cuda::detail::check(d.event_record(done, comm), "cuEventRecord");
    track(g, comm, "DataParallel's gradient all-reduce (bucket " + std::to_string(id) + ", " + std::to_string(flat.numel()) + " elements)");
    return flat;
}

KILN_DECL Tensor bucket_wait(const Tensor& flat, int id, const Loc& loc) {
    Group& g = group("DataParallel", loc);
    if (g.nccl && g.world > 1) {
        const cuda::CUstream s = cuda::current_stream(g.device.index);
        cuda::detail::check(cuda::detail::driver().stream_wait_event(s, g.bucket_events.at(2 * static_cast<std::size_t>(id) + 1), 0),
                            "cuStreamWaitEvent");
        // a window's sum becomes the average here, on the compute stream, so that the next
        // bucket's all-reduce never queues behind it on NCCL's stream (measured: on NCCL's stream
        // the scale passes cost the MLP, whose step is mostly communication, 7-10 us)
        if (static_cast<std::size_t>(id) < g.bucket_summed.size() && g.bucket_summed[static_cast<std::size_t>(id)]) {
            if (!g.windows->holds(flat.data_ptr(), flat.nbytes()))
                kiln::detail::fail<DistError>("DataParallel", "internal: bucket " + std::to_string(id) +
                                                                  " was summed in its window but is waited for elsewhere", loc);
            if (flat.numel() > 0) scale_in_place(flat, 1.0 / g.world, s);
        }
    }
    return flat;
}

KILN_DECL void broadcast_coalesced(std::vector<Tensor>& tensors, int src, const Loc& loc) {
    Group& g = group("DataParallel", loc);
    if (!g.nccl) {
        for (Tensor& t : tensors) broadcast(t, src, loc);
        return;
    }
    const cuda::CUstream s = cuda::current_stream(g.device.index);
    std::vector<Tensor> c;
    for (const Tensor& t : tensors) c.push_back(t.contiguous());
    nccl_call(g, "DataParallel", loc, [&](const nccl::Lib& l) {
        nccl::Result r = l.group_start();
        for (std::size_t i = 0; i < c.size() && r == nccl::success; ++i)
            if (c[i].numel() > 0)
                r = l.broadcast(c[i].data_ptr(), c[i].data_ptr(), static_cast<std::size_t>(c[i].numel()), nccl::data_type(c[i].dtype()), src,
                                g.comm, s);
        const nccl::Result e = l.group_end();
        return r != nccl::success ? r : e;
    });
    track(g, s, "DataParallel's broadcast of " + std::to_string(c.size()) + " tensors");
    for (std::size_t i = 0; i < c.size(); ++i)
        if (!c[i].is_same(tensors[i])) tensors[i].copy_(c[i], loc);
}

}  // namespace detail
}  // namespace kiln::dist
