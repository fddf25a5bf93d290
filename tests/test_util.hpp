// Helpers shared by the test files: comparing tensors.
#pragma once

#include <doctest/doctest.h>

#include <kiln/kiln.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln_test {

/// Largest difference between a and b relative to max(1, |b|), both copied to the host first.
/// Shapes must match; NaN equals NaN and an infinity equals itself, while NaN or an infinity
/// against anything else is an infinite difference (never skipped).
inline double maxdiff(const kiln::Tensor& a, const kiln::Tensor& b) {
    const kiln::Tensor x = a.cpu(), y = b.cpu();
    REQUIRE(x.shape() == y.shape());
    double m = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
        const double p = x.item<double>(i), q = y.item<double>(i);
        if (std::isnan(p) || std::isnan(q) || std::isinf(p) || std::isinf(q)) {
            if (!(std::isnan(p) && std::isnan(q)) && p != q) return std::numeric_limits<double>::infinity();
            continue;
        }
        m = std::max(m, std::abs(p - q) / std::max(1.0, std::abs(q)));
    }
    return m;
}

}  // namespace kiln_test
