// Shape and dtype inference of expression nodes, compiled once in separate mode.
#pragma once
// Included at the end of kiln/expr/node.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <memory>
#include <string>

namespace kiln::expr {

KILN_DECL Info infer_node(ops::OpId op, const OperandInfo* in, int n, DType attr) {
    using ops::DTypeRule;
    const DTypeRule rule = ops::op_rule(op);
    Info out;
    out.agnostic = false;
    // the first fault in the operands wins
    for (int k = 0; k < n; ++k)
        if (in[k].info && !in[k].info->ok()) {
            out.fault = in[k].info->fault;
            out.error = in[k].info->error;
            return out;
        }
    auto fail = [&](Info::Fault f, std::string msg) {
        out.fault = f;
        out.error = std::make_shared<const std::string>("kiln::" + std::string(ops::op_name(op)) + ": " + msg);
        return out;
    };
    // broadcast shapes
    std::string shapes;
    bool first = true, bad = false;
    for (int k = 0; k < n; ++k) {
        if (!in[k].info) continue;
        const Shape& s = in[k].info->shape;
        shapes += (shapes.empty() ? "" : " with ") + s.str();
        if (first) {
            out.shape = s;
            first = false;
        } else if (!bad && !kiln::detail::try_broadcast(out.shape, s, out.shape)) {
            bad = true;
        }
    }
    if (bad) return fail(Info::Fault::shape, "cannot broadcast " + shapes);
    // promote dtypes (where: the condition does not take part)
    kiln::detail::ResultType rt;
    std::string dtypes;
    DType cond = DType::boolean;
    for (int k = 0; k < n; ++k) {
        const bool skip = rule == DTypeRule::where && k == 0;
        if (!in[k].info) {
            dtypes += (dtypes.empty() ? "" : ", ") + std::string("scalar");
            if (!skip) rt.scalar(*in[k].scalar);
        } else {
            const Info& i = *in[k].info;
            dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(i.dtype));
            if (skip) cond = i.dtype;
            else rt.tensor(i.dtype, i.shape.rank() == 0);
        }
    }
    if (rule == DTypeRule::where && cond != DType::boolean)
        return fail(Info::Fault::dtype, "the condition must be bool, got " + std::string(dtype_name(cond)));
    const DType p = rt.result();
    if (!(ops::op_allowed_categories(op) & (1u << dtype_category(p))))
        return fail(Info::Fault::dtype, "not supported for dtype " + std::string(dtype_name(p)) + " (operands: " + dtypes + ")");
    switch (rule) {
        case DTypeRule::same: case DTypeRule::where:
            out.dtype = p;
            out.ct = compute_dtype(p);
            out.agnostic = p == DType::boolean;
            break;
        case DTypeRule::float_math:
            out.dtype = is_floating(p) ? p : default_float_dtype;
            out.ct = compute_dtype(out.dtype);
            break;
        case DTypeRule::compare: case DTypeRule::logical:
            out.dtype = DType::boolean;
            out.ct = compute_dtype(p);
            out.agnostic = p == DType::boolean;
            break;
        case DTypeRule::cast:
            out.dtype = attr;
            out.ct = attr == DType::boolean ? compute_dtype(p) : compute_dtype(attr);
            out.agnostic = attr == DType::boolean && p == DType::boolean;
            break;
    }
    // the compute type the whole tree shares, if any (tensor leaves take no part: tree_none)
    out.tree_ct = out.agnostic ? Info::tree_none : static_cast<int>(out.ct);
    for (int k = 0; k < n; ++k) {
        if (!in[k].info) continue;
        const int c = in[k].info->tree_ct;
        if (c == Info::tree_none) continue;
        if (out.tree_ct == Info::tree_none) out.tree_ct = c;
        else if (c != out.tree_ct) out.tree_ct = Info::tree_mixed;
    }
    return out;
}

}  // namespace kiln::expr
