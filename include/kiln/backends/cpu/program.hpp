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
