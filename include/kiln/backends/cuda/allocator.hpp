// Device memory: a caching allocator per CUDA device, binned by (stream, size class), with statistics.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/driver.hpp"
#include "kiln/core/allocator.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cuda {

/// Statistics of kiln's caching allocator on one device (sizes are rounded block sizes).
struct DeviceMemoryStats {
    std::size_t allocations = 0;        ///< allocate() calls that returned a block
    std::size_t cache_hits = 0;         ///< of those, served from a cached block
    std::size_t driver_allocs = 0;      ///< successful cuMemAlloc calls
    std::size_t driver_frees = 0;       ///< cuMemFree calls (empty_cache, out-of-memory retries)
    std::size_t bytes_in_use = 0;       ///< handed out and not yet returned
    std::size_t bytes_cached = 0;       ///< freed by kiln, held for reuse
    std::size_t peak_bytes_in_use = 0;  ///< the most bytes_in_use ever reached
    /// The bytes tensors asked for, each rounded up to 512 B, of the blocks handed out (bytes_in_use
    /// counts whole size classes): torch.cuda.memory_stats()'s requested_bytes (there unrounded).
    std::size_t bytes_requested = 0;
    std::size_t peak_bytes_requested = 0;  ///< the most bytes_requested ever reached
    std::size_t oom_retries = 0;        ///< cuMemAlloc out-of-memory failures retried after freeing the cache
};

namespace detail {

inline constexpr std::size_t min_block = 512;
inline constexpr std::size_t small_limit = std::size_t{1} << 20;  // 1 MiB
inline constexpr std::size_t large_granule = std::size_t{2} << 20;  // 2 MiB

/// The size class of a request: at least 512 B, 512 B multiples below 1 MiB, 2 MiB multiples from
/// 1 MiB up, so repeated requests of nearby sizes land in one bin.
constexpr std::size_t device_size_class(std::size_t n) {
    if (n <= min_block) return min_block;
    const std::size_t g = n < small_limit ? min_block : large_granule;
    return (n + g - 1) / g * g;
}

/// "12.50 MiB".
inline std::string format_mib(std::size_t bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

/// Caches freed device blocks per (stream, size class) and hands them back only to requests on
/// the same stream: work queued on one stream runs in order, so a block freed there can be reused
/// there at once, while another stream could still be running kernels that use it.
/// A block remembers the stream that was current when it was allocated (kiln's stream, or a
/// StreamGuard's); a tensor used on another stream must be kept alive until that work is done.
/// Blocks cached for a Stream that was destroyed stay cached until empty_cache().
class CachingDeviceAllocator final : public kiln::Allocator {
public:
    explicit CachingDeviceAllocator(int device) : device_(device) {}
    CachingDeviceAllocator(const CachingDeviceAllocator&) = delete;
    CachingDeviceAllocator& operator=(const CachingDeviceAllocator&) = delete;

    /// A device pointer (as void*) to at least nbytes bytes, 512-byte aligned; 0 bytes gives a
    /// distinct block of the smallest class. Throws OutOfMemory when the device is full even after
    /// the cache was freed, DeviceError for other driver failures.
    void* allocate(std::size_t nbytes) override;

    /// Returns the block to the bins of the stream it was allocated on (no driver call).
    void deallocate(void* p, std::size_t) noexcept override;

    /// Waits for all work on the device, then frees every cached block.
    void empty_cache();

    /// Reserves (or gives back) the cached blocks of `stream`: a CUDA graph captured there keeps
    /// using the memory its capture freed, so empty_cache() and out-of-memory retries leave them.
    void reserve_stream(CUstream stream, bool reserve) {
        std::lock_guard lock(mutex_);
        if (reserve) reserved_.push_back(key_of(stream));
        else std::erase(reserved_, key_of(stream));
    }

    DeviceMemoryStats stats() const {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    void reset_peak() {
        std::lock_guard lock(mutex_);
        stats_.peak_bytes_in_use = stats_.bytes_in_use;
        stats_.peak_bytes_requested = stats_.bytes_requested;
    }
    int device() const { return device_; }

private:
    struct Block {
        std::size_t size;
        CUstream stream;
        std::size_t requested;  ///< the request, rounded up to min_block
    };

    static std::uintptr_t key_of(CUstream s) { return reinterpret_cast<std::uintptr_t>(s); }

    void note_handed_out(std::size_t size, std::size_t requested) {
        ++stats_.allocations;
        stats_.bytes_in_use += size;
        if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
        stats_.bytes_requested += requested;
        if (stats_.bytes_requested > stats_.peak_bytes_requested) stats_.peak_bytes_requested = stats_.bytes_requested;
    }

    // Cached blocks may still be read or written by queued work (their tensors died on the host
    // first), so the whole context is synchronized before any is freed. Stream handles of cached
    // blocks may be dead, so the per-stream synchronize is not an option.
    void release_cached_locked();

    std::string oom_message(std::size_t nbytes, std::size_t size) const;

    int device_;
    mutable std::mutex mutex_;
    std::unordered_map<void*, Block> live_;
    std::map<std::pair<std::uintptr_t, std::size_t>, std::vector<void*>> free_;  // (stream, size) -> blocks
    std::vector<std::uintptr_t> reserved_;  // streams whose blocks CUDA graphs hold (reserve_stream)
    DeviceMemoryStats stats_;
};

/// The allocator of device `index` (validated by the caller), made on first use and never
/// destroyed, so tensors in static storage can still free into it at exit.
inline CachingDeviceAllocator& device_allocator_at(int index) {
    static std::array<std::atomic<CachingDeviceAllocator*>, max_devices> allocators{};
    static std::mutex create;
    if (index < 0 || index >= max_devices)  // the callers' check, restated where GCC sees it (-Wstringop-overflow)
        throw DeviceError("kiln::cuda: device index " + std::to_string(index) + " is out of range");
    auto& slot = allocators[static_cast<std::size_t>(index)];
    if (CachingDeviceAllocator* a = slot.load(std::memory_order_acquire)) return *a;
    std::lock_guard lock(create);
    if (CachingDeviceAllocator* a = slot.load(std::memory_order_acquire)) return *a;
    auto* a = new CachingDeviceAllocator(index);  // leaked on purpose (see above)
    slot.store(a, std::memory_order_release);
    return *a;
}

/// The allocator of device `index`; DeviceError when there is no driver or no such device.
inline CachingDeviceAllocator& caching_allocator(int index, const char* op) {
    device_state(index, op);  // validates the driver and the index
    return device_allocator_at(index);
}

KILN_DECL kiln::Allocator* device_allocator_hook(int index);

/// Installs the hook core's Tensor uses to allocate on CUDA devices (core includes no CUDA header).
inline const bool device_allocator_hook_installed = (kiln::cuda_allocator_hook() = &device_allocator_hook, true);

}  // namespace detail

/// The caching allocator of CUDA device `device`: allocate() returns a device pointer as void*.
/// Throws DeviceError when there is no driver or no such device.
inline kiln::Allocator& device_allocator(int device) { return detail::caching_allocator(device, "cuda::device_allocator"); }

/// Statistics of kiln's caching allocator on `device`.
inline DeviceMemoryStats memory_stats(int device = 0) { return detail::caching_allocator(device, "cuda::memory_stats").stats(); }

/// Starts peak_bytes_in_use over from the bytes in use now (torch.cuda.reset_peak_memory_stats).
inline void reset_peak_memory_stats(int device = 0) {
    detail::caching_allocator(device, "cuda::reset_peak_memory_stats").reset_peak();
}

/// Synchronizes `device`, then frees every block kiln's allocator keeps cached there.
inline void empty_cache(int device = 0) { detail::caching_allocator(device, "cuda::empty_cache").empty_cache(); }

}  // namespace kiln::cuda

#if KILN_HEADER_ONLY
#include "kiln/backends/cuda/allocator_impl.hpp"
#endif
