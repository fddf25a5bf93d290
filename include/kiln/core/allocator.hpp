// Host memory: the pluggable allocator interface, the default caching 64-byte-aligned one, and the CUDA allocator hook.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "kiln/core/error.hpp"

namespace kiln {

/// Memory source. Host allocators return blocks aligned to at least 64 bytes; a device allocator
/// (backends/cuda/allocator.hpp) returns device addresses as void*.
class Allocator {
public:
    virtual ~Allocator() = default;
    virtual void* allocate(std::size_t nbytes) = 0;
    virtual void deallocate(void* p, std::size_t nbytes) noexcept = 0;
};

/// Statistics of the default host allocator.
struct AllocatorStats {
    std::size_t allocations = 0;   ///< allocate() calls
    std::size_t cache_hits = 0;    ///< served from a cached block
    std::size_t bytes_in_use = 0;  ///< handed out and not yet returned
    std::size_t bytes_cached = 0;  ///< held for reuse
};

namespace detail {

/// Keeps freed blocks by rounded size and hands them back, so a loop that repeats its
/// allocations stops paying for page faults after its first iteration (large blocks would
/// otherwise go back to the OS with munmap on every free).
class CachingHostAllocator final : public Allocator {
public:
    static constexpr std::size_t alignment = 64;
    /// Bytes kept in the cache at most; larger frees go straight back to the system.
    static constexpr std::size_t max_cached_bytes = std::size_t{4} << 30;

    void* allocate(std::size_t nbytes) override {
        const std::size_t size = round_up(nbytes);
        {
            std::lock_guard lock(mutex_);
            ++stats_.allocations;
            if (auto it = free_.find(size); it != free_.end()) {
                void* p = it->second;
                free_.erase(it);
                ++stats_.cache_hits;
                stats_.bytes_cached -= size;
                stats_.bytes_in_use += size;
                return p;
            }
        }
        void* p = system_allocate(size);
        if (!p) {
            empty_cache();
            p = system_allocate(size);
            if (!p)
                throw OutOfMemory("kiln: failed to allocate " + std::to_string(nbytes) + " bytes of host memory");
        }
        std::lock_guard lock(mutex_);
        stats_.bytes_in_use += size;
        return p;
    }
    void deallocate(void* p, std::size_t nbytes) noexcept override {
        if (!p) return;
        const std::size_t size = round_up(nbytes);
        std::lock_guard lock(mutex_);
        stats_.bytes_in_use -= size;
        if (stats_.bytes_cached + size > max_cached_bytes) {
            ::operator delete(p, std::align_val_t{alignment});
            return;
        }
        free_.emplace(size, p);
        stats_.bytes_cached += size;
    }
    /// Returns every cached block to the system.
    void empty_cache() noexcept {
        std::lock_guard lock(mutex_);
        for (auto& [size, p] : free_) ::operator delete(p, std::align_val_t{alignment});
        free_.clear();
        stats_.bytes_cached = 0;
    }
    AllocatorStats stats() const {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    ~CachingHostAllocator() override { empty_cache(); }

private:
    static std::size_t round_up(std::size_t n) {
        // Small blocks to 64 bytes, medium to pages, large to 2 MiB, so repeats land in one bin.
        const std::size_t g = n <= 4096 ? 64 : n <= (std::size_t{1} << 21) ? 4096 : (std::size_t{1} << 21);
        return n == 0 ? g : (n + g - 1) / g * g;
    }
    static void* system_allocate(std::size_t size) noexcept {
        return ::operator new(size, std::align_val_t{alignment}, std::nothrow);
    }
    mutable std::mutex mutex_;
    std::multimap<std::size_t, void*> free_;
    AllocatorStats stats_;
};

inline CachingHostAllocator& host_caching_allocator() {
    static CachingHostAllocator a;  // never destroyed before tensors in static storage: leaked on purpose below
    return a;
}

inline Allocator*& current_host_allocator() {
    static Allocator* a = &host_caching_allocator();
    return a;
}

}  // namespace detail

/// The allocator new host tensors use.
inline Allocator& host_allocator() { return *detail::current_host_allocator(); }
/// Replaces the host allocator for tensors created from now on (nullptr restores the default).
/// Tensors remember the allocator that made them.
inline void set_host_allocator(Allocator* a) {
    detail::current_host_allocator() = a ? a : &detail::host_caching_allocator();
}
/// Gives the allocator of CUDA device `index`, or throws DeviceError (no driver, no such device).
using DeviceAllocatorHook = Allocator* (*)(int index);
/// The hook Tensor uses to allocate on CUDA devices, so core needs no CUDA header: null until
/// kiln/backends/cuda/allocator.hpp (included by kiln/kiln.hpp) installs kiln's caching allocator.
inline DeviceAllocatorHook& cuda_allocator_hook() {
    static DeviceAllocatorHook hook = nullptr;
    return hook;
}

/// Statistics of kiln's default host allocator.
inline AllocatorStats host_allocator_stats() { return detail::host_caching_allocator().stats(); }
/// Frees the blocks the default host allocator keeps for reuse.
inline void empty_host_cache() { detail::host_caching_allocator().empty_cache(); }

}  // namespace kiln
