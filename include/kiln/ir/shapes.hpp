// Shape inference for the nodes whose result is not an elementwise broadcast: matrix products and
// reductions. One rule each: eager (ops/), the backends (cuda/matmul.hpp, the CPU GEMM), tracing
// and compile's shape re-derivation (compile/program.hpp) all call these.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/shape.hpp"

namespace kiln::ir {

/// torch.matmul's shapes for operands of shapes a and b: a 1-D a is a row (1, k) and a 1-D b a
/// column (k, 1), whose dim the result then drops; the batch dims (all but the last two)
/// broadcast. `error` says why the shapes do not multiply (empty when they do).
struct MatmulShapes {
    Shape batch;                      ///< the broadcast batch dims
    std::int64_t m = 0, k = 0, n = 0;  ///< (m, k) @ (k, n) per batch element
    Shape result;                     ///< batch + (m if a is not 1-D) + (n if b is not 1-D)
    std::string error;
    bool ok() const { return error.empty(); }
};

inline MatmulShapes matmul_shapes(const Shape& a, const Shape& b) {
    MatmulShapes r;
    if (a.rank() == 0 || b.rank() == 0) {
        r.error = "both operands need at least 1 dim, got " + a.str() + " and " + b.str();
        return r;
    }
    const bool a_vec = a.rank() == 1, b_vec = b.rank() == 1;
    r.m = a_vec ? 1 : a[a.rank() - 2];
    r.k = a[a.rank() - 1];
    const std::int64_t kb = b_vec ? b[0] : b[b.rank() - 2];
    r.n = b_vec ? 1 : b[b.rank() - 1];
    if (r.k != kb) {
        r.error = "shapes " + a.str() + " and " + b.str() + " cannot be multiplied (" + std::to_string(r.k) + " != " +
                  std::to_string(kb) + ")";
        return r;
    }
    Shape ba, bb;
    for (int d = 0; d < a.rank() - 2; ++d) ba.push_back(a[d]);
    for (int d = 0; d < b.rank() - 2; ++d) bb.push_back(b[d]);
    if (!kiln::detail::try_broadcast(ba, bb, r.batch)) {
        r.error = "batch dims " + ba.str() + " and " + bb.str() + " do not broadcast (shapes " + a.str() + " and " + b.str() + ")";
        return r;
    }
    r.result = r.batch;
    if (!a_vec) r.result.push_back(r.m);
    if (!b_vec) r.result.push_back(r.n);
    return r;
}

/// The shape of a reduction of a tensor of shape s over the dims in `mask` (bit d: dim d):
/// those dims are dropped, or kept with size 1 under keepdim.
inline Shape reduced_shape(const Shape& s, unsigned mask, bool keepdim) {
    Shape out;
    for (int d = 0; d < s.rank(); ++d) {
        if (!(mask & (1u << d))) out.push_back(s[d]);
        else if (keepdim) out.push_back(1);
    }
    return out;
}

}  // namespace kiln::ir
