// scaled_dot_product_attention on CUDA in one kernel (the registry's attention_kernel): which
// operands it takes, and the launch.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/backends/cuda/library_kernels.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// The longest key sequence the one-thread-per-row kernel (f32, or f16/bf16 before sm_80) takes.
inline constexpr std::int64_t max_row_attention_keys = 64;

/// Whether q (B, H, Sq, D), k and v (B, H, Sk, D) and mask (undefined, or bool or floating and
/// broadcasting to (B, H, Sq, Sk)) are attention's operands on any device: rank 4, one floating
/// dtype and one device, matching batch, heads and head dim. What the library op "attention" takes.
inline bool attention_operands(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || k.dtype() != q.dtype() || v.dtype() != q.dtype() || !is_floating(q.dtype()))
        return false;
    if (!(k.device() == q.device()) || !(v.device() == q.device())) return false;
    for (int d : {0, 1})
        if (k.size(d) != q.size(d) || v.size(d) != q.size(d)) return false;
    if (k.size(3) != q.size(3) || v.size(3) != q.size(3) || v.size(2) != k.size(2)) return false;
    if (!mask.defined()) return true;
    Shape full{q.size(0), q.size(1), q.size(2), k.size(2)}, out;
    return mask.device() == q.device() && mask.rank() <= 4 && (mask.dtype() == DType::boolean || is_floating(mask.dtype())) &&
           kiln::detail::try_broadcast(mask.shape(), full, out) && out == full;
}

/// The signature of the one-kernel attention for these operands (attention_operands, on a CUDA
/// device), or false where the kernel does not take them (the caller decomposes).
inline bool attention_signature(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, AttentionSignature& s) {
    if (!q.device().is_cuda() || !attention_operands(q, k, v, mask)) return false;
    if (q.numel() == 0 || k.numel() == 0 || q.size(0) > 65535 || q.size(1) > 65535) return false;
    const std::int64_t D = q.size(3);
    s = AttentionSignature{};
    s.dtype = q.dtype();
    s.head_dim = static_cast<int>(D);
    const bool half = s.dtype == DType::f16 || s.dtype == DType::bf16;
    s.mma = half && properties(q.device().index).arch() >= 80;
    if (s.dtype != DType::f32 && !half) return false;
    if (D > (s.mma ? 128 : 64)) return false;
    // one thread per query row reads every key from shared memory for each of its FMAs: on long
    // sequences (BERT's 128 tokens in f32) cuBLAS's GEMMs and the row kernel are faster
    if (!s.mma && k.size(2) > max_row_attention_keys) return false;
    if (mask.defined()) {
        if (mask.dtype() == DType::boolean) s.mask = 1;
        else if (mask.dtype() == DType::f32 || mask.dtype() == DType::f16 || mask.dtype() == DType::bf16) s.mask = 2, s.mask_dtype = mask.dtype();
        else return false;
    }
    return true;
}

/// out (B, Sq, H, D), contiguous, new = attention of concrete q, k, v (and mask) as
/// attention_signature took them, with scores scaled by `scale`; queued on the device's current stream.
inline Tensor run_attention(AttentionSignature s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale) {
    const int device = q.device().index;
    // 16-byte vector loads where the layout allows (addresses are known only here: the signature
    // may be taken of traced operands)
    const std::int64_t w = 16 / static_cast<std::int64_t>(dtype_size(q.dtype()));  // elements per vector
    s.vec = s.head_dim % w == 0;
    for (const Tensor* t : {&q, &k, &v}) {
        s.vec = s.vec && t->stride(3) == 1 && reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 == 0;
        for (int d = 0; d < 3; ++d) s.vec = s.vec && (t->stride(d) % w == 0 || t->size(d) == 1);
    }
    const std::int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2);
    if (s.mma) {
        // short sequences (a sentence at batch 1): a warp per 16 query rows present, and a key
        // tile no longer than the keys need, where a 64 x 64 tile would mostly multiply padding
        s.q_warps = static_cast<int>(std::clamp<std::int64_t>((Sq + 15) / 16, 1, 4));
        if (const int w = Tuning::get().attn_q_warps; w > 0) s.q_warps = w;  // KILN_CUDA_ATTN_QWARPS
        s.key_tile = Sk <= 16 ? 16 : Sk <= 32 ? 32 : 0;
    }
    const Strides ms = mask.defined() ? kiln::detail::broadcast_strides(mask.shape(), mask.strides(), Shape{B, H, Sq, Sk}) : Strides{0, 0, 0, 0};
    s.mask_keys = s.mma && mask.defined() && ms[2] == 0;  // the same terms for every query row
    Tensor out(Shape{B, Sq, H, q.size(3)}, q.dtype(), q.device());
    // by signature: the kernel's text is made once
    const CUfunction f = named_function(attention_kernel_name(s), device, [&s](const std::string&) { return attention_kernel(s).source; });
    Args a;
    a.add_ptr(q.data_ptr());
    a.add_ptr(k.data_ptr());
    a.add_ptr(v.data_ptr());
    a.add_ptr(mask.defined() ? mask.data_ptr() : nullptr);
    a.add_ptr(out.data_ptr());
    for (std::int64_t n : {B, H, Sq, Sk}) a.add(n);
    for (const Tensor* t : {&q, &k, &v})
        for (int d = 0; d < 4; ++d) a.add(t->stride(d));
    for (int d = 0; d < 4; ++d) a.add(ms[static_cast<std::size_t>(d)]);
    a.add(std::bit_cast<std::int64_t>(scale));
    const std::int64_t rows = s.mma ? 16 * s.q_warps : 64;  // query rows per block
    const std::int64_t blocks = (Sq + rows - 1) / rows * H * B;
    launch(f, static_cast<unsigned>(blocks), static_cast<unsigned>(s.mma ? 32 * s.q_warps : 64), 0, current_stream(device), a.finish());
    return out;
}

}  // namespace kiln::cuda::detail
