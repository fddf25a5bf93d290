// Tensor-level matrix products on CUDA: kiln::matmul's rules (1-D operands, batch broadcasting) on cuBLASLt,
// and on small_gemm.hpp's kernel for products of few rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>

#include "kiln/backends/cuda/allocator.hpp"
#include "kiln/backends/cuda/blas.hpp"
#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/small_gemm.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ir/shapes.hpp"

namespace kiln::cuda {
namespace detail {

/// The GEMM layout of a (batch, rows, cols) view, or nullopt when it needs a copy first.
inline std::optional<GemmOperand> gemm_operand(const Tensor& t3) {
    const std::int64_t batch_stride = t3.size(0) > 1 ? t3.stride(0) : 0;
    if (batch_stride < 0) return std::nullopt;
    return gemm_operand(t3.size(1), t3.size(2), t3.stride(1), t3.stride(2), batch_stride);
}

/// t broadcast to `full` (batch dims + (rows, cols)) as a (nb, rows, cols) view cuBLASLt can read:
/// the batch dims merged into one stride (0 where the batch is broadcast) and the matrices row- or
/// column-major. Where the strides allow neither (no unit stride in the matrix, batch dims that do
/// not merge into one stride, e.g. a partly broadcast batch), a contiguous copy instead.
inline Tensor gemm_view(const Tensor& t, const Shape& full, std::int64_t nb, std::int64_t rows, std::int64_t cols) {
    const Tensor v = t.expand(full);
    const Shape s3{nb, rows, cols};
    Tensor v3;
    Strides st;
    if (v.rank() == 2)
        v3 = v.unsqueeze(0);
    else if (kiln::detail::view_strides(v.shape(), v.strides(), s3, st))
        v3 = Tensor(v.storage(), v.offset(), s3, st, v.dtype());
    else
        v3 = v.contiguous().view(s3);
    if (!gemm_operand(v3)) v3 = v3.contiguous();
    return v3;
}

/// The problem for c3 = epilogue(a3 @ b3) on (batch, rows, cols) views: a3 and b3 as gemm_view makes
/// them (each batch either full or broadcast), c3 contiguous (nb, m, n).
inline GemmProblem make_gemm_problem(const Tensor& a3, const Tensor& b3, const Tensor& c3, Epilogue epi, bool tf32) {
    const auto a = gemm_operand(a3), b = gemm_operand(b3), c = gemm_operand(c3);
    if (!a || !b || !c || c->transposed)
        throw InternalError("kiln::cuda::matmul: operand layouts " + a3.strides().str() + ", " + b3.strides().str() +
                            ", " + c3.strides().str() + " are not GEMM layouts");
    GemmProblem p;
    p.dtype = c3.dtype();
    p.m = c3.size(1);
    p.n = c3.size(2);
    p.k = a3.size(2);
    p.batch = c3.size(0);
    p.a = *a;
    p.b = *b;
    p.c = *c;
    p.epilogue = epi;
    p.tf32 = tf32 && p.dtype == DType::f32;
    return p;
}

/// Whether the memory two tensors' elements span overlaps (a conservative aliasing test).
inline bool may_overlap(const Tensor& x, const Tensor& y) {
    if (x.numel() == 0 || y.numel() == 0 || x.storage() != y.storage()) return false;
    auto range = [](const Tensor& t) {
        std::int64_t lo = t.offset(), hi = t.offset();
        for (int d = 0; d < t.rank(); ++d) (t.stride(d) < 0 ? lo : hi) += (t.size(d) - 1) * t.stride(d);
        return std::pair{lo * static_cast<std::int64_t>(t.element_size()),
                         (hi + 1) * static_cast<std::int64_t>(t.element_size())};
    };
    const auto [xl, xh] = range(x);
    const auto [yl, yh] = range(y);
    return xl < yh && yl < xh;
}

/// kiln::matmul's semantics on cuBLASLt, into `out` when given (contiguous, the result's shape and
/// dtype), otherwise into a new tensor. Shared by matmul and matmul_out.
inline Tensor run_matmul(const Tensor& a_in, const Tensor& b_in, Epilogue epi, const Tensor* bias, const Tensor* out,
                         const std::source_location& loc) {
    using kiln::detail::fail;
    const Device dev = a_in.device();
    if (!dev.is_cuda() || a_in.device() != b_in.device())
        fail<DeviceError>("matmul", dev.is_cuda() && b_in.device().is_cuda()
                                        ? "operands are on different devices: " + dev.str() + " and " + b_in.device().str()
                                        : "kiln::cuda::matmul takes tensors on one CUDA device, got " + dev.str() +
                                              " and " + b_in.device().str(),
                          loc);
#if !(defined(KILN_WITH_CUDA) && KILN_WITH_CUDA)
    fail<DeviceError>("matmul", "kiln was built without the CUDA toolkit (cuBLASLt)", loc);
#endif
    const ir::MatmulShapes sh = ir::matmul_shapes(a_in.shape(), b_in.shape());
    if (!sh.ok()) fail<ShapeError>("matmul", sh.error, loc);
    const DType dt = promote_types(a_in.dtype(), b_in.dtype());
    if (dt == DType::boolean) fail<DTypeError>("matmul", "not supported for bool operands", loc);
    if (!is_floating(dt))
        fail<DTypeError>("matmul", std::string(dtype_name(dt)) +
                                       " operands are not supported on CUDA (cuBLASLt takes float32, float16, bfloat16, "
                                       "float64)", loc);
    const Tensor a = a_in.rank() == 1 ? a_in.unsqueeze(0) : a_in;
    const Tensor b = b_in.rank() == 1 ? b_in.unsqueeze(1) : b_in;
    const std::int64_t m = sh.m, k = sh.k, n = sh.n;
    const Shape& batch = sh.batch;
    const Shape& result = sh.result;

    // the bias: one value per output column, on the device, in the result dtype (f32 is converted)
    Tensor bias_t;
    // what cuBLASLt applies: the exact gelu comes after it, in a pass (or in the small kernel)
    const Epilogue lib_epi{epi.act == Act::gelu ? Act::none : epi.act, epi.bias};
    const Act act_after = epi.act == Act::gelu ? epi.act : Act::none;
    static_assert(std::all_of(act_table.begin(), act_table.end(), [](const ActInfo& r) { return r.gemm_epilogue; }),
                  "every table activation is a CUDA GEMM epilogue here (cuBLASLt's, the small kernel's or act_pass); "
                  "a row that is not needs a refusal in cuda::matmul");
    if (epilogue_has_bias(epi) && !bias)
        fail<ValueError>("matmul", "epilogue " + epilogue_name(epi) + " needs a bias tensor", loc);
    if (bias && !epilogue_has_bias(epi))
        fail<ValueError>("matmul", "a bias was given but epilogue " + epilogue_name(epi) +
                                       " adds none (use an epilogue with .bias = true)", loc);
    if (bias) {
        if (bias->device() != dev)
            fail<DeviceError>("matmul", "the bias is on " + bias->device().str() + " but the operands are on " + dev.str(), loc);
        if (bias->rank() != 1 || bias->size(0) != n)
            fail<ShapeError>("matmul", "the bias must be 1-D with one value per output column (" + std::to_string(n) +
                                           "), got shape " + bias->shape().str() + " for " + a_in.shape().str() + " @ " +
                                           b_in.shape().str(), loc);
        if (bias->dtype() != dt && bias->dtype() != DType::f32)
            fail<DTypeError>("matmul", "the bias is " + std::string(dtype_name(bias->dtype())) + " but the result is " +
                                           std::string(dtype_name(dt)) + " (the bias must be " + std::string(dtype_name(dt)) +
                                           " or float32)", loc);
        // cuBLASLt reads the bias in the output dtype (D's type), contiguous
        bias_t = bias->to(dt, loc).contiguous();
    }

    if (out) {
        if (out->device() != dev)
            fail<DeviceError>("matmul", "out is on " + out->device().str() + " but the operands are on " + dev.str(), loc);
        if (out->shape() != result)
            fail<ShapeError>("matmul", "out has shape " + out->shape().str() + " but " + a_in.shape().str() + " @ " +
                                           b_in.shape().str() + " is " + result.str(), loc);
        if (out->dtype() != dt)
            fail<DTypeError>("matmul", "out is " + std::string(dtype_name(out->dtype())) + " but the result is " +
                                           std::string(dtype_name(dt)), loc);
        if (!out->is_contiguous()) fail<ValueError>("matmul", "out must be contiguous, got strides " + out->strides().str(), loc);
        if (may_overlap(*out, a_in) || may_overlap(*out, b_in) || (bias && may_overlap(*out, *bias)))
            fail<ValueError>("matmul", "out shares memory with an operand", loc);
    }
    if (result.numel() == 0) return out ? *out : Tensor(result, dt, dev, loc);

    Shape sa = batch, sb = batch;
    sa.push_back(m); sa.push_back(k);
    sb.push_back(k); sb.push_back(n);
    const std::int64_t nb = batch.numel();
    const Shape s3{nb, m, n};
    Tensor c3 = out ? Tensor(out->storage(), out->offset(), s3, contiguous_strides(s3), dt) : Tensor(s3, dt, dev, loc);
    const int index = dev.index;
    const CUstream stream = current_stream(index);
    const bool tf32 = allow_tf32();

    if (k == 0) {
        // an empty sum: C = act(0 + bias). Without a bias every epilogue maps 0 to 0; with one,
        // C = act(zeros(m, 1) @ zeros(1, n) + bias) gives cuBLASLt the epilogue to apply.
        if (!epilogue_has_bias(epi)) {
            c3.fill_(0);
        } else {
            Tensor za(Shape{1, m, 1}, dt, dev, loc), zb(Shape{1, 1, n}, dt, dev, loc);
            za.fill_(0);
            zb.fill_(0);
            // the zero operands broadcast over c3's batch (batch stride 0)
            const GemmProblem p = make_gemm_problem(za, zb, c3, lib_epi, tf32);
            gemm(p, za.data_ptr(), zb.data_ptr(), c3.data_ptr(), bias_t.data_ptr(), index, stream);
            run_act_pass(dt, act_after, c3.data_ptr(), c3.numel(), index, stream);
        }
    } else {
        Tensor ad = a.to(dt, loc);
        Tensor a3, b3, cg = c3;
        Strides st;
        // (..., m, k) @ (k, n) whose batch dims do not merge into the rows (a transposed batch: a
        // seq-first view of batch-first memory, as torch's nn.MultiheadAttention exports it): a
        // batched GEMM of nb products of m < 128 rows fills cuBLASLt's tiles poorly (BERT's QKV
        // projection on (128, 8, 768): 128 GEMMs of 8 rows). One copy of a, then one GEMM of nb * m
        // rows, as torch's matmul copies; the copy moves (nb * m * k) elements, ~66 / n of the GEMM's
        // time at f32 rates.
        if (nb > 1 && b.rank() == 2 && m < 128 && !kiln::detail::view_strides(ad.shape(), ad.strides(), Shape{nb * m, k}, st))
            ad = ad.contiguous();
        if (nb > 1 && b.rank() == 2 && kiln::detail::view_strides(ad.shape(), ad.strides(), Shape{nb * m, k}, st) &&
            gemm_operand(Tensor(ad.storage(), ad.offset(), Shape{1, nb * m, k}, Strides{0, st[0], st[1]}, dt))) {
            // (..., m, k) @ (k, n) with a's batch dims merging into its rows: one GEMM of nb*m rows
            a3 = Tensor(ad.storage(), ad.offset(), Shape{1, nb * m, k}, Strides{0, st[0], st[1]}, dt);
            b3 = gemm_view(b.to(dt, loc), Shape{k, n}, 1, k, n);
            cg = Tensor(c3.storage(), c3.offset(), Shape{1, nb * m, n}, contiguous_strides(Shape{1, nb * m, n}), dt);
        } else {
            a3 = gemm_view(ad, sa, nb, m, k);
            b3 = gemm_view(b.to(dt, loc), sb, nb, k, n);
        }
        const GemmProblem p = make_gemm_problem(a3, b3, cg, epi, tf32);
        const void* bias_ptr = bias ? bias_t.data_ptr() : nullptr;
        if (small_gemm_takes(p, a3.data_ptr(), b3.data_ptr(), properties(index).arch())) {
            check_gemm_problem(p);
            run_small_gemm(p, a3.data_ptr(), b3.data_ptr(), cg.data_ptr(), bias_ptr, index, stream);
        } else {
            GemmProblem lp = p;
            lp.epilogue = lib_epi;
            gemm(lp, a3.data_ptr(), b3.data_ptr(), cg.data_ptr(), bias_ptr, index, stream);
            run_act_pass(dt, act_after, cg.data_ptr(), cg.numel(), index, stream);  // cg: contiguous
        }
    }
    if (out) return *out;
    Shape sc = batch;
    sc.push_back(m); sc.push_back(n);
    Tensor c = c3.view(sc, loc);
    if (a_in.rank() == 1) c = c.squeeze(-2);
    if (b_in.rank() == 1) c = c.squeeze(-1);
    return c;
}

}  // namespace detail

/// Matrix product on a CUDA device through cuBLASLt, with kiln::matmul's rules (1-D operands are
/// vectors, leading dims broadcast, the result dtype is the operands' promoted dtype): float32
/// (TF32 when set_allow_tf32(true)), float16/bfloat16 (computed in f32), float64. Both operands on
/// one CUDA device; `epi` is applied by cuBLASLt, with `bias` (1-D, one value per output column, the
/// result's dtype or float32) for the bias epilogues. Transposed operands (`.t()` views) are read in
/// place; other layouts are copied with .contiguous() first. Queued on current_stream(device).
inline Tensor matmul(const Tensor& a, const Tensor& b, Epilogue epi = {}, const Tensor* bias = nullptr,
                     std::source_location loc = std::source_location::current()) {
    return detail::run_matmul(a, b, epi, bias, nullptr, loc);
}

/// matmul into `out` (on the operands' device, contiguous, the result's shape and dtype, not
/// overlapping an operand): for callers that plan their memory. Returns out.
inline Tensor& matmul_out(Tensor& out, const Tensor& a, const Tensor& b, Epilogue epi = {},
                          const Tensor* bias = nullptr, std::source_location loc = std::source_location::current()) {
    if (!out.defined()) kiln::detail::fail<ValueError>("matmul", "out is an undefined tensor", loc);
    detail::run_matmul(a, b, epi, bias, &out, loc);
    return out;
}

}  // namespace kiln::cuda
