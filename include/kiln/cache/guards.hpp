// Guards: what a compiled program assumed about its inputs, checked on every call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/tensor.hpp"

namespace kiln::cache {

/// A dim that is symbolic matches any size except 0 and 1, which stay specialized (they change
/// broadcasting and emptiness).
inline constexpr std::int64_t symbolic = -1;

inline int size_class(std::int64_t n) { return n == 0 ? 0 : n == 1 ? 1 : 2; }

/// What a program assumed about one tensor argument.
struct TensorGuard {
    DType dtype = DType::f32;
    Device device = Device::cpu();
    Dims dims;  ///< sizes, or `symbolic` for dims that may change
    bool contiguous = true;

    static TensorGuard of(const Tensor& t, const std::vector<char>& dynamic_dims) {
        TensorGuard g{t.dtype(), t.device(), t.shape(), t.is_contiguous()};
        for (int d = 0; d < g.dims.rank(); ++d)
            if (static_cast<std::size_t>(d) < dynamic_dims.size() && dynamic_dims[static_cast<std::size_t>(d)] &&
                size_class(t.shape()[d]) == 2)
                g.dims[d] = symbolic;
        return g;
    }
    bool matches(const Tensor& t) const {
        if (t.dtype() != dtype || !(t.device() == device) || t.rank() != dims.rank() || t.is_contiguous() != contiguous)
            return false;
        for (int d = 0; d < dims.rank(); ++d) {
            if (dims[d] == symbolic ? size_class(t.shape()[d]) != 2 : dims[d] != t.shape()[d]) return false;
        }
        return true;
    }
    /// Why t fails this guard, in words ("dim 0 was 32, now 64"), or "" when it passes.
    std::string mismatch(const Tensor& t) const {
        if (t.dtype() != dtype) return "dtype was " + std::string(dtype_name(dtype)) + ", now " + std::string(dtype_name(t.dtype()));
        if (!(t.device() == device)) return "device was " + device.str() + ", now " + t.device().str();
        if (t.rank() != dims.rank()) return "rank was " + std::to_string(dims.rank()) + ", now " + std::to_string(t.rank());
        if (t.is_contiguous() != contiguous) return contiguous ? "was contiguous, now strided" : "was strided, now contiguous";
        for (int d = 0; d < dims.rank(); ++d) {
            if (dims[d] == symbolic && size_class(t.shape()[d]) != 2)
                return "dim " + std::to_string(d) + " was symbolic, now " + std::to_string(t.shape()[d]);
            if (dims[d] != symbolic && dims[d] != t.shape()[d])
                return "dim " + std::to_string(d) + " was " + std::to_string(dims[d]) + ", now " + std::to_string(t.shape()[d]);
        }
        return "";
    }
    std::string str() const {
        std::string s = std::string(dtype_name(dtype)) + "(";
        for (int d = 0; d < dims.rank(); ++d) s += (d ? ", " : "") + (dims[d] == symbolic ? std::string("s") : std::to_string(dims[d]));
        return s + ")" + (contiguous ? "" : " strided") + " on " + device.str();
    }
};

}  // namespace kiln::cache
