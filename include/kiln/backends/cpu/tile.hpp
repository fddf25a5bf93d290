// Iteration spaces over strided operands, and tile gathers/scatters that convert between storage and compute types.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/thread_pool.hpp"  // tile_elems

namespace kiln::detail {


/// One operand read (or written) over an iteration space: base address, dtype and per-dim
/// strides in elements (0 on broadcast dims).
struct Access {
    char* base = nullptr;
    DType dtype = DType::f32;
    Strides strides;
};

/// Row-major iteration over `shape`; operands are Accesses with strides over the same dims.
struct IterSpace {
    Shape shape;
    std::int64_t numel() const { return shape.numel(); }
};

/// Access of tensor t broadcast to shape `to`.
inline Access access_of(const Tensor& t, const Shape& to) {
    return {static_cast<char*>(t.data_ptr()), t.dtype(), broadcast_strides(t.shape(), t.strides(), to)};
}

/// Drops size-1 dims and merges neighbouring dims that every access walks contiguously, so the
/// common cases become rank 1 (contiguous) or rank 2 (row broadcast).
inline void collapse(IterSpace& space, std::vector<Access*> accs) {
    Shape s;
    std::vector<Strides> st(accs.size());
    for (int d = 0; d < space.shape.rank(); ++d) {
        const std::int64_t n = space.shape[d];
        if (n == 1) continue;
        bool merge = s.rank() > 0;
        for (std::size_t a = 0; merge && a < accs.size(); ++a)
            merge = st[a].back() == accs[a]->strides[d] * n;
        if (merge) {
            s[s.rank() - 1] *= n;
            for (std::size_t a = 0; a < accs.size(); ++a) st[a][st[a].rank() - 1] = accs[a]->strides[d];
        } else {
            s.push_back(n);
            for (std::size_t a = 0; a < accs.size(); ++a) st[a].push_back(accs[a]->strides[d]);
        }
    }
    if (space.shape.numel() == 0) s = Shape{0};
    space.shape = s;
    for (std::size_t a = 0; a < accs.size(); ++a) accs[a]->strides = space.shape.numel() == 0 ? Strides{1} : st[a];
}

/// Whether element i of the space lives at base + i for this access: its strides are the
/// space's row-major ones. (After collapse a space has rank 2 when some other access broadcasts,
/// as a bias row does: the contiguous operands are still read and written in place.)
inline bool is_linear(const IterSpace& space, const Access& a) {
    std::int64_t expect = 1;
    for (int d = space.shape.rank() - 1; d >= 0; --d) {
        if (space.shape[d] != 1 && a.strides[d] != expect) return false;
        expect *= space.shape[d];
    }
    return true;
}

/// Walks [start, start + len) of a space in row-major order, calling seg(offset_elems, count,
/// inner_stride, dst_pos) once per run along the innermost dim.
template <class Seg>
inline void for_each_segment(const IterSpace& space, const Strides& st, std::int64_t start, std::int64_t len, Seg&& seg) {
    const int r = space.shape.rank();
    if (r == 0) {
        seg(std::int64_t{0}, len, std::int64_t{0}, std::int64_t{0});
        return;
    }
    std::int64_t idx[max_rank];
    std::int64_t rem = start, off = 0;
    for (int d = r - 1; d >= 0; --d) {
        idx[d] = rem % space.shape[d];
        rem /= space.shape[d];
        off += idx[d] * st[d];
    }
    const std::int64_t inner = space.shape[r - 1], is = st[r - 1];
    std::int64_t pos = 0;
    while (pos < len) {
        const std::int64_t n = std::min(len - pos, inner - idx[r - 1]);
        seg(off, n, is, pos);
        pos += n;
        off += n * is;
        idx[r - 1] += n;
        for (int d = r - 1; d > 0 && idx[d] == space.shape[d]; --d) {
            off -= idx[d] * st[d];
            idx[d] = 0;
            ++idx[d - 1];
            off += st[d - 1];
        }
    }
}

/// Reads elements [start, start + len) of an access into dst, converting to T.
template <class T>
void gather(const IterSpace& space, const Access& a, std::int64_t start, std::int64_t len, T* dst) {
    visit_dtype(a.dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        const S* base = reinterpret_cast<const S*>(a.base);
        for_each_segment(space, a.strides, start, len, [&](std::int64_t off, std::int64_t n, std::int64_t s, std::int64_t pos) {
            const S* p = base + off;
            T* d = dst + pos;
            if constexpr (std::is_same_v<S, T>) {
                if (s == 1) {
                    std::memcpy(d, p, static_cast<std::size_t>(n) * sizeof(T));
                    return;
                }
            }
            if (s == 0) {
                std::fill_n(d, n, load_as<T>(*p));
            } else if (s == 1) {
                for (std::int64_t k = 0; k < n; ++k) d[k] = load_as<T>(p[k]);
            } else {
                for (std::int64_t k = 0; k < n; ++k) d[k] = load_as<T>(p[k * s]);
            }
        });
    });
}

/// Writes src (compute type T) to elements [start, start + len) of an access, converting.
template <class T>
void scatter(const IterSpace& space, const Access& a, std::int64_t start, std::int64_t len, const T* src) {
    visit_dtype(a.dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        S* base = reinterpret_cast<S*>(a.base);
        for_each_segment(space, a.strides, start, len, [&](std::int64_t off, std::int64_t n, std::int64_t s, std::int64_t pos) {
            S* p = base + off;
            const T* v = src + pos;
            if (s == 1) {
                for (std::int64_t k = 0; k < n; ++k) p[k] = store_as<S>(v[k]);
            } else {
                for (std::int64_t k = 0; k < n; ++k) p[k * s] = store_as<S>(v[k]);
            }
        });
    });
}

// gather and scatter for the four compute types: in separate compilation the runtime compiles
// them once and user code only calls them.
#if !KILN_HEADER_ONLY
#define KILN_TILE_MOVES(T)                                                                              \
    extern template void gather<T>(const IterSpace&, const Access&, std::int64_t, std::int64_t, T*);  \
    extern template void scatter<T>(const IterSpace&, const Access&, std::int64_t, std::int64_t, const T*);
#elif defined(KILN_SEPARATE_COMPILATION)
#define KILN_TILE_MOVES(T)                                                                       \
    template void gather<T>(const IterSpace&, const Access&, std::int64_t, std::int64_t, T*);  \
    template void scatter<T>(const IterSpace&, const Access&, std::int64_t, std::int64_t, const T*);
#else
#define KILN_TILE_MOVES(T)
#endif
KILN_TILE_MOVES(float)
KILN_TILE_MOVES(double)
KILN_TILE_MOVES(std::int32_t)
KILN_TILE_MOVES(std::int64_t)
#undef KILN_TILE_MOVES

/// Converts a tile between compute types.
template <class To, class From>
inline void convert_tile(const From* src, To* dst, std::int64_t n) {
    for (std::int64_t k = 0; k < n; ++k) dst[k] = static_cast<To>(src[k]);
}

/// Per-thread scratch: `buffers` aligned tiles of T in one block, reused across calls. Each
/// caller passes its own Tag so nested users (a reduction around a tile source) never share.
template <class T, class Tag>
inline T* scratch(std::size_t buffers) {
    static_assert(tile_elems * sizeof(T) % 64 == 0);
    struct Block {
        T* p = nullptr;
        std::size_t n = 0;
        ~Block() { ::operator delete(p, std::align_val_t{64}); }
    };
    thread_local Block b;
    if (b.n < buffers) {
        ::operator delete(b.p, std::align_val_t{64});
        b.p = static_cast<T*>(::operator new(buffers * tile_elems * sizeof(T), std::align_val_t{64}));
        b.n = buffers;
    }
    return b.p;
}

}  // namespace kiln::detail
