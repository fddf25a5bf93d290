// Seedable counter-based random numbers: results do not depend on the thread count.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <numbers>

namespace kiln {

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
/// generator of cuRAND and of torch's CUDA dropout): four 32-bit words from a 128-bit counter and
/// a 64-bit key. The CUDA text of the same rounds is cuda::detail::philox_source().
constexpr std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k[0] += 0x9E3779B9u;
            k[1] += 0xBB67AE85u;
        }
        const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c[0], p1 = std::uint64_t{0xCD9E8D57u} * c[2];
        c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
             static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
    }
    return c;
}

/// The first Philox word for a 64-bit counter under a 64-bit seed (what dropout draws per element).
constexpr std::uint32_t philox_word(std::uint64_t seed, std::uint64_t counter) {
    return philox4x32_10({static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32), 0, 0},
                         {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)})[0];
}

/// A random stream: a seed and a counter. Element i of a draw hashes (seed, counter + i), so a
/// parallel fill gives the same numbers as a serial one.
class Generator {
public:
    explicit Generator(std::uint64_t seed = 0x6b696c6e) : seed_(seed) {}
    void manual_seed(std::uint64_t seed) {
        seed_ = seed;
        counter_.store(0);
        epoch_.fetch_add(1);
    }
    std::uint64_t seed() const { return seed_; }
    /// The next counter a draw would get.
    std::uint64_t offset() const { return counter_.load(); }
    /// How many times manual_seed ran (streams derived from this one restart when it changes).
    std::uint64_t epoch() const { return epoch_.load(); }
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
    std::atomic<std::uint64_t> epoch_{0};
};

/// The generator factories use when none is given.
inline Generator& default_generator() {
    static Generator g;
    return g;
}
/// Seeds the default generator (torch.manual_seed).
inline void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
