// Helpers shared by the test files: comparing tensors, skipping GPU tests where there is no GPU.
#pragma once

#include <doctest/doctest.h>

#include <kiln/kiln.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

namespace kiln_test {

/// The message of the E that f throws; fails the test when f throws nothing or something else.
template <class E, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        CHECK(typeid(e) == typeid(E));  // the exact type, not a sibling caught through a base
        return e.what();
    } catch (const std::exception& e) {
        FAIL_CHECK("threw " << typeid(e).name() << " instead of " << typeid(E).name() << ": " << e.what());
        return {};
    }
    FAIL_CHECK("threw nothing, expected " << typeid(E).name());
    return {};
}

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

/// Softmax of a row of float64 scores, in place: a row whose scores are all -inf becomes NaN, as
/// softmax over -inf does (the float64 references of attention).
inline void softmax_row_f64(std::vector<double>& p) {
    double mx = -std::numeric_limits<double>::infinity();
    for (double x : p) mx = std::max(mx, x);
    double z = 0;
    for (double& x : p) z += (x = std::exp(x - mx));
    for (double& x : p) x /= z;
}

/// For doctest's skip decorator: `TEST_CASE("..." * doctest::skip(kiln_test::no_cuda()))` is reported
/// as skipped, not passed, where there is no CUDA device (tests/gpu.sh fails on any skip on a GPU machine).
inline bool no_cuda() { return !kiln::cuda::is_available(); }
/// The converse: tests of the errors kiln gives without a GPU are skipped where there is one.
inline bool has_cuda() { return kiln::cuda::is_available(); }

/// Captures the log lines of the given KILN_LOGS channels while alive (then turns logging off).
struct LogCapture {
    std::vector<std::string> lines;
    explicit LogCapture(const std::string& channels) {
        kiln::set_logs(channels);
        kiln::debug::Logs::instance().set_sink([this](const std::string& l) { lines.push_back(l); });
    }
    ~LogCapture() {
        kiln::set_logs("");
        kiln::debug::Logs::instance().set_sink({});
    }
    LogCapture(const LogCapture&) = delete;
    LogCapture& operator=(const LogCapture&) = delete;
    /// How many lines contain s.
    int count(const std::string& s) const {
        int n = 0;
        for (const auto& l : lines) n += l.find(s) != std::string::npos;
        return n;
    }
    bool contains(const std::string& s) const { return count(s) > 0; }
};

}  // namespace kiln_test
