// Storage types for f16 and bf16: bit containers with exact float conversions (math runs in f32).
#pragma once

#include <bit>
#include <cstdint>

namespace kiln {

/// IEEE binary16 storage; converts to float exactly and from float with round-to-nearest-even.
struct half {
    std::uint16_t bits = 0;
    half() = default;
    half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin float type
    operator float() const { return to_float(bits); }

    static constexpr std::uint16_t from_float(float f) {
        const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
        const std::uint32_t sign = (x >> 16) & 0x8000u;
        const std::uint32_t abs = x & 0x7fffffffu;
        if (abs >= 0x7f800000u) {  // inf or nan; keep nan quiet and nonzero
            return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
        }
        if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
        if (abs < 0x38800000u) {  // result is subnormal or zero: align the mantissa and round once
            if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
            const std::uint32_t exp = abs >> 23;
            const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
            const std::uint32_t shift = 126u - exp;  // 14 + (113 - exp) - 1
            std::uint32_t r = mant >> shift;
            const std::uint32_t rem = mant & ((1u << shift) - 1u);
            const std::uint32_t halfway = 1u << (shift - 1u);
            if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
            return static_cast<std::uint16_t>(sign | r);
        }
        std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
        r += 0xfffu + ((r >> 13) & 1u);       // round to nearest even on the 13 dropped bits
        return static_cast<std::uint16_t>(sign | (r >> 13));
    }
    static constexpr float to_float(std::uint16_t h) {
        const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
        std::uint32_t exp = (h >> 10) & 0x1fu;
        std::uint32_t mant = h & 0x3ffu;
        std::uint32_t out;
        if (exp == 0x1fu) {
            out = sign | 0x7f800000u | (mant << 13);
        } else if (exp == 0) {
            if (mant == 0) {
                out = sign;
            } else {  // subnormal: normalize
                exp = 113;
                while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
                out = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
            }
        } else {
            out = sign | ((exp + 112u) << 23) | (mant << 13);
        }
        return std::bit_cast<float>(out);
    }
};

/// bfloat16 storage: the top half of a float, rounded to nearest even.
struct bfloat16 {
    std::uint16_t bits = 0;
    bfloat16() = default;
    bfloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin float type
    operator float() const { return to_float(bits); }

    static constexpr std::uint16_t from_float(float f) {
        const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet nan
        return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
    static constexpr float to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
};

}  // namespace kiln
