// Where a tensor's memory lives: the host CPU or a CUDA device.
#pragma once

#include <compare>
#include <string>

namespace kiln {

enum class DeviceType : unsigned char { cpu, cuda };

/// A device: the CPU, or CUDA device `index`.
struct Device {
    DeviceType type = DeviceType::cpu;
    int index = 0;

    static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
    static constexpr Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
    constexpr bool is_cpu() const { return type == DeviceType::cpu; }
    constexpr bool is_cuda() const { return type == DeviceType::cuda; }
    constexpr auto operator<=>(const Device&) const = default;

    std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace kiln
