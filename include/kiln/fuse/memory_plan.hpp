// Memory planning over a fused plan, one pass for both executors: where each value is last read,
// which values must keep memory of their own (outputs, and what outputs view), and buffer slots
// that intermediates with disjoint lifetimes share. The CPU executor runs steady-state calls on
// the slots (allocating nothing but the outputs); the CUDA executor drops each intermediate after
// the last group that reads it, so the stream-ordered caching allocator hands its block to the
// next value (peak memory is the live set, not every intermediate of the call).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::fuse {

struct MemoryPlan {
    /// per group: the nodes whose last reader it is (not pinned, not inputs or constants), which
    /// an executor may drop once the group has run.
    std::vector<std::vector<int>> dead_after;
    /// node -> buffer slot (-1: memory of its own); empty when no node has one.
    std::vector<int> slot_of;
    std::vector<std::size_t> slot_bytes;  ///< bytes of each slot
    std::vector<int> base;       ///< node -> the node whose memory it is (itself, or what a view or in-place write shows)
    std::vector<int> last_use;   ///< base node -> the last group that reads its memory through any view of it (-1: none)
    std::vector<char> pinned;    ///< node -> an output, or memory an output shows (never dropped early)
};

/// Bytes of node i's value (its shape and dtype).
inline std::size_t node_bytes(const ir::Graph& g, int i) {
    return static_cast<std::size_t>(g[i].shape.numel()) * dtype_size(g[i].dtype);
}

/// The memory plan of graph g run as `plan`. Slots go to the values of elementwise, row, reduce
/// and write groups (a GEMM, a library call and a view make their own memory), of a size equal to
/// a free slot's; `with_slots = false` leaves them out (liveness only).
inline MemoryPlan plan_memory(const ir::Graph& g, const Plan& plan, bool with_slots = true) {
    const int N = g.size();
    const auto& groups = plan.groups;
    const auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
    MemoryPlan m;
    // node -> the node whose memory it is: a view, or a value an in-place write group produces,
    // shows its operand's memory; every other node its own
    std::vector<int>& base = m.base;
    base.resize(static_cast<std::size_t>(N));
    for (int i = 0; i < N; ++i) {
        const int gi = at(plan.group_of, i);
        const bool aliases = g[i].kind == ir::Kind::view ||
                             (gi >= 0 && groups[static_cast<std::size_t>(gi)].kind == Group::Kind::write &&
                              groups[static_cast<std::size_t>(gi)].in_place);
        at(base, i) = aliases ? at(base, g[i].in[0]) : i;
    }
    // node -> an output, or memory an output shows: never shared, never dropped early
    std::vector<char>& pinned = m.pinned;
    pinned.assign(static_cast<std::size_t>(N), 0);
    for (int o : g.outputs) {
        at(pinned, o) = 1;
        at(pinned, at(base, o)) = 1;
    }
    // node -> the last group that reads it as a leaf / that reads its memory through any view of
    // it (-1: none); a slot is free again after its last use
    std::vector<int> last_read(static_cast<std::size_t>(N), -1);
    std::vector<int>& last_use = m.last_use;
    last_use.assign(static_cast<std::size_t>(N), -1);
    for (std::size_t k = 0; k < groups.size(); ++k)
        for (int l : groups[k].leaves) {
            at(last_read, l) = std::max(at(last_read, l), static_cast<int>(k));
            int& u = at(last_use, at(base, l));
            u = std::max(u, static_cast<int>(k));
        }
    m.dead_after.resize(groups.size());
    for (int i = 0; i < N; ++i) {
        const int k = at(last_read, i);
        const ir::Kind kind = g[i].kind;
        if (k >= 0 && !at(pinned, i) && kind != ir::Kind::input && kind != ir::Kind::constant && kind != ir::Kind::scalar)
            m.dead_after[static_cast<std::size_t>(k)].push_back(i);
    }
    if (!with_slots) return m;
    m.slot_of.assign(static_cast<std::size_t>(N), -1);
    std::vector<int> slot_free_after;  // group index after which the slot is free again
    for (std::size_t k = 0; k < groups.size(); ++k) {
        const Group& G = groups[k];
        if (G.kind == Group::Kind::view || G.kind == Group::Kind::matmul || G.kind == Group::Kind::call) continue;
        for (int o : G.outputs) {
            if (at(pinned, o) || at(last_use, o) < 0) continue;
            const std::size_t bytes = node_bytes(g, o);
            int pick = -1;
            for (std::size_t sl = 0; sl < m.slot_bytes.size() && pick < 0; ++sl)
                if (m.slot_bytes[sl] == bytes && slot_free_after[sl] < static_cast<int>(k)) pick = static_cast<int>(sl);
            if (pick < 0) {
                pick = static_cast<int>(m.slot_bytes.size());
                m.slot_bytes.push_back(bytes);
                slot_free_after.push_back(0);
            }
            at(m.slot_of, o) = pick;
            at(slot_free_after, pick) = at(last_use, o);
        }
    }
    if (m.slot_bytes.empty()) m.slot_of.clear();
    return m;
}

/// The live set at the peak of a run of `plan` that drops each value after its last reader
/// (through any view of it: MemoryPlan::last_use), as the CUDA executor does: memory the call
/// makes, not counting its inputs and constants (KILN_LOGS=memory). Views, in-place writes and
/// values stored straight into captured memory make none; library calls' workspaces are not
/// counted.
struct MemoryPeak {
    std::size_t bytes = 0;     ///< live bytes at the peak
    int group = -1;            ///< the group after whose outputs the peak is reached
    std::vector<int> live;     ///< the nodes holding memory then, largest first
    std::size_t pinned = 0;    ///< bytes of the program's outputs (live to the end) at the peak
};

inline MemoryPeak peak_live(const ir::Graph& g, const Plan& plan, const MemoryPlan& mem) {
    const int N = g.size();
    const auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
    // memory a node makes lives until the last group that reads it through any view of it
    std::vector<std::vector<int>> free_after(plan.groups.size());
    for (int i = 0; i < N; ++i)
        if (at(mem.base, i) == i && !at(mem.pinned, i) && at(mem.last_use, i) >= 0)
            free_after[static_cast<std::size_t>(at(mem.last_use, i))].push_back(i);
    std::vector<char> owns(static_cast<std::size_t>(N), 0);
    std::vector<int> live;
    std::size_t now = 0;
    MemoryPeak peak;
    for (std::size_t k = 0; k < plan.groups.size(); ++k) {
        const Group& G = plan.groups[k];
        if (G.kind != Group::Kind::view && !(G.kind == Group::Kind::write && G.in_place))
            for (int o : G.outputs) {
                if (!plan.store_into.empty() && plan.store_into[static_cast<std::size_t>(o)] >= 0) continue;
                owns[static_cast<std::size_t>(o)] = 1;
                live.push_back(o);
                now += node_bytes(g, o);
            }
        if (now > peak.bytes) {
            peak.bytes = now;
            peak.group = static_cast<int>(k);
            peak.live = live;
        }
        for (int d : free_after[k])
            if (owns[static_cast<std::size_t>(d)]) {
                owns[static_cast<std::size_t>(d)] = 0;
                now -= node_bytes(g, d);
                live.erase(std::find(live.begin(), live.end(), d));
            }
    }
    std::sort(peak.live.begin(), peak.live.end(), [&](int a, int b) { return node_bytes(g, a) > node_bytes(g, b); });
    for (int i : peak.live)
        if (at(mem.pinned, i)) peak.pinned += node_bytes(g, i);
    return peak;
}

}  // namespace kiln::fuse
