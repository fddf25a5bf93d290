// The CUDA caching allocator's out-of-line members, compiled once in separate compilation.
// Included at the end of kiln/backends/cuda/allocator.hpp (in header-only mode, or by
// kiln/src.hpp), never on its own.
#pragma once

#include <algorithm>
#include <string>

namespace kiln::cuda::detail {

KILN_DECL void* CachingDeviceAllocator::allocate(std::size_t nbytes) {
    const std::size_t size = device_size_class(nbytes);
    const std::size_t requested = (std::max<std::size_t>(nbytes, 1) + min_block - 1) / min_block * min_block;
    const CUstream stream = current_stream(device_);  // also makes the device's context current
    std::lock_guard lock(mutex_);
    if (auto it = free_.find({key_of(stream), size}); it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        live_.emplace(p, Block{size, stream, requested});  // may throw: the bins are untouched until it succeeded
        it->second.pop_back();
        stats_.bytes_cached -= size;
        ++stats_.cache_hits;
        note_handed_out(size, requested);
        return p;
    }
    const Driver& d = driver();
    CUdeviceptr ptr = 0;
    CUresult r = d.mem_alloc(&ptr, size);
    if (r == cuda_error_out_of_memory) {
        ++stats_.oom_retries;
        release_cached_locked();
        r = d.mem_alloc(&ptr, size);
        if (r == cuda_error_out_of_memory) throw OutOfMemory(oom_message(nbytes, size));
    }
    check(r, "cuMemAlloc");
    ++stats_.driver_allocs;
    void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
    try {
        live_.emplace(p, Block{size, stream, requested});
    } catch (...) {  // no host memory to track it: give it back rather than leak it
        d.mem_free(ptr);
        ++stats_.driver_frees;
        throw;
    }
    note_handed_out(size, requested);
    return p;
}

KILN_DECL void CachingDeviceAllocator::deallocate(void* p, std::size_t) noexcept {
    if (!p) return;
    std::lock_guard lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: nothing sane to do in a noexcept path
    const Block b = it->second;
    live_.erase(it);
    stats_.bytes_in_use -= b.size;
    stats_.bytes_requested -= b.requested;
    try {
        free_[{key_of(b.stream), b.size}].push_back(p);
        stats_.bytes_cached += b.size;
    } catch (...) {  // no memory for the bin entry: give the block back to the driver instead
        if (driver_state().ok()) {
            driver_state().mem_free(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)));
            ++stats_.driver_frees;
        }
    }
}

KILN_DECL void CachingDeviceAllocator::empty_cache() {
    use_device(device_);
    std::lock_guard lock(mutex_);
    release_cached_locked();
}

KILN_DECL void CachingDeviceAllocator::release_cached_locked() {
    if (free_.empty()) return;
    const Driver& d = driver();
    check(d.ctx_synchronize(), "cuCtxSynchronize");  // throws with the bins untouched
    for (auto it = free_.begin(); it != free_.end();) {
        if (std::find(reserved_.begin(), reserved_.end(), it->first.first) != reserved_.end()) {
            ++it;  // a live CUDA graph still uses these
            continue;
        }
        for (void* p : it->second) {
            d.mem_free(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)));  // nothing to do on failure
            ++stats_.driver_frees;
            stats_.bytes_cached -= it->first.second;
        }
        it = free_.erase(it);
    }
}

KILN_DECL std::string CachingDeviceAllocator::oom_message(std::size_t nbytes, std::size_t size) const {
    std::size_t free_b = 0, total_b = 0;
    const bool have_info = driver_state().mem_get_info(&free_b, &total_b) == cuda_success;
    std::string m = "kiln::cuda: out of memory on cuda:" + std::to_string(device_) + ": tried to allocate " +
                    format_mib(size) + " (" + std::to_string(nbytes) + " bytes requested); kiln has " +
                    format_mib(stats_.bytes_in_use) + " in use and " + format_mib(stats_.bytes_cached) +
                    " cached";
    if (have_info) m += "; the device has " + format_mib(free_b) + " free of " + format_mib(total_b);
    return m;
}

KILN_DECL kiln::Allocator* device_allocator_hook(int index) { return &caching_allocator(index, "cuda"); }

}  // namespace kiln::cuda::detail
