// C++ source for a fused elementwise group (issue 18): the tile program's instruction list as one
// loop over SIMD chunks, built by the host compiler at run time (backends/cpu/cpp_build.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/backends/cpu/program.hpp"

namespace kiln::detail::cppgen {

/// The text every generated kernel includes (through a precompiled header where the compiler has
/// them): the op table's formulas, shared with the tile interpreter and the fused loops, and
/// chunk helpers. A chunk is L elements, L the widest SIMD batch of a 32-bit type; a value of a
/// 64-bit compute type is two batches in it. Partial chunks (a segment's tail) go through padded
/// copies, as the interpreter's tail does, so every lane runs the same code.
inline constexpr std::string_view prelude = R"(#pragma once
#include "kiln/tables/op_table.hpp"
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
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
// Element offsets of a segment start: idx (the multi-index) against each access's strides.
template <int R> inline i64 offset(const i64* idx, const i64* strides) {
    i64 o = 0;
    for (int d = 0; d < R; ++d) o += idx[d] * strides[d];
    return o;
}
}  // namespace kj
)";

/// The signature every generated kernel exports as `kiln_group`: pointers of the accesses (leaves,
/// the result, side outputs), the space's shape, each access's strides (rank per access, in
/// elements), the scalars, and the element range [begin, end) of the space to compute.
using GroupFn = void (*)(void* const* ptrs, const std::int64_t* shape, const std::int64_t* strides,
                         const double* scalars, std::int64_t begin, std::int64_t end);

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

/// The source of `p`'s kernel (p collapsed, rank >= 1), or "" where the generator does not cover
/// it (then the interpreter runs it). What the text fixes: the rank, each access's dtype and
/// whether its innermost stride is 1, 0 or other, and the instruction list; sizes, strides,
/// scalars and addresses are arguments, so one build serves every shape of that layout.
inline std::string group_source(const TileProgram& p) {
    using program_detail::kernel_ct;
    const int R = p.space.shape.rank();
    if (R < 1 || R > max_rank || p.instrs.empty()) return "";
    const std::size_t nl = p.leaves.size(), ns = p.scalars.size();
    std::vector<const Access*> acc;
    for (const Access& a : p.leaves) acc.push_back(&a);
    acc.push_back(&p.out);
    for (const auto& sd : p.side) acc.push_back(&sd.second);
    for (const Access* a : acc)
        if (a->strides.rank() != R) return "";
    auto ct_name = [](DType ct) { return cpp_type(kernel_ct(ct)); };
    auto inner = [&](const Access& a) { return a.strides[R - 1]; };
    std::string s;
    s.reserve(4096);
    s += "#include \"kiln_cpu_prelude.hpp\"\n";
    s += "// kiln CPU kernel: " + std::to_string(p.instrs.size()) + " ops over rank " + std::to_string(R) + "\n";
    s += "extern \"C\" void kiln_group(void* const* ptr, const kj::i64* shape, const kj::i64* strides, const double* sc,\n"
         "                           kj::i64 begin, kj::i64 end) {\n";
    s += "    using namespace kj;\n    constexpr int R = " + std::to_string(R) + ";\n";
    for (std::size_t k = 0; k < acc.size(); ++k) {
        const bool out = k >= nl;
        s += "    " + std::string(out ? "" : "const ") + std::string(cpp_type(acc[k]->dtype)) + "* const a" + std::to_string(k) +
             " = static_cast<" + (out ? "" : "const ") + std::string(cpp_type(acc[k]->dtype)) + "*>(ptr[" + std::to_string(k) + "]);\n";
    }
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
    s += "    i64 idx[R];\n    {\n        i64 rem = begin;\n"
         "        for (int d = R - 1; d >= 0; --d) { idx[d] = rem % shape[d]; rem /= shape[d]; }\n    }\n";
    s += "    for (i64 pos = begin; pos < end;) {\n";
    s += "        const i64 n = std::min(end - pos, shape[R - 1] - idx[R - 1]);\n";
    for (std::size_t k = 0; k < acc.size(); ++k) {
        const std::string ks = std::to_string(k);
        s += "        " + std::string(k >= nl ? "" : "const ") + std::string(cpp_type(acc[k]->dtype)) + "* const p" + ks + " = a" + ks +
             " + offset<R>(idx, strides + " + std::to_string(k * static_cast<std::size_t>(R)) + ");\n";
        if (inner(*acc[k]) != 0 && inner(*acc[k]) != 1)
            s += "        const i64 is" + ks + " = strides[" + std::to_string(k * static_cast<std::size_t>(R) + static_cast<std::size_t>(R - 1)) + "];\n";
    }
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
    s += "        auto chunk = [&]<bool Full>(i64 i, int m) {\n";
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
    auto store = [&](std::size_t k, int v) {
        const std::size_t i = static_cast<std::size_t>(v) - nl - ns;
        const std::string ks = std::to_string(k);
        const std::string stride = inner(*acc[k]) == 1 ? "1" : inner(*acc[k]) == 0 ? "0" : "is" + ks;
        s += "            st<Full>(p" + ks + " + i * " + stride + ", " + stride + ", m, v" + std::to_string(i) + ");\n";
    };
    store(nl, static_cast<int>(nl + ns + p.instrs.size() - 1));
    for (std::size_t k = 0; k < p.side.size(); ++k) store(nl + 1 + k, p.side[k].first);
    s += "        };\n";
    s += "        i64 i = 0;\n";
    s += "        for (; i + L <= n; i += L) chunk.template operator()<true>(i, L);\n";
    s += "        if (i < n) chunk.template operator()<false>(i, static_cast<int>(n - i));\n";
    s += "        pos += n;\n        idx[R - 1] += n;\n";
    s += "        for (int d = R - 1; d > 0 && idx[d] == shape[d]; --d) { idx[d] = 0; ++idx[d - 1]; }\n";
    s += "    }\n}\n";
    return s;
}

}  // namespace kiln::detail::cppgen
