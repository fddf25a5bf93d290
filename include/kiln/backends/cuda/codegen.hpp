// CUDA C generation for fused groups: one skeleton per kernel family (elementwise, row, reduce),
// filled only with the op table's CUDA strings and the reduction table's combines.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/fuse/fuser.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/tables/op_table.hpp"
#include "kiln/tables/reduce_table.hpp"

namespace kiln::cuda::detail {

// ------------------------------------------------------------------ types and conversions
/// C type a dtype is stored as in device memory.
inline const char* storage_type(DType d) {
    switch (d) {
        case DType::boolean: return "unsigned char";
        case DType::i32: return "int";
        case DType::i64: return "long long";
        case DType::f16: case DType::bf16: return "unsigned short";
        case DType::f32: return "float";
        case DType::f64: return "double";
    }
    return "float";
}
/// The unsigned C type of a raw element of this size (kernels that move elements without reading them).
inline const char* raw_word(std::size_t element_size) {
    return element_size == 1 ? "unsigned char" : element_size == 2 ? "unsigned short" : element_size == 4 ? "unsigned int" : "unsigned long long";
}
/// C type a value of dtype d is held in while computing (f16/bf16 as float, bool as bool).
inline const char* value_type(DType d) {
    switch (d) {
        case DType::boolean: return "bool";
        case DType::i32: return "int";
        case DType::i64: return "long long";
        case DType::f64: return "double";
        default: return "float";
    }
}
/// C type an op with compute type ct runs in (bool computes as float, like the CPU backend).
inline const char* compute_type(DType ct) { return ct == DType::boolean ? "float" : value_type(ct); }

/// A stored element (expression `raw` of storage_type(d)) as its value type.
inline std::string load_conv(DType d, const std::string& raw) {
    switch (d) {
        case DType::f16: return "kiln_h2f(" + raw + ")";
        case DType::bf16: return "kiln_bf2f(" + raw + ")";
        case DType::boolean: return "(" + raw + " != 0)";
        default: return raw;
    }
}
/// A value `v` as the storage type of d.
inline std::string store_conv(DType d, const std::string& v) {
    switch (d) {
        case DType::f16: return "kiln_f2h((float)(" + v + "))";
        case DType::bf16: return "kiln_f2bf((float)(" + v + "))";
        case DType::boolean: return "(unsigned char)((" + v + ") != 0)";
        default: return "(" + std::string(storage_type(d)) + ")(" + v + ")";
    }
}

/// A number as an exact C literal of compute type ct.
inline std::string literal(double v, DType ct) {
    const std::string t = compute_type(ct);
    char buf[64];
    if (!is_floating(ct) && ct != DType::boolean) {
        std::snprintf(buf, sizeof buf, "%lldll", static_cast<long long>(v));
        return "((" + t + ")" + buf + ")";
    }
    if (std::isnan(v)) return "((" + t + ")__longlong_as_double(0x7ff8000000000000ll))";
    if (std::isinf(v)) return v > 0 ? "((" + t + ")__longlong_as_double(0x7ff0000000000000ll))"
                                     : "((" + t + ")__longlong_as_double(0xfff0000000000000ll))";
    std::snprintf(buf, sizeof buf, "%a", v);  // hex float: exact
    return "((" + t + ")" + buf + ")";
}

/// The op table's CUDA text for op with its operand expressions substituted ({0}, {1}, {2});
/// for casts, {1} is the target: a type, or a rounding function for f16/bf16/bool.
inline std::string op_text(ops::OpId op, const std::vector<std::string>& args, DType attr) {
    const std::string_view pat = ops::visit_op(op, [](auto t) { return decltype(t)::type::cuda; });
    const bool cast = op == ops::op_id<ops::Cast>;
    std::string out;
    for (std::size_t i = 0; i < pat.size(); ++i) {
        if (pat[i] == '{' && i + 2 < pat.size() && pat[i + 2] == '}') {
            const std::size_t k = static_cast<std::size_t>(pat[i + 1] - '0');
            if (cast && k == 1) {
                out += attr == DType::f16 ? "kiln_f16r" : attr == DType::bf16 ? "kiln_bf16r"
                       : attr == DType::boolean ? "kiln_tobool" : value_type(attr);
            } else {
                out += args.at(k);
            }
            i += 2;
        } else {
            out += pat[i];
        }
    }
    return out;
}

/// The reduction table's combine for a reduction kind (what it accumulates), as a C expression of a and b.
inline std::string combine_text(ir::ReduceKind k, const std::string& a, const std::string& b) {
    const std::string_view pat =
        ir::visit_reduction(k, [](auto t) { return std::string_view(decltype(t)::type::Accumulate::cuda_combine); });
    std::string out;
    for (std::size_t i = 0; i < pat.size(); ++i) {
        if (pat[i] == '{' && i + 2 < pat.size() && pat[i + 2] == '}') {
            out += pat[i + 1] == '0' ? a : b;
            i += 2;
        } else {
            out += pat[i];
        }
    }
    return out;
}
/// The identity of a reduction kind in accumulator type ct, as a literal: the table's identity<T>()
/// (bool accumulators take the double one).
inline std::string identity_text(ir::ReduceKind k, DType ct) {
    return ir::visit_reduction(k, [&](auto t) {
        using A = typename decltype(t)::type::Accumulate;
        if (ct == DType::boolean) return literal(A::template identity<double>(), ct);
        return visit_compute_dtype(ct, [&](auto dtag) -> std::string {
            using T = typename decltype(dtag)::type;
            const T v = A::template identity<T>();
            if constexpr (std::is_same_v<T, std::int32_t>)
                return v == std::numeric_limits<std::int32_t>::min() ? "((int)(-2147483647 - 1))" : "((int)" + std::to_string(v) + ")";
            else if constexpr (std::is_same_v<T, std::int64_t>)
                return v == std::numeric_limits<std::int64_t>::min() ? "((long long)(-9223372036854775807ll - 1))"
                                                                     : "((long long)" + std::to_string(v) + "ll)";
            else return literal(static_cast<double>(v), ct);
        });
    });
}

/// Helpers every generated kernel starts with: conversions, NaN-propagating max/min, the table's
/// named functions that CUDA lacks, vector access and block reductions (the table's own helpers,
/// ops::Op::cuda_helper, follow: prelude()).
inline const char* base_prelude() {
    return R"KILN(
typedef unsigned short kiln_u16;
__device__ __forceinline__ float kiln_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short kiln_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float kiln_bf2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short kiln_f2bf(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float kiln_f16r(float x) { return kiln_h2f(kiln_f2h(x)); }
__device__ __forceinline__ float kiln_bf16r(float x) { return kiln_bf2f(kiln_f2bf(x)); }
template <class T> __device__ __forceinline__ bool kiln_tobool(T x) { return x != T(0); }
template <class T> __device__ __forceinline__ T kiln_max(T a, T b) { return (a != a) ? a : (b != b) ? b : (a > b ? a : b); }
template <class T> __device__ __forceinline__ T kiln_min(T a, T b) { return (a != a) ? a : (b != b) ? b : (a < b ? a : b); }
template <class T> __device__ __forceinline__ T relu(T x) { return x < T(0) ? T(0) : x; }  // NaN and -0 pass, as on the CPU
template <class T> __device__ __forceinline__ T sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
__device__ __forceinline__ int floor(int x) { return x; }
__device__ __forceinline__ long long floor(long long x) { return x; }
__device__ __forceinline__ int ceil(int x) { return x; }
__device__ __forceinline__ long long ceil(long long x) { return x; }
__device__ __forceinline__ int rint(int x) { return x; }
__device__ __forceinline__ long long rint(long long x) { return x; }
template <class T> __device__ __forceinline__ T kiln_ipow(T a, T e) {
  if (e < 0) return a == 1 ? T(1) : a == -1 ? ((e & 1) ? T(-1) : T(1)) : T(0);
  unsigned long long r = 1, b = (unsigned long long)a;
  for (; e != 0; e >>= 1) { if (e & 1) r *= b; b *= b; }
  return (T)r;
}
__device__ __forceinline__ int pow(int a, int e) { return kiln_ipow(a, e); }
__device__ __forceinline__ long long pow(long long a, long long e) { return kiln_ipow(a, e); }
// remainder (sign of the divisor), fmod (sign of the dividend), floor_divide (floor of the true
// quotient), as on the CPU (simd.hpp): integer division by 0 gives 0, by -1 never divides (INT_MIN / -1 traps).
template <class T> __device__ __forceinline__ T kiln_ifmod(T a, T b) { return (b == 0 || b == -1) ? T(0) : T(a % b); }
template <class T> __device__ __forceinline__ T kiln_ifloor_divide(T a, T b) {
  if (b == 0) return T(0);
  if (b == -1) return (T)(0ull - (unsigned long long)a);
  const T q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? T(q - 1) : q;
}
__device__ __forceinline__ int kiln_fmod(int a, int b) { return kiln_ifmod(a, b); }
__device__ __forceinline__ long long kiln_fmod(long long a, long long b) { return kiln_ifmod(a, b); }
__device__ __forceinline__ float kiln_fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double kiln_fmod(double a, double b) { return fmod(a, b); }
template <class T> __device__ __forceinline__ T kiln_remainder(T a, T b) {
  const T m = kiln_fmod(a, b);
  return (m != T(0) && ((b < T(0)) != (m < T(0)))) ? T(m + b) : m;
}
template <class T> __device__ __forceinline__ T kiln_ffloor_divide(T a, T b) {  // torch's div_floor_floating
  if (b == T(0)) return a / b;
  const T mod = kiln_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
  if (div == T(0)) return copysign(T(0), a / b);
  T fl = floor(div);
  if (div - fl > T(0.5)) fl += T(1);
  return fl;
}
__device__ __forceinline__ int kiln_floor_divide(int a, int b) { return kiln_ifloor_divide(a, b); }
__device__ __forceinline__ long long kiln_floor_divide(long long a, long long b) { return kiln_ifloor_divide(a, b); }
__device__ __forceinline__ float kiln_floor_divide(float a, float b) { return kiln_ffloor_divide(a, b); }
__device__ __forceinline__ double kiln_floor_divide(double a, double b) { return kiln_ffloor_divide(a, b); }
template <class T, int N> struct __align__(sizeof(T) * N) kiln_vec { T v[N]; };
template <class T, class F> __device__ __forceinline__ T kiln_block_reduce(T v, F f, T* smem, T ident) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) smem[w] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : ident;
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Reduces over each aligned group of G lanes (every lane of the warp must call it).
template <int G, class T, class F> __device__ __forceinline__ T kiln_group_reduce(T v, F f) {
  #pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
)KILN";
}

/// base_prelude() and every op's cuda_helper, in table order (built once).
inline const std::string& prelude() {
    static const std::string text = [] {
        std::string t = base_prelude();
        ops::for_each_op([&](auto tag) { t += decltype(tag)::type::cuda_helper; });
        return t;
    }();
    return text;
}

// ------------------------------------------------------------------ operand layouts
/// How a kernel reaches an operand's elements from the iteration index.
enum class Access : std::uint8_t {
    contig,   ///< element i at p[i] (same layout as the iteration space)
    scalar,   ///< one element for every index
    inner,    ///< innermost dim unit-stride: a vector of consecutive elements at one offset
    strided,  ///< offsets from coordinates and strides
};
inline char access_code(Access a) { return "csit"[static_cast<int>(a)]; }

/// An operand collapsed with the iteration space: its strides (elements) per collapsed dim.
struct Operand {
    DType dtype = DType::f32;
    std::uintptr_t address = 0;
    std::vector<std::int64_t> strides;
    Access access = Access::strided;
};

/// Collapses an iteration shape and its operands' strides: drops size-1 dims and merges dims that
/// every operand walks contiguously. Returns the collapsed sizes.
inline std::vector<std::int64_t> collapse_dims(const Shape& shape, std::vector<std::vector<std::int64_t>*> strides) {
    std::vector<std::int64_t> sz;
    std::vector<std::vector<std::int64_t>> st(strides.size());
    for (int d = 0; d < shape.rank(); ++d) {
        const std::int64_t n = shape[d];
        if (n == 1) continue;
        bool merge = !sz.empty();
        for (std::size_t a = 0; merge && a < strides.size(); ++a) merge = st[a].back() == (*strides[a])[static_cast<std::size_t>(d)] * n;
        if (merge) {
            sz.back() *= n;
            for (std::size_t a = 0; a < strides.size(); ++a) st[a].back() = (*strides[a])[static_cast<std::size_t>(d)];
        } else {
            sz.push_back(n);
            for (std::size_t a = 0; a < strides.size(); ++a) st[a].push_back((*strides[a])[static_cast<std::size_t>(d)]);
        }
    }
    for (std::size_t a = 0; a < strides.size(); ++a) *strides[a] = std::move(st[a]);
    return sz;
}

/// Classifies an operand over collapsed sizes `sz`; `vec` is the vector width the kernel would use.
inline Access classify(const Operand& o, const std::vector<std::int64_t>& sz, int vec) {
    bool all_zero = true, contig = true;
    std::int64_t expect = 1;
    for (std::size_t d = sz.size(); d-- > 0;) {
        if (o.strides[d] != 0) all_zero = false;
        if (o.strides[d] != expect) contig = false;
        expect *= sz[d];
    }
    if (all_zero) return Access::scalar;
    const std::uintptr_t vbytes = static_cast<std::uintptr_t>(vec) * dtype_size(o.dtype);
    if (contig) return Access::contig;
    if (vec > 1 && !sz.empty() && o.strides.back() == 1 && sz.back() % vec == 0 && o.address % vbytes == 0) {
        bool ok = true;
        for (std::size_t d = 0; d + 1 < sz.size(); ++d) ok = ok && o.strides[d] % vec == 0;
        if (ok) return Access::inner;
    }
    return Access::strided;
}

// ------------------------------------------------------------------ expression emission
/// Emits the C statements computing the elementwise members of a group for one element, given
/// how each leaf's value is named. `vals[i]` receives the variable naming node i.
/// Variables are named by a node's place in the group (`nodes`), not its id in the graph, so
/// that groups computing the same thing (one optimizer update per parameter) give one kernel text,
/// compiled once.
struct ExprEmitter {
    const ir::Graph& g;
    std::vector<std::string>& vals;  ///< node -> C expression of its value (value type)
    const std::vector<int>& nodes;   ///< the group's nodes, in order

    /// The name-stem number of node i: its place in the group.
    std::string local(int i) const {
        return std::to_string(std::find(nodes.begin(), nodes.end(), i) - nodes.begin());
    }

    /// Operand j of a node computing in ct, converted to ct.
    std::string operand(int j, DType ct) const {
        const ir::Node& n = g[j];
        if (n.kind == ir::Kind::scalar) return literal(n.value, ct);
        return "((" + std::string(compute_type(ct)) + ")(" + vals[static_cast<std::size_t>(j)] + "))";
    }
    /// `const VT v<i> = ...;` for elementwise node i; returns the statement.
    std::string node(int i, const std::string& suffix = "") const {
        const ir::Node& n = g[i];
        std::vector<std::string> args;
        for (int j : n.in) args.push_back(operand(j, n.ct));
        const std::string var = "v" + local(i) + suffix;
        vals[static_cast<std::size_t>(i)] = var;
        return "const " + std::string(value_type(n.dtype)) + " " + var + " = (" + value_type(n.dtype) + ")(" +
               op_text(n.op, args, n.attr) + ");\n";
    }
};

/// A generated kernel: its name (from the hash of its text) and source.
struct KernelText {
    std::string name;
    std::string source;
};

inline std::uint64_t text_hash(const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}
inline KernelText finish_kernel(const std::string& family, const std::string& body_with_NAME) {
    const std::uint64_t h = text_hash(body_with_NAME);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    const std::string name = "kiln_" + family + "_" + hex;
    std::string src = body_with_NAME;
    for (std::size_t p; (p = src.find("@NAME@")) != std::string::npos;) src.replace(p, 6, name);
    return {name, prelude() + src};
}

// ------------------------------------------------------------------ elementwise family
/// The shape of one elementwise launch: collapsed sizes, operand layouts, vector width, index type.
struct EwSignature {
    int rank = 0;                  ///< collapsed rank
    std::vector<Access> leaves;    ///< per leaf, in group leaf order
    std::vector<DType> leaf_dtypes;
    int vec = 1;
    int unroll = 1;  ///< vectors per thread per grid-stride step
    bool idx64 = false;
    bool out_strided = false;  ///< the output is a strided view (a write into a slice): element stores through its strides
    /// The multi-tensor form (a combo launch): one launch runs this kernel over several groups'
    /// operands, each a segment of the grid (combo_args; rank <= 1, contiguous or scalar leaves only)
    bool multi = false;
    /// Whether this launch may run as a segment of a combo launch.
    bool combinable() const {
        bool ok = rank <= 1 && !out_strided;
        for (Access a : leaves) ok = ok && (a == Access::contig || a == Access::scalar);
        return ok;
    }
    std::string key() const {
        std::string k = std::to_string(rank) + (idx64 ? "L" : "i") + std::to_string(vec) + "u" + std::to_string(unroll) +
                        (out_strided ? "s" : "") + (multi ? "m" : "") + ":";
        for (std::size_t i = 0; i < leaves.size(); ++i) k += access_code(leaves[i]) + std::to_string(static_cast<int>(leaf_dtypes[i]));
        return k;
    }
};

/// The parameter block of a combo launch (EwSignature::multi), in 8-byte slots: the segment count
/// S, each segment's first block (S slots, ascending: a block finds its segment by binary search),
/// then per segment its n and its pointers (leaves, then outputs). One kernel parameter of
/// combo_slots slots, read in place (__grid_constant__).
inline constexpr int combo_slots = 511;
/// Slots one segment of a combo launch takes for a kernel with `pointers` pointer parameters.
inline int combo_segment_slots(int pointers) { return pointers + 2; }

/// Lines declaring `c<d>` (with prefix `coord`), the coordinates of index `var` over the sizes
/// `size`<0..rank-1> (row-major), consuming `var`. The index is below the sizes' product, so what is
/// left at the outermost dim is already below its size: no remainder there, one division fewer.
inline std::string coordinate_lines(const std::string& indent, const std::string& var, const std::string& size, const std::string& coord,
                                    int rank) {
    std::string c;
    for (int d = rank - 1; d >= 0; --d) {
        const std::string zd = "(idx_t)" + size + std::to_string(d);
        c += indent + "const idx_t " + coord + std::to_string(d) + " = " + (d > 0 ? var + " % " + zd + "; " + var + " /= " + zd + ";" : var + ";");
        c += "\n";
    }
    return c;
}

/// Kernel parameters, in order: leaf pointers, the outputs' pointers, n, sizes[rank], then per strided or
/// inner leaf its strides[rank], then (out_strided) the output's strides[rank]. Every parameter is 8 bytes. Each thread handles UNROLL vectors of
/// VEC elements per grid-stride step, issuing all their loads before computing. The multi form
/// (sig.multi) takes the same per segment from one combo parameter block; each segment's blocks
/// run the same loop over its operands as a launch of its own would.
inline KernelText elementwise_kernel(const ir::Graph& g, const fuse::Group& G, const EwSignature& sig) {
    const std::size_t no = G.outputs.size(), nl = G.leaves.size();
    auto out_name = [&](std::size_t m) { return no == 1 ? std::string("out") : "out" + std::to_string(m); };
    auto out_dtype = [&](std::size_t m) { return g[G.outputs[m]].dtype; };
    const int V = sig.vec, R = sig.rank, U = std::max(1, sig.unroll);
    const std::string Vs = std::to_string(V), Us = std::to_string(U);
    const std::string idx = sig.idx64 ? "long long" : "int";
    std::string s, bid = "blockIdx.x", nblk = "gridDim.x";
    if (!sig.multi) {
        s = "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(";
        for (std::size_t k = 0; k < nl; ++k)
            s += "const " + std::string(storage_type(sig.leaf_dtypes[k])) + "* __restrict__ a" + std::to_string(k) + ", ";
        for (std::size_t m = 0; m < no; ++m) s += std::string(storage_type(out_dtype(m))) + "* __restrict__ " + out_name(m) + ", ";
        s += "long long n";
        for (int d = 0; d < R; ++d) s += ", long long z" + std::to_string(d);
        for (std::size_t k = 0; k < nl; ++k)
            if (sig.leaves[k] == Access::strided || sig.leaves[k] == Access::inner)
                for (int d = 0; d < R; ++d) s += ", long long s" + std::to_string(k) + "_" + std::to_string(d);
        if (sig.out_strided)
            for (int d = 0; d < R; ++d) s += ", long long os" + std::to_string(d);
        s += ") {\n";
    } else {
        const std::string W = std::to_string(combo_segment_slots(static_cast<int>(nl + no)) - 1);
        s = "struct kiln_combo_args { unsigned long long s[" + std::to_string(combo_slots) + "]; };\n";
        s += "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(const __grid_constant__ kiln_combo_args p_) {\n";
        s += "  const int nseg_ = (int)p_.s[0];\n  int seg_ = 0;\n";
        s += "  for (int hi_ = nseg_ - 1; seg_ < hi_;) {\n";
        s += "    const int mid_ = (seg_ + hi_ + 1) >> 1;\n";
        s += "    if (blockIdx.x >= (unsigned)p_.s[1 + mid_]) seg_ = mid_; else hi_ = mid_ - 1;\n  }\n";
        s += "  const unsigned first_ = (unsigned)p_.s[1 + seg_];\n";
        s += "  const unsigned nblk_ = (seg_ + 1 < nseg_ ? (unsigned)p_.s[2 + seg_] : gridDim.x) - first_;\n";
        s += "  const unsigned long long* q_ = p_.s + 1 + nseg_ + seg_ * " + W + ";\n";
        s += "  const long long n = (long long)q_[0];\n";  // (rank <= 1, no strides: the sizes are n alone)
        for (std::size_t k = 0; k < nl; ++k) {
            const std::string t = storage_type(sig.leaf_dtypes[k]);
            s += "  const " + t + "* __restrict__ a" + std::to_string(k) + " = (const " + t + "*)q_[" + std::to_string(1 + k) + "];\n";
        }
        for (std::size_t m = 0; m < no; ++m) {
            const std::string t = storage_type(out_dtype(m));
            s += "  " + t + "* __restrict__ " + out_name(m) + " = (" + t + "*)q_[" + std::to_string(1 + nl + m) + "];\n";
        }
        bid = "(blockIdx.x - first_)";
        nblk = "nblk_";
    }
    s += "  typedef " + idx + " idx_t;\n";
    std::vector<std::string> vals(static_cast<std::size_t>(g.size()));
    for (std::size_t k = 0; k < G.leaves.size(); ++k)
        if (sig.leaves[k] == Access::scalar)
            s += "  const " + std::string(value_type(sig.leaf_dtypes[k])) + " x" + std::to_string(k) + " = " +
                 load_conv(sig.leaf_dtypes[k], "a" + std::to_string(k) + "[0]") + ";\n";
    s += "  const idx_t nvec = (idx_t)(n / " + Vs + ");\n";
    s += "  const idx_t step = (idx_t)" + nblk + " * blockDim.x;\n";
    s += "  for (idx_t t0 = (idx_t)" + bid + " * blockDim.x + threadIdx.x; t0 < nvec; t0 += step * " + Us + ") {\n";
    auto coords = [&](const std::string& at, const std::string& pre) {  // (at < n, the sizes' product)
        return "      { idx_t r_ = " + at + ";\n" + coordinate_lines("        ", "r_", "z", pre, R);
    };
    auto offset = [&](std::size_t k, const std::string& pre) {
        std::string o = "(idx_t)0";
        for (int d = 0; d < R; ++d) o += " + " + pre + std::to_string(d) + " * (idx_t)s" + std::to_string(k) + "_" + std::to_string(d);
        return o;
    };
    auto vec_t = [&](DType d) { return "kiln_vec<" + std::string(storage_type(d)) + ", " + Vs + ">"; };
    // 1. every vector load of the step first (contiguous and inner-broadcast leaves)
    bool any_vec_load = false;
    for (std::size_t k = 0; k < G.leaves.size(); ++k)
        if (sig.leaves[k] == Access::contig || sig.leaves[k] == Access::inner) {
            s += "    " + vec_t(sig.leaf_dtypes[k]) + " r" + std::to_string(k) + "[" + Us + "];\n";
            any_vec_load = true;
        }
    if (any_vec_load) {
        s += "    #pragma unroll\n    for (int u = 0; u < " + Us + "; ++u) {\n";
        s += "      const idx_t t = t0 + u * step;\n      if (t < nvec) {\n        const idx_t i = t * " + Vs + ";\n";
        bool need_base = false;
        for (auto a : sig.leaves) need_base = need_base || a == Access::inner;
        if (need_base) s += coords("i", "c");
        for (std::size_t k = 0; k < G.leaves.size(); ++k) {
            const std::string ks = std::to_string(k);
            if (sig.leaves[k] == Access::contig)
                s += "        r" + ks + "[u] = *(const " + vec_t(sig.leaf_dtypes[k]) + "*)(a" + ks + " + i);\n";
            else if (sig.leaves[k] == Access::inner)
                s += "        r" + ks + "[u] = *(const " + vec_t(sig.leaf_dtypes[k]) + "*)(a" + ks + " + " + offset(k, "c") + ");\n";
        }
        if (need_base) s += "      }\n";
        s += "      }\n    }\n";
    }
    // 2. compute and store
    s += "    #pragma unroll\n    for (int u = 0; u < " + Us + "; ++u) {\n";
    s += "      const idx_t t = t0 + u * step;\n      if (t >= nvec) break;\n      const idx_t i = t * " + Vs + ";\n";
    if (!sig.out_strided)
        for (std::size_t m = 0; m < no; ++m) s += "      " + vec_t(out_dtype(m)) + " o" + std::to_string(m) + "_;\n";
    s += "      #pragma unroll\n      for (int e = 0; e < " + Vs + "; ++e) {\n";
    bool any_strided = sig.out_strided;
    for (auto a : sig.leaves) any_strided = any_strided || a == Access::strided;
    if (any_strided) s += coords("i + e", "c");
    for (std::size_t k = 0; k < G.leaves.size(); ++k) {
        const std::string ks = std::to_string(k);
        const DType dt = sig.leaf_dtypes[k];
        std::string raw;
        switch (sig.leaves[k]) {
            case Access::scalar: break;
            case Access::contig: case Access::inner: raw = "r" + ks + "[u].v[e]"; break;
            case Access::strided: raw = "a" + ks + "[" + offset(k, "c") + "]"; break;
        }
        if (!raw.empty()) s += "        const " + std::string(value_type(dt)) + " x" + ks + " = " + load_conv(dt, raw) + ";\n";
        vals[static_cast<std::size_t>(G.leaves[k])] = "x" + ks;
    }
    ExprEmitter em{g, vals, G.nodes};
    for (int i : G.nodes)
        if (g[i].kind == ir::Kind::elementwise) s += "        " + em.node(i);
    for (std::size_t m = 0; m < no; ++m) {
        const std::string v = store_conv(out_dtype(m), vals[static_cast<std::size_t>(G.outputs[m])]);
        if (sig.out_strided) {  // (one output)
            std::string o = "(idx_t)0";
            for (int d = 0; d < R; ++d) o += " + c" + std::to_string(d) + " * (idx_t)os" + std::to_string(d);
            s += "        " + out_name(m) + "[" + o + "] = " + v + ";\n";
        } else {
            s += "        o" + std::to_string(m) + "_.v[e] = " + v + ";\n";
        }
    }
    if (any_strided) s += "      }\n";
    s += "      }\n";
    if (!sig.out_strided)
        for (std::size_t m = 0; m < no; ++m)
            s += "      *(" + vec_t(out_dtype(m)) + "*)(" + out_name(m) + " + i) = o" + std::to_string(m) + "_;\n";
    s += "    }\n  }\n}\n";
    return finish_kernel("ew", s);
}

// ------------------------------------------------------------------ row family
/// One row launch: rows x L elements per row (the reduced axes collapsed last); per operand
/// (leaves, then outputs) its access over the outer (row) dims and the inner (row element) dims.
struct RowSignature {
    int outer_rank = 0, inner_rank = 0;
    std::vector<Access> inner_access;   ///< per operand: contig (unit stride row), scalar (per row), inner/strided
    std::vector<char> outer_zero;       ///< per operand: same for every row (a weight)
    std::vector<DType> dtypes;          ///< per operand
    int threads = 256, items = 4, vec = 1;
    /// 0: one block of `threads` per row; else `lanes` (1, 2, ..., 32) threads per row and
    /// threads / lanes rows per block, reduced by warp shuffles alone (short rows)
    int lanes = 0;
    bool exact = false;  ///< the row length is exactly (lanes or threads) x items x vec (no bounds checks)
    bool idx64 = false;
    std::string key() const {
        std::string k = std::to_string(outer_rank) + "." + std::to_string(inner_rank) + (idx64 ? "L" : "i") + (exact ? "x" : "") +
                        std::to_string(threads) + "x" + std::to_string(items) + "x" + std::to_string(vec) + "g" + std::to_string(lanes) + ":";
        for (std::size_t i = 0; i < inner_access.size(); ++i)
            k += access_code(inner_access[i]) + std::to_string(static_cast<int>(dtypes[i])) + (outer_zero[i] ? "z" : "");
        return k;
    }
};

/// Row launches' size and stride parameters: outer and inner sizes, then per operand its outer
/// strides and (for strided inner access) its inner strides.
inline std::string row_params(const std::vector<Access>& inner_access, int Ro, int Ri) {
    std::string s;
    for (int d = 0; d < Ro; ++d) s += ", long long zo" + std::to_string(d);
    for (int d = 0; d < Ri; ++d) s += ", long long zi" + std::to_string(d);
    for (std::size_t k = 0; k < inner_access.size(); ++k) {
        for (int d = 0; d < Ro; ++d) s += ", long long so" + std::to_string(k) + "_" + std::to_string(d);
        if (inner_access[k] == Access::strided || inner_access[k] == Access::inner)
            for (int d = 0; d < Ri; ++d) s += ", long long si" + std::to_string(k) + "_" + std::to_string(d);
    }
    return s;
}
/// `b_[k]`: where row r starts in operand k, from r's outer coordinates.
inline std::string row_bases(std::size_t nops, int Ro) {
    std::string s = "    idx_t b_[" + std::to_string(std::max<std::size_t>(nops, 1)) + "];\n    { idx_t q_ = r;\n";
    s += coordinate_lines("      ", "q_", "zo", "c", Ro);  // (r < rows, the outer sizes' product)
    for (std::size_t k = 0; k < nops; ++k) {
        std::string o = "(idx_t)0";
        for (int d = 0; d < Ro; ++d) o += " + c" + std::to_string(d) + " * (idx_t)so" + std::to_string(k) + "_" + std::to_string(d);
        s += "      b_[" + std::to_string(k) + "] = " + o + ";\n";
    }
    return s + "    }\n";
}
/// Offset of operand k at row element `col` through its inner sizes and strides.
inline std::string inner_offset(std::size_t k, const std::string& col, int Ri) {
    std::string o = "([&]() { idx_t q_ = " + col + "; idx_t o_ = b_[" + std::to_string(k) + "];";
    for (int d = Ri - 1; d >= 0; --d) {
        // what is left of col at the outermost dim is below its size: no remainder to take
        const std::string q = d > 0 ? "(q_ % (idx_t)zi" + std::to_string(d) + ")" : "q_";
        o += " o_ += " + q + " * (idx_t)si" + std::to_string(k) + "_" + std::to_string(d) + ";";
        if (d > 0) o += " q_ /= (idx_t)zi" + std::to_string(d) + ";";
    }
    return o + " return o_; }())";
}

/// Whether a node of a row group takes a value per row element (otherwise one per row).
inline bool row_varies(const ir::Graph& g, int i, const Shape& space, unsigned mask) {
    const ir::Node& n = g[i];
    if (n.kind == ir::Kind::reduce) return false;
    const Shape& s = n.shape;
    for (int d = 0; d < space.rank(); ++d) {
        const int k = d - (space.rank() - s.rank());
        if ((mask & (1u << d)) && k >= 0 && s[k] != 1) return true;
    }
    return false;
}

/// The row kernel: one block per row (grid-stride), THREADS threads, each holding ITEMS vectors
/// of VEC elements of every row-varying value in registers, so each leaf is read once per row.
/// For short rows (sig.lanes > 0), LANES threads per row and THREADS / LANES rows per block,
/// reduced by shuffles within the lanes of a row; the rows loop is uniform over the block (a lane
/// past the last row recomputes the last row and stores nothing), so every shuffle is full-warp.
/// Operands (G.leaves then the stored outputs) come as pointers; then rows, L, outer sizes, inner
/// sizes, and per operand its outer strides and (unless contig/scalar) inner strides.
inline KernelText row_kernel(const ir::Graph& g, const fuse::Group& G, const std::vector<int>& stored,
                             const RowSignature& sig) {
    const std::size_t nl = G.leaves.size(), no = stored.size();
    const int T = sig.threads, I = sig.items, V = sig.vec, Ro = sig.outer_rank, Ri = sig.inner_rank;
    const std::string idx = sig.idx64 ? "long long" : "int";
    auto op_name = [&](std::size_t k) { return k < nl ? "a" + std::to_string(k) : "o" + std::to_string(k - nl); };
    std::string s = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(T) + ") @NAME@(";
    for (std::size_t k = 0; k < nl + no; ++k)
        s += std::string(k < nl ? "const " : "") + storage_type(sig.dtypes[k]) + "* __restrict__ " + op_name(k) + ", ";
    s += "long long rows, long long L" + row_params(sig.inner_access, Ro, Ri);
    s += ") {\n  typedef " + idx + " idx_t;\n";
    const int GL = sig.lanes, TR = GL > 0 ? GL : T;  // threads per row
    if (GL == 0) {
        s += "  __shared__ double smem_[32];\n  const int tid = threadIdx.x;\n";
        s += "  for (idx_t r = blockIdx.x; r < (idx_t)rows; r += gridDim.x) {\n";
    } else {
        const std::string rpb = std::to_string(T / GL), gs = std::to_string(GL);
        s += "  const int tid = threadIdx.x % " + gs + ";\n";
        s += "  for (idx_t r0_ = (idx_t)blockIdx.x * " + rpb + "; r0_ < (idx_t)rows; r0_ += (idx_t)gridDim.x * " + rpb + ") {\n";
        s += "    const idx_t rr_ = r0_ + (idx_t)(threadIdx.x / " + gs + ");\n";
        s += "    const bool live_ = rr_ < (idx_t)rows;\n    const idx_t r = live_ ? rr_ : (idx_t)rows - 1;\n";
    }
    s += row_bases(nl + no, Ro);
    // element offset of operand k at row element `col`
    auto elem_offset = [&](std::size_t k, const std::string& col) -> std::string {
        const std::string b = "b_[" + std::to_string(k) + "]";
        switch (sig.inner_access[k]) {
            case Access::scalar: return b;
            case Access::contig: return b + " + " + col;
            default: return inner_offset(k, col, Ri);
        }
    };
    const int per = I * V;
    // rows of exactly THREADS x ITEMS x VEC need no bounds checks; otherwise one per vector (L is
    // a multiple of VEC when VEC > 1)
    const std::string guard = sig.exact ? "true" : "col0 < (idx_t)L";
    const std::string loop_open = "    #pragma unroll\n    for (int j = 0; j < " + std::to_string(I) + "; ++j) {\n"
                                  "      const idx_t col0 = ((idx_t)j * " + std::to_string(TR) + " + tid) * " + std::to_string(V) + ";\n"
                                  "      if (" + guard + ") {\n"
                                  "      #pragma unroll\n      for (int e = 0; e < " + std::to_string(V) + "; ++e) {\n"
                                  "        const idx_t col = col0 + e; const int q = j * " + std::to_string(V) + " + e;\n"
                                  "        {\n";
    const std::string loop_close = "        }\n      }\n      }\n    }\n";
    std::vector<std::string> vals(static_cast<std::size_t>(g.size()));
    std::vector<char> varies(static_cast<std::size_t>(g.size()), 0);
    // leaves: per-row ones as scalars, row-varying ones into registers
    for (std::size_t k = 0; k < nl; ++k) {
        const int leaf = G.leaves[k];
        const DType dt = sig.dtypes[k];
        const std::string ks = std::to_string(k), vt = value_type(dt), st = storage_type(dt);
        if (sig.inner_access[k] == Access::scalar) {
            s += "    const " + vt + " x" + ks + " = " + load_conv(dt, "a" + ks + "[b_[" + ks + "]]") + ";\n";
            vals[static_cast<std::size_t>(leaf)] = "x" + ks;
            continue;
        }
        varies[static_cast<std::size_t>(leaf)] = 1;
        s += "    " + vt + " x" + ks + "[" + std::to_string(per) + "];\n";
        if (V > 1 && (sig.inner_access[k] == Access::contig)) {
            s += "    #pragma unroll\n    for (int j = 0; j < " + std::to_string(I) + "; ++j) {\n";
            s += "      const idx_t col0 = ((idx_t)j * " + std::to_string(TR) + " + tid) * " + std::to_string(V) + ";\n";
            s += "      if (" + guard + ") { const kiln_vec<" + st + ", " + std::to_string(V) + "> w_ = *(const kiln_vec<" + st +
                 ", " + std::to_string(V) + ">*)(a" + ks + " + b_[" + ks + "] + col0);\n";
            s += "        #pragma unroll\n        for (int e = 0; e < " + std::to_string(V) + "; ++e) x" + ks + "[j * " +
                 std::to_string(V) + " + e] = " + load_conv(dt, "w_.v[e]") + "; }\n    }\n";
        } else {
            s += loop_open + "          x" + ks + "[q] = " + load_conv(dt, "a" + ks + "[" + elem_offset(k, "col") + "]") + ";\n" + loop_close;
        }
        vals[static_cast<std::size_t>(leaf)] = "x" + ks + "[q]";
    }
    ExprEmitter em{g, vals, G.nodes};
    int red = 0;
    for (int i : G.nodes) {
        const ir::Node& n = g[i];
        const std::string is = em.local(i);
        if (n.kind == ir::Kind::elementwise) {
            bool v = false;
            for (int j : n.in) v = v || varies[static_cast<std::size_t>(j)];
            varies[static_cast<std::size_t>(i)] = v;
            if (!v) {
                s += "    " + em.node(i);
                continue;
            }
            s += "    " + std::string(value_type(n.dtype)) + " v" + is + "[" + std::to_string(per) + "];\n";
            std::vector<std::string> args;
            for (int j : n.in) args.push_back(em.operand(j, n.ct));
            s += loop_open + "          v" + is + "[q] = (" + value_type(n.dtype) + ")(" + op_text(n.op, args, n.attr) + ");\n" + loop_close;
            vals[static_cast<std::size_t>(i)] = "v" + is + "[q]";
        } else {  // reduce over the row
            const DType acc = compute_dtype(n.dtype);
            const std::string at = compute_type(acc);
            const int x = n.in[0];
            const std::string rs = std::to_string(red++);
            s += "    " + at + " acc" + rs + " = " + identity_text(n.rkind, acc) + ";\n";
            const std::string xv = "((" + at + ")(" + vals[static_cast<std::size_t>(x)] + "))";
            if (varies[static_cast<std::size_t>(x)]) {
                s += loop_open + "          acc" + rs + " = " + combine_text(n.rkind, "acc" + rs, xv) + ";\n" + loop_close;
            } else {  // a per-row value reduced over L copies (sum: L * x)
                s += "    for (idx_t c_ = tid; c_ < (idx_t)L; c_ += " + std::to_string(TR) + ") acc" + rs + " = " +
                     combine_text(n.rkind, "acc" + rs, xv) + ";\n";
            }
            const std::string comb = "[](" + at + " a, " + at + " b) { return (" + at + ")(" + combine_text(n.rkind, "a", "b") + "); }";
            if (GL == 0)
                s += "    acc" + rs + " = kiln_block_reduce(acc" + rs + ", " + comb + ", (" + at + "*)smem_, " + identity_text(n.rkind, acc) + ");\n";
            else
                s += "    acc" + rs + " = kiln_group_reduce<" + std::to_string(GL) + ">(acc" + rs + ", " + comb + ");\n";
            std::string val = "acc" + rs;
            if (n.rkind == ir::ReduceKind::mean)
                val = "(" + val + " / (" + at + ")kiln_max(0.0, (double)L - " + literal(n.correction, DType::f64) + "))";
            s += "    const " + std::string(value_type(n.dtype)) + " v" + is + " = (" + value_type(n.dtype) + ")(" + val + ");\n";
            vals[static_cast<std::size_t>(i)] = "v" + is;
        }
    }
    // stores
    if (GL > 0) s += "    if (live_) {\n";
    for (std::size_t m = 0; m < no; ++m) {
        const std::size_t k = nl + m;
        const int o = stored[m];
        const DType dt = sig.dtypes[k];
        const std::string on = "o" + std::to_string(m);
        if (!varies[static_cast<std::size_t>(o)] && sig.inner_access[k] == Access::scalar) {
            s += "    if (tid == 0) " + on + "[b_[" + std::to_string(k) + "]] = " + store_conv(dt, vals[static_cast<std::size_t>(o)]) + ";\n";
        } else if (!varies[static_cast<std::size_t>(o)]) {  // one value per row (its leaves broadcast), stored over the whole row
            s += loop_open + "          " + on + "[" + elem_offset(k, "col") + "] = " + store_conv(dt, vals[static_cast<std::size_t>(o)]) +
                 ";\n" + loop_close;
        } else if (V > 1 && sig.inner_access[k] == Access::contig) {  // one vector store per V elements
            const std::string st = storage_type(dt), vt = "kiln_vec<" + st + ", " + std::to_string(V) + ">";
            s += "    #pragma unroll\n    for (int j = 0; j < " + std::to_string(I) + "; ++j) {\n";
            s += "      const idx_t col0 = ((idx_t)j * " + std::to_string(TR) + " + tid) * " + std::to_string(V) + ";\n";
            s += "      if (" + guard + ") { " + vt + " w_;\n";
            s += "        #pragma unroll\n        for (int e = 0; e < " + std::to_string(V) + "; ++e) { const int q = j * " +
                 std::to_string(V) + " + e; w_.v[e] = " + store_conv(dt, vals[static_cast<std::size_t>(o)]) + "; }\n";
            s += "        *(" + vt + "*)(" + on + " + b_[" + std::to_string(k) + "] + col0) = w_; }\n    }\n";
        } else {
            s += loop_open + "          " + on + "[" + elem_offset(k, "col") + "] = " + store_conv(dt, vals[static_cast<std::size_t>(o)]) +
                 ";\n" + loop_close;
        }
    }
    s += GL > 0 ? "    }\n" : "    __syncthreads();\n";
    s += "  }\n}\n";
    return finish_kernel("row", s);
}

// ------------------------------------------------------------------ reduce family
/// Positions of a column reduction's row each warp loads before it combines any (ReduceSignature::columns).
inline constexpr int kColumnUnroll = 16;

/// A reduction (or arg-reduction) with its elementwise prologue over rows of any length: blocks
/// of 256 threads, `chunks` blocks per row; each block reduces its part of the row; with more
/// than one chunk the block writes a partial (accumulator type) that a second launch combines, or
/// (`finish`) the last block of the row to arrive combines, in the same launch.
struct ReduceSignature {
    int outer_rank = 0, inner_rank = 0;
    std::vector<Access> inner_access;  ///< per leaf
    std::vector<DType> dtypes;         ///< per leaf
    bool idx64 = false;
    bool partial = false;  ///< writes accumulators (first pass of a split reduction)
    /// 0: a block of 256 threads per row (or per chunk); else `lanes` (1, 2, ..., 32) threads per
    /// row and 256 / lanes rows per block, reduced by warp shuffles alone (short rows; no chunks)
    int lanes = 0;
    /// Column layout (rows next to each other in memory, a row's elements far apart: a sum over
    /// (N, H, W) of channels-last values): the 32 lanes of a warp take 32 neighbouring rows and
    /// the 8 warps of a block split the block's chunk of the row, so each load is one coalesced
    /// line; the warps' sums meet in shared memory. Not for arg-reductions.
    bool columns = false;
    /// With `partial`: the blocks of a row (of a group of 32 rows in column layout) count
    /// themselves in sem_[row] (a zeroed counter) after storing their partials; the last one
    /// combines the row's partials in chunk order, stores the result into fin_ and sets the counter
    /// back to 0. Deterministic; one launch instead of two.
    bool finish = false;
    std::string key() const {
        std::string k = std::to_string(outer_rank) + "." + std::to_string(inner_rank) + (idx64 ? "L" : "i") + (partial ? (finish ? "P" : "p") : "f") +
                        "g" + std::to_string(lanes) + (columns ? "c" : "") + ":";
        for (std::size_t i = 0; i < inner_access.size(); ++i) k += access_code(inner_access[i]) + std::to_string(static_cast<int>(dtypes[i]));
        return k;
    }
};

/// Parameters: leaf pointers, an out pointer per output, rows, L, chunks, outer sizes, inner
/// sizes, per leaf outer strides and (unless contig/scalar) inner strides; with `finish` the
/// counters and a result pointer per output. For arg-reductions out is int64. A group of several
/// reductions (fuse::merge_reduce_groups: the same rows, one pass over the operands) keeps an
/// accumulator for each and stores each into its own output (partials: its own partial buffer).
inline KernelText reduce_kernel(const ir::Graph& g, const fuse::Group& G, const ReduceSignature& sig) {
    const ir::Node& rn = g[G.outputs[0]];
    const bool arg = rn.kind == ir::Kind::arg_reduce;
    const std::size_t nl = G.leaves.size(), K = G.outputs.size();
    if (arg && K != 1) throw InternalError("kiln: cuda codegen: an arg-reduction group has one output");
    const int Ro = sig.outer_rank, Ri = sig.inner_rank;
    const std::string idx = sig.idx64 ? "long long" : "int";
    // per output j: its node, accumulator type, and names (one output keeps the plain names)
    const auto node = [&](std::size_t j) -> const ir::Node& { return g[G.outputs[j]]; };
    const auto acc_t = [&](std::size_t j) {
        return arg ? compute_dtype(g[rn.in[0]].dtype) : compute_dtype(node(j).dtype);
    };
    const auto at = [&](std::size_t j) { return std::string(compute_type(acc_t(j))); };
    const auto name = [K](const char* stem, std::size_t j, const char* tail = "") {
        return std::string(stem) + (K == 1 ? "" : std::to_string(j)) + tail;
    };
    const auto acc = [&](std::size_t j) { return name("acc", j); };
    const auto out = [&](std::size_t j) { return name("out", j); };
    const auto fin_p = [&](std::size_t j) { return name("fin", j, "_"); };
    // what a finished row stores: its accumulator, divided by the count for a mean
    const auto final_value = [&](std::size_t j) {
        const ir::Node& n = node(j);
        return n.rkind == ir::ReduceKind::mean && !arg
                   ? "(" + acc(j) + " / (" + at(j) + ")kiln_max(0.0, (double)L - " + literal(n.correction, DType::f64) + "))"
                   : acc(j);
    };
    const auto combine = [&](std::size_t j, const std::string& a, const std::string& b) { return combine_text(node(j).rkind, a, b); };
    const auto identity = [&](std::size_t j) { return identity_text(node(j).rkind, acc_t(j)); };
    std::string s = "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(";
    for (std::size_t k = 0; k < nl; ++k) s += "const " + std::string(storage_type(sig.dtypes[k])) + "* __restrict__ a" + std::to_string(k) + ", ";
    for (std::size_t j = 0; j < K; ++j)
        s += (sig.partial ? at(j) : arg ? std::string("long long") : std::string(storage_type(node(j).dtype))) + "* __restrict__ " + out(j) + ", ";
    s += "long long rows, long long L, long long chunks" + row_params(sig.inner_access, Ro, Ri);
    const bool fin = sig.partial && sig.finish && !arg;
    if (fin) {
        s += ", unsigned* __restrict__ sem_";
        for (std::size_t j = 0; j < K; ++j) s += ", " + std::string(storage_type(node(j).dtype)) + "* __restrict__ " + fin_p(j);
    }
    s += ") {\n  typedef " + idx + " idx_t;\n";
    if (fin) s += "  __shared__ bool last_;\n";
    // the last block to arrive (after every block's partials are visible) combines them
    const auto arrive = [](const std::string& counter) {
        return "    __threadfence();\n    __syncthreads();\n    if (threadIdx.x == 0) last_ = atomicAdd(&sem_[" + counter +
               "], 1u) == (unsigned)(chunks - 1);\n    __syncthreads();\n";
    };
    const int GL = sig.lanes;
    const std::string gs = std::to_string(GL);
    // where chunk ch of row r keeps its partial in column layout: chunk-major when the last block
    // combines them (a warp's 32 rows in one line), row-major for combine_kernel's second launch
    const auto column_partial = [&sig](const std::string& ch) {
        return sig.finish ? ch + " * (idx_t)rows + r" : "r * (idx_t)chunks + " + ch;
    };
    // output j's slice of the warps' sums in shared memory (column layout)
    const auto slice = [&](std::size_t j) { return "((" + at(j) + "*)(csm_ + " + std::to_string(256 * j) + "))"; };
    if (sig.columns) {
        s += "  __shared__ double csm_[" + std::to_string(256 * K) + "];\n  const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;\n";
        s += "  const idx_t groups_ = ((idx_t)rows + 31) / 32;\n";
        s += "  for (idx_t blk = blockIdx.x; blk < groups_ * (idx_t)chunks; blk += gridDim.x) {\n";
        s += "    const idx_t rg_ = blk / (idx_t)chunks, ch = blk % (idx_t)chunks;\n";
        s += "    const idx_t rr_ = rg_ * 32 + lane_;\n    const bool live_ = rr_ < (idx_t)rows;\n    const idx_t r = live_ ? rr_ : (idx_t)rows - 1;\n";
        s += "    const idx_t per_ = ((idx_t)L + (idx_t)chunks - 1) / (idx_t)chunks;\n";
        s += "    const idx_t beg_ = ch * per_, end_ = beg_ + per_ < (idx_t)L ? beg_ + per_ : (idx_t)L;\n";
    } else if (GL == 0) {
        s += "  __shared__ double smem_[32];\n  __shared__ long long smi_[32];\n";
        s += "  for (idx_t blk = blockIdx.x; blk < (idx_t)(rows * chunks); blk += gridDim.x) {\n";
        s += "    const idx_t r = blk / (idx_t)chunks, ch = blk % (idx_t)chunks;\n";
        s += "    const idx_t per_ = ((idx_t)L + (idx_t)chunks - 1) / (idx_t)chunks;\n";
        s += "    const idx_t beg_ = ch * per_, end_ = beg_ + per_ < (idx_t)L ? beg_ + per_ : (idx_t)L;\n";
    } else {  // uniform rows loop: a lane past the last row recomputes the last row and stores nothing
        const std::string rpb = std::to_string(256 / GL);
        s += "  const int lane_ = threadIdx.x % " + gs + ";\n";
        s += "  for (idx_t r0_ = (idx_t)blockIdx.x * " + rpb + "; r0_ < (idx_t)rows; r0_ += (idx_t)gridDim.x * " + rpb + ") {\n";
        s += "    const idx_t rr_ = r0_ + (idx_t)(threadIdx.x / " + gs + ");\n";
        s += "    const bool live_ = rr_ < (idx_t)rows;\n    const idx_t r = live_ ? rr_ : (idx_t)rows - 1;\n";
        s += "    const idx_t beg_ = 0, end_ = (idx_t)L;\n";
    }
    s += row_bases(nl, Ro);
    for (std::size_t j = 0; j < K; ++j) s += "    " + at(j) + " " + acc(j) + " = " + (arg ? literal(0, acc_t(j)) : identity(j)) + ";\n";
    if (arg) s += "    long long at_ = -1;\n";
    std::vector<std::string> vals(static_cast<std::size_t>(g.size()));
    const auto offset = [&](std::size_t k) -> std::string {
        const std::string ks = std::to_string(k);
        switch (sig.inner_access[k]) {
            case Access::scalar: return "b_[" + ks + "]";
            case Access::contig: return "b_[" + ks + "] + col";
            default: return inner_offset(k, "col", Ri);
        }
    };
    if (sig.columns) {
        // kColumnUnroll positions per warp at a time, every load issued before any is used (the
        // loads in flight, not the arithmetic, bound a column sum); a row's values (broadcast
        // leaves) loaded once
        const std::string U = std::to_string(kColumnUnroll);
        for (std::size_t k = 0; k < nl; ++k)
            if (sig.inner_access[k] == Access::scalar)
                s += "    const " + std::string(value_type(sig.dtypes[k])) + " x" + std::to_string(k) + " = " +
                     load_conv(sig.dtypes[k], "a" + std::to_string(k) + "[" + offset(k) + "]") + ";\n";
        s += "    for (idx_t c0_ = beg_ + warp_; c0_ < end_; c0_ += 8 * " + U + ") {\n";
        for (std::size_t k = 0; k < nl; ++k)
            if (sig.inner_access[k] != Access::scalar) s += "      " + std::string(value_type(sig.dtypes[k])) + " x" + std::to_string(k) + "_[" + U + "];\n";
        s += "      #pragma unroll\n      for (int u_ = 0; u_ < " + U + "; ++u_) {\n        const idx_t col = c0_ + 8 * u_;\n        if (col < end_) {\n";
        for (std::size_t k = 0; k < nl; ++k)
            if (sig.inner_access[k] != Access::scalar)
                s += "          x" + std::to_string(k) + "_[u_] = " + load_conv(sig.dtypes[k], "a" + std::to_string(k) + "[" + offset(k) + "]") + ";\n";
        s += "        }\n      }\n";
        s += "      #pragma unroll\n      for (int u_ = 0; u_ < " + U + "; ++u_) {\n        if (c0_ + 8 * u_ >= end_) break;\n";
        for (std::size_t k = 0; k < nl; ++k) {
            const std::string ks = std::to_string(k);
            if (sig.inner_access[k] != Access::scalar) s += "        const " + std::string(value_type(sig.dtypes[k])) + " x" + ks + " = x" + ks + "_[u_];\n";
            vals[static_cast<std::size_t>(G.leaves[k])] = "x" + ks;
        }
    } else {
        if (GL == 0) s += "    for (idx_t col = beg_ + threadIdx.x; col < end_; col += blockDim.x) {\n";
        else s += "    for (idx_t col = beg_ + lane_; col < end_; col += " + gs + ") {\n";
        for (std::size_t k = 0; k < nl; ++k) {
            const DType dt = sig.dtypes[k];
            const std::string ks = std::to_string(k);
            s += "      const " + std::string(value_type(dt)) + " x" + ks + " = " + load_conv(dt, "a" + ks + "[" + offset(k) + "]") + ";\n";
            vals[static_cast<std::size_t>(G.leaves[k])] = "x" + ks;
        }
    }
    ExprEmitter em{g, vals, G.nodes};
    for (int i : G.nodes)
        if (g[i].kind == ir::Kind::elementwise) s += "      " + em.node(i);
    const auto xv = [&](std::size_t j) { return "((" + at(j) + ")(" + vals[static_cast<std::size_t>(node(j).in[0])] + "))"; };
    if (arg) {
        const std::string better = rn.arg_max ? "v_ > acc" : "v_ < acc";
        s += "      const " + at(0) + " v_ = " + xv(0) + ";\n";
        s += "      if (at_ < 0 || (acc == acc && (v_ != v_ || " + better + "))) { acc = v_; at_ = col; }\n";
    } else {
        for (std::size_t j = 0; j < K; ++j) s += "      " + acc(j) + " = " + combine(j, acc(j), xv(j)) + ";\n";
    }
    if (sig.columns) s += "      }\n";
    s += "    }\n";
    if (arg) {
        // (value, index) pairs: NaN wins, then the better value, then the lower index
        const std::string a0 = at(0), better = rn.arg_max ? "b > a" : "b < a";
        s += "    #pragma unroll\n    for (int o = " + std::to_string(GL == 0 ? 16 : GL / 2) + "; o > 0; o >>= 1) {\n";
        s += "      const " + a0 + " b = __shfl_xor_sync(0xffffffffu, acc, o); const long long bi = __shfl_xor_sync(0xffffffffu, at_, o);\n";
        s += "      const " + a0 + " a = acc;\n";
        s += "      const bool take = bi >= 0 && (at_ < 0 || (a == a && (b != b || " + better + ")) || ((a == b || (a != a && b != b)) && bi < at_));\n";
        s += "      if (take) { acc = b; at_ = bi; }\n    }\n";
        if (GL > 0) s += "    if (live_ && lane_ == 0) out[r] = at_;\n";
    }
    if (arg && GL == 0) {
        const std::string a0 = at(0), better = rn.arg_max ? "b > a" : "b < a";
        s += "    __syncthreads();\n    if ((threadIdx.x & 31) == 0) { ((" + a0 + "*)smem_)[threadIdx.x >> 5] = acc; smi_[threadIdx.x >> 5] = at_; }\n";
        s += "    __syncthreads();\n    if (threadIdx.x == 0) {\n";
        s += "      for (int w = 1; w < (int)((blockDim.x + 31) >> 5); ++w) {\n";
        s += "        const " + a0 + " b = ((" + a0 + "*)smem_)[w]; const long long bi = smi_[w]; const " + a0 + " a = acc;\n";
        s += "        const bool take = bi >= 0 && (at_ < 0 || (a == a && (b != b || " + better + ")) || ((a == b || (a != a && b != b)) && bi < at_));\n";
        s += "        if (take) { acc = b; at_ = bi; }\n      }\n";
        s += "      out[r] = at_;\n    }\n";
    } else if (!arg && sig.columns) {
        // the 8 warps' sums of each row meet in shared memory; warp 0 combines and stores them
        for (std::size_t j = 0; j < K; ++j) s += "    " + slice(j) + "[threadIdx.x] = " + acc(j) + ";\n";
        s += "    __syncthreads();\n    if (warp_ == 0) {\n";
        for (std::size_t j = 0; j < K; ++j) {
            s += "      for (int w = 1; w < 8; ++w) " + acc(j) + " = " + combine(j, acc(j), slice(j) + "[w * 32 + lane_]") + ";\n";
            if (sig.partial) s += "      if (live_) " + out(j) + "[" + column_partial("ch") + "] = " + acc(j) + ";\n";
            else s += "      if (live_) " + out(j) + "[r] = " + store_conv(node(j).dtype, final_value(j)) + ";\n";
        }
        s += "    }\n";
        if (fin) {
            s += arrive("rg_");
            // the partials of 32 neighbouring rows are neighbours (chunk-major): one line per load,
            // kColumnUnroll loads in flight per warp, combined in chunk order
            const std::string U = std::to_string(kColumnUnroll);
            s += "    if (last_) {\n";
            for (std::size_t j = 0; j < K; ++j) {
                s += "      " + acc(j) + " = " + identity(j) + ";\n";
                s += "      for (idx_t c0_ = warp_; c0_ < (idx_t)chunks; c0_ += 8 * " + U + ") {\n        " + at(j) + " p_[" + U + "];\n";
                s += "        #pragma unroll\n        for (int u_ = 0; u_ < " + U + "; ++u_) { const idx_t c = c0_ + 8 * u_; if (c < (idx_t)chunks) p_[u_] = ((volatile " +
                     at(j) + "*)" + out(j) + ")[" + column_partial("c") + "]; }\n";
                s += "        #pragma unroll\n        for (int u_ = 0; u_ < " + U + "; ++u_) { if (c0_ + 8 * u_ >= (idx_t)chunks) break; " + acc(j) +
                     " = " + combine(j, acc(j), "p_[u_]") + "; }\n      }\n";
                s += "      " + slice(j) + "[threadIdx.x] = " + acc(j) + ";\n";
            }
            s += "      __syncthreads();\n      if (warp_ == 0) {\n";
            for (std::size_t j = 0; j < K; ++j) {
                s += "        for (int w = 1; w < 8; ++w) " + acc(j) + " = " + combine(j, acc(j), slice(j) + "[w * 32 + lane_]") + ";\n";
                s += "        if (live_) " + fin_p(j) + "[r] = " + store_conv(node(j).dtype, final_value(j)) + ";\n";
            }
            s += "      }\n      if (threadIdx.x == 0) sem_[rg_] = 0;\n    }\n";
        }
        s += "    __syncthreads();\n  }\n}\n";
        return finish_kernel("red", s);
    } else if (!arg) {
        const auto comb = [&](std::size_t j) {
            return "[](" + at(j) + " a, " + at(j) + " b) { return (" + at(j) + ")(" + combine(j, "a", "b") + "); }";
        };
        for (std::size_t j = 0; j < K; ++j) {
            if (GL == 0) s += "    " + acc(j) + " = kiln_block_reduce(" + acc(j) + ", " + comb(j) + ", (" + at(j) + "*)smem_, " + identity(j) + ");\n";
            else s += "    " + acc(j) + " = kiln_group_reduce<" + gs + ">(" + acc(j) + ", " + comb(j) + ");\n";
        }
        if (sig.partial) {
            for (std::size_t j = 0; j < K; ++j) s += "    if (threadIdx.x == 0) " + out(j) + "[blk] = " + acc(j) + ";\n";
            if (fin) {
                s += arrive("r");
                s += "    if (last_) {\n";
                for (std::size_t j = 0; j < K; ++j) {
                    s += "      " + acc(j) + " = " + identity(j) + ";\n";
                    s += "      for (idx_t c = threadIdx.x; c < (idx_t)chunks; c += blockDim.x) " + acc(j) + " = " +
                         combine(j, acc(j), "((volatile " + at(j) + "*)" + out(j) + ")[r * (idx_t)chunks + c]") + ";\n";
                    s += "      " + acc(j) + " = kiln_block_reduce(" + acc(j) + ", " + comb(j) + ", (" + at(j) + "*)smem_, " + identity(j) + ");\n";
                    s += "      if (threadIdx.x == 0) " + fin_p(j) + "[r] = " + store_conv(node(j).dtype, final_value(j)) + ";\n";
                }
                s += "      if (threadIdx.x == 0) sem_[r] = 0;\n    }\n";
            }
        } else {
            for (std::size_t j = 0; j < K; ++j)
                s += std::string(GL == 0 ? "    if (threadIdx.x == 0) " : "    if (live_ && lane_ == 0) ") + out(j) + "[r] = " +
                     store_conv(node(j).dtype, final_value(j)) + ";\n";
        }
    }
    if (GL == 0) s += "    __syncthreads();\n";
    s += "  }\n}\n";
    return finish_kernel("red", s);
}

/// Second pass of a split reduction: combines `chunks` partials per row (accumulator type acc)
/// and stores the result (mean divides by the full count `count`).
inline KernelText combine_kernel(ir::ReduceKind k, DType acc, DType out, double correction) {
    const std::string at = compute_type(acc);
    std::string s = "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(const " + at + "* __restrict__ in, " +
                    storage_type(out) + "* __restrict__ out, long long rows, long long chunks, long long count) {\n";
    s += "  __shared__ double smem_[32];\n";
    s += "  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {\n";
    s += "    " + at + " acc = " + identity_text(k, acc) + ";\n";
    s += "    for (long long c = threadIdx.x; c < chunks; c += blockDim.x) acc = " + combine_text(k, "acc", "in[r * chunks + c]") + ";\n";
    s += "    acc = kiln_block_reduce(acc, [](" + at + " a, " + at + " b) { return (" + at + ")(" + combine_text(k, "a", "b") +
         "); }, (" + at + "*)smem_, " + identity_text(k, acc) + ");\n";
    std::string val = "acc";
    if (k == ir::ReduceKind::mean) val = "(acc / (" + at + ")kiln_max(0.0, (double)count - " + literal(correction, DType::f64) + "))";
    s += "    if (threadIdx.x == 0) out[r] = " + store_conv(out, val) + ";\n    __syncthreads();\n  }\n}\n";
    return finish_kernel("comb", s);
}

}  // namespace kiln::cuda::detail
