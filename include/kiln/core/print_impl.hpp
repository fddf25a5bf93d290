// Printing tensors (declared in core/print.hpp), compiled once in separate mode.
#pragma once
// Included at the end of kiln/core/print.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <vector>

namespace kiln {
namespace detail {

struct PrintFormat {
    bool floating = false, integral_values = true, sci = false;
    int width = 1;
    std::string format(double v) const {
        char buf[64];
        if (!floating) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
        else if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
        else if (std::isinf(v)) std::snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
        else if (sci) std::snprintf(buf, sizeof buf, "%.4e", v);
        else if (integral_values) std::snprintf(buf, sizeof buf, "%.0f.", v);
        else std::snprintf(buf, sizeof buf, "%.4f", v);
        return buf;
    }
};

inline constexpr std::int64_t print_threshold = 1000, print_edge = 3;

inline void print_rec(std::ostream& os, const Tensor& t, const PrintFormat& f, int dim, std::int64_t offset,
                      bool summarize, int indent) {
    auto value = [&](std::int64_t off) {
        return visit_dtype(t.dtype(), [&](auto tag) {
            using S = typename decltype(tag)::type;
            const S* p = static_cast<const S*>(t.data_ptr()) + off;
            if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) return static_cast<double>(static_cast<float>(*p));
            else return static_cast<double>(*p);
        });
    };
    const std::int64_t n = t.size(dim);
    os << '[';
    for (std::int64_t i = 0; i < n; ++i) {
        if (summarize && n > 2 * print_edge && i == print_edge) {
            os << (dim == t.rank() - 1 ? "..." : "...");
            i = n - print_edge - 1;
            os << (dim == t.rank() - 1 ? ", " : ",\n" + std::string(static_cast<std::size_t>(indent + 1), ' '));
            continue;
        }
        const std::int64_t off = offset + i * t.stride(dim);
        if (dim == t.rank() - 1) {
            std::string s = t.dtype() == DType::boolean ? (value(off) != 0 ? "True" : "False") : f.format(value(off));
            os << std::string(static_cast<std::size_t>(std::max<int>(0, f.width - static_cast<int>(s.size()))), ' ') << s;
        } else {
            print_rec(os, t, f, dim + 1, off, summarize, indent + 1);
        }
        if (i + 1 < n)
            os << (dim == t.rank() - 1 ? ", " : "," + std::string(static_cast<std::size_t>(t.rank() - 1 - dim), '\n') +
                                                    std::string(static_cast<std::size_t>(indent + 1), ' '));
    }
    os << ']';
}

}  // namespace detail

KILN_DECL std::string to_string(const Tensor& tensor) {
    if (!tensor.defined()) return "tensor(undefined)";
    const Tensor t = tensor.device().is_cpu() ? tensor : tensor.cpu();
    std::ostringstream os;
    const bool summarize = t.numel() > detail::print_threshold;
    detail::PrintFormat f;
    f.floating = is_floating(t.dtype());
    // format from the values that will be shown
    double lo = INFINITY, hi = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        if (summarize && i >= detail::print_edge * 64 && i < t.numel() - detail::print_edge * 64) continue;
        const double v = t.item<double>(i);
        if (!std::isfinite(v)) continue;
        if (v != std::floor(v)) f.integral_values = false;
        const double a = std::fabs(v);
        if (a > 0) lo = std::min(lo, a);
        hi = std::max(hi, a);
    }
    if (f.floating && hi > 0 && (hi / lo > 1000 || hi > 1e8 || lo < 1e-4)) f.sci = true;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        if (summarize && i >= detail::print_edge * 64 && i < t.numel() - detail::print_edge * 64) continue;
        const double v = t.item<double>(i);
        f.width = std::max<int>(f.width, static_cast<int>(t.dtype() == DType::boolean ? (v != 0 ? 4 : 5) : f.format(v).size()));
    }
    os << "tensor(";
    if (t.rank() == 0) {
        os << (t.dtype() == DType::boolean ? (t.item<double>() != 0 ? "True" : "False") : f.format(t.item<double>()));
    } else if (t.numel() == 0) {
        os << "[]";
    } else {
        detail::print_rec(os, t, f, 0, 0, summarize, 7);
    }
    if (t.numel() == 0 && t.rank() != 1) os << ", size=" << t.shape().str();
    if (t.dtype() != DType::f32 && t.dtype() != DType::i64 && t.dtype() != DType::boolean)
        os << ", dtype=kiln." << dtype_name(t.dtype());
    if (!tensor.device().is_cpu()) os << ", device=" << tensor.device().str();
    os << ')';
    return os.str();
}

KILN_DECL std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace kiln
