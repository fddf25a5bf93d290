// The tile interpreter's compiled part: a program's plan resolved to kernels, run tile by tile.
#pragma once
// Included at the end of kiln/backends/cpu/program.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <vector>


namespace kiln::detail {

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
