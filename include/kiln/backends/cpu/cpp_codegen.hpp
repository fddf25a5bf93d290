// C++ source for a fused elementwise group (issue 18): the tile program's instruction list as one
// loop over SIMD chunks, built by the host compiler at run time (backends/cpu/cpp_build.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/cpu/program.hpp"
#include "kiln/tables/reduce_table.hpp"

namespace kiln::detail::cppgen {

/// The text every generated kernel includes (through a precompiled header where the compiler has
/// them): the op table's formulas, shared with the tile interpreter and the fused loops, and
/// chunk helpers. A chunk is L elements, L the widest SIMD batch of a 32-bit type; a value of a
/// 64-bit compute type is two batches in it. Partial chunks (a segment's tail) go through padded
/// copies, as the interpreter's tail does, so every lane runs the same code.
inline constexpr std::string_view prelude = R"(#pragma once
#include "kiln/tables/op_table.hpp"
#include "kiln/tables/reduce_table.hpp"
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>
namespace kj {
using kiln::DType;
using i32 = std::int32_t;
using i64 = std::int64_t;
template <class T> using B = kiln::detail::simd::Batch<T>;
template <class T> inline constexpr int W = static_cast<int>(B<T>::size);
inline constexpr int L = std::max({W<float>, W<double>, W<i32>, W<i64>});
template <class T> inline constexpr int P = L / W<T>;
template <class T> struct V { B<T> b[P<T>]; };
template <class T> inline V<T> splat(T x) { V<T> r; for (int q = 0; q < P<T>; ++q) r.b[q] = B<T>(x); return r; }
template <class T, class S> inline T cv(const S& s) { return kiln::detail::load_as<T>(s); }
// L elements (Full) or the first n (zeros after) of storage S at p, stride s (1: contiguous), as T.
template <bool Full, class T, class S> inline V<T> ld(const S* p, i64 s, int n) {
    V<T> r;
    if constexpr (Full && std::is_same_v<S, T>) {
        if (s == 1) { for (int q = 0; q < P<T>; ++q) r.b[q] = B<T>::load_unaligned(p + q * W<T>); return r; }
    }
    alignas(64) T t[L] = {};
    if constexpr (Full) n = L;
    if (s == 1) { for (int k = 0; k < n; ++k) t[k] = cv<T>(p[k]); }
    else { for (int k = 0; k < n; ++k) t[k] = cv<T>(p[k * s]); }
    for (int q = 0; q < P<T>; ++q) r.b[q] = B<T>::load_aligned(t + q * W<T>);
    return r;
}
template <bool Full, class S, class T> inline void st(S* p, i64 s, int n, const V<T>& v) {
    if constexpr (Full && std::is_same_v<S, T>) {
        if (s == 1) { for (int q = 0; q < P<T>; ++q) v.b[q].store_unaligned(p + q * W<T>); return; }
    }
    alignas(64) T t[L];
    for (int q = 0; q < P<T>; ++q) v.b[q].store_aligned(t + q * W<T>);
    if constexpr (Full) n = L;
    if (s == 1) { for (int k = 0; k < n; ++k) p[k] = kiln::detail::store_as<S>(t[k]); }
    else { for (int k = 0; k < n; ++k) p[k * s] = kiln::detail::store_as<S>(t[k]); }
}
// Outputs of at least stream_min_bytes in all, of loops bound by memory, are written with
// non-temporal stores (sto<Full, true>; simd.hpp's store_stream says why).
inline constexpr i64 stream_min_bytes = kiln::detail::simd::stream_min_bytes;
using kiln::detail::simd::stream_aligned;
using kiln::detail::simd::stream_head;
template <bool Full, bool NT, class S, class T> inline void sto(S* p, i64 s, int n, const V<T>& v) {
    if constexpr (NT && Full && std::is_same_v<S, T>) {
        for (int q = 0; q < P<T>; ++q) kiln::detail::simd::store_stream(p + q * W<T>, v.b[q]);
    } else {
        st<Full>(p, s, n, v);
    }
}
using kiln::detail::simd::stream_fence;
template <int R> inline i64 numel(const i64* shape) {
    i64 n = 1;
    for (int d = 0; d < R; ++d) n *= shape[d];
    return n;
}
// A value in another compute type (the interpreter's convert step: static_cast per element).
template <class To, class From> inline V<To> to(const V<From>& v) {
    if constexpr (std::is_same_v<To, From>) { return v; }
    else {
        alignas(64) From f[L];
        alignas(64) To t[L];
        for (int q = 0; q < P<From>; ++q) v.b[q].store_aligned(f + q * W<From>);
        for (int k = 0; k < L; ++k) t[k] = static_cast<To>(f[k]);
        V<To> r;
        for (int q = 0; q < P<To>; ++q) r.b[q] = B<To>::load_aligned(t + q * W<To>);
        return r;
    }
}
template <int I, class List> struct At;
template <int I, class... Os> struct At<I, kiln::ops::OpList<Os...>> { using type = std::tuple_element_t<I, std::tuple<Os...>>; };
template <int Id> using Op = typename At<Id, kiln::ops::ElementwiseOps>::type;
template <class O, class T, class... A> inline V<T> op(DType attr, const A&... a) {
    V<T> r;
    for (int q = 0; q < P<T>; ++q) {
        if constexpr (O::rule == kiln::ops::DTypeRule::cast) r.b[q] = O::eval(a.b[q]..., attr);
        else r.b[q] = O::eval(a.b[q]...);
    }
    return r;
}
template <class O, class T, class... A> inline T sop(DType attr, A... a) {
    if constexpr (O::rule == kiln::ops::DTypeRule::cast) return O::eval(a..., attr);
    else return O::eval(a...);
}
// Row reductions: what a reduction accumulates in (double for float sums, as the interpreter's).
template <int Id> using Red = typename At<Id, kiln::ops::Reductions>::type::Accumulate;
template <class R, class T>
using Acc = std::conditional_t<std::is_floating_point_v<T> && R::rule == kiln::ops::ReduceRule::widen_int, double, T>;
template <class R, class T> inline T hred(const V<T>& v) {
    if constexpr (std::is_same_v<typename R::Combine, kiln::ops::Add> && std::is_floating_point_v<T>) {
        B<T> b = v.b[0];
        for (int q = 1; q < P<T>; ++q) b += v.b[q];
        return xsimd::hadd(b);
    }
    alignas(64) T l[L];
    for (int q = 0; q < P<T>; ++q) v.b[q].store_aligned(l + q * W<T>);
    T r = l[0];
    for (int k = 1; k < L; ++k) r = R::Combine::eval(r, l[k]);
    return r;
}
template <class R, class T> inline void acc(V<T>& a, const V<T>& v) {
    for (int q = 0; q < P<T>; ++q) a.b[q] = R::Combine::eval(a.b[q], v.b[q]);
}
template <class R, class T> inline void acc_n(T& a, const V<T>& v, int n) {
    alignas(64) T l[L];
    for (int q = 0; q < P<T>; ++q) v.b[q].store_aligned(l + q * W<T>);
    for (int k = 0; k < n; ++k) a = R::Combine::eval(a, l[k]);
}
// The multi-index of element `at` of a row-major shape.
template <int R> inline void unravel(i64 at, const i64* shape, i64* idx) {
    // (at < the sizes' product: what is left at the outermost dim is below its size)
    for (int d = R - 1; d > 0; --d) { idx[d] = at % shape[d]; at /= shape[d]; }
    idx[0] = at;
}
// Element offsets of a segment start: idx (the multi-index) against each access's strides.
template <int R> inline i64 offset(const i64* idx, const i64* strides) {
    i64 o = 0;
    for (int d = 0; d < R; ++d) o += idx[d] * strides[d];
    return o;
}
// Whether rows of n elements at a and b share a byte (a row written in place over one read).
template <class A, class B2> inline bool overlaps(const A* a, const B2* b, i64 n) {
    const char *x = reinterpret_cast<const char*>(a), *y = reinterpret_cast<const char*>(b);
    return x < reinterpret_cast<const char*>(b + n) && y < reinterpret_cast<const char*>(a + n);
}
}  // namespace kj
)";

/// The signature of an elementwise group's kernel (exported as `kiln_kernel`): pointers of the accesses (leaves,
/// the result, side outputs), the space's shape, each access's strides (rank per access, in
/// elements), the scalars, and the element range [begin, end) of the space to compute.
using GroupFn = void (*)(void* const* ptrs, const std::int64_t* shape, const std::int64_t* strides,
                         const double* scalars, std::int64_t begin, std::int64_t end);
/// A row group's kernel (`kiln_kernel` too): the accesses (leaves, then outputs), the outer shape,
/// each access's outer strides, the scalars, the row length, and the rows [begin, end) to compute.
using RowsFn = void (*)(void* const* ptrs, const std::int64_t* outer_shape, const std::int64_t* outer_strides,
                        const double* scalars, std::int64_t inner, std::int64_t begin, std::int64_t end);

/// C++ spelling of a dtype's storage type in generated code.
inline std::string_view cpp_type(DType d) {
    switch (d) {
        case DType::boolean: return "bool";
        case DType::i32: return "kj::i32";
        case DType::i64: return "kj::i64";
        case DType::f16: return "kiln::half";
        case DType::bf16: return "kiln::bfloat16";
        case DType::f32: return "float";
        case DType::f64: return "double";
    }
    return "?";
}

/// Kernel text shared by both generators: access k's typed base pointer `a<k>` (read-only below
/// `first_out`), and `p<k>`, that base at the multi-index `idx` (strides at `strides + k * rank`).
inline void declare_bases(std::string& s, const std::vector<DType>& dtypes, std::size_t first_out) {
    for (std::size_t k = 0; k < dtypes.size(); ++k) {
        const std::string c = k < first_out ? "const " : "", ty = c + std::string(cpp_type(dtypes[k])) + "*";
        s += "    " + ty + " const a" + std::to_string(k) + " = static_cast<" + ty + ">(ptr[" + std::to_string(k) + "]);\n";
    }
}
inline void declare_at(std::string& s, const std::vector<DType>& dtypes, std::size_t first_out, const std::string& rank,
                       const std::string& strides, int rank_value) {
    for (std::size_t k = 0; k < dtypes.size(); ++k) {
        const std::string c = k < first_out ? "const " : "";
        s += "        " + c + std::string(cpp_type(dtypes[k])) + "* const p" + std::to_string(k) + " = a" + std::to_string(k) + " + offset<" +
             rank + ">(idx, " + strides + " + " + std::to_string(k * static_cast<std::size_t>(rank_value)) + ");\n";
    }
}

/// Whether a loop computing `op` per element may write its large outputs with streaming stores.
inline bool streams_ok(ops::OpId op) { return ops::streams_ok(ops::op_rule(op)); }

/// The source of `p`'s kernel (p collapsed, rank >= 1), or "" where the generator does not cover
/// it (then the interpreter runs it). What the text fixes: the rank, each access's dtype and
/// whether its innermost stride is 1, 0 or other, and the instruction list; sizes, strides,
/// scalars and addresses are arguments, so one build serves every shape of that layout.
/// `streams`: large outputs of a loop bound by memory are written with streaming stores (false
/// where the output is a caller's tile that is read back at once: a reduction's prologue).
inline std::string group_source(const TileProgram& p, bool streams = true) {
    using program_detail::kernel_ct;
    const int R = p.space.shape.rank();
    if (R < 1 || R > max_rank || p.instrs.empty()) return "";
    const std::size_t nl = p.leaves.size(), ns = p.scalars.size();
    const std::vector<const Access*> acc = p.accesses();
    std::vector<DType> dtypes;
    for (const Access* a : acc) {
        if (a->strides.rank() != R) return "";
        dtypes.push_back(a->dtype);
    }
    auto ct_name = [](DType ct) { return cpp_type(kernel_ct(ct)); };
    auto inner = [&](const Access& a) { return a.strides[R - 1]; };
    std::string s;
    s.reserve(4096);
    s += "#include \"kiln_cpu_prelude.hpp\"\n";
    s += "// kiln CPU kernel: " + std::to_string(p.instrs.size()) + " ops over rank " + std::to_string(R) + "\n";
    s += "extern \"C\" void kiln_kernel(void* const* ptr, const kj::i64* shape, const kj::i64* strides, const double* sc,\n"
         "                           kj::i64 begin, kj::i64 end) {\n";
    s += "    using namespace kj;\n    constexpr int R = " + std::to_string(R) + ";\n";
    declare_bases(s, dtypes, nl);
    // values: leaf k -> "x<k>", scalar k -> "s<k>_<ct>", instruction i -> "v<i>"; in a compute type
    // other than the one it was born in, through to<>.
    std::vector<DType> born(p.instrs.size());
    for (std::size_t i = 0; i < p.instrs.size(); ++i) born[i] = kernel_ct(p.instrs[i].ct);
    // scalars: one splat per (scalar, compute type) used, before the loop
    std::vector<std::pair<std::size_t, DType>> splats;
    for (const auto& ins : p.instrs)
        for (int k = 0; k < 3; ++k)
            if (ins.in[k] >= static_cast<int>(nl) && ins.in[k] < static_cast<int>(nl + ns)) {
                const std::pair<std::size_t, DType> sp{static_cast<std::size_t>(ins.in[k]) - nl, kernel_ct(ins.ct)};
                if (std::find(splats.begin(), splats.end(), sp) == splats.end()) splats.push_back(sp);
            }
    auto splat_name = [](std::size_t k, DType ct) { return "s" + std::to_string(k) + "_" + std::string(dtype_name(ct)); };
    for (const auto& [k, ct] : splats)
        s += "    const V<" + std::string(ct_name(ct)) + "> " + splat_name(k, ct) + " = splat<" + std::string(ct_name(ct)) +
             ">(static_cast<" + std::string(ct_name(ct)) + ">(sc[" + std::to_string(k) + "]));\n";
    s += "    i64 idx[R];\n    unravel<R>(begin, shape, idx);\n";
    s += "    for (i64 pos = begin; pos < end;) {\n";
    s += "        const i64 n = std::min(end - pos, shape[R - 1] - idx[R - 1]);\n";
    declare_at(s, dtypes, nl, "R", "strides", R);
    for (std::size_t k = 0; k < acc.size(); ++k)
        if (inner(*acc[k]) != 0 && inner(*acc[k]) != 1)
            s += "        const i64 is" + std::to_string(k) + " = strides[" +
                 std::to_string(k * static_cast<std::size_t>(R) + static_cast<std::size_t>(R - 1)) + "];\n";
    // leaves constant along the segment (inner stride 0): one value per segment, per compute type read in
    std::vector<std::pair<std::size_t, DType>> uses;  // (leaf, compute type) pairs the instructions read
    for (const auto& ins : p.instrs)
        for (int k = 0; k < 3; ++k)
            if (ins.in[k] >= 0 && ins.in[k] < static_cast<int>(nl)) {
                const std::pair<std::size_t, DType> u{static_cast<std::size_t>(ins.in[k]), kernel_ct(ins.ct)};
                if (std::find(uses.begin(), uses.end(), u) == uses.end()) uses.push_back(u);
            }
    auto leaf_name = [](std::size_t k, DType ct) { return "x" + std::to_string(k) + "_" + std::string(dtype_name(ct)); };
    for (const auto& [k, ct] : uses)
        if (inner(*acc[k]) == 0)
            s += "        const V<" + std::string(ct_name(ct)) + "> " + leaf_name(k, ct) + " = splat<" + std::string(ct_name(ct)) +
                 ">(cv<" + std::string(ct_name(ct)) + ">(p" + std::to_string(k) + "[0]));\n";
    s += "        auto chunk = [&]<bool Full, bool NT>(i64 i, int m) {\n";
    for (const auto& [k, ct] : uses) {
        if (inner(*acc[k]) == 0) continue;
        const std::string ks = std::to_string(k), stride = inner(*acc[k]) == 1 ? "1" : "is" + ks;
        s += "            const V<" + std::string(ct_name(ct)) + "> " + leaf_name(k, ct) + " = ld<Full, " + std::string(ct_name(ct)) +
             ">(p" + ks + " + i * " + stride + ", " + stride + ", m);\n";
    }
    auto value = [&](int v, DType ct) -> std::string {
        if (v < static_cast<int>(nl)) return leaf_name(static_cast<std::size_t>(v), ct);
        if (v < static_cast<int>(nl + ns)) return splat_name(static_cast<std::size_t>(v) - nl, ct);
        const std::size_t i = static_cast<std::size_t>(v) - nl - ns;
        const std::string name = "v" + std::to_string(i);
        if (born[i] == ct) return name;
        return "to<" + std::string(ct_name(ct)) + ">(" + name + ")";
    };
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
        const auto& ins = p.instrs[i];
        const DType ct = kernel_ct(ins.ct);
        s += "            const V<" + std::string(ct_name(ct)) + "> v" + std::to_string(i) + " = op<Op<" + std::to_string(ins.op) +
             ">, " + std::string(ct_name(ct)) + ">(DType(" + std::to_string(static_cast<int>(ins.attr)) + ")";
        for (int k = 0; k < 3; ++k)
            if (ins.in[k] >= 0) s += ", " + value(ins.in[k], ct);
        s += ");  // " + std::string(ops::op_name(ins.op)) + "\n";
    }
    // outputs contiguous along the segment in their compute type, when the loop is light enough
    // to be bound by memory (see streams_ok)
    std::vector<std::size_t> streamed;
    bool light = streams;
    for (const auto& ins : p.instrs) light = light && streams_ok(ins.op);
    auto store = [&](std::size_t k, int v) {
        const std::size_t i = static_cast<std::size_t>(v) - nl - ns;
        const std::string ks = std::to_string(k);
        const std::string stride = inner(*acc[k]) == 1 ? "1" : inner(*acc[k]) == 0 ? "0" : "is" + ks;
        const bool nt = light && inner(*acc[k]) == 1 && acc[k]->dtype == born[i];
        if (nt) streamed.push_back(k);
        s += std::string("            ") + (nt ? "sto<Full, NT>" : "st<Full>") + "(p" + ks + " + i * " + stride + ", " + stride + ", m, v" +
             std::to_string(i) + ");\n";
    };
    store(nl, static_cast<int>(nl + ns + p.instrs.size() - 1));
    for (std::size_t k = 0; k < p.side.size(); ++k) store(nl + 1 + k, p.side[k].first);
    s += "        };\n";
    s += "        i64 i = 0;\n";
    if (!streamed.empty()) {
        // a segment long enough: a head up to the first output's streaming alignment, then
        // streaming stores while every streamed output is aligned there
        const std::string p0 = "p" + std::to_string(streamed[0]);
        std::string aligned;
        for (std::size_t k : streamed) aligned += std::string(aligned.empty() ? "" : " && ") + "stream_aligned(p" + std::to_string(k) + " + i)";
        s += "        if (stream && n >= 2 * L) {\n";
        s += "            const int h = stream_head(" + p0 + ");\n";
        s += "            if (h > 0) { chunk.template operator()<false, false>(0, h); i = h; }\n";
        s += "            if (" + aligned + ")\n";
        s += "                for (; i + L <= n; i += L) chunk.template operator()<true, true>(i, L);\n";
        s += "        }\n";
    }
    s += "        for (; i + L <= n; i += L) chunk.template operator()<true, false>(i, L);\n";
    s += "        if (i < n) chunk.template operator()<false, false>(i, static_cast<int>(n - i));\n";
    s += "        pos += n;\n        idx[R - 1] += n;\n";
    s += "        for (int d = R - 1; d > 0 && idx[d] == shape[d]; --d) { idx[d] = 0; ++idx[d - 1]; }\n";
    s += "    }\n";
    std::string head;
    if (!streamed.empty()) {
        std::size_t bytes = 0;
        for (std::size_t k : streamed) bytes += dtype_size(acc[k]->dtype);
        head = "    const bool stream = numel<R>(shape) * " + std::to_string(bytes) + " >= stream_min_bytes;\n";
        s += "    if (stream) stream_fence();\n";
    }
    s += "}\n";
    if (!head.empty()) s.insert(s.find("    i64 idx[R];\n"), head);
    return s;
}

/// A row group for generated code: every member computes in `ct`, row by row; rows are the
/// innermost (reduced) dim, the outer dims any rank. Values: leaf k -> k, scalar k -> leaves + k,
/// member m -> leaves + scalars + m.
struct RowProgram {
    struct Leaf {
        DType dtype;
        bool varies;  ///< along the row (then read with inner stride 1); else one value per row
    };
    struct Member {
        bool reduce = false;
        bool vec = false;            ///< elementwise with a value per element of the row
        ops::OpId op = 0;            ///< elementwise
        DType attr = DType::f32;     ///< cast target
        ops::ReduceId rid = 0;       ///< reduce: the table entry (mean accumulates a sum)
        bool mean = false;
        double correction = 0;       ///< mean: divides by inner - correction
        int in[3] = {-1, -1, -1};
    };
    struct Out {
        int member;
        DType dtype;  ///< a vec member's row (inner stride 1) or a row scalar
    };
    DType ct = DType::f32;
    int outer_rank = 1;
    std::vector<Leaf> leaves;
    std::size_t scalars = 0;
    std::vector<Member> members;
    std::vector<Out> outs;
};

/// Elements a row kernel reduces in T before folding into the accumulator type: each of the 4 L
/// lane chains adds row_tile_elems / (4 L) values in T (32 with AVX-512, 64 with AVX2).
inline constexpr std::int64_t row_tile_elems = 2048;

/// The source of a row program's kernel `kiln_kernel(ptrs, outer_shape, outer_strides, scalars,
/// inner, begin_row, end_row)`, or "" where not covered. Members run in stages: one loop over the
/// row per stage (leaves re-read from L1), a stage ending where a value needs a reduction of the
/// same loop; row values used by a later stage go through a row buffer (or an output's row);
/// scalar members run between stages. A reduction combines chunks into 4 vector accumulators (4
/// independent dependency chains: a NaN-aware max is 3 dependent instructions a chunk), whose
/// lanes are combined in T per tile of row_tile_elems (as the interpreter's reduce_tile) and
/// folded into one scalar of the table entry's accumulator type (double for float sums). (Folding
/// lanes into a vector of doubles and combining those once per row was 4% slower on a 4096 x 1024
/// softmax: the conversion went through memory; Zen 4, 2026-12-07.) A row value of a cheap op (add, sub, mul, neg, abs of
/// leaves and row scalars: layer_norm's x - mean) that a later pass reads is computed again there
/// from L1 instead of going through a row buffer (a store and a load saved). Measured on a
/// 4096 x 1024 softmax (Zen 5, one thread, 2026-11-27): 1.8-2.1 ms against 2.9-3.1 ms with one
/// chain and a lane reduction per 256-element tile; a 2048-element tile then took 1.83-1.99 ms
/// against 1.93-2.15 with 256; the hand-written xsimd loop (bench/hand_cpu.hpp) took 1.60-1.68 ms.
inline std::string row_source(const RowProgram& p) {
    const std::size_t nl = p.leaves.size(), ns = p.scalars, nm = p.members.size();
    const int O = p.outer_rank;
    if (nm == 0 || O < 1 || O > max_rank) return "";
    const DType ct = program_detail::kernel_ct(p.ct);
    const std::string T(cpp_type(ct));
    auto is_member = [&](int v) { return v >= static_cast<int>(nl + ns); };
    auto member_of = [&](int v) { return static_cast<std::size_t>(v) - nl - ns; };
    // stage of each vec member and reduction, stage after which each scalar value is ready
    std::vector<int> stage(nm, 0), ready(nm, 0);
    auto value_ready = [&](int v) { return is_member(v) && !p.members[member_of(v)].vec ? ready[member_of(v)] : 0; };
    auto value_stage = [&](int v) { return is_member(v) && p.members[member_of(v)].vec ? stage[member_of(v)] : 0; };
    auto varies = [&](int v) {
        if (v < static_cast<int>(nl)) return p.leaves[static_cast<std::size_t>(v)].varies;
        return is_member(v) && p.members[member_of(v)].vec;
    };
    int stages = 1;
    for (std::size_t m = 0; m < nm; ++m) {
        const auto& mb = p.members[m];
        int st = 0;
        for (int k = 0; k < 3; ++k)
            if (mb.in[k] >= 0) st = std::max({st, value_ready(mb.in[k]), value_stage(mb.in[k])});
        if (mb.reduce) {
            if (!varies(mb.in[0])) return "";  // a reduction of a row constant: the interpreter's
            stage[m] = st;
            ready[m] = st + 1;
            stages = std::max(stages, st + 1);
        } else if (mb.vec) {
            stage[m] = st;
            stages = std::max(stages, st + 1);
        } else {
            ready[m] = st;
        }
    }
    // vec members a later stage computes again instead of buffering: one cheap op on leaves,
    // scalars and row scalars
    std::vector<char> remat(nm, 0);
    for (std::size_t m = 0; m < nm; ++m) {
        const auto& mb = p.members[m];
        const bool cheap = mb.op == ops::op_id<ops::Add> || mb.op == ops::op_id<ops::Sub> || mb.op == ops::op_id<ops::Mul> ||
                           mb.op == ops::op_id<ops::Neg> || mb.op == ops::op_id<ops::Abs>;
        bool ok = mb.vec && cheap;
        for (int k = 0; k < 3 && ok; ++k)
            if (mb.in[k] >= 0 && is_member(mb.in[k]) && p.members[member_of(mb.in[k])].vec) ok = false;
        remat[m] = ok;
    }
    // row buffers: vec members read in a later stage than their own
    std::vector<int> buffer(nm, -1);
    int nbuf = 0;
    for (std::size_t m = 0; m < nm; ++m)
        for (int k = 0; k < 3; ++k) {
            const int v = p.members[m].in[k];
            if (v >= 0 && is_member(v) && p.members[member_of(v)].vec && !remat[member_of(v)] && buffer[member_of(v)] < 0 &&
                (p.members[m].reduce || p.members[m].vec ? stage[m] : ready[m]) > stage[member_of(v)])
                buffer[member_of(v)] = nbuf++;
        }
    // a buffered member kept in an output's row instead (the hand-written softmax's way: exp
    // written to the output, scaled there in place): an output of T written in the member's own
    // stage or in one no earlier than the last that reads it, by a member that loads the buffered
    // value before its store; one buffer an output. Per row, where that output row overlaps a
    // varying leaf's row (a write in place), the row buffer is used after all.
    std::vector<int> last_read(nm, -1), in_out(nm, -1);
    for (std::size_t m = 0; m < nm; ++m)
        for (int k = 0; k < 3; ++k) {
            const int v = p.members[m].in[k];
            if (v >= 0 && is_member(v) && buffer[member_of(v)] >= 0) last_read[member_of(v)] = std::max(last_read[member_of(v)], stage[m]);
        }
    std::vector<char> out_taken(p.outs.size(), 0);
    for (std::size_t m = 0; m < nm; ++m) {
        if (buffer[m] < 0) continue;
        for (std::size_t k = 0; k < p.outs.size() && in_out[m] < 0; ++k) {
            const std::size_t om = static_cast<std::size_t>(p.outs[k].member);
            if (out_taken[k] || !p.members[om].vec || p.outs[k].dtype != ct) continue;
            if (om == m || stage[om] >= last_read[m]) {
                in_out[m] = static_cast<int>(k);
                out_taken[k] = 1;
            }
        }
    }
    for (std::size_t m = 0; m < nm; ++m)  // a vec member read by a scalar member: not covered
        for (int k = 0; k < 3; ++k) {
            const int v = p.members[m].in[k];
            if (!p.members[m].vec && !p.members[m].reduce && v >= 0 && varies(v)) return "";
        }
    // outputs written with streaming stores when large: a vec member's row in T, not a buffer
    std::vector<char> out_nt(p.outs.size(), 0);
    std::size_t nt_bytes = 0;
    bool light = true;
    for (const auto& mb : p.members) light = light && (!mb.vec || streams_ok(mb.op));
    for (std::size_t k = 0; k < p.outs.size() && light; ++k)
        if (p.members[static_cast<std::size_t>(p.outs[k].member)].vec && p.outs[k].dtype == ct && !out_taken[k]) {
            out_nt[k] = 1;
            nt_bytes += dtype_size(ct);
        }
    std::string s;
    s.reserve(8192);
    s += "#include \"kiln_cpu_prelude.hpp\"\n";
    s += "// kiln CPU row kernel: " + std::to_string(nm) + " members in " + std::to_string(stages) + " passes over each row\n";
    s += "extern \"C\" void kiln_kernel(void* const* ptr, const kj::i64* oshape, const kj::i64* ostr, const double* sc, kj::i64 inner,\n"
         "                          kj::i64 begin, kj::i64 end) {\n";
    s += "    using namespace kj;\n    using T = " + T + ";\n    constexpr int O = " + std::to_string(O) + ";\n";
    std::vector<DType> dtypes;
    for (const auto& l : p.leaves) dtypes.push_back(l.dtype);
    for (const auto& o : p.outs) dtypes.push_back(o.dtype);
    declare_bases(s, dtypes, nl);
    for (std::size_t k = 0; k < ns; ++k)
        s += "    const T c" + std::to_string(k) + " = static_cast<T>(sc[" + std::to_string(k) + "]);\n";
    if (nbuf > 0) s += "    std::vector<T> buf(static_cast<std::size_t>(" + std::to_string(nbuf) + " * inner + L));\n";
    if (nt_bytes > 0) s += "    const bool stream = numel<O>(oshape) * inner * " + std::to_string(nt_bytes) + " >= stream_min_bytes;\n";
    s += "    i64 idx[O];\n    unravel<O>(begin, oshape, idx);\n";
    s += "    for (i64 o = begin; o < end; ++o) {\n";
    declare_at(s, dtypes, nl, "O", "ostr", O);
    if (nt_bytes > 0) {
        s += "        const bool nt = stream";
        for (std::size_t k = 0; k < p.outs.size(); ++k)
            if (out_nt[k]) s += " && stream_aligned(p" + std::to_string(nl + k) + ")";
        s += ";\n";
    }
    for (std::size_t k = 0; k < nl; ++k)
        if (!p.leaves[k].varies) s += "        const T l" + std::to_string(k) + " = cv<T>(p" + std::to_string(k) + "[0]);\n";
    for (std::size_t m = 0; m < nm; ++m) {
        if (buffer[m] < 0) continue;
        const std::string bs = "buf.data() + " + std::to_string(buffer[m]) + " * inner";
        if (in_out[m] < 0) {
            s += "        T* const q" + std::to_string(m) + " = " + bs + ";\n";
            continue;
        }
        const std::string po = "p" + std::to_string(nl + static_cast<std::size_t>(in_out[m]));
        std::string overlap;
        for (std::size_t k = 0; k < nl; ++k)
            if (p.leaves[k].varies)
                overlap += std::string(overlap.empty() ? "" : " || ") + "overlaps(p" + std::to_string(k) + ", " + po + ", inner)";
        s += "        T* const q" + std::to_string(m) + " = " + (overlap.empty() ? po : "(" + overlap + ") ? " + bs + " : " + po) + ";\n";
    }
    // a value as a scalar of T (row constants) or, inside a chunk, as V<T>
    auto scalar_name = [&](int v) -> std::string {
        if (v < static_cast<int>(nl)) return "l" + std::to_string(v);
        if (v < static_cast<int>(nl + ns)) return "c" + std::to_string(v - static_cast<int>(nl));
        return "m" + std::to_string(member_of(v));
    };
    auto scalar_members = [&](int at) {
        for (std::size_t m = 0; m < nm; ++m) {
            const auto& mb = p.members[m];
            if (mb.vec || mb.reduce || ready[m] != at) continue;
            s += "        const T m" + std::to_string(m) + " = sop<Op<" + std::to_string(mb.op) + ">, T>(DType(" +
                 std::to_string(static_cast<int>(mb.attr)) + ")";
            for (int k = 0; k < 3; ++k)
                if (mb.in[k] >= 0) s += ", " + scalar_name(mb.in[k]);
            s += ");  // " + std::string(ops::op_name(mb.op)) + "\n";
        }
    };
    for (int st = 0; st < stages; ++st) {
        scalar_members(st);
        s += "        // pass " + std::to_string(st) + "\n";
        std::vector<std::size_t> reds;
        for (std::size_t m = 0; m < nm; ++m)
            if (p.members[m].reduce && stage[m] == st) reds.push_back(m);
        // each reduction: 4 chunk accumulators (4 independent chains), combined per tile into
        // one vector of its accumulator type (double for float sums), reduced across lanes once a row
        for (std::size_t m : reds) {
            const std::string ms = std::to_string(m), R = "Red<" + std::to_string(p.members[m].rid) + ">";
            s += "        using R" + ms + " = " + R + ";\n        using A" + ms + " = Acc<R" + ms + ", T>;\n";
            s += "        A" + ms + " aa" + ms + " = static_cast<A" + ms + ">(R" + ms + "::template identity<T>());\n";
            s += "        T at" + ms + " = R" + ms + "::template identity<T>();  // the row's partial chunk\n";
        }
        s += "        for (i64 t0 = 0; t0 < inner; t0 += " + std::to_string(row_tile_elems) + ") {\n";
        s += "            const i64 tn = std::min<i64>(" + std::to_string(row_tile_elems) + ", inner - t0);\n";
        for (std::size_t m : reds) {
            const std::string ms = std::to_string(m);
            s += "            V<T> ab" + ms + "[4];\n";
            s += "            for (int j = 0; j < 4; ++j) ab" + ms + "[j] = splat<T>(R" + ms + "::template identity<T>());\n";
        }
        s += "            auto chunk = [&]<bool Full, int J, bool NT>(i64 i, int n) {\n";
        bool stage_nt = false;
        // values this stage reads: leaves (varying) loaded, earlier-stage vec members from buffers
        // or computed again (remat)
        std::vector<int> loaded;
        std::function<std::string(int)> vec_name;
        auto emit_op = [&](std::size_t m) {  // member m's value as v<m>, from its operands
            const auto& mb = p.members[m];
            const std::string ms = std::to_string(m);
            // a row divided by one value (softmax's normalization): times its reciprocal, as the interpreter
            if (mb.op == ops::op_id<ops::Div> && varies(mb.in[0]) && !varies(mb.in[1])) {
                const std::string a = vec_name(mb.in[0]);
                s += "                const V<T> v" + ms + " = op<Op<" + std::to_string(ops::op_id<ops::Mul>) + ">, T>(DType(" +
                     std::to_string(static_cast<int>(mb.attr)) + "), " + a + ", splat<T>(T(1) / " + scalar_name(mb.in[1]) + "));  // div\n";
                return;
            }
            std::vector<std::string> args;
            for (int k = 0; k < 3; ++k)
                if (mb.in[k] >= 0) args.push_back(vec_name(mb.in[k]));
            s += "                const V<T> v" + ms + " = op<Op<" + std::to_string(mb.op) + ">, T>(DType(" +
                 std::to_string(static_cast<int>(mb.attr)) + ")";
            for (const auto& a : args) s += ", " + a;
            s += ");  // " + std::string(ops::op_name(mb.op)) + "\n";
        };
        vec_name = [&](int v) -> std::string {
            if (v < static_cast<int>(nl)) {
                if (!p.leaves[static_cast<std::size_t>(v)].varies) return "splat<T>(l" + std::to_string(v) + ")";
                if (std::find(loaded.begin(), loaded.end(), v) == loaded.end()) {
                    loaded.push_back(v);
                    s += "                const V<T> x" + std::to_string(v) + " = ld<Full, T>(p" + std::to_string(v) + " + i, 1, n);\n";
                }
                return "x" + std::to_string(v);
            }
            if (v < static_cast<int>(nl + ns)) return "splat<T>(c" + std::to_string(v - static_cast<int>(nl)) + ")";
            const std::size_t m = member_of(v);
            if (!p.members[m].vec) return "splat<T>(m" + std::to_string(m) + ")";
            if (stage[m] == st) return "v" + std::to_string(m);
            if (std::find(loaded.begin(), loaded.end(), v) == loaded.end()) {
                loaded.push_back(v);
                if (remat[m]) emit_op(m);
                else
                    s += "                const V<T> v" + std::to_string(m) + " = ld<Full, T>(q" + std::to_string(m) + " + i, 1, n);\n";
            }
            return "v" + std::to_string(m);
        };
        for (std::size_t m = 0; m < nm; ++m) {
            const auto& mb = p.members[m];
            if (mb.reduce && stage[m] == st) {
                const std::string ms = std::to_string(m), x = vec_name(mb.in[0]);
                s += "                if constexpr (Full) acc<R" + ms + ">(ab" + ms + "[J], " + x + "); else acc_n<R" + ms + ">(at" + ms + ", " + x +
                     ", n);\n";
                continue;
            }
            if (!mb.vec || stage[m] != st) continue;
            const std::string ms = std::to_string(m);
            emit_op(m);
            if (buffer[m] >= 0 && !(in_out[m] >= 0 && p.outs[static_cast<std::size_t>(in_out[m])].member == static_cast<int>(m)))
                s += "                st<Full>(q" + ms + " + i, 1, n, v" + ms + ");\n";
            for (std::size_t k = 0; k < p.outs.size(); ++k) {
                if (p.outs[k].member != static_cast<int>(m)) continue;
                for (std::size_t b = 0; b < nm; ++b)  // a value buffered in this output's row: read before it is overwritten
                    if (in_out[b] == static_cast<int>(k) && b != m) vec_name(static_cast<int>(nl + ns + b));
                stage_nt = stage_nt || out_nt[k];
                s += std::string("                ") + (out_nt[k] ? "sto<Full, NT>" : "st<Full>") + "(p" + std::to_string(nl + k) +
                     " + i, 1, n, v" + ms + ");\n";
            }
        }
        s += "            };\n";
        auto loops = [&](const std::string& pad, const char* nt) {
            s += pad + "i64 i = 0;\n";
            s += pad + "for (; i + 4 * L <= tn; i += 4 * L) {\n";
            for (int j = 0; j < 4; ++j)
                s += pad + "    chunk.template operator()<true, " + std::to_string(j) + ", " + nt + ">(t0 + i + " + std::to_string(j) +
                     " * L, L);\n";
            s += pad + "}\n";
            s += pad + "for (; i + L <= tn; i += L) chunk.template operator()<true, 0, " + nt + ">(t0 + i, L);\n";
            s += pad + "if (i < tn) chunk.template operator()<false, 0, false>(t0 + i, static_cast<int>(tn - i));\n";
        };
        if (stage_nt) {  // the same loops with streaming stores, for rows where they apply
            s += "            if (nt) {\n";
            loops("                ", "true");
            s += "            } else {\n";
            loops("                ", "false");
            s += "            }\n";
        } else {
            loops("            ", "false");
        }
        for (std::size_t m : reds) {
            const std::string ms = std::to_string(m);
            s += "            acc<R" + ms + ">(ab" + ms + "[0], ab" + ms + "[1]);\n            acc<R" + ms + ">(ab" + ms + "[2], ab" + ms +
                 "[3]);\n            acc<R" + ms + ">(ab" + ms + "[0], ab" + ms + "[2]);\n";
            s += "            aa" + ms + " = R" + ms + "::Combine::eval(aa" + ms + ", static_cast<A" + ms + ">(hred<R" + ms + ">(ab" + ms + "[0])));\n";
        }
        s += "        }\n";
        for (std::size_t m : reds) {
            const std::string ms = std::to_string(m);
            s += "        A" + ms + " acc" + ms + " = R" + ms + "::Combine::eval(aa" + ms + ", static_cast<A" + ms + ">(at" + ms + "));\n";
            if (p.members[m].mean) {
                char corr[64];
                std::snprintf(corr, sizeof corr, "%.17g", p.members[m].correction);
                s += "        acc" + ms + " = static_cast<Acc<R" + ms + ", T>>(acc" + ms + " / static_cast<Acc<R" + ms +
                     ", T>>(std::max(0.0, static_cast<double>(inner) - " + corr + ")));\n";
            }
            s += "        const T m" + ms + " = static_cast<T>(acc" + ms + ");\n";
        }
    }
    scalar_members(stages);
    for (std::size_t k = 0; k < p.outs.size(); ++k)
        if (!p.members[static_cast<std::size_t>(p.outs[k].member)].vec)
            s += "        p" + std::to_string(nl + k) + "[0] = kiln::detail::store_as<" + std::string(cpp_type(p.outs[k].dtype)) + ">(m" +
                 std::to_string(p.outs[k].member) + ");\n";
    s += "        for (int d = O - 1; d >= 0; --d) { if (++idx[d] < oshape[d]) break; idx[d] = 0; }\n";
    s += "    }\n";
    if (nt_bytes > 0) s += "    if (stream) stream_fence();\n";
    s += "}\n";
    return s;
}

}  // namespace kiln::detail::cppgen
