// The bodies of backends/cuda/copy.hpp's transfers (staging buffers, memsets), compiled once in separate mode.
#pragma once
// Included at the end of kiln/backends/cuda/copy.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "kiln/backends/cpu/program.hpp"  // parallel_for, store_as
#include "kiln/backends/cuda/allocator.hpp"
#include "kiln/backends/cuda/driver.hpp"

namespace kiln::cuda::detail {


/// Transfers of at least this many bytes go through the pinned staging buffers.
inline constexpr std::size_t staging_threshold = std::size_t{1} << 20;
/// Bytes per staging buffer (two per device).
inline constexpr std::size_t staging_chunk = std::size_t{8} << 20;

inline CUdeviceptr device_address(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

/// Two pinned host buffers per device, each with an event marking when the copy that last used
/// it has finished. A large transfer moves its data chunk by chunk through them, alternating, so
/// the host's memcpy of one chunk overlaps the DMA of the other; pinned memory is what lets the
/// DMA run asynchronously at full speed (pageable memory is staged by the driver, synchronously).
struct Staging {
    std::mutex mutex;  ///< held for a whole transfer
    bool tried = false;
    std::array<void*, 2> buffer{};
    std::array<CUevent, 2> done{};
    std::array<bool, 2> in_flight{};
    bool ok() const { return buffer[0] && buffer[1] && done[0] && done[1]; }
};

/// The staging buffers of `device`, allocated on first use (caller holds the mutex, with the
/// device's context current). False when pinned memory could not be had: transfers then go
/// directly from pageable memory.
inline bool prepare_staging(Staging& s) {
    if (s.tried) return s.ok();
    s.tried = true;
    const Driver& d = driver();
    for (std::size_t k = 0; k < 2; ++k) {
        if (d.mem_alloc_host(&s.buffer[k], staging_chunk) != cuda_success) s.buffer[k] = nullptr;
        if (d.event_create(&s.done[k], /*CU_EVENT_DISABLE_TIMING*/ 0x2) != cuda_success) s.done[k] = nullptr;
    }
    if (s.ok()) return true;
    for (std::size_t k = 0; k < 2; ++k) {
        if (s.buffer[k]) d.mem_free_host(s.buffer[k]);
        if (s.done[k]) d.event_destroy(s.done[k]);
        s.buffer[k] = nullptr;
        s.done[k] = nullptr;
    }
    return false;
}

/// The staging state of each device (never destroyed: the pinned buffers live as long as the process).
inline Staging& staging(int device) {
    static auto* all = new std::array<Staging, max_devices>();
    return (*all)[static_cast<std::size_t>(device)];
}

/// memcpy spread over kiln's CPU threads: one thread does not saturate a host-to-device link.
inline void parallel_memcpy(void* dst, const void* src, std::size_t n) {
    constexpr std::int64_t grain = std::int64_t{256} << 10;
    kiln::detail::parallel_for(static_cast<std::int64_t>(n), grain, [&](std::int64_t b, std::int64_t e) {
        std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, static_cast<std::size_t>(e - b));
    });
}

/// Waits until the copy that last used staging buffer k has finished.
inline void wait_staging(Staging& s, std::size_t k) {
    if (!s.in_flight[k]) return;
    check(driver().event_synchronize(s.done[k]), "cuEventSynchronize (staging buffer)");
    s.in_flight[k] = false;
}

/// Copies n bytes of host memory to device memory of `device`, on current_stream(device). When it
/// returns the host memory may be reused (the device copy may still be in flight on the stream).
KILN_DECL void host_to_device(void* dst, const void* src, std::size_t n, int device) {
    if (n == 0) return;
    const CUstream stream = current_stream(device);  // makes the device's context current
    const Driver& d = driver();
    const char* from = static_cast<const char*>(src);
    if (n >= staging_threshold) {
        Staging& s = staging(device);
        std::lock_guard lock(s.mutex);
        if (prepare_staging(s)) {
            const std::size_t chunk = staging_chunk;
            for (std::size_t off = 0, i = 0; off < n; off += chunk, ++i) {
                const std::size_t k = i % 2, len = std::min(chunk, n - off);
                wait_staging(s, k);
                parallel_memcpy(s.buffer[k], from + off, len);
                check(d.memcpy_htod_async(device_address(dst) + off, s.buffer[k], len, stream), "cuMemcpyHtoDAsync");
                check(d.event_record(s.done[k], stream), "cuEventRecord (staging buffer)");
                s.in_flight[k] = true;
            }
            return;
        }
    }
    // Pageable memory is consumed before the call returns; the synchronize also covers a source the
    // user pinned, which the copy would otherwise read after we return (torch's blocking copy).
    check(d.memcpy_htod_async(device_address(dst), src, n, stream), "cuMemcpyHtoDAsync");
    check(d.stream_synchronize(stream), "cuStreamSynchronize");
}

/// Copies n bytes of device memory of `device` to host memory, on current_stream(device), after
/// the work queued before it there; returns when the host has the data.
KILN_DECL void device_to_host(void* dst, const void* src, std::size_t n, int device) {
    if (n == 0) return;
    const CUstream stream = current_stream(device);
    const Driver& d = driver();
    char* to = static_cast<char*>(dst);
    if (n >= staging_threshold) {
        Staging& s = staging(device);
        std::lock_guard lock(s.mutex);
        if (prepare_staging(s)) {
            const std::size_t chunk = staging_chunk, chunks = (n + chunk - 1) / chunk;
            auto issue = [&](std::size_t i) {
                const std::size_t k = i % 2, off = i * chunk, len = std::min(chunk, n - off);
                wait_staging(s, k);
                check(d.memcpy_dtoh_async(s.buffer[k], device_address(src) + off, len, stream), "cuMemcpyDtoHAsync");
                check(d.event_record(s.done[k], stream), "cuEventRecord (staging buffer)");
                s.in_flight[k] = true;
            };
            issue(0);
            if (chunks > 1) issue(1);
            for (std::size_t i = 0; i < chunks; ++i) {
                const std::size_t k = i % 2, off = i * chunk, len = std::min(chunk, n - off);
                wait_staging(s, k);
                parallel_memcpy(to + off, s.buffer[k], len);
                if (i + 2 < chunks) issue(i + 2);
            }
            return;
        }
    }
    check(d.memcpy_dtoh_async(dst, device_address(src), n, stream), "cuMemcpyDtoHAsync");
    check(d.stream_synchronize(stream), "cuStreamSynchronize");
}

/// Copies n bytes between two non-overlapping ranges of device memory of `device`, queued on
/// current_stream(device) (asynchronous to the host).
KILN_DECL void device_to_device(void* dst, const void* src, std::size_t n, int device) {
    if (n == 0) return;
    const CUstream stream = current_stream(device);
    check(driver().memcpy_dtod_async(device_address(dst), device_address(src), n, stream), "cuMemcpyDtoDAsync");
}

/// Writes host tensor src into dst, a contiguous CUDA tensor of the same shape and dtype
/// (a strided src is made contiguous on the host first).
KILN_DECL void upload(const Tensor& dst, const Tensor& src) {
    const Tensor h = src.contiguous();
    host_to_device(dst.data_ptr(), h.data_ptr(), dst.nbytes(), dst.device().index);
}

/// Writes CUDA tensor src into dst, a contiguous host tensor of the same shape and dtype (a
/// strided src is made contiguous on its device first, by a kernel).
KILN_DECL void download(const Tensor& dst, const Tensor& src) {
    const Tensor c = src.contiguous();
    device_to_host(dst.data_ptr(), c.data_ptr(), dst.nbytes(), src.device().index);
}

/// Whether t's elements exactly cover numel() consecutive elements from its first address in some
/// order (contiguous, or a permutation of a contiguous layout such as a transpose).
KILN_DECL bool is_dense(const Tensor& t) {
    std::array<std::pair<std::int64_t, std::int64_t>, max_rank> dims{};  // (stride, size), size-1 dims skipped
    std::size_t r = 0;
    for (int i = 0; i < t.rank(); ++i) {
        if (t.shape()[i] == 1) continue;
        std::size_t j = r++;  // insertion by stride (at most 8 dims)
        for (; j > 0 && dims[j - 1].first > t.strides()[i]; --j) dims[j] = dims[j - 1];
        dims[j] = {t.strides()[i], t.shape()[i]};
    }
    std::int64_t expect = 1;
    for (std::size_t i = 0; i < r; ++i) {
        if (dims[i].first != expect) return false;
        expect *= dims[i].second;
    }
    return true;
}

/// Sets every element of t, a dense CUDA tensor (see is_dense), to value with the driver's
/// memsets when the element's bytes form a repeating 1, 2 or 4-byte pattern; otherwise fills a
/// host tensor and uploads it. Queued on current_stream of t's device.
KILN_DECL void fill_dense(const Tensor& t, double value) {
    if (t.numel() == 0) return;
    unsigned char bytes[8] = {};
    const std::size_t es = t.element_size();
    visit_dtype(t.dtype(), [&](auto tag) {
        using S = typename decltype(tag)::type;
        const S v = kiln::detail::store_as<S>(value);
        std::memcpy(bytes, &v, sizeof(S));
    });
    auto repeats = [&](std::size_t w) {
        for (std::size_t i = w; i < es; ++i)
            if (bytes[i] != bytes[i % w]) return false;
        return true;
    };
    const int dev = t.device().index;
    const CUstream stream = current_stream(dev);
    const Driver& d = driver();
    const CUdeviceptr p = device_address(t.data_ptr());
    const std::size_t n = static_cast<std::size_t>(t.numel());
    if (repeats(1)) {
        check(d.memset_d8_async(p, bytes[0], n * es, stream), "cuMemsetD8Async");
    } else if (repeats(2)) {
        unsigned short w = 0;
        std::memcpy(&w, bytes, 2);
        check(d.memset_d16_async(p, w, n * es / 2, stream), "cuMemsetD16Async");
    } else if (repeats(4)) {
        unsigned w = 0;
        std::memcpy(&w, bytes, 4);
        check(d.memset_d32_async(p, w, n * es / 4, stream), "cuMemsetD32Async");
    } else {
        Tensor h(Shape{t.numel()}, t.dtype());
        h.fill_(value);
        host_to_device(t.data_ptr(), h.data_ptr(), h.nbytes(), dev);
    }
}

}  // namespace kiln::cuda::detail
