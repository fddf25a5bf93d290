// Ref-counted memory blocks that tensors view: owned (from an Allocator) or borrowed (Eigen, user).
#pragma once

#include <cstddef>
#include <memory>

#include "kiln/core/allocator.hpp"
#include "kiln/core/device.hpp"

namespace kiln::detail {

/// One block of memory. Tensors share it through shared_ptr; the last one frees it.
class Storage {
public:
    /// Allocates nbytes from alloc.
    Storage(std::size_t nbytes, Allocator& alloc, Device device = Device::cpu())
        : data_(alloc.allocate(nbytes)), nbytes_(nbytes), device_(device), allocator_(&alloc) {}
    /// Borrows memory someone else owns; `keep_alive` (may be null) is held as long as the storage.
    Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> keep_alive)
        : data_(data), nbytes_(nbytes), device_(device), keep_alive_(std::move(keep_alive)) {}
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
        if (allocator_) allocator_->deallocate(data_, nbytes_);
    }

    void* data() const { return data_; }
    std::size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }
    bool owns_memory() const { return allocator_ != nullptr; }

private:
    void* data_ = nullptr;
    std::size_t nbytes_ = 0;
    Device device_;
    Allocator* allocator_ = nullptr;
    std::shared_ptr<void> keep_alive_;
};

}  // namespace kiln::detail
