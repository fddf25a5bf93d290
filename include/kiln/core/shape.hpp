// Shapes and strides (rank up to 8), broadcasting, and the helpers views are built from.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln {

inline constexpr int max_rank = 8;

/// A fixed-capacity list of up to 8 int64 values: the dims of a shape or the strides of a view.
class Dims {
public:
    Dims() = default;
    Dims(std::initializer_list<std::int64_t> v, std::source_location loc = std::source_location::current()) {
        assign(v.begin(), v.end(), loc);
    }
    explicit Dims(std::span<const std::int64_t> v, std::source_location loc = std::source_location::current()) {
        assign(v.begin(), v.end(), loc);
    }
    Dims(const std::vector<std::int64_t>& v, std::source_location loc = std::source_location::current()) {
        assign(v.begin(), v.end(), loc);
    }
    static Dims filled(int rank, std::int64_t value) {
        Dims d;
        d.check_rank(rank, std::source_location::current());
        d.rank_ = rank;
        std::fill_n(d.v_.begin(), rank, value);
        return d;
    }

    int rank() const { return rank_; }
    int size() const { return rank_; }
    bool empty() const { return rank_ == 0; }
    std::int64_t& operator[](int i) { return v_[static_cast<std::size_t>(i)]; }
    std::int64_t operator[](int i) const { return v_[static_cast<std::size_t>(i)]; }
    std::int64_t* begin() { return v_.data(); }
    std::int64_t* end() { return v_.data() + rank_; }
    const std::int64_t* begin() const { return v_.data(); }
    const std::int64_t* end() const { return v_.data() + rank_; }
    std::int64_t back() const { return v_[static_cast<std::size_t>(rank_ - 1)]; }

    void push_back(std::int64_t x, std::source_location loc = std::source_location::current()) {
        check_rank(rank_ + 1, loc);
        v_[static_cast<std::size_t>(rank_++)] = x;
    }
    void insert(int pos, std::int64_t x, std::source_location loc = std::source_location::current()) {
        check_rank(rank_ + 1, loc);
        for (int i = rank_; i > pos; --i) v_[static_cast<std::size_t>(i)] = v_[static_cast<std::size_t>(i - 1)];
        v_[static_cast<std::size_t>(pos)] = x;
        ++rank_;
    }
    void erase(int pos) {
        for (int i = pos; i + 1 < rank_; ++i) v_[static_cast<std::size_t>(i)] = v_[static_cast<std::size_t>(i + 1)];
        --rank_;
    }
    /// Product of the values (the element count of a shape); 1 for rank 0. Shapes are checked
    /// where they are made (detail::check_shape), so this overflows only for a shape that skipped
    /// the check: ShapeError then, rather than a wrong count.
    std::int64_t numel() const {
        std::int64_t n = 1;
        bool overflow = false;
        for (int i = 0; i < rank_; ++i) {
            const std::int64_t d = v_[static_cast<std::size_t>(i)];
            if (d == 0) return 0;
            overflow = overflow || __builtin_mul_overflow(n, d, &n);
        }
        if (overflow) throw ShapeError("kiln::numel: the element count of shape " + str() + " overflows int64");
        return n;
    }
    std::vector<std::int64_t> vec() const { return {begin(), end()}; }

    friend bool operator==(const Dims& a, const Dims& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

    /// "(3, 4)" like a Python tuple: "()" for rank 0 and "(5,)" for rank 1.
    std::string str() const {
        std::string s = "(";
        for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(v_[static_cast<std::size_t>(i)]);
        return s + (rank_ == 1 ? ",)" : ")");
    }

private:
    template <class It>
    void assign(It first, It last, const std::source_location& loc) {
        check_rank(static_cast<int>(last - first), loc);
        rank_ = 0;
        for (; first != last; ++first) v_[static_cast<std::size_t>(rank_++)] = *first;
    }
    static void check_rank(int r, const std::source_location& loc) {
        if (r > max_rank)
            detail::fail<ShapeError>("shape", "rank " + std::to_string(r) + " exceeds the maximum rank " +
                                                  std::to_string(max_rank), loc);
    }
    std::array<std::int64_t, max_rank> v_{};
    int rank_ = 0;
};

using Shape = Dims;
using Strides = Dims;

/// Row-major (C order) strides in elements for a shape (one detail::check_shape accepted: for
/// any other the strides that overflow are wrong, though never undefined behaviour).
inline Strides contiguous_strides(const Shape& s) {
    Strides st = Strides::filled(s.rank(), 1);
    std::int64_t acc = 1;
    for (int i = s.rank() - 1; i > 0; --i) {
        st[i] = acc;
        (void)__builtin_mul_overflow(acc, std::max<std::int64_t>(s[i], 1), &acc);
    }
    if (s.rank() > 0) st[0] = acc;
    return st;
}

/// Whether a view with these strides covers its elements densely in row-major order.
inline bool is_contiguous(const Shape& s, const Strides& st) {
    std::int64_t expect = 1;
    for (int i = s.rank() - 1; i >= 0; --i) {
        if (s[i] == 1) continue;
        if (s[i] == 0) return true;
        if (st[i] != expect) return false;
        expect *= s[i];
    }
    return true;
}

/// The memory order of a dense layout: `order` gets the dims from the largest stride to the
/// smallest (equal strides keep their order, so size-1 dims stay where they stand) and the result
/// says whether the elements fill their span exactly once in that order (row-major, channels-last,
/// a transposed matrix: torch's "non-overlapping and dense"). An empty tensor is dense, row-major.
inline bool dense_order(const Shape& s, const Strides& st, std::vector<std::int64_t>& order) {
    const int r = s.rank();
    order.resize(static_cast<std::size_t>(r));
    for (int i = 0; i < r; ++i) order[static_cast<std::size_t>(i)] = i;
    for (int i = 0; i < r; ++i)
        if (s[i] == 0) return true;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return st[static_cast<int>(a)] > st[static_cast<int>(b)]; });
    std::int64_t expect = 1;
    for (int k = r - 1; k >= 0; --k) {
        const int d = static_cast<int>(order[static_cast<std::size_t>(k)]);
        if (s[d] == 1) continue;
        if (st[d] != expect) return false;
        expect *= s[d];
    }
    return true;
}

/// Whether an elementwise iteration over `shape` whose output has strides `out` is better walked in
/// another dim order: `out` dense and not row-major (channels-last memory); `order` then gets its
/// memory order. Kernels permute their dims so (as torch's TensorIterator orders dims by the
/// output's strides): operands laid out as the output then merge into one contiguous run.
inline bool walk_in_memory_order(const Shape& shape, const Strides& out, std::vector<std::int64_t>& order) {
    if (is_contiguous(shape, out) || !dense_order(shape, out, order)) return false;
    for (std::size_t k = 0; k < order.size(); ++k)
        if (order[k] != static_cast<std::int64_t>(k)) return true;
    return false;
}

/// d (Dims, or a std::vector of per-dim numbers) with its dims taken in `order` (d[order[0]],
/// d[order[1]], ...).
template <class D>
D permuted(const D& d, const std::vector<std::int64_t>& order) {
    D out = d;
    auto o = out.begin();
    for (std::size_t k = 0; k < order.size(); ++k, ++o) *o = *std::next(d.begin(), static_cast<std::ptrdiff_t>(order[k]));
    return out;
}

namespace detail {

/// Wraps a possibly negative axis into [0, rank); throws ShapeError naming op otherwise.
inline int normalize_axis(std::int64_t axis, int rank, std::string_view op, const std::source_location& loc) {
    const int r = std::max(rank, 1);
    if (axis < -r || axis >= r)
        fail<ShapeError>(op, "axis " + std::to_string(axis) + " is out of range for a tensor of rank " +
                                 std::to_string(rank), loc);
    return static_cast<int>(axis < 0 ? axis + r : axis);
}

/// Checks the shape of a new tensor or view and returns it: ShapeError naming op, the shape and
/// loc when a dim is negative, or when the element count, the byte count (elements x
/// element_size) or a contiguous stride does not fit in int64 (`empty({1 << 40, 1 << 40})`).
inline const Shape& check_shape(const Shape& shape, std::size_t element_size, std::string_view op,
                                const std::source_location& loc) {
    bool has_zero = false;
    for (const std::int64_t d : shape) {
        if (d < 0) fail<ShapeError>(op, "negative dimension in shape " + shape.str(), loc);
        has_zero = has_zero || d == 0;
    }
    // The product of max(d, 1) bounds the element count and every contiguous stride, so a zero dim
    // cannot hide an overflow in the others (as nn/io.hpp's shape_problem for shapes from files).
    const char* what = has_zero ? "the product of its nonzero dims" : "its element count";
    std::int64_t extent = 1, bytes = 0;
    for (const std::int64_t d : shape)
        if (__builtin_mul_overflow(extent, std::max<std::int64_t>(d, 1), &extent))
            fail<ShapeError>(op, "shape " + shape.str() + " is too large: " + what + " overflows int64", loc);
    if (__builtin_mul_overflow(extent, static_cast<std::int64_t>(element_size), &bytes))
        fail<ShapeError>(op, "shape " + shape.str() + " is too large: " + what + " (" + std::to_string(extent) +
                                 ") times " + std::to_string(element_size) + " bytes per element overflows int64", loc);
    return shape;
}

/// NumPy broadcasting of two shapes into result; false when they do not broadcast.
inline bool try_broadcast(const Shape& a, const Shape& b, Shape& result) {
    const int r = std::max(a.rank(), b.rank());
    Shape out = Shape::filled(r, 1);  // result may alias a or b
    for (int i = 0; i < r; ++i) {
        const std::int64_t da = i < r - a.rank() ? 1 : a[i - (r - a.rank())];
        const std::int64_t db = i < r - b.rank() ? 1 : b[i - (r - b.rank())];
        if (da != db && da != 1 && db != 1) return false;
        out[i] = da == 1 ? db : da;
    }
    result = out;
    return true;
}

/// Strides that read a tensor of shape `s` and strides `st` as if it had shape `to` (stride 0 on
/// broadcast dims). Assumes `s` broadcasts to `to`.
inline Strides broadcast_strides(const Shape& s, const Strides& st, const Shape& to) {
    Strides out = Strides::filled(to.rank(), 0);
    const int off = to.rank() - s.rank();
    for (int i = 0; i < s.rank(); ++i) out[i + off] = (s[i] == 1 && to[i + off] != 1) ? 0 : st[i];
    return out;
}

}  // namespace detail
}  // namespace kiln
