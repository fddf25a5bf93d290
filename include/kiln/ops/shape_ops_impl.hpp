// Shape ops' definitions (declared in ops/shape_ops.hpp): cat, stack, split, chunk, pad, roll,
// gather, take_along_dim, scatter, scatter_add; compiled once in separate mode.
#pragma once
// Included at the end of kiln/ops/shape_ops.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "kiln/backends/cuda/driver.hpp"  // cuda::capturing, current_stream
#include "kiln/backends/cuda/index_ops.hpp"
#include "kiln/ir/library_ops.hpp"
#include "kiln/ops/copy.hpp"
#include "kiln/ops/reductions.hpp"
#include "kiln/trace/tracer.hpp"

namespace kiln {

namespace detail {

/// The one device of a list of tensors; DeviceError naming op and the devices otherwise.
inline Device common_device_of(const std::vector<Tensor>& ts, std::string_view op, const std::source_location& loc) {
    for (const Tensor& t : ts)
        if (!(t.device() == ts.front().device())) {
            std::string devs;
            for (const Tensor& u : ts) devs += (devs.empty() ? "" : ", ") + u.device().str();
            fail<DeviceError>(op, "expected all tensors on one device, got " + devs, loc);
        }
    return ts.empty() ? Device::cpu() : ts.front().device();
}

}  // namespace detail

namespace detail {

inline const char* index_op_name(IndexOp m) {
    switch (m) {
        case IndexOp::gather: return "gather";
        case IndexOp::scatter_add: return "scatter_add";
        default: return "scatter";
    }
}

/// Validates the operands of gather / scatter along dim d (ranks, sizes, dtypes, devices).
inline int check_index_operands(IndexOp m, const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor* src,
                                const std::source_location& loc) {
    const char* op = index_op_name(m);
    if (!is_integral(index.dtype()))
        fail<DTypeError>(op, "index must be int64 (or int32), got " + std::string(dtype_name(index.dtype())), loc);
    const int d = normalize_axis(dim, x.rank(), op, loc);
    // torch lets a 0-dim tensor stand for a 1-element 1-D one here
    const int rx = std::max(x.rank(), 1), ri = std::max(index.rank(), 1);
    auto size = [](const Tensor& t, int k) { return t.rank() == 0 ? std::int64_t{1} : t.size(k); };
    if (rx != ri)
        fail<ShapeError>(op, "index " + index.shape().str() + " must have the rank of the input " + x.shape().str(), loc);
    for (int k = 0; k < rx; ++k)
        if (k != d && size(index, k) > size(x, k))
            fail<ShapeError>(op, "index " + index.shape().str() + " is larger than the input " + x.shape().str() + " in dim " +
                                     std::to_string(k), loc);
    std::vector<Tensor> all{x, index};
    if (src) {
        const int rs = std::max(src->rank(), 1);
        if (rs != rx) fail<ShapeError>(op, "src " + src->shape().str() + " must have the rank of the input " + x.shape().str(), loc);
        for (int k = 0; k < rx; ++k)
            if (size(index, k) > size(*src, k))
                fail<ShapeError>(op, "index " + index.shape().str() + " is larger than src " + src->shape().str() + " in dim " +
                                         std::to_string(k), loc);
        if (src->dtype() != x.dtype())
            fail<DTypeError>(op, "src has dtype " + std::string(dtype_name(src->dtype())) + " but the input " +
                                     std::string(dtype_name(x.dtype())) + " (convert it with .to(dtype))", loc);
        all.push_back(*src);
    }
    (void)common_device_of(all, op, loc);
    return d;
}

/// ValueError unless every index is in [0, n): one pass on the host, a min/max on a device.
inline void check_index_values(IndexOp m, const Tensor& index, int d, std::int64_t n, const std::source_location& loc) {
    if (index.numel() == 0) return;
    auto bad = [&](std::int64_t v) {
        fail<ValueError>(index_op_name(m), "index " + std::to_string(v) + " is out of bounds for dim " + std::to_string(d) +
                                               " with size " + std::to_string(n), loc);
    };
    if (index.device().is_cuda()) {
        // a CUDA graph being captured cannot wait for the device: the calls before the capture
        // (reduce_overhead runs a program twice before it captures it) checked their indices
        if (cuda::capturing(cuda::current_stream(index.device().index))) return;
        const auto lo = min(index, {}, false, loc).item<std::int64_t>(loc);
        if (lo < 0) bad(lo);
        const auto hi = max(index, {}, false, loc).item<std::int64_t>(loc);
        if (hi >= n) bad(hi);
        return;
    }
    const Tensor c = index.contiguous();
    visit_dtype(c.dtype(), [&](auto tag) {
        using I = typename decltype(tag)::type;
        if constexpr (std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>) {
            const I* p = static_cast<const I*>(c.data_ptr());
            for (std::int64_t i = 0; i < c.numel(); ++i)
                if (p[i] < 0 || p[i] >= n) bad(static_cast<std::int64_t>(p[i]));
        }
    });
}

/// Visits every coordinate of `shape` (rank >= 1) in row-major order with the element offsets of
/// up to three strided operands: f(offsets). Strides of the selected dim are the caller's business.
template <std::size_t N, class F>
void walk_offsets(const Shape& shape, const std::array<Strides, N>& strides, F&& f) {
    const int r = shape.rank();
    std::int64_t c[8] = {};
    std::array<std::int64_t, N> off{};
    for (std::int64_t left = shape.numel(); left-- > 0;) {
        f(off);
        for (int d = r - 1; d >= 0; --d) {
            if (++c[d] < shape[d]) {
                for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
                break;
            }
            for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * (shape[d] - 1);
            c[d] = 0;
        }
    }
}

/// a + b in storage type S (bool: or; integers wrap; f16/bf16 through float).
template <class S> S add_elements(S a, S b) {
    if constexpr (std::is_same_v<S, bool>) return a || b;
    else if constexpr (std::is_integral_v<S>) return static_cast<S>(static_cast<std::make_unsigned_t<S>>(a) + static_cast<std::make_unsigned_t<S>>(b));
    else if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) return S(static_cast<float>(a) + static_cast<float>(b));
    else return a + b;
}

/// A 0-dim tensor seen as 1-D of one element (gather and scatter treat them alike), and back.
inline Tensor at_least_1d(const Tensor& t) {
    return t.rank() == 0 ? Tensor(t.storage(), t.offset(), Shape{1}, Strides{1}, t.dtype()) : t;
}
inline Tensor as_shape_of(const Tensor& t, const Tensor& like) {
    return like.rank() == 0 ? Tensor(t.storage(), t.offset(), Shape{}, Strides{}, t.dtype()) : t;
}

/// gather or scatter on concrete tensors whose operands were validated (index values too).
inline Tensor run_index_op(IndexOp m, const Tensor& x0, int d, const Tensor& index0, const Tensor& src0, Scalar value) {
    const Tensor x = at_least_1d(x0), index = at_least_1d(index0);
    const Tensor src = src0.defined() ? at_least_1d(src0) : src0;
    const bool gather = m == IndexOp::gather;
    Tensor out(gather ? index.shape() : x.shape(), x.dtype(), x.device());
    if (!gather) out.copy_(x);
    if (index.numel() > 0) {
        if (x.device().is_cuda() && (m != IndexOp::scatter_add || cuda::detail::has_atomic_add(x.dtype()))) {
            cuda::detail::IndexSignature s;
            s.mode = static_cast<cuda::detail::IndexMode>(m);
            s.dtype = x.dtype();
            s.index_dtype = index.dtype();
            s.rank = index.rank();
            s.dim = d;
            std::uint64_t bits = 0;
            if (m == IndexOp::scatter_value)
                visit_dtype(x.dtype(), [&](auto tag) {
                    using S = typename decltype(tag)::type;
                    const S v = store_as<S>(value.value);
                    std::memcpy(&bits, &v, sizeof v);
                });
            cuda::detail::run_index_kernel(s, out, gather ? x : src, index, bits);
        } else if (x.device().is_cuda()) {  // scatter_add of f16 / bf16 / bool: on the host
            return as_shape_of(run_index_op(m, x.cpu(), d, index.cpu(), src.cpu(), value).to(x.device()), x0);
        } else {
            visit_dtype(x.dtype(), [&](auto tag) {
                using S = typename decltype(tag)::type;
                visit_dtype(index.dtype(), [&](auto itag) {
                    using I = typename decltype(itag)::type;
                    if constexpr (std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>) {
                        const I* ip = static_cast<const I*>(index.data_ptr());
                        S* op = static_cast<S*>(out.data_ptr());
                        // the selected dim of the operand that it indexes walks by the index, not the coordinate
                        Strides sel = gather ? x.strides() : out.strides();
                        const std::int64_t step = sel[d];
                        sel[d] = 0;
                        if (gather) {
                            const S* xp = static_cast<const S*>(x.data_ptr());
                            std::int64_t i = 0;
                            walk_offsets<2>(index.shape(), {index.strides(), sel},
                                            [&](const auto& o) { op[i++] = xp[o[1] + static_cast<std::int64_t>(ip[o[0]]) * step]; });
                        } else if (m == IndexOp::scatter_value) {
                            const S v = store_as<S>(value.value);
                            walk_offsets<2>(index.shape(), {index.strides(), sel},
                                            [&](const auto& o) { op[o[1] + static_cast<std::int64_t>(ip[o[0]]) * step] = v; });
                        } else {
                            const S* sp = static_cast<const S*>(src.data_ptr());
                            const bool add = m == IndexOp::scatter_add;
                            walk_offsets<3>(index.shape(), {index.strides(), sel, src.strides()}, [&](const auto& o) {
                                S& dst = op[o[1] + static_cast<std::int64_t>(ip[o[0]]) * step];
                                dst = add ? add_elements(dst, sp[o[2]]) : sp[o[2]];
                            });
                        }
                    }
                });
            });
        }
    }
    return as_shape_of(out, gather ? index0 : x0);
}

/// The registered names of the index library ops, by IndexOp.
inline constexpr const char* index_call_names[] = {"gather", "scatter", "scatter_value", "scatter_add"};

/// The library op of gather / scatter along dim d, as a traced program calls it; registered by
/// name (index_call_names) so that an exported program saves it.
inline std::shared_ptr<ir::CallOp> index_call(IndexOp m, int d, Scalar value, const std::source_location& loc) {
    auto call = std::make_shared<ir::CallOp>();
    // the key tells calls apart for CSE and the caches: the value's exact bits (%a), not rounded
    char value_text[64] = "";
    if (m == IndexOp::scatter_value)
        std::snprintf(value_text, sizeof value_text, ", value=%a:%d", value.value, static_cast<int>(value.kind));
    call->key = std::string(index_op_name(m)) + "(dim=" + std::to_string(d) + value_text + ")";
    call->name = index_call_names[static_cast<int>(m)];
    call->attrs = {{"dim", static_cast<double>(d)}};
    if (m == IndexOp::scatter_value) call->attrs.insert(call->attrs.end(), {{"value", value.value}, {"value_kind", static_cast<double>(value.kind)}});
    const bool gather = m == IndexOp::gather;
    call->shape = [gather](const std::vector<Shape>& s) { return gather ? s[1] : s[0]; };
    // a dynamic program calls this with other sizes than the trace's: shapes and index values are
    // checked against each call's operands
    call->run = [m, d, value, loc](const std::vector<Tensor>& in) {
        const Tensor src_in = in.size() > 2 ? in[2] : Tensor{};
        const int dd = check_index_operands(m, in[0], d, in[1], src_in.defined() ? &src_in : nullptr, loc);
        check_index_values(m, in[1], dd, in[0].rank() == 0 ? 1 : in[0].size(dd), loc);
        return run_index_op(m, in[0], dd, in[1], src_in, value);
    };
    return call;
}
/// Registers gather/scatter/scatter_add's library-op factories (for loading a program file;
/// called by export/program_file.hpp, not at static initialization: a registration made there
/// would compile every index kernel into every translation unit that includes kiln.hpp).
KILN_DECL void register_index_ops() {
    for (IndexOp m : {IndexOp::gather, IndexOp::scatter, IndexOp::scatter_value, IndexOp::scatter_add}) {
        ir::register_library_op(index_call_names[static_cast<int>(m)], [m](const ir::CallAttrs& a) -> std::shared_ptr<const ir::CallOp> {
            const std::string op = index_call_names[static_cast<int>(m)];
            const int d = static_cast<int>(ir::int_attr(a, op, "dim", 0, max_rank - 1));
            Scalar value;
            if (m == IndexOp::scatter_value) {
                const auto kind = static_cast<DType>(ir::int_attr(a, op, "value_kind", 0, 255));
                if (kind != DType::boolean && kind != DType::i64 && kind != DType::f64)
                    throw ValueError(op + ": attribute 'value_kind' is not a scalar kind (bool, int64, float64)");
                for (const auto& [k, v] : a)
                    if (k == "value") value.value = v;
                value.kind = kind;
            }
            return index_call(m, d, value, std::source_location::current());
        });
    }
}

/// The front door of gather / scatter: validates, then runs now or records a library call.
KILN_DECL Tensor index_op(IndexOp m, const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Scalar value,
                          const std::source_location& loc) {
    const char* op = index_op_name(m);
    const UserOpScope scope(op, loc);
    const int d = check_index_operands(m, x, dim, index, src.defined() ? &src : nullptr, loc);
    if (autograd::detail::needs_grad({&x, &src})) {
        const DType xd = x.dtype();
        return autograd::detail::library(
            op, {&x, &index, &src}, [&] { return index_op(m, x, dim, index, src, value, loc); },
            [m, d, index, xs = x.shape(), xd, dev = x.device()](const Tensor& g) {
                std::vector<Tensor> r(3);
                if (m == IndexOp::gather) {
                    r[0] = index_op(IndexOp::scatter_add, zeros(xs, g.dtype(), dev), d, index, g, 0, std::source_location::current());
                    if (r[0].dtype() != xd) r[0] = r[0].to(xd);
                    return r;
                }
                // scatter / scatter_value: what was overwritten gets nothing; scatter_add: all of it
                r[0] = m == IndexOp::scatter_add ? g : index_op(IndexOp::scatter_value, g, d, index, {}, 0, std::source_location::current());
                if (m != IndexOp::scatter_value) r[2] = index_op(IndexOp::gather, g, d, index, {}, 0, std::source_location::current());
                return r;
            },
            loc);
    }
    auto call = index_call(m, d, value, loc);
    std::vector<Tensor> operands{x, index};
    if (src.defined()) operands.push_back(src);
    return trace::call_op(std::move(call), operands, x.dtype(), loc);
}

}  // namespace detail

KILN_DECL Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim, Loc loc) {
    const detail::UserOpScope scope("cat", loc);
    if (autograd::detail::grad_mode()) {
        std::vector<const Tensor*> ops;
        bool need = false;
        for (const Tensor& t : tensors) {
            ops.push_back(&t);
            need = need || t.requires_grad();
        }
        if (need) {
            std::vector<std::int64_t> sizes;
            for (const Tensor& t : tensors) sizes.push_back(t.rank() == 1 && t.numel() == 0 ? -1 : t.size(dim, loc));
            std::vector<DType> dtypes;
            for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
            return autograd::detail::library(
                "cat", ops, [&] { return cat(tensors, dim, loc); },
                [sizes, dtypes, dim](const Tensor& g) {  // each part's slice of the gradient
                    std::vector<Tensor> r;
                    std::int64_t at = 0;
                    for (std::size_t i = 0; i < sizes.size(); ++i) {
                        if (sizes[i] < 0) { r.emplace_back(); continue; }
                        const Tensor s = g.slice(dim, at, at + sizes[i]);
                        r.push_back(s.dtype() == dtypes[i] ? s : s.to(dtypes[i]));
                        at += sizes[i];
                    }
                    return r;
                },
                loc);
        }
    }
    if (tensors.empty()) detail::fail<ValueError>("cat", "expects a non-empty list of tensors", loc);
    std::vector<Tensor> parts;
    for (const Tensor& t : tensors)
        if (!(t.rank() == 1 && t.numel() == 0)) parts.push_back(t);  // torch's legacy empty tensors
    if (parts.empty()) parts.push_back(tensors.front());
    const Tensor& first = parts.front();
    for (std::size_t i = 0; i < tensors.size(); ++i)
        if (tensors[i].rank() == 0)
            detail::fail<ShapeError>("cat", "a 0-dim tensor (at position " + std::to_string(i) + ") cannot be concatenated", loc);
    const int d = detail::normalize_axis(dim, first.rank(), "cat", loc);
    DType dtype = first.dtype();
    Shape shape = first.shape();
    shape[d] = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        const Tensor& t = parts[i];
        bool ok = t.rank() == first.rank();
        for (int k = 0; ok && k < t.rank(); ++k) ok = k == d || t.size(k) == first.size(k);
        if (!ok)
            detail::fail<ShapeError>("cat", "tensors must match in every dim but " + std::to_string(d) + ": got " +
                                                first.shape().str() + " and " + t.shape().str(), loc);
        dtype = promote_types(dtype, t.dtype());
        shape[d] += t.size(d);
    }
    Tensor out(shape, dtype, detail::common_device_of(parts, "cat", loc), loc);
    std::int64_t at = 0;
    for (const Tensor& t : parts) {
        if (t.size(d) > 0) out.slice(d, at, at + t.size(d), 1, loc).copy_(t, loc);
        at += t.size(d);
    }
    return out;
}

KILN_DECL Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim, Loc loc) {
    const detail::UserOpScope scope("stack", loc);
    if (tensors.empty()) detail::fail<ValueError>("stack", "expects a non-empty list of tensors", loc);
    const int d = detail::normalize_axis(dim, tensors.front().rank() + 1, "stack", loc);
    std::vector<Tensor> parts;
    for (const Tensor& t : tensors) {
        if (!(t.shape() == tensors.front().shape()))
            detail::fail<ShapeError>("stack", "expects tensors of one shape, got " + tensors.front().shape().str() + " and " +
                                                  t.shape().str(), loc);
        parts.push_back(t.unsqueeze(d, loc));
    }
    return cat(parts, d, loc);
}

KILN_DECL std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim, Loc loc) {
    const detail::UserOpScope scope("split", loc);
    if (x.rank() == 0) detail::fail<ShapeError>("split", "cannot split a 0-dim tensor", loc);
    const int d = detail::normalize_axis(dim, x.rank(), "split", loc);
    const std::int64_t n = x.size(d);
    if (split_size < 0 || (split_size == 0 && n != 0))
        detail::fail<ValueError>("split", "split_size must be positive, got " + std::to_string(split_size) + " for dim " +
                                              std::to_string(d) + " of size " + std::to_string(n), loc);
    std::vector<Tensor> out;
    if (n == 0) {
        out.push_back(x);
        return out;
    }
    for (std::int64_t at = 0; at < n; at += split_size) out.push_back(x.slice(d, at, std::min(n, at + split_size), 1, loc));
    return out;
}

KILN_DECL std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim, Loc loc) {
    const detail::UserOpScope scope("split", loc);
    if (x.rank() == 0) detail::fail<ShapeError>("split", "cannot split a 0-dim tensor", loc);
    const int d = detail::normalize_axis(dim, x.rank(), "split", loc);
    std::int64_t total = 0;
    std::string list;
    for (std::int64_t s : sizes) {
        if (s < 0) detail::fail<ValueError>("split", "sizes must be non-negative, got " + std::to_string(s), loc);
        total += s;
        list += (list.empty() ? "" : ", ") + std::to_string(s);
    }
    if (total != x.size(d))
        detail::fail<ShapeError>("split", "sizes [" + list + "] add up to " + std::to_string(total) + ", not to dim " +
                                              std::to_string(d) + " of size " + std::to_string(x.size(d)) + " in " + x.shape().str(), loc);
    std::vector<Tensor> out;
    std::int64_t at = 0;
    for (std::int64_t s : sizes) {
        out.push_back(x.slice(d, at, at + s, 1, loc));
        at += s;
    }
    return out;
}

KILN_DECL std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim, Loc loc) {
    const detail::UserOpScope scope("chunk", loc);
    if (chunks <= 0) detail::fail<ValueError>("chunk", "chunks must be positive, got " + std::to_string(chunks), loc);
    if (x.rank() == 0) detail::fail<ShapeError>("chunk", "cannot chunk a 0-dim tensor", loc);
    const int d = detail::normalize_axis(dim, x.rank(), "chunk", loc);
    const std::int64_t n = x.size(d);
    if (n == 0) return std::vector<Tensor>(static_cast<std::size_t>(chunks), x);  // torch: `chunks` empty pieces
    return split(x, (n + chunks - 1) / chunks, d, loc);
}

KILN_DECL Tensor pad(const Tensor& x, const std::vector<std::int64_t>& pads, Scalar value, Loc loc) {
    const detail::UserOpScope scope("pad", loc);
    if (autograd::detail::needs_grad({&x}))
        return autograd::detail::library(
            "pad", {&x}, [&] { return pad(x, pads, value, loc); },
            [pads](const Tensor& g) {  // the padding cut off again (and what it cropped, zeros)
                std::vector<std::int64_t> back(pads.size());
                for (std::size_t i = 0; i < pads.size(); ++i) back[i] = -pads[i];
                return std::vector<Tensor>{pad(g, back, 0)};
            },
            loc);
    if (pads.size() % 2 != 0 || static_cast<int>(pads.size() / 2) > x.rank())
        detail::fail<ShapeError>("pad", "pads must be (before, after) pairs for at most " + std::to_string(x.rank()) +
                                            " dims of " + x.shape().str() + ", got " + std::to_string(pads.size()) + " values", loc);
    Shape shape = x.shape();
    Tensor src = x;  // x cropped by the negative pads
    std::vector<std::int64_t> before(static_cast<std::size_t>(x.rank()), 0);
    for (std::size_t p = 0; p < pads.size() / 2; ++p) {
        const int d = x.rank() - 1 - static_cast<int>(p);
        const std::int64_t lo = pads[2 * p], hi = pads[2 * p + 1];
        shape[d] = x.size(d) + lo + hi;
        if (shape[d] < 0)
            detail::fail<ShapeError>("pad", "pads (" + std::to_string(lo) + ", " + std::to_string(hi) + ") leave dim " +
                                                std::to_string(d) + " of " + x.shape().str() + " with a negative size", loc);
        const std::int64_t from = std::max<std::int64_t>(0, -lo), to = x.size(d) - std::max<std::int64_t>(0, -hi);
        src = src.slice(d, from, std::max(from, to), 1, loc);
        before[static_cast<std::size_t>(d)] = std::max<std::int64_t>(0, lo);
    }
    Tensor out = full(shape, value, x.dtype(), x.device(), loc);
    if (src.numel() == 0) return out;
    Tensor dst = out;
    for (int d = 0; d < x.rank(); ++d)
        dst = dst.slice(d, before[static_cast<std::size_t>(d)], before[static_cast<std::size_t>(d)] + src.size(d), 1, loc);
    dst.copy_(src, loc);
    return out;
}

KILN_DECL Tensor roll(const Tensor& x, const std::vector<std::int64_t>& shifts, const std::vector<std::int64_t>& dims, Loc loc) {
    const detail::UserOpScope scope("roll", loc);
    if (autograd::detail::needs_grad({&x}))
        return autograd::detail::library(
            "roll", {&x}, [&] { return roll(x, shifts, dims, loc); },
            [shifts, dims](const Tensor& g) {
                std::vector<std::int64_t> back(shifts.size());
                for (std::size_t i = 0; i < shifts.size(); ++i) back[i] = -shifts[i];
                return std::vector<Tensor>{roll(g, back, dims)};
            },
            loc);
    if (dims.empty()) {
        if (shifts.size() != 1)
            detail::fail<ValueError>("roll", "without dims takes one shift, got " + std::to_string(shifts.size()), loc);
        return roll(x.reshape({-1}, loc), shifts, {0}, loc).view(x.shape(), loc);
    }
    if (shifts.size() != dims.size())
        detail::fail<ValueError>("roll", "takes one shift per dim, got " + std::to_string(shifts.size()) + " shifts and " +
                                             std::to_string(dims.size()) + " dims", loc);
    Tensor cur = x;
    for (std::size_t k = 0; k < dims.size(); ++k) {
        const int d = detail::normalize_axis(dims[k], x.rank(), "roll", loc);
        const std::int64_t n = x.size(d);
        const std::int64_t s = n == 0 ? 0 : ((shifts[k] % n) + n) % n;
        Tensor out(cur.shape(), cur.dtype(), cur.device(), loc);
        if (out.numel() == 0) {
            cur = out;
            continue;
        }
        if (s == 0) {
            out.copy_(cur, loc);
        } else {
            out.slice(d, s, n, 1, loc).copy_(cur.slice(d, 0, n - s, 1, loc), loc);
            out.slice(d, 0, s, 1, loc).copy_(cur.slice(d, n - s, n, 1, loc), loc);
        }
        cur = out;
    }
    return cur;
}

KILN_DECL Tensor roll(const Tensor& x, std::int64_t shift, std::optional<std::int64_t> dim, Loc loc) {
    return dim ? roll(x, std::vector<std::int64_t>{shift}, std::vector<std::int64_t>{*dim}, loc)
               : roll(x, std::vector<std::int64_t>{shift}, std::vector<std::int64_t>{}, loc);
}

KILN_DECL Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index, Loc loc) {
    return detail::index_op(detail::IndexOp::gather, x, dim, index, {}, 0, loc);
}

KILN_DECL Tensor take_along_dim(const Tensor& x, const Tensor& indices, std::optional<std::int64_t> dim, Loc loc) {
    const detail::UserOpScope scope("take_along_dim", loc);
    if (!dim) return gather(x.reshape({-1}, loc), 0, indices.reshape({-1}, loc), loc);
    if (x.rank() != indices.rank())
        detail::fail<ShapeError>("take_along_dim", "x " + x.shape().str() + " and indices " + indices.shape().str() +
                                                       " must have the same rank", loc);
    const int d = detail::normalize_axis(*dim, x.rank(), "take_along_dim", loc);
    Shape xs = x.shape(), is = indices.shape(), bi, bx;
    xs[d] = indices.size(d);
    is[d] = x.size(d);
    if (!detail::try_broadcast(xs, indices.shape(), bi) || !detail::try_broadcast(is, x.shape(), bx))
        detail::fail<ShapeError>("take_along_dim", "x " + x.shape().str() + " and indices " + indices.shape().str() +
                                                       " do not broadcast outside dim " + std::to_string(d), loc);
    return gather(x.expand(bx, loc), d, indices.expand(bi, loc), loc);
}

KILN_DECL Tensor scatter(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Loc loc) {
    return detail::index_op(detail::IndexOp::scatter, x, dim, index, src, 0, loc);
}

KILN_DECL Tensor scatter(const Tensor& x, std::int64_t dim, const Tensor& index, Scalar value, Loc loc) {
    return detail::index_op(detail::IndexOp::scatter_value, x, dim, index, {}, value, loc);
}

KILN_DECL Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src, Loc loc) {
    return detail::index_op(detail::IndexOp::scatter_add, x, dim, index, src, 0, loc);
}

}  // namespace kiln
