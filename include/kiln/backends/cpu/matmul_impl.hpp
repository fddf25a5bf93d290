// The CPU matrix product: kiln's GEMM (backends/cpu/gemm.hpp) for f32 and f64 on AVX-512 targets,
// Eigen's otherwise and for the integer types, over kiln's threads.
#pragma once

#include <Eigen/Core>

#include "kiln/backends/cpu/gemm.hpp"
#include "kiln/backends/cpu/program.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/thread_pool.hpp"
#include "kiln/ir/shapes.hpp"

namespace kiln::detail {


/// Calls f with an Eigen::Map over the (rows, cols) matrix at p with element strides (rs, cs):
/// row-major or column-major as the strides say, so a transposed view is a layout, not a copy.
/// Returns false when neither stride is 1 (the caller copies first).
/// Whether (rows, cols) at element strides (rs, cs) is a row-major (or column-major) matrix
/// Eigen can map: unit inner stride and an outer stride that steps past a whole row (column).
/// Broadcast (stride 0) and overlapping layouts are neither; the caller copies them first.
inline bool row_major_ok(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
    return (cs == 1 || cols == 1) && (rows == 1 || rs >= cols);
}
inline bool col_major_ok(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
    return (rs == 1 || rows == 1) && (cols == 1 || cs >= rows);
}

/// Calls f with an Eigen::Map over the (rows, cols) matrix at p with element strides (rs, cs):
/// row-major or column-major as the strides say, so a transposed view is a layout, not a copy.
/// Returns false when neither layout fits (the caller copies first).
template <class T, class F>
bool with_matrix_map(const T* p, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs, F&& f) {
    using RowM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using ColM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
    if (row_major_ok(rows, cols, rs, cs)) {
        f(Eigen::Map<const RowM, Eigen::Unaligned, Eigen::OuterStride<>>(p, rows, cols, Eigen::OuterStride<>(rows == 1 ? cols : rs)));
        return true;
    }
    if (col_major_ok(rows, cols, rs, cs)) {
        f(Eigen::Map<const ColM, Eigen::Unaligned, Eigen::OuterStride<>>(p, rows, cols, Eigen::OuterStride<>(cols == 1 ? rows : cs)));
        return true;
    }
    return false;
}

/// C[b] = A[b] @ B[b] for 3-D contiguous-output batches through Eigen's GEMM (integers, and floats
/// where kiln's GEMM is off); A and B already broadcast to the batch.
template <class T>
void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c) {
    const std::int64_t batch = c.size(0), m = c.size(1), n = c.size(2), k = a.size(2);
    using RowM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* pc = static_cast<T*>(c.data_ptr());
    const std::int64_t flops = 2 * batch * m * n * k;
    // split over batches, or over rows of C when there are fewer batches than threads
    const std::int64_t threads = flops < (std::int64_t{1} << 21) ? 1 : num_threads();
    const std::int64_t row_parts = batch >= threads ? 1 : std::min<std::int64_t>(m, (threads + batch - 1) / batch);
    // Row parts start at multiples of 48 rows (a multiple of Eigen's micro-kernel heights, 3 packets
    // of floats or doubles up to AVX-512): a row's sum then runs through the same kernel as in one
    // product over all rows, so the result has the same bits whatever the thread count (parts cut
    // anywhere else put rows in a tail kernel that adds in another order).
    auto cut = [&](std::int64_t part) { return part >= row_parts ? m : m * part / row_parts / 48 * 48; };
    thread_pool().run(batch * row_parts, [&](std::int64_t task) {
        const std::int64_t bi = task / row_parts, part = task % row_parts;
        const std::int64_t r0 = cut(part), r1 = cut(part + 1);
        if (r1 <= r0) return;
        Eigen::Map<RowM> cm(pc + bi * m * n + r0 * n, r1 - r0, n);
        const T* ap = pa + bi * a.stride(0) + r0 * a.stride(1);
        with_matrix_map(ap, r1 - r0, k, a.stride(1), a.stride(2), [&](const auto& am) {
            with_matrix_map(pb + bi * b.stride(0), k, n, b.stride(1), b.stride(2), [&](const auto& bm) {
                cm.noalias() = am * bm;
            });
        });
    });
}

inline bool gemm_layout_ok(const Tensor& t) {
    const std::int64_t rows = t.size(1), cols = t.size(2), rs = t.stride(1), cs = t.stride(2);
    return row_major_ok(rows, cols, rs, cs) || col_major_ok(rows, cols, rs, cs);
}


/// t as `shape` (same numel): a view where its strides allow one, else a contiguous copy. A
/// backend's own reshaping: unlike Tensor::reshape it records no view for tracing or autograd.
inline Tensor as_shape(const Tensor& t, const Shape& shape) {
    Strides st;
    return view_strides(t.shape(), t.strides(), shape, st) ? Tensor(t.storage(), t.offset(), shape, st, t.dtype()) : t.contiguous().view(shape);
}

/// a @ b on the CPU with torch.matmul's rules, for operands already validated (kiln::matmul, or a
/// traced graph): kiln's GEMM on AVX-512 (Eigen's otherwise, and for integers) over kiln's threads;
/// f16/bf16 compute in f32.
KILN_DECL Tensor cpu_matmul(const Tensor& a_in, const Tensor& b_in, MatmulEpilogue* epilogue) {
    if (a_in.rank() >= 3 && b_in.rank() == 2) {
        // (..., m, k) @ (k, n) is one (rows, k) @ (k, n) product, as torch folds it: B is packed
        // once per block of rows instead of once per batch (A copied first when its rows do not
        // share one stride, a pass over A against a pass over B per batch)
        std::int64_t rows = 1;
        for (int d = 0; d + 1 < a_in.rank(); ++d) rows *= a_in.size(d);
        Shape out = a_in.shape();
        out[out.rank() - 1] = b_in.size(1);
        return cpu_matmul(as_shape(a_in, Shape{rows, a_in.size(-1)}), b_in, epilogue).view(out);
    }
    const DType dt = promote_types(a_in.dtype(), b_in.dtype());
    Tensor a = a_in.rank() == 1 ? a_in.unsqueeze(0) : a_in;
    Tensor b = b_in.rank() == 1 ? b_in.unsqueeze(1) : b_in;
    const ir::MatmulShapes sh = ir::matmul_shapes(a_in.shape(), b_in.shape());
    if (!sh.ok()) throw InternalError("kiln: cpu_matmul called with unchecked operands: " + sh.error);
    const std::int64_t m = sh.m, k = sh.k, n = sh.n;
    const Shape& batch = sh.batch;
    const DType ct = compute_dtype(dt);
    Shape sa = batch, sb = batch, sc = batch;
    sa.push_back(m); sa.push_back(k);
    sb.push_back(k); sb.push_back(n);
    sc.push_back(m); sc.push_back(n);
    const std::int64_t nb = batch.numel();
    // operands as 3-D (batch, rows, cols) views in the compute type
    auto prep = [&](const Tensor& t, const Shape& to, std::int64_t r, std::int64_t c) {
        Tensor v = t.dtype() == ct ? t : t.to(ct);
        v = v.expand(to);
        Tensor v3 = v.unsqueeze(0);
        if (v.rank() >= 3) v3 = as_shape(v, Shape{nb, r, c});  // the batch dims merged into one
        // kiln's GEMM packs any strides; Eigen maps row- or column-major ones only
        if (!(gemm::enabled && is_floating(ct)) && !gemm_layout_ok(v3)) v3 = v3.contiguous();
        return v3;
    };
    const Tensor a3 = prep(a, sa, m, k), b3 = prep(b, sb, k, n);
    Tensor c3(Shape{nb, m, n}, ct);
    if (c3.numel() > 0) {
        if (k == 0) {
            c3.fill_(0);
        } else {
            visit_ct(ct, [&](auto tag) {
                using T = typename decltype(tag)::type;
                if constexpr (gemm::enabled && std::is_floating_point_v<T>) {
                    const gemm::View<T> av{static_cast<const T*>(a3.data_ptr()), a3.stride(1), a3.stride(2)};
                    const gemm::View<T> bv{static_cast<const T*>(b3.data_ptr()), b3.stride(1), b3.stride(2)};
                    T* const cp = static_cast<T*>(c3.data_ptr());
                    if (epilogue && dt == ct) {  // the hooks see the result itself, not a converted copy
                        epilogue->prepare(epilogue->ctx, c3, n);
                        gemm::batched<T>(nb, m, n, k, av, a3.stride(0), bv, b3.stride(0), cp,
                                         [epilogue](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                                             epilogue->rows(epilogue->ctx, r0, r1, c0, c1);
                                         });
                    } else {
                        gemm::batched<T>(nb, m, n, k, av, a3.stride(0), bv, b3.stride(0), cp);
                    }
                } else {
                    batched_gemm<T>(a3, b3, c3);
                }
            });
        }
    }
    Tensor c = c3.reshape(sc);
    if (a_in.rank() == 1) c = c.squeeze(-2);
    if (b_in.rank() == 1) c = c.squeeze(-1);
    return dt == ct ? c : c.to(dt);
}

}  // namespace kiln::detail
