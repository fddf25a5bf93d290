// The activation table: the activations a matrix product or convolution applies to its result
// (nn::Linear's `act`, cuBLASLt's and cuDNN's epilogues, the fuser's epilogue absorption). One row
// per activation; nn::Act, cuda::Epilogue and the fuser read it, and ops/activations.hpp binds each
// to its formula.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/tables/op_table.hpp"

namespace kiln {

/// An activation applied after a matrix product or convolution.
enum class Act : std::uint8_t {
    none,       ///< identity
    relu,       ///< max(x, 0)
    gelu_tanh,  ///< GELU, tanh approximation (torch's approximate='tanh', BERT's "gelu_new")
    gelu,       ///< GELU, exact (erf) form (BERT's "gelu")
};

/// What kiln knows about one activation.
struct ActInfo {
    Act act;
    std::string_view name;  ///< for messages, logs and kernel names
    int op;                 ///< the op-table op that computes it (ops::op_id), -1 for none and composites
    bool gemm_epilogue;     ///< a CUDA GEMM applies it after the product (cuBLASLt's epilogue or the small
                            ///< kernel's; the exact gelu, which cuBLASLt lacks, in a pass after cuBLASLt),
                            ///< so the fuser may absorb it
    bool conv_epilogue;     ///< cuDNN's fused convolution applies it
};

/// The rows, in enum order.
inline constexpr std::array<ActInfo, 4> act_table{{
    {Act::none, "none", -1, true, true},
    {Act::relu, "relu", static_cast<int>(ops::op_id<ops::Relu>), true, true},
    {Act::gelu_tanh, "gelu_tanh", static_cast<int>(ops::op_id<ops::GeluTanh>), true, false},
    {Act::gelu, "gelu", -1, true, false},  // a composite of erf (ops/composites.hpp); cuBLASLt's GELU is the tanh form
}};

namespace detail {
constexpr bool act_table_in_order() {
    for (std::size_t i = 0; i < act_table.size(); ++i)
        if (static_cast<std::size_t>(act_table[i].act) != i) return false;
    return true;
}
static_assert(act_table_in_order(), "act_table rows must follow enum Act's order");
}  // namespace detail

/// The table row of an activation.
constexpr const ActInfo& act_info(Act a) { return act_table[static_cast<std::size_t>(a)]; }

/// The activation's name ("gelu_tanh").
constexpr std::string_view act_name(Act a) { return act_info(a).name; }

/// The activation a table op computes, if it is one (relu -> Act::relu).
constexpr std::optional<Act> act_of_op(ops::OpId op) {
    for (const ActInfo& r : act_table)
        if (r.op >= 0 && static_cast<ops::OpId>(r.op) == op) return r.act;
    return std::nullopt;
}

}  // namespace kiln
