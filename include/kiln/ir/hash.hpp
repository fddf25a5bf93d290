// Structural hash and equality of graphs: equal for graphs that compute the same thing in the same way.
#pragma once

#include <bit>
#include <cstdint>

#include "kiln/ir/graph.hpp"

namespace kiln::ir {

inline std::uint64_t hash_mix(std::uint64_t h, std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/// Hash of one node's own attributes and operand ids (not its shape: shapes are guarded).
inline std::uint64_t node_hash(const Node& n) {
    std::uint64_t h = hash_mix(0, static_cast<std::uint64_t>(n.kind));
    h = hash_mix(h, static_cast<std::uint64_t>(n.dtype));
    for (int i : n.in) h = hash_mix(h, static_cast<std::uint64_t>(i));
    switch (n.kind) {
        case Kind::input: h = hash_mix(h, static_cast<std::uint64_t>(n.index)); break;
        case Kind::constant:
            h = hash_mix(h, reinterpret_cast<std::uintptr_t>(n.tensor.storage().get()));
            h = hash_mix(h, static_cast<std::uint64_t>(n.tensor.offset()));
            for (auto st : n.tensor.strides()) h = hash_mix(h, static_cast<std::uint64_t>(st));
            break;
        case Kind::scalar: h = hash_mix(h, std::bit_cast<std::uint64_t>(n.value)); break;
        case Kind::elementwise:
            h = hash_mix(h, static_cast<std::uint64_t>(n.op));
            h = hash_mix(h, static_cast<std::uint64_t>(n.ct));
            h = hash_mix(h, static_cast<std::uint64_t>(n.attr));
            break;
        case Kind::reduce:
        case Kind::arg_reduce:
            h = hash_mix(h, static_cast<std::uint64_t>(n.rkind));
            h = hash_mix(h, n.mask);
            h = hash_mix(h, (n.keepdim ? 1u : 0u) | (n.arg_max ? 2u : 0u));
            h = hash_mix(h, std::bit_cast<std::uint64_t>(n.correction));
            break;
        case Kind::matmul: break;
        case Kind::call:
            for (char c : n.call->key) h = hash_mix(h, static_cast<std::uint64_t>(static_cast<unsigned char>(c)));
            break;
        case Kind::view: case Kind::view_write:
            h = hash_mix(h, static_cast<std::uint64_t>(n.vkind));
            for (auto a : n.args) h = hash_mix(h, static_cast<std::uint64_t>(a));
            for (auto d : n.shape) h = hash_mix(h, static_cast<std::uint64_t>(d));
            h = hash_mix(h, std::bit_cast<std::uint64_t>(n.value));
            h = hash_mix(h, n.mask);
            break;
    }
    return h;
}

/// Structural hash of the whole graph (node order, attributes, outputs).
inline std::uint64_t structural_hash(const Graph& g) {
    std::uint64_t h = 0x6b696c6eull;  // "kiln"
    for (const Node& n : g.nodes) h = hash_mix(h, node_hash(n));
    for (int o : g.outputs) h = hash_mix(h, static_cast<std::uint64_t>(o) + 0x100000000ull);
    return h;
}

/// Whether two nodes are the same computation: what node_hash reads, and shapes (a cache keyed by
/// the hash compares with this, so two graphs that collide are never taken for each other).
inline bool same_node(const Node& a, const Node& b) {
    if (a.kind != b.kind || a.dtype != b.dtype || a.in != b.in || !(a.shape == b.shape)) return false;
    switch (a.kind) {
        case Kind::input: return a.index == b.index;
        case Kind::constant:
            return a.tensor.storage() == b.tensor.storage() && a.tensor.offset() == b.tensor.offset() &&
                   a.tensor.strides() == b.tensor.strides() && a.tensor.dtype() == b.tensor.dtype() && a.fresh == b.fresh;
        case Kind::scalar: return std::bit_cast<std::uint64_t>(a.value) == std::bit_cast<std::uint64_t>(b.value);
        case Kind::elementwise: return a.op == b.op && a.ct == b.ct && a.attr == b.attr;
        case Kind::reduce:
        case Kind::arg_reduce:
            return a.rkind == b.rkind && a.mask == b.mask && a.keepdim == b.keepdim && a.arg_max == b.arg_max &&
                   std::bit_cast<std::uint64_t>(a.correction) == std::bit_cast<std::uint64_t>(b.correction);
        case Kind::matmul: return true;
        case Kind::call: return a.call->key == b.call->key;
        case Kind::view: case Kind::view_write:
            return a.vkind == b.vkind && a.args == b.args && std::bit_cast<std::uint64_t>(a.value) == std::bit_cast<std::uint64_t>(b.value) &&
                   a.mask == b.mask;
    }
    return false;
}

/// Whether two graphs are structurally equal: the same nodes in the same order, and the same outputs.
inline bool structurally_equal(const Graph& a, const Graph& b) {
    if (a.nodes.size() != b.nodes.size() || a.outputs != b.outputs) return false;
    for (std::size_t i = 0; i < a.nodes.size(); ++i)
        if (!same_node(a.nodes[i], b.nodes[i])) return false;
    return true;
}

}  // namespace kiln::ir
