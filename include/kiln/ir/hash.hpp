// Structural hash of a graph: equal for graphs that compute the same thing in the same way.
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

}  // namespace kiln::ir
