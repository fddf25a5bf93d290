// The tile interpreter's compiled part: a program's plan resolved to kernels, run tile by tile.
#pragma once
// Included at the end of kiln/backends/cpu/program.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <vector>


namespace kiln::detail {

namespace program_detail {

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

KILN_DECL ProgramRunner::ProgramRunner(const TileProgram& p) : p_(p), pl_(program_detail::plan(p)) {
    using program_detail::Step;
    if (p.instrs.empty()) throw InternalError("kiln: empty tile program");
    const std::size_t ns = pl_.slots.size();
    std::vector<char> external(ns, 0), filled(ns, 0);
    for (Step& st : pl_.steps) {
        const std::size_t si = static_cast<std::size_t>(st.slot);
        if (st.kind == Step::fill) filled[si] = 1;
        // leaves that are linear in the space and already of the compute type are read in place
        if (st.kind == Step::gather && is_linear(p.space, p.leaves[static_cast<std::size_t>(st.src)]) &&
            p.leaves[static_cast<std::size_t>(st.src)].dtype == pl_.slots[si].ct) {
            st.kind = Step::direct;
            external[si] = 1;
        }
    }
    external[static_cast<std::size_t>(pl_.result_slot)] = 1;
    std::vector<char> kept(ns, 0);
    for (const auto& [value, access] : p.side) {
        const int slot = pl_.instr_out[static_cast<std::size_t>(value - p.instr_value(0))];
        kept[static_cast<std::size_t>(slot)] = 1;
        side_slots_.push_back(slot);
    }
    buffer_of_ = program_detail::assign_buffers(pl_, external, filled, kept, buffers_);
    for (const Step& st : pl_.steps) {
        if (st.kind == Step::fill) continue;
        Exec e{st.kind, st.slot, st.src};
        if (st.kind == Step::exec) {
            const auto& ins = p.instrs[static_cast<std::size_t>(st.src)];
            unsigned scalars = 0;
            for (int k = 0; k < 3; ++k) {
                e.in[k] = pl_.instr_in[k][static_cast<std::size_t>(st.src)];
                if (e.in[k] >= 0 && filled[static_cast<std::size_t>(e.in[k])]) scalars |= 1u << k;
            }
            if (scalars == 3u) scalars = 0;  // both scalar: keep the filled tiles
            e.attr = ins.attr;
            e.kernel = any_tile_kernel(ins.op, program_detail::kernel_ct(ins.ct), scalars);
            if (!e.kernel)
                throw InternalError("kiln: op " + std::string(ops::op_name(ins.op)) + " has no kernel for " +
                                    std::string(dtype_name(ins.ct)));
        } else if (st.kind == Step::direct) {
            e.esize = static_cast<std::int64_t>(dtype_size(pl_.slots[static_cast<std::size_t>(st.slot)].ct));
        }
        execs_.push_back(e);
    }
}

KILN_DECL void ProgramRunner::tile(std::int64_t start, std::int64_t len, void* dst) const {
    using namespace program_detail;
    struct Tag {};
    char* buf = reinterpret_cast<char*>(scratch<double, Tag>(static_cast<std::size_t>(std::max(buffers_, 1))));
    thread_local std::vector<void*> ptr;
    ptr.assign(pl_.slots.size(), nullptr);
    for (std::size_t s = 0; s < pl_.slots.size(); ++s)
        if (buffer_of_[s] >= 0) ptr[s] = buf + static_cast<std::size_t>(buffer_of_[s]) * tile_elems * sizeof(double);
    for (const Step& st : pl_.steps)
        if (st.kind == Step::fill)
            visit_ct(pl_.slots[static_cast<std::size_t>(st.slot)].ct, [&](auto tag) {
                using T = typename decltype(tag)::type;
                std::fill_n(static_cast<T*>(ptr[static_cast<std::size_t>(st.slot)]), std::min(len, tile_elems),
                            static_cast<T>(p_.scalars[static_cast<std::size_t>(st.src)]));
            });
    const std::size_t rs = static_cast<std::size_t>(pl_.result_slot);
    const std::int64_t rsize = static_cast<std::int64_t>(dtype_size(result_ct()));
    for (std::int64_t off = 0; off < len; off += tile_elems) {
        const std::int64_t n = std::min(tile_elems, len - off), at = start + off;
        ptr[rs] = static_cast<char*>(dst) + off * rsize;
        for (const Exec& e : execs_) {
            void*& out = ptr[static_cast<std::size_t>(e.slot)];
            switch (e.kind) {
                case Step::exec: {
                    const void* in[3] = {};
                    for (int k = 0; k < 3; ++k)
                        if (e.in[k] >= 0) in[k] = ptr[static_cast<std::size_t>(e.in[k])];
                    e.kernel(in, out, n, e.attr);
                    break;
                }
                case Step::direct: out = p_.leaves[static_cast<std::size_t>(e.src)].base + at * e.esize; break;
                case Step::gather:
                    visit_ct(pl_.slots[static_cast<std::size_t>(e.slot)].ct, [&](auto tag) {
                        using T = typename decltype(tag)::type;
                        gather(p_.space, p_.leaves[static_cast<std::size_t>(e.src)], at, n, static_cast<T*>(out));
                    });
                    break;
                case Step::convert:
                    visit_ct(pl_.slots[static_cast<std::size_t>(e.slot)].ct, [&](auto tag) {
                        using T = typename decltype(tag)::type;
                        visit_ct(pl_.slots[static_cast<std::size_t>(e.src)].ct, [&](auto ftag) {
                            using F = typename decltype(ftag)::type;
                            convert_tile(static_cast<const F*>(ptr[static_cast<std::size_t>(e.src)]), static_cast<T*>(out), n);
                        });
                    });
                    break;
                case Step::fill: break;
            }
        }
        for (std::size_t k = 0; k < side_slots_.size(); ++k) {
            const std::size_t s = static_cast<std::size_t>(side_slots_[k]);
            visit_ct(pl_.slots[s].ct, [&](auto tag) {
                using T = typename decltype(tag)::type;
                scatter(p_.space, p_.side[k].second, at, n, static_cast<const T*>(ptr[s]));
            });
        }
    }
}

/// Evaluates the program's result into p.out, elementwise over p.space. A linear output of the
/// result's compute type takes each thread's whole run in one call.
KILN_DECL void run_program(const TileProgram& p) {
    const ProgramRunner runner(p);
    if (is_linear(p.space, p.out) && p.out.dtype == runner.result_ct()) {
        const std::int64_t esize = static_cast<std::int64_t>(dtype_size(p.out.dtype));
        // runs of whole tiles (tile-aligned on any thread count: bitwise the same results)
        const std::int64_t n = p.space.numel(), tiles = (n + tile_elems - 1) / tile_elems;
        parallel_for(tiles, parallel_grain / tile_elems, [&](std::int64_t tb, std::int64_t te) {
            const std::int64_t b = tb * tile_elems, e = std::min(n, te * tile_elems);
            runner.tile(b, e - b, p.out.base + b * esize);
        });
        return;
    }
    store_tiles(p.space, p.out, runner.result_ct(),
                [&](std::int64_t start, std::int64_t len, void* dst) { runner.tile(start, len, dst); });
}

}  // namespace kiln::detail
