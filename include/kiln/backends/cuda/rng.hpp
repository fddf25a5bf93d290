// Random draws on CUDA that a replayed CUDA graph must redo (dropout's keep mask): the counter
// offset of each (generator, device) lives in device memory, read by the draw and moved on by a
// second launch, so the same launches captured once draw new numbers on every replay.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kiln/backends/cuda/graph_exec.hpp"
#include "kiln/backends/cuda/library_kernels.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::cuda::detail {

/// A generator's stream on one device: {seed, offset} as two int64 in device memory.
struct DeviceRngState {
    std::uint64_t epoch = 0;
    Tensor words;  ///< (2) int64: seed bits, next counter
};

/// The device state of (gen, device), (re)started from the generator's seed and counter when it is
/// new or the generator was re-seeded since. Outside a capture only: a capture cannot copy from the
/// host (the first call of a reduce_overhead program, which runs uncaptured, creates it).
inline const Tensor& device_rng_state(Generator& gen, int device, const std::source_location& loc) {
    static std::mutex mu;
    static std::map<std::pair<const Generator*, int>, DeviceRngState> states;
    std::lock_guard lock(mu);
    DeviceRngState& s = states[{&gen, device}];
    if (!s.words.defined() || s.epoch != gen.epoch()) {
        if (capturing(current_stream(device)))
            kiln::detail::fail<Error>("dropout", "the generator's device stream must exist before a CUDA graph capture "
                                                 "(run the program once uncaptured after manual_seed)", loc);
        Tensor host(Shape{2}, DType::i64, Device::cpu(), loc);
        auto* w = static_cast<std::int64_t*>(host.data_ptr());
        w[0] = static_cast<std::int64_t>(gen.seed());
        w[1] = static_cast<std::int64_t>(gen.offset());
        if (!s.words.defined()) s.words = Tensor(Shape{2}, DType::i64, Device::cuda(device), loc);
        s.words.copy_(host, loc);
        s.epoch = gen.epoch();
    }
    return s.words;
}

/// keep (bool, contiguous, on a CUDA device): element i kept when the Philox word for the device
/// stream's seed and counter offset + i, shifted right by 8, is at least `threshold` (p * 2^24
/// rounded up); the device offset then moves on by keep's size.
inline void dropout_mask(Tensor& keep, Generator& gen, std::int64_t threshold, const std::source_location& loc) {
    const int device = keep.device().index;
    const Tensor& st = device_rng_state(gen, device, loc);
    const std::int64_t n = keep.numel();
    {
        Args a;
        a.add_ptr(keep.data_ptr());
        a.add(n);
        a.add_ptr(st.data_ptr());
        a.add(threshold);
        launch(kernel_function(dropout_mask_kernel(), device), grid_for(n, 256, device), 256, 0, current_stream(device), a.finish());
    }
    Args b;
    b.add_ptr(static_cast<const std::int64_t*>(st.data_ptr()) + 1);
    b.add(n);
    launch(kernel_function(rng_advance_kernel(), device), 1, 1, 0, current_stream(device), b.finish());
}

}  // namespace kiln::cuda::detail
