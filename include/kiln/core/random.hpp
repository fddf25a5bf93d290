// Seedable counter-based random numbers: results do not depend on the thread count.
#pragma once

#include <atomic>
#include <cstdint>
#include <cmath>
#include <numbers>

namespace kiln {

/// A random stream: a seed and a counter. Element i of a draw hashes (seed, counter + i), so a
/// parallel fill gives the same numbers as a serial one.
class Generator {
public:
    explicit Generator(std::uint64_t seed = 0x6b696c6e) : seed_(seed) {}
    void manual_seed(std::uint64_t seed) {
        seed_ = seed;
        counter_.store(0);
    }
    std::uint64_t seed() const { return seed_; }
    /// Reserves n counters and returns the first.
    std::uint64_t advance(std::uint64_t n) { return counter_.fetch_add(n); }

    /// 64 random bits for counter c (SplitMix64 of the seed-mixed counter).
    std::uint64_t bits(std::uint64_t c) const {
        std::uint64_t z = seed_ * 0x9e3779b97f4a7c15ull + c * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Uniform in [0, 1) with 53 random bits.
    double uniform(std::uint64_t c) const { return static_cast<double>(bits(c) >> 11) * 0x1.0p-53; }
    /// Standard normal (Box-Muller on two uniforms of the same counter).
    double normal(std::uint64_t c) const {
        const double u1 = (static_cast<double>(bits(c) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = static_cast<double>(bits(c ^ 0x5555555555555555ull) >> 11) * 0x1.0p-53;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }

private:
    std::uint64_t seed_;
    std::atomic<std::uint64_t> counter_{0};
};

/// The generator factories use when none is given.
inline Generator& default_generator() {
    static Generator g;
    return g;
}
/// Seeds the default generator (torch.manual_seed).
inline void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
