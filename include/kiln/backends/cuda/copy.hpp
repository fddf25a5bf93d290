// Transfers between host and CUDA memory on kiln's stream (pinned, double-buffered staging for
// large ones), device copies and fills; the bodies are in copy_impl.hpp (compiled once in separate mode).
#pragma once

#include <cstddef>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// Copies n bytes from host memory to device memory of `device` on current_stream(device):
/// through the pinned staging buffers when large; returns when src may be reused.
KILN_DECL void host_to_device(void* dst, const void* src, std::size_t n, int device);
/// Copies n bytes from device memory of `device` to host memory; returns when dst holds them.
KILN_DECL void device_to_host(void* dst, const void* src, std::size_t n, int device);
/// Copies n bytes between two non-overlapping ranges of device memory of `device`, queued on
/// current_stream(device) (asynchronous to the host).
KILN_DECL void device_to_device(void* dst, const void* src, std::size_t n, int device);
/// Writes host tensor src into dst, a contiguous CUDA tensor of the same shape and dtype
/// (a strided src is made contiguous on the host first).
KILN_DECL void upload(const Tensor& dst, const Tensor& src);
/// Writes CUDA tensor src into dst, a contiguous host tensor of the same shape and dtype (a
/// strided src is made contiguous on its device first, by a kernel).
KILN_DECL void download(const Tensor& dst, const Tensor& src);
/// Whether t's elements exactly cover numel() consecutive elements from its first address in some
/// order (contiguous, or a permutation of a contiguous layout such as a transpose).
KILN_DECL bool is_dense(const Tensor& t);
/// Sets every element of t, a dense CUDA tensor (see is_dense), to value with the driver's
/// memsets when the element's bytes form a repeating 1, 2 or 4-byte pattern; otherwise fills a
/// host tensor and uploads it. Queued on current_stream of t's device.
KILN_DECL void fill_dense(const Tensor& t, double value);

}  // namespace kiln::cuda::detail

#if KILN_HEADER_ONLY
#include "kiln/backends/cuda/copy_impl.hpp"
#endif
