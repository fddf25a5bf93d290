// CPU reductions: rows of a permuted iteration space reduced with SIMD accumulators, across threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/backends/cpu/program.hpp"
#include "kiln/tables/reduce_table.hpp"

namespace kiln::detail {

/// Accumulator across tiles: double for float sums/products (keeps long rows accurate), else T.
template <class R, class T>
using reduce_acc_t = std::conditional_t<std::is_floating_point_v<T> && R::rule == ops::ReduceRule::widen_int, double, T>;

/// R-combination of v[0..n) in T, with four independent SIMD accumulators.
template <class R, class T>
T reduce_tile(const T* v, std::int64_t n) {
    using B = simd::Batch<T>;
    using C = typename R::Combine;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    const B id(R::template identity<T>());
    B a0 = id, a1 = id, a2 = id, a3 = id;
    std::int64_t i = 0;
    for (; i + 4 * w <= n; i += 4 * w) {
        a0 = C::eval(a0, simd::load(v + i));
        a1 = C::eval(a1, simd::load(v + i + w));
        a2 = C::eval(a2, simd::load(v + i + 2 * w));
        a3 = C::eval(a3, simd::load(v + i + 3 * w));
    }
    for (; i + w <= n; i += w) a0 = C::eval(a0, simd::load(v + i));
    a0 = C::eval(C::eval(a0, a1), C::eval(a2, a3));
    alignas(64) T lanes[w];
    simd::store_aligned(lanes, a0);
    T r = lanes[0];
    for (std::int64_t k = 1; k < w; ++k) r = C::eval(r, lanes[k]);
    for (; i < n; ++i) r = C::eval(r, v[i]);
    return r;
}

/// Values [start, start + len) of `source` (written in compute type src_ct) as T in buf; where
/// src_ct is not T they go through `spare` (room for len values of any compute type) first.
template <class T, class Source>
void source_tile(const Source& source, DType src_ct, std::int64_t start, std::int64_t len, T* buf, void* spare) {
    if (src_ct == dtype_of<T>) {
        source(start, len, static_cast<void*>(buf));
        return;
    }
    visit_ct(src_ct, [&](auto stag) {
        using S = typename decltype(stag)::type;
        S* tmp = static_cast<S*>(spare);
        source(start, len, static_cast<void*>(tmp));
        convert_tile(tmp, buf, len);
    });
}

/// Reduces `outer` rows of `inner` consecutive elements (in the source's iteration order) with R,
/// writing one value per row to out (a contiguous tensor of `outer` elements). `source(start, len,
/// dst)` writes values in compute type `src_ct`; R runs in the compute type of out's dtype.
template <class R, class Source>
void reduce_rows(std::int64_t outer, std::int64_t inner, DType src_ct, const Source& source, const Tensor& out) {
    visit_ct(compute_dtype(out.dtype()) == DType::boolean ? DType::f32 : compute_dtype(out.dtype()), [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Acc = reduce_acc_t<R, T>;
        using C = typename R::Combine;
        std::vector<T> results(static_cast<std::size_t>(outer));
        struct Tag {};
        // values of [start, start+len) as T in a scratch tile (the scratch's second half spare)
        auto tile_values = [&](std::int64_t start, std::int64_t len, T* buf) -> const T* {
            source_tile(source, src_ct, start, len, buf, buf + tile_elems);
            return buf;
        };
        auto reduce_span = [&](std::int64_t start, std::int64_t len) -> Acc {
            T* buf = reinterpret_cast<T*>(scratch<double, Tag>(2));
            Acc acc = static_cast<Acc>(R::template identity<T>());
            for (std::int64_t s = start; s < start + len; s += tile_elems) {
                const std::int64_t n = std::min(tile_elems, start + len - s);
                acc = C::eval(acc, static_cast<Acc>(reduce_tile<R, T>(tile_values(s, n, buf), n)));
            }
            return acc;
        };
        const std::int64_t threads = num_threads();
        if (outer >= threads || outer * inner < parallel_grain) {
            // rows across threads
            const std::int64_t grain = std::max<std::int64_t>(1, parallel_grain / std::max<std::int64_t>(inner, 1));
            parallel_for(outer, grain, [&](std::int64_t b, std::int64_t e) {
                for (std::int64_t o = b; o < e; ++o) results[static_cast<std::size_t>(o)] = static_cast<T>(reduce_span(o * inner, inner));
            });
        } else {
            // few long rows: split each row across threads, combine the partials in order
            for (std::int64_t o = 0; o < outer; ++o) {
                const std::int64_t parts = std::min<std::int64_t>(threads, std::max<std::int64_t>(1, inner / tile_elems));
                std::vector<Acc> partial(static_cast<std::size_t>(parts), static_cast<Acc>(R::template identity<T>()));
                thread_pool().run(parts, [&](std::int64_t p) {
                    const std::int64_t b = inner * p / parts, e = inner * (p + 1) / parts;
                    partial[static_cast<std::size_t>(p)] = reduce_span(o * inner + b, e - b);
                });
                Acc acc = partial[0];
                for (std::int64_t p = 1; p < parts; ++p) acc = C::eval(acc, partial[static_cast<std::size_t>(p)]);
                results[static_cast<std::size_t>(o)] = static_cast<T>(acc);
            }
        }
        IterSpace space{Shape{outer}};
        Access oa{static_cast<char*>(out.data_ptr()), out.dtype(), Strides{1}};
        if (outer > 0) scatter(space, oa, 0, outer, results.data());
    });
}

/// Kept elements after the last reduced dim from which a reduction runs as columns (reduce_cols):
/// below it, a run of stride kept_run per output costs less than tiles of kept_run columns.
inline constexpr std::int64_t column_reduce_min = 16;

/// How a reduction over `mask` of shape s walks its space: `perm` puts the kept dims first and the
/// reduced ones after them, so each output element reduces `inner` consecutive elements of the
/// permuted order (`outer` outputs: reduce_rows); or, where columns are allowed and at least
/// column_reduce_min kept elements follow the last reduced dim (a column sum), those kept dims
/// stay innermost: (other kept dims: `outer`, reduced dims: `inner`, the kept run: `kept_run`),
/// for reduce_cols. Either way `inner` is the count each output reduces.
struct ReduceLayout {
    std::vector<int> perm;
    std::int64_t outer = 1, inner = 1, kept_run = 1;
    bool columns = false;
};
inline ReduceLayout reduce_layout(const Shape& s, unsigned mask, bool columns_ok) {
    ReduceLayout l;
    int last_reduced = -1;
    for (int d = 0; d < s.rank(); ++d)
        if (mask & (1u << d)) last_reduced = d;
    std::int64_t run = 1;
    for (int d = last_reduced + 1; d < s.rank(); ++d) run *= s[d];
    l.columns = columns_ok && last_reduced >= 0 && run >= column_reduce_min;
    for (int d = 0; d < s.rank(); ++d)
        if (!(mask & (1u << d)) && (!l.columns || d < last_reduced)) { l.perm.push_back(d); l.outer *= s[d]; }
    for (int d = 0; d < s.rank(); ++d)
        if (mask & (1u << d)) { l.perm.push_back(d); l.inner *= s[d]; }
    if (l.columns) {
        for (int d = last_reduced + 1; d < s.rank(); ++d) l.perm.push_back(d);
        l.kept_run = run;
    }
    return l;
}

/// Reduces columns: the source's iteration order is (ko, rn, ki) (kept dims, reduced dims, then
/// the kept dims after the last reduced one), and out (contiguous, ko * ki elements) gets, for each
/// (o, j), R over r of element (o, r, j). Each task takes a block of up to column_block columns of
/// one o and walks r, reading that part of each row in tiles (contiguous: whole pages, which the
/// prefetchers follow) and combining it lane by lane into accumulators in T, folded into the
/// accumulator type (double for float sums) every 64 rows; where there are fewer blocks than
/// threads, r is split too and the partials combined in order. (Reduced as rows instead, each
/// output would read a run of stride ki, one element a tile row.)
inline constexpr std::int64_t column_block = 8192;
template <class R, class Source>
void reduce_cols(std::int64_t ko, std::int64_t rn, std::int64_t ki, DType src_ct, const Source& source, const Tensor& out) {
    static_assert(column_block % tile_elems == 0);
    visit_ct(compute_dtype(out.dtype()) == DType::boolean ? DType::f32 : compute_dtype(out.dtype()), [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Acc = reduce_acc_t<R, T>;
        using C = typename R::Combine;
        constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>), fold_every = 64;
        const std::int64_t blocks = (ki + column_block - 1) / column_block, tasks = ko * blocks, threads = num_threads();
        const std::int64_t parts = tasks >= threads ? 1 : std::max<std::int64_t>(1, std::min(threads, rn / fold_every));
        const T id = R::template identity<T>();
        std::vector<Acc> partial(static_cast<std::size_t>(parts * ko * ki), static_cast<Acc>(id));
        struct Tag {};
        parallel_for(tasks * parts, 1, [&](std::int64_t b, std::int64_t e) {
            // tiles (of tile_elems doubles): the accumulators, then the values and the source's own
            // dtype. (Values first, 4 KB below the accumulators, made kiln_bench's compiled colsum
            // row, a generated prologue, 10-30% slower; the fused row did not change. Zen 4,
            // 2026-12-08, bench/results/cpu_2026-12-08_s33; not understood.)
            double* const block = scratch<double, Tag>(column_block / tile_elems + 2);
            T* const ta = reinterpret_cast<T*>(block);
            T* const buf = reinterpret_cast<T*>(block + column_block);
            for (std::int64_t task = b; task < e; ++task) {
                const std::int64_t part = task % parts, o = task / parts / blocks, c0 = task / parts % blocks * column_block;
                const std::int64_t cn = std::min(column_block, ki - c0), r0 = rn * part / parts, r1 = rn * (part + 1) / parts;
                Acc* const acc = partial.data() + part * ko * ki + o * ki + c0;
                for (std::int64_t r = r0; r < r1;) {
                    std::fill(ta, ta + cn, id);
                    for (const std::int64_t stop = std::min(r1, r + fold_every); r < stop; ++r)
                        for (std::int64_t t = 0; t < cn; t += tile_elems) {
                            const std::int64_t n = std::min(tile_elems, cn - t);
                            source_tile(source, src_ct, (o * rn + r) * ki + c0 + t, n, buf, reinterpret_cast<double*>(buf) + tile_elems);
                            T* const a = ta + t;
                            std::int64_t j = 0;
                            for (; j + w <= n; j += w) simd::store(a + j, C::eval(simd::load(a + j), simd::load(buf + j)));
                            for (; j < n; ++j) a[j] = C::eval(a[j], buf[j]);
                        }
                    for (std::int64_t j = 0; j < cn; ++j) acc[j] = C::eval(acc[j], static_cast<Acc>(ta[j]));
                }
            }
        });
        std::vector<T> results(static_cast<std::size_t>(ko * ki));
        for (std::int64_t i = 0; i < ko * ki; ++i) {
            Acc a = partial[static_cast<std::size_t>(i)];
            for (std::int64_t q = 1; q < parts; ++q) a = C::eval(a, partial[static_cast<std::size_t>(q * ko * ki + i)]);
            results[static_cast<std::size_t>(i)] = static_cast<T>(a);
        }
        IterSpace space{Shape{ko * ki}};
        Access oa{static_cast<char*>(out.data_ptr()), out.dtype(), Strides{1}};
        if (ko * ki > 0) scatter(space, oa, 0, ko * ki, results.data());
    });
}

/// The first extreme (Max: maximum) of v[0..n): its index and value, or the index of the first
/// NaN where there is one (then `nan`). SIMD lanes keep their own first extreme and its index (as
/// a T: exact below 2^24, and n <= tile_elems); the lane of the extreme value with the lowest index
/// wins, as the scalar scan's first extreme would.
template <bool Max, class T>
std::int64_t tile_arg_extreme(const T* v, std::int64_t n, T& value, bool& nan) {
    using B = simd::Batch<T>;
    constexpr std::int64_t w = static_cast<std::int64_t>(simd::width<T>);
    auto better = [](T a, T b) { return Max ? a > b : a < b; };
    nan = false;
    std::int64_t at = 0, k = 0;
    if (n >= 2 * w) {
        alignas(64) T lane[w], li[w];
        for (std::int64_t j = 0; j < w; ++j) li[j] = static_cast<T>(j);
        B best = simd::load(v), bi = simd::load_aligned(li), idx = bi + B(static_cast<T>(w));
        auto bad = !(best == best);
        for (k = w; k + w <= n; k += w) {
            const B x = simd::load(v + k);
            if constexpr (std::is_floating_point_v<T>) bad = bad | !(x == x);
            const auto c = Max ? x > best : x < best;
            best = simd::impl::sel(c, x, best);
            bi = simd::impl::sel(c, idx, bi);
            idx = idx + B(static_cast<T>(w));
        }
        if constexpr (std::is_floating_point_v<T>) {
            if (simd::impl::any_lane(bad)) {
                for (std::int64_t j = 0; j < n; ++j)
                    if (std::isnan(v[j])) {
                        nan = true;
                        return j;
                    }
            }
        }
        simd::store_aligned(lane, best);
        simd::store_aligned(li, bi);
        at = static_cast<std::int64_t>(li[0]);
        for (std::int64_t j = 1; j < w; ++j) {
            const std::int64_t i = static_cast<std::int64_t>(li[j]);
            if (better(lane[j], v[at]) || (lane[j] == v[at] && i < at)) at = i;
        }
    }
    for (; k < n; ++k) {  // the tail, or a short tile from its start: a NaN met here is the tile's first
        if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(v[k])) {
                nan = true;
                return k;
            }
        }
        if (better(v[k], v[at])) at = k;
    }
    value = v[at];
    return at;
}

/// Index of the first maximum (Max = true) or minimum of each row; NaN counts as the extreme,
/// like torch.argmax.
template <bool Max, class Source>
void arg_reduce_rows(std::int64_t outer, std::int64_t inner, DType src_ct, const Source& source, std::int64_t* out) {
    visit_ct(src_ct, [&](auto tag) {
        using T = typename decltype(tag)::type;
        struct Tag {};
        parallel_for(outer, std::max<std::int64_t>(1, parallel_grain / std::max<std::int64_t>(inner, 1)),
                     [&](std::int64_t b, std::int64_t e) {
                         T* buf = reinterpret_cast<T*>(scratch<double, Tag>(1));
                         for (std::int64_t o = b; o < e; ++o) {
                             T best{};
                             std::int64_t at = -1;
                             bool best_nan = false;
                             for (std::int64_t s = 0; s < inner && !best_nan; s += tile_elems) {
                                 const std::int64_t n = std::min(tile_elems, inner - s);
                                 source(o * inner + s, n, static_cast<void*>(buf));
                                 T v{};
                                 const std::int64_t k = tile_arg_extreme<Max>(buf, n, v, best_nan);
                                 if (best_nan || at < 0 || (Max ? v > best : v < best)) { best = v; at = s + k; }
                             }
                             out[o] = at;
                         }
                     });
    });
}

}  // namespace kiln::detail
