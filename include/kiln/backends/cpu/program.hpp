// The tile interpreter: a runtime list of table ops evaluated tile by tile, across threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tables/op_kernels.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/thread_pool.hpp"
#include "kiln/backends/cpu/tile.hpp"

namespace kiln::detail {

/// Calls visit with TypeTag<C> for the compute types f32, f64, i32, i64.
template <class F>
decltype(auto) visit_ct(DType ct, F&& f) {
    return visit_compute_dtype(ct, std::forward<F>(f));
}

/// A group of elementwise ops as an instruction list over an iteration space. Values are numbered:
/// leaves first, then scalars, then one per instruction; the last instruction is the result.
struct TileProgram {
    struct Instr {
        ops::OpId op;
        DType ct;                 ///< compute type
        DType attr = DType::f32;  ///< cast target
        int in[3] = {-1, -1, -1};
    };
    IterSpace space;
    std::vector<Access> leaves;
    std::vector<double> scalars;
    std::vector<Instr> instrs;
    Access out;
    /// More values stored per tile besides the result (a group with several outputs): an
    /// instruction's value index and where it goes.
    std::vector<std::pair<int, Access>> side;

    /// Every access in the order generated kernels take them: the leaves, the result, the side outputs.
    std::vector<const Access*> accesses() const {
        std::vector<const Access*> all;
        for (const Access& a : leaves) all.push_back(&a);
        all.push_back(&out);
        for (const auto& sd : side) all.push_back(&sd.second);
        return all;
    }

    int leaf_value(int i) const { return i; }
    int scalar_value(int i) const { return static_cast<int>(leaves.size()) + i; }
    int instr_value(int i) const { return static_cast<int>(leaves.size() + scalars.size()) + i; }
};

namespace program_detail {

/// The type a compute type's kernels run in: bool-valued work computes as f32 (0 and 1).
constexpr DType kernel_ct(DType ct) { return ct == DType::boolean ? DType::f32 : ct; }

struct Slot {
    int value;
    DType ct;
};
struct Step {
    enum Kind { gather, direct, fill, exec, convert } kind;
    int slot;         // destination
    int src = -1;     // leaf index, scalar index, instruction index or source slot
};
struct Plan {
    std::vector<Slot> slots;
    std::vector<Step> steps;     // per tile
    std::vector<int> instr_in[3];
    std::vector<int> instr_out;
    int result_slot = -1;
};

inline Plan plan(const TileProgram& p) {
    Plan pl;
    const int nv = p.instr_value(static_cast<int>(p.instrs.size()));
    std::vector<DType> produced(static_cast<std::size_t>(nv), DType::boolean);  // ct a node value is born in
    auto slot_of = [&](int value, DType ct) -> int {
        for (std::size_t s = 0; s < pl.slots.size(); ++s)
            if (pl.slots[s].value == value && pl.slots[s].ct == ct) return static_cast<int>(s);
        pl.slots.push_back({value, ct});
        const int s = static_cast<int>(pl.slots.size() - 1);
        const int nl = static_cast<int>(p.leaves.size()), ns = static_cast<int>(p.scalars.size());
        if (value < nl) {
            pl.steps.push_back({Step::gather, s, value});
        } else if (value < nl + ns) {
            pl.steps.push_back({Step::fill, s, value - nl});
        } else if (produced[static_cast<std::size_t>(value)] != ct) {
            // a node value needed in another compute type: convert from the slot it was born in
            int from = -1;
            for (std::size_t t = 0; t < pl.slots.size(); ++t)
                if (pl.slots[t].value == value && pl.slots[t].ct == produced[static_cast<std::size_t>(value)]) from = static_cast<int>(t);
            pl.steps.push_back({Step::convert, s, from});
        }
        return s;
    };
    for (int k = 0; k < 3; ++k) pl.instr_in[k].resize(p.instrs.size(), -1);
    pl.instr_out.resize(p.instrs.size());
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
        const auto& ins = p.instrs[i];
        const DType ct = kernel_ct(ins.ct);
        for (int k = 0; k < 3; ++k)
            if (ins.in[k] >= 0) pl.instr_in[k][i] = slot_of(ins.in[k], ct);
        const int v = p.instr_value(static_cast<int>(i));
        produced[static_cast<std::size_t>(v)] = ct;
        pl.slots.push_back({v, ct});
        pl.instr_out[i] = static_cast<int>(pl.slots.size() - 1);
        pl.steps.push_back({Step::exec, pl.instr_out[i], static_cast<int>(i)});
    }
    pl.result_slot = pl.instr_out.back();
    return pl;
}

/// Scratch tiles for the slots, shared by slots whose lives do not overlap (a chain of n ops
/// needs a few tiles, not n, so the working set stays in L1). Slots marked external (leaves read
/// in place, the result) get -1. Fill slots keep their tile for the whole run, since a run fills
/// them once, not per tile (`filled` marks them); `kept` slots keep theirs to the end of the tile
/// (values stored after the last step).
inline std::vector<int> assign_buffers(const Plan& pl, const std::vector<char>& external, const std::vector<char>& filled,
                                       const std::vector<char>& kept, int& buffers) {
    const std::size_t ns = pl.slots.size();
    std::vector<int> last_use(ns, -1), buf(ns, -1);
    auto reads = [&](const Step& st, auto&& f) {
        if (st.kind == Step::convert) f(st.src);
        if (st.kind == Step::exec)
            for (int k = 0; k < 3; ++k)
                if (const int s = pl.instr_in[k][static_cast<std::size_t>(st.src)]; s >= 0) f(s);
    };
    for (std::size_t i = 0; i < pl.steps.size(); ++i) reads(pl.steps[i], [&](int s) { last_use[static_cast<std::size_t>(s)] = static_cast<int>(i); });
    std::vector<int> free_list;
    buffers = 0;
    auto take = [&] {
        if (free_list.empty()) return buffers++;
        const int b = free_list.back();
        free_list.pop_back();
        return b;
    };
    for (std::size_t s = 0; s < ns; ++s)
        if (filled[s]) buf[s] = take();
    for (std::size_t i = 0; i < pl.steps.size(); ++i) {
        const Step& st = pl.steps[i];
        const std::size_t d = static_cast<std::size_t>(st.slot);
        if (st.kind != Step::fill && !external[d]) buf[d] = take();  // before freeing inputs: never in place
        auto release = [&](int s) {
            const std::size_t u = static_cast<std::size_t>(s);
            if (last_use[u] == static_cast<int>(i) && buf[u] >= 0 && !external[u] && !filled[u] && !kept[u]) {
                free_list.push_back(buf[u]);
                last_use[u] = -2;  // released once even when read twice by this step
            }
        };
        reads(st, release);
        if (last_use[d] == -1 && buf[d] >= 0 && !kept[d]) free_list.push_back(buf[d]);  // written, never read
    }
    return buf;
}

}  // namespace program_detail

/// Evaluates a program's result tile by tile; reusable as the value source of a reduction.
class ProgramRunner {
public:
    KILN_DECL explicit ProgramRunner(const TileProgram& p);
    /// Compute type of the result values tile() writes.
    DType result_ct() const { return program_detail::kernel_ct(p_.instrs.back().ct); }
    /// Scratch tiles one thread uses (after sharing between slots).
    int scratch_tiles() const { return buffers_; }

    /// Writes result elements [start, start + len) of the iteration space to dst (result_ct), in
    /// tiles of tile_elems; any len works, and a long run pays the set-up (scalar fills) once.
    KILN_DECL void tile(std::int64_t start, std::int64_t len, void* dst) const;

private:
    /// A per-tile step with what it needs resolved: the kernel (scalar operands broadcast from
    /// their one value), the operand slots, the element size of a leaf read in place.
    struct Exec {
        program_detail::Step::Kind kind;
        int slot, src;
        int in[3] = {-1, -1, -1};
        AnyTileKernel kernel = nullptr;
        DType attr = DType::f32;
        std::int64_t esize = 0;
    };
    const TileProgram& p_;
    program_detail::Plan pl_;
    std::vector<int> buffer_of_;
    int buffers_ = 0;
    std::vector<Exec> execs_;
    std::vector<int> side_slots_;  ///< slots of p.side's values
};

/// Writes a tile of compute-type values produced by `produce(start, len, dst)` to an access,
/// straight into its memory when it is linear and of the compute type.
template <class Produce>
inline void store_tiles(const IterSpace& space, const Access& out, DType ct, Produce&& produce) {
    const bool direct = is_linear(space, out) && out.dtype == ct;
    const std::int64_t esize = static_cast<std::int64_t>(dtype_size(out.dtype));
    struct Tag {};
    for_each_tile(space.numel(), [&](std::int64_t start, std::int64_t len) {
        if (direct) {
            produce(start, len, static_cast<void*>(out.base + start * esize));
            return;
        }
        double* buf = scratch<double, Tag>(1);
        produce(start, len, static_cast<void*>(buf));
        visit_ct(ct, [&](auto tag) {
            using T = typename decltype(tag)::type;
            scatter(space, out, start, len, reinterpret_cast<const T*>(buf));
        });
    });
}

/// Evaluates the program's result into p.out, elementwise over p.space. A linear output of the
/// result's compute type takes each thread's whole run in one call.
KILN_DECL void run_program(const TileProgram& p);

}  // namespace kiln::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cpu/program_impl.hpp"
#endif
