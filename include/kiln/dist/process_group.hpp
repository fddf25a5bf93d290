// Process groups: one process per GPU (or per CPU worker), the collectives over them, and the
// failure handling that keeps a job from hanging when a rank dies.
//
//   kiln::dist::init_from_env();                 // RANK, WORLD_SIZE, LOCAL_RANK (tools/kilnrun, torchrun)
//   kiln::Tensor t = kiln::ones({4}, kiln::DType::f32, kiln::dist::device());
//   kiln::dist::all_reduce(t);                   // in place: every rank now holds the sum
//   kiln::dist::destroy();
//
// On CUDA the collectives are NCCL's (loaded at run time, backends/cuda/nccl.hpp) on kiln's stream
// of the rank's GPU; on the CPU they go through the group's store (small and slow: tests and
// CPU-only runs, not a fast transport). Ranks meet through a TCP store that rank 0 runs
// (dist/store.hpp): at MASTER_ADDR:MASTER_PORT, or at a free port rank 0 writes into
// KILN_RDZV_DIR (what tools/kilnrun does).
//
// Failures are DistError: at init, a rank out of range, two processes with one rank, ranks started
// with different world sizes, a rank that never joins; later, a rank that exits (its store
// connection closes without a goodbye: every other rank learns it at once) or a collective that
// does not finish within the timeout. A watchdog thread per process notices both, aborts the NCCL
// communicator (so kernels waiting for the dead peer return) and the next collective, DDP step or
// check() throws DistError naming what happened.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::dist {

using Loc = std::source_location;

/// How a collective combines the ranks' values (avg: floating dtypes only).
enum class ReduceOp : std::uint8_t { sum, avg, max, min, prod };
KILN_DECL const char* reduce_op_name(ReduceOp op);

struct InitOptions {
    /// The rank's device. Default: cuda(LOCAL_RANK) where there are CUDA devices, else the CPU.
    std::optional<Device> device{};
    /// The store's host. Default: $MASTER_ADDR, else 127.0.0.1.
    std::string master_addr{};
    /// The store's port. Default: $MASTER_PORT; without it, the rendezvous folder.
    int master_port = -1;
    /// A folder the ranks share: rank 0 listens on a free port and writes it there. Default: $KILN_RDZV_DIR.
    std::string rendezvous_dir{};
    /// Seconds to wait for the other ranks at init, in a barrier, and for a collective to finish.
    /// Default: $KILN_DIST_TIMEOUT, else 300.
    double timeout_s = -1;
    /// Which GPU of this host the rank uses. Default: $LOCAL_RANK, else the rank.
    int local_rank = -1;
};

/// Joins the group of `world_size` processes as `rank` (0-based). Blocks until every rank has
/// joined; DistError when one cannot (see the file comment).
KILN_DECL void init(int rank, int world_size, InitOptions o = {}, Loc loc = Loc::current());
/// init() with RANK and WORLD_SIZE from the environment (tools/kilnrun and torchrun set them;
/// both absent: a group of one).
KILN_DECL void init_from_env(InitOptions o = {}, Loc loc = Loc::current());
/// Leaves the group in order: waits for its GPU work, says goodbye to the store (rank 0 waits
/// for every other rank's goodbye first, at most the timeout), frees the communicator. Safe to
/// call when not initialized.
KILN_DECL void destroy();
KILN_DECL bool is_initialized();
KILN_DECL int rank();
KILN_DECL int world_size();
KILN_DECL int local_rank();
/// The device this rank's collectives run on.
KILN_DECL Device device();
/// "nccl" or "store".
KILN_DECL std::string backend();
/// Throws DistError if the group has failed (a rank died, a collective timed out).
KILN_DECL void check(Loc loc = Loc::current());

// ------------------------------------------------------------------ collectives
// Every rank calls the same collectives in the same order, with tensors of one shape and dtype
// on the group's device. Under kiln::compile they are nodes of the program (run on every call,
// captured into the CUDA graph under reduce_overhead).

/// t = op over the ranks of t, in place.
KILN_DECL void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current());
/// t = rank src's t, in place.
KILN_DECL void broadcast(Tensor& t, int src = 0, Loc loc = Loc::current());
/// Every rank's t stacked: shape (world_size, *t.shape), rank r's at index r.
KILN_DECL Tensor all_gather(const Tensor& t, Loc loc = Loc::current());
/// op over the ranks of t, split along dim 0 into world_size equal parts: rank r gets part r.
KILN_DECL Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current());
/// Returns once every rank has called it (and this rank's queued GPU work has finished).
KILN_DECL void barrier(Loc loc = Loc::current());

namespace detail {
/// DDP's gradient buckets (dist/ddp.hpp). bucket_start averages `flat` (a bucket: contiguous, on
/// the group's device) over the ranks in place and returns it: on NCCL asynchronously on the
/// group's communication stream (after the work queued so far), on the store at once.
/// bucket_wait makes the current stream wait for it and returns `flat` (kept alive until then).
/// `id` names the bucket's events (reserve_buckets).
/// A bucket's memory, zeroed: with `symmetric` a symmetric window (ncclMemAlloc, registered once:
/// NCCL's symmetric kernels) where NCCL >= 2.27 runs with more than one rank, else an ordinary
/// tensor. Every rank calls it for its buckets in the same order (the registration is collective).
KILN_DECL Tensor bucket_memory(std::int64_t numel, DType dt, Device dev, bool symmetric, const Loc& loc);
/// Whether t's memory lies in one of this process group's symmetric windows (false without a group).
KILN_DECL bool in_window(const Tensor& t);
KILN_DECL Tensor bucket_start(const Tensor& flat, int id, const Loc& loc);
KILN_DECL Tensor bucket_wait(const Tensor& flat, int id, const Loc& loc);
/// n new bucket ids (each with its own pair of events).
KILN_DECL int reserve_buckets(int n);
/// Broadcasts each tensor from `src` in place, as one group of collectives.
KILN_DECL void broadcast_coalesced(std::vector<Tensor>& tensors, int src, const Loc& loc);
}  // namespace detail

}  // namespace kiln::dist

#if KILN_HEADER_ONLY
#include "kiln/dist/process_group_impl.hpp"
#endif
