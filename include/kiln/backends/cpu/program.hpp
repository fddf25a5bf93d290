// The tile interpreter: a runtime list of table ops evaluated tile by tile, across threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/backends/cpu/op_kernels.hpp"
#include "kiln/backends/cpu/thread_pool.hpp"
#include "kiln/backends/cpu/tile.hpp"

namespace kiln::detail {

/// Calls visit with TypeTag<C> for the compute types f32, f64, i32, i64.
template <class F>
decltype(auto) visit_ct(DType ct, F&& f) {
    return visit_compute_dtype(ct, std::forward<F>(f));
}

/// Runs body(start, len) over [0, n) in tiles, threads taking contiguous runs of tiles.
template <class Body>
inline void for_each_tile(std::int64_t n, Body&& body) {
    parallel_for(n, parallel_grain, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t s = b; s < e; s += tile_elems) body(s, std::min(tile_elems, e - s));
    });
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

    int leaf_value(int i) const { return i; }
    int scalar_value(int i) const { return static_cast<int>(leaves.size()) + i; }
    int instr_value(int i) const { return static_cast<int>(leaves.size() + scalars.size()) + i; }
};

namespace program_detail {

struct Slot {
    int value;
    DType ct;
};
struct Step {
    enum Kind { gather, fill, exec, convert } kind;
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
        for (int k = 0; k < 3; ++k)
            if (ins.in[k] >= 0) pl.instr_in[k][i] = slot_of(ins.in[k], ins.ct);
        const int v = p.instr_value(static_cast<int>(i));
        produced[static_cast<std::size_t>(v)] = ins.ct;
        pl.slots.push_back({v, ins.ct});
        pl.instr_out[i] = static_cast<int>(pl.slots.size() - 1);
        pl.steps.push_back({Step::exec, pl.instr_out[i], static_cast<int>(i)});
    }
    pl.result_slot = pl.instr_out.back();
    return pl;
}

}  // namespace program_detail

/// Evaluates a program's result tile by tile; reusable as the value source of a reduction.
class ProgramRunner {
public:
    explicit ProgramRunner(const TileProgram& p) : p_(p), pl_(program_detail::plan(p)) {
        if (p.instrs.empty()) throw InternalError("kiln: empty tile program");
        leaf_direct_.resize(p.leaves.size());
        for (std::size_t l = 0; l < p.leaves.size(); ++l) leaf_direct_[l] = is_linear(p.space, p.leaves[l]);
        kernels_.resize(p.instrs.size());
        for (std::size_t i = 0; i < p.instrs.size(); ++i) {
            const auto& ins = p.instrs[i];
            visit_ct(ins.ct, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const TileKernel<T> k = tile_kernel<T>(ins.op);
                if (!k)
                    throw InternalError("kiln: op " + std::string(ops::op_name(ins.op)) + " has no kernel for " +
                                        std::string(dtype_name(ins.ct)));
                kernels_[i] = reinterpret_cast<void*>(k);
            });
        }
    }
    /// Compute type of the result values tile() writes.
    DType result_ct() const { return p_.instrs.back().ct; }

    /// Writes result elements [start, start + len) of the iteration space to dst (result_ct).
    void tile(std::int64_t start, std::int64_t len, void* dst) const {
        using namespace program_detail;
        struct Tag {};
        char* buf = reinterpret_cast<char*>(scratch<double, Tag>(pl_.slots.size()));
        thread_local std::vector<void*> ptr;
        ptr.resize(pl_.slots.size());
        for (std::size_t s = 0; s < pl_.slots.size(); ++s) ptr[s] = buf + s * tile_elems * sizeof(double);
        ptr[static_cast<std::size_t>(pl_.result_slot)] = dst;
        for (const Step& st : pl_.steps) {
            const std::size_t si = static_cast<std::size_t>(st.slot);
            visit_ct(pl_.slots[si].ct, [&](auto tag) {
                using T = typename decltype(tag)::type;
                T* out = static_cast<T*>(ptr[si]);
                switch (st.kind) {
                    case Step::gather: {
                        const Access& a = p_.leaves[static_cast<std::size_t>(st.src)];
                        if (leaf_direct_[static_cast<std::size_t>(st.src)] && a.dtype == dtype_of<T>)
                            ptr[si] = a.base + start * static_cast<std::int64_t>(sizeof(T));
                        else
                            gather(p_.space, a, start, len, out);
                        break;
                    }
                    case Step::fill:
                        std::fill_n(out, len, static_cast<T>(p_.scalars[static_cast<std::size_t>(st.src)]));
                        break;
                    case Step::convert:
                        visit_ct(pl_.slots[static_cast<std::size_t>(st.src)].ct, [&](auto ftag) {
                            using F = typename decltype(ftag)::type;
                            convert_tile(static_cast<const F*>(ptr[static_cast<std::size_t>(st.src)]), out, len);
                        });
                        break;
                    case Step::exec: {
                        const std::size_t ii = static_cast<std::size_t>(st.src);
                        const T* in[3] = {};
                        for (int k = 0; k < 3; ++k) {
                            const int s = pl_.instr_in[k][ii];
                            if (s >= 0) in[k] = static_cast<const T*>(ptr[static_cast<std::size_t>(s)]);
                        }
                        reinterpret_cast<TileKernel<T>>(kernels_[ii])(in, out, len, p_.instrs[ii].attr);
                        break;
                    }
                }
            });
        }
    }

private:
    const TileProgram& p_;
    program_detail::Plan pl_;
    std::vector<char> leaf_direct_;
    std::vector<void*> kernels_;
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

/// Evaluates the program's result into p.out, elementwise over p.space.
inline void run_program(const TileProgram& p) {
    const ProgramRunner runner(p);
    store_tiles(p.space, p.out, runner.result_ct(),
                [&](std::int64_t start, std::int64_t len, void* dst) { runner.tile(start, len, dst); });
}

}  // namespace kiln::detail
