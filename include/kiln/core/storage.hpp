// Ref-counted memory blocks that tensors view: owned (from an Allocator) or borrowed (Eigen, user).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/core/allocator.hpp"
#include "kiln/core/device.hpp"

namespace kiln::detail {

/// One block of memory. Tensors share it through shared_ptr; the last one frees it.
class Storage {
public:
    /// Allocates nbytes from alloc.
    Storage(std::size_t nbytes, Allocator& alloc, Device device = Device::cpu())
        : data_(alloc.allocate(nbytes)), nbytes_(nbytes), device_(device), allocator_(&alloc), serial_(take_serial()) {}
    /// Borrows memory someone else owns; `keep_alive` (may be null) is held as long as the storage.
    Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> keep_alive)
        : data_(data), nbytes_(nbytes), device_(device), keep_alive_(std::move(keep_alive)), serial_(take_serial()) {}
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
        if (allocator_) allocator_->deallocate(data_, nbytes_);
    }

    void* data() const { return data_; }
    std::size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }
    bool owns_memory() const { return allocator_ != nullptr; }
    /// Creation order: storages made later have larger serials (a tracer tells memory from outside
    /// its traced call from memory the call made).
    std::uint64_t serial() const { return serial_; }
    /// The serial the next storage will get.
    static std::uint64_t next_serial() { return counter().load(std::memory_order_relaxed); }
    /// Bumped by every in-place write through kiln (copy_, fill_, assign): backward checks that a
    /// tensor it saved was not modified since.
    std::uint32_t version() const { return version_; }
    void bump_version() { ++version_; }
    /// Set once a tensor over this memory is marked requires_grad_ (a parameter): a trace then
    /// records work on any tensor over it, a detached one included, since a training step writes
    /// it later in the same program (Tracer::live).
    bool grad_memory() const { return grad_memory_; }
    void mark_grad_memory() { grad_memory_ = true; }

private:
    static std::atomic<std::uint64_t>& counter() {
        static std::atomic<std::uint64_t> c{0};
        return c;
    }
    static std::uint64_t take_serial() { return counter().fetch_add(1, std::memory_order_relaxed); }

    void* data_ = nullptr;
    std::size_t nbytes_ = 0;
    Device device_;
    Allocator* allocator_ = nullptr;
    std::shared_ptr<void> keep_alive_;
    std::uint64_t serial_ = 0;
    std::uint32_t version_ = 0;
    bool grad_memory_ = false;
};

/// Set while a tracer holds recorded writes into concrete memory that the memory does not show
/// yet: reading or writing a tensor's memory directly first lets the tracer apply them.
using PendingWritesHook = void (*)(const Storage*);
inline PendingWritesHook& pending_writes_hook() {
    thread_local PendingWritesHook h = nullptr;
    return h;
}

}  // namespace kiln::detail
