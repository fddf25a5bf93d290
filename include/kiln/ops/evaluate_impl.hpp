// Evaluating expressions through their flat form (EvalState, statements, eager), compiled once
// in separate mode.
#pragma once
// Included at the end of kiln/ops/evaluate.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <memory>
#include <vector>

namespace kiln::expr {

namespace detail {
/// Lowers f into p's instructions (leaf k is p's leaf k, scalar s its scalar s). Agnostic
/// (bool-valued) ops run in the compute type of their first node operand, else f32.
inline void lower(const Flat& f, kiln::detail::TileProgram& p) {
    std::vector<int> value(f.items.size()), ct(f.items.size(), -1);
    for (std::size_t i = 0; i < f.items.size(); ++i) {
        const Flat::Item& it = f.items[i];
        if (it.kind == Flat::Kind::tensor) {
            value[i] = p.leaf_value(it.index);
        } else if (it.kind == Flat::Kind::scalar) {
            value[i] = p.scalar_value(it.index);
        } else {
            DType c = it.info->ct;
            if (it.info->agnostic) {
                c = DType::f32;
                for (int k = 0; k < it.arity; ++k)
                    if (ct[it.in[k]] >= 0) {
                        c = static_cast<DType>(ct[it.in[k]]);
                        break;
                    }
            }
            kiln::detail::TileProgram::Instr ins{it.op, c, it.attr, {-1, -1, -1}};
            for (int k = 0; k < it.arity; ++k) ins.in[k] = value[it.in[k]];
            p.instrs.push_back(ins);
            value[i] = p.instr_value(static_cast<int>(p.instrs.size() - 1));
            ct[i] = static_cast<int>(c);
        }
    }
}
}  // namespace detail

KILN_DECL EvalState::EvalState(const Flat& f, Fused fused, const Shape& shape, const std::vector<int>& perm,
                               std::vector<kiln::detail::Access*> extra) {
    std::vector<const Tensor*> leaves;
    collect(f, leaves, scalars_);
    for (const Tensor* t : leaves) leaves_.push_back(kiln::detail::access_of(*t, shape));
    space_.shape = shape;
    std::vector<kiln::detail::Access*> all;
    for (auto& a : leaves_) all.push_back(&a);
    for (auto* a : extra) all.push_back(a);
    if (!perm.empty()) {
        Shape s = shape;
        for (std::size_t i = 0; i < perm.size(); ++i) s[static_cast<int>(i)] = shape[perm[i]];
        for (auto* a : all) {
            Strides st = a->strides;
            for (std::size_t i = 0; i < perm.size(); ++i) st[static_cast<int>(i)] = a->strides[perm[i]];
            a->strides = st;
        }
        space_.shape = s;
    }
    kiln::detail::collapse(space_, all);
    for (const auto& a : leaves_) direct_.push_back(kiln::detail::is_linear(space_, a));
    // the expression type's fused loop in the floating compute types (one across the tree); a tree
    // of integer compute type (or of mixed ones), or one without a fused loop, runs on the tile
    // interpreter, compiled once; so does a tree with an add of bool result (Flat::bool_add)
    const int tree_ct = f.info().tree_ct;
    const DType tree = tree_ct == Info::tree_none ? DType::f32 : static_cast<DType>(tree_ct);
    if (fused.tile && !f.bool_add && tree_ct != Info::tree_mixed && (tree == DType::f32 || tree == DType::f64)) {
        fused_ = fused;
        ct_ = tree;
        return;
    }
    prog_ = std::make_unique<kiln::detail::TileProgram>();
    prog_->space = space_;
    prog_->leaves = leaves_;
    prog_->scalars = scalars_;
    detail::lower(f, *prog_);
    runner_ = std::make_unique<kiln::detail::ProgramRunner>(*prog_);
    ct_ = runner_->result_ct();
}

KILN_DECL void evaluate_into(const Flat& f, Fused fused, const Tensor& out) {
    if (out.numel() == 0) return;
    const Info& info = f.info();
    if (out.device().is_cuda() || on_cuda(f)) {
        // the statement's kernel writes straight into out when it can (contiguous, same shape and
        // dtype); otherwise into a new tensor that is then converted, broadcast and copied
        const auto here = std::source_location::current();
        if (out.device().is_cuda() && info.shape == out.shape() && info.dtype == out.dtype()) {  // contiguous or a strided view
            (void)cuda::detail::eval_expr(f, here, &out);
            return;
        }
        const Tensor v = cuda::detail::eval_expr(f, here);
        const Tensor w = v.shape() == out.shape() && v.dtype() == out.dtype()
                             ? v
                             : cuda::detail::eval_expr(flatten(make<ops::Cast>(out.dtype(), v.expand(out.shape()))), here);
        if (out.is_contiguous()) cuda::detail::copy_contiguous_into(out, w);
        else (void)cuda::detail::eval_expr(flatten(make<ops::Cast>(out.dtype(), w)), here, &out);
        return;
    }
    kiln::detail::Access oa = kiln::detail::access_of(out, out.shape());
    EvalState ev(f, fused, out.shape(), {}, {&oa});
    // written straight into the output's memory (store_tiles' direct case): large ones streamed
    ev.set_stream(kiln::detail::is_linear(ev.space(), oa) && oa.dtype == ev.ct() &&
                  ev.space().numel() * static_cast<std::int64_t>(dtype_size(oa.dtype)) >= simd::stream_min_bytes);
    kiln::detail::store_tiles(ev.space(), oa, ev.ct(),
                              [&](std::int64_t start, std::int64_t len, void* dst) { ev.tile(start, len, dst); });
}

KILN_DECL Tensor run_single_op(ops::OpId op, const Info& info, DType attr, const std::vector<Tensor>& tensors,
                               const std::vector<int>& operand_is_tensor, const std::vector<double>& scalars) {
    DType ct = info.ct;
    if (info.agnostic) {  // bool-valued logic: run in the operands' compute type, f32 for bools
        ct = DType::f32;
        for (const Tensor& t : tensors)
            if (t.dtype() != DType::boolean) { ct = compute_dtype(t.dtype()); break; }
    }
    for (const Tensor& t : tensors)
        if (t.device().is_cuda()) return cuda::detail::run_op(op, info.dtype, ct, attr, info.shape, tensors, operand_is_tensor, scalars);
    kiln::detail::TileProgram p;
    Tensor out(info.shape, info.dtype);
    p.scalars = scalars;
    for (const Tensor& t : tensors) p.leaves.push_back(kiln::detail::access_of(t, out.shape()));
    p.out = kiln::detail::access_of(out, out.shape());
    p.space.shape = out.shape();
    std::vector<kiln::detail::Access*> all{&p.out};
    for (auto& a : p.leaves) all.push_back(&a);
    kiln::detail::collapse(p.space, all);
    kiln::detail::TileProgram::Instr ins{op, ct, attr, {-1, -1, -1}};
    int nt = 0, ns = 0;
    for (std::size_t k = 0; k < operand_is_tensor.size(); ++k)
        ins.in[k] = operand_is_tensor[k] ? p.leaf_value(nt++) : p.scalar_value(ns++);
    p.instrs.push_back(ins);
    if (out.numel() > 0) kiln::detail::run_program(p);
    return out;
}

KILN_DECL Tensor eager_eval(const Flat& f) {
    std::vector<Tensor> value(f.items.size());
    for (std::size_t i = 0; i < f.items.size(); ++i) {
        const Flat::Item& it = f.items[i];
        if (it.kind == Flat::Kind::tensor) {
            value[i] = *it.tensor;
        } else if (it.kind == Flat::Kind::op) {
            std::vector<Tensor> tensors;
            std::vector<int> is_tensor;
            std::vector<double> scalars;
            for (int k = 0; k < it.arity; ++k) {
                const Flat::Item& a = f.items[it.in[k]];
                if (a.kind == Flat::Kind::scalar) {
                    scalars.push_back(a.value);
                    is_tensor.push_back(0);
                } else {
                    tensors.push_back(value[it.in[k]]);
                    is_tensor.push_back(1);
                }
            }
            value[i] = run_single_op(it.op, *it.info, it.attr, tensors, is_tensor, scalars);
            for (int k = 0; k < it.arity; ++k) value[it.in[k]] = Tensor();  // each value has one reader
        }
    }
    return value.back();
}

KILN_DECL Tensor eval_statement(const Flat& f, Fused fused, const std::source_location& loc) {
    if (autograd::detail::needs_grad(f)) return autograd::detail::statement(f, loc);
    if (any_traced(f)) return trace::record_expr(f, loc);
    const Info& info = f.info();
    if (!info.ok()) info.raise(loc);
    if (on_cuda(f)) return cuda::detail::eval_expr(f, loc);
    Tensor out(info.shape, info.dtype);
    evaluate_into(f, fused, out);
    return out;
}

KILN_DECL void assign_into(Tensor& t, const Flat& f, Fused fused, const std::source_location& loc) {
    const Info& info = f.info();
    if (autograd::detail::grad_mode() && (t.requires_grad() || autograd::detail::needs_grad(f))) {
        // recorded: the value with its history, then written; t's handle takes the history
        autograd::detail::before_write(t, "assign", loc);
        if (!info.ok()) info.raise(loc);
        const Tensor v = autograd::detail::statement(f, loc);
        {
            const no_grad off;
            t.copy_(v, loc);
        }
        autograd::detail::after_write(t, v);
        return;
    }
    if (t.storage()) t.storage()->bump_version();
    if (trace::Tracer* tr = trace::Tracer::active(); t.is_traced() || any_traced(f) || (tr && tr->records_write_into(t))) {
        // inside a traced function a write is recorded (functionalized): the tensor's base
        // gets a new value, which every view of it sees and the program writes back
        if (tr == nullptr) kiln::detail::fail<Error>("assign", "a tracing tensor was used outside its traced call", loc);
        if (!info.ok()) info.raise(loc);
        tr->write(t, trace::detail::lower(*tr, f), loc);
        return;
    }
    if (!info.ok()) info.raise(loc);
    Shape b;
    if (!kiln::detail::try_broadcast(info.shape, t.shape(), b) || !(b == t.shape()))
        kiln::detail::fail<ShapeError>("assign", "cannot write a value of shape " + info.shape.str() +
                                                     " into a tensor of shape " + t.shape().str(), loc);
    bool alias = false;
    for (const Flat::Item& it : f.items)
        alias = alias || (it.kind == Flat::Kind::tensor && may_alias(t, *it.tensor));
    if (alias) {  // evaluate first, then write
        t.copy_(eval_statement(f, fused, loc), loc);
        return;
    }
    evaluate_into(f, fused, t);
}

}  // namespace kiln::expr
