// Autograd: the backward graph recorded as ops run, the engine that walks it, kiln::grad.
#pragma once

#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/evaluate.hpp"

namespace kiln::autograd {

namespace detail {

struct Recorder;

/// A tensor kept for backward, with its storage's version when saved: reading it after an
/// in-place write is a GradError naming the op that saved it.
class Saved {
public:
    Saved() = default;
    explicit Saved(const Tensor& t) : t_(t.detach()), version_(t.storage() ? t.storage()->version() : 0) {}
    KILN_DECL const Tensor& get(const Node& by) const;
    bool defined() const { return t_.defined(); }

private:
    Tensor t_;
    std::uint32_t version_ = 0;
};

/// Where an operand's gradient goes: the node that made it, or a leaf's accumulator.
struct Edge {
    std::shared_ptr<Node> fn;
    std::shared_ptr<Meta> leaf;
    bool live() const { return fn || leaf; }
};

/// The edge for operand t (none when t does not require grad).
inline Edge edge_of(const Tensor& t) {
    const auto& m = t.autograd_meta();
    if (!m) return {};
    if (m->grad_fn) return {m->grad_fn, nullptr};
    if (m->requires_grad) return {nullptr, m};
    return {};
}

}  // namespace detail

/// One recorded op: gradients of its operands from the gradient of its result. Subclasses are the
/// table ops' rule (one per op, from the op table's vjp), reductions, views, matmul, copies and
/// library calls.
class Node {
public:
    Node(std::string name, const std::source_location& loc) : name_(std::move(name)), loc_(loc) {}
    virtual ~Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;

    /// The gradient of each operand (undefined where the operand needs none), given the gradient
    /// of the result. Runs with recording off.
    virtual std::vector<Tensor> apply(const Tensor& grad) = 0;

    const std::string& name() const { return name_; }
    const std::source_location& loc() const { return loc_; }
    const std::vector<detail::Edge>& edges() const { return edges_; }
    /// The result's shape, dtype and device: an incoming gradient must match them.
    Shape shape;
    DType dtype = DType::f32;

protected:
    friend struct detail::Recorder;
    std::string name_;
    std::source_location loc_;
    std::vector<detail::Edge> edges_;
};

namespace detail {

/// A node whose backward is a function (views, copies, matmul, library calls).
class FnNode final : public Node {
public:
    using Fn = std::function<std::vector<Tensor>(const Tensor& grad, const Node& self)>;
    FnNode(std::string name, const std::source_location& loc, Fn fn) : Node(std::move(name), loc), fn_(std::move(fn)) {}
    std::vector<Tensor> apply(const Tensor& grad) override { return fn_(grad, *this); }

private:
    Fn fn_;
};

/// Makes `out` the result of `node` over `operands` when recording is on and an operand requires
/// grad (otherwise leaves out alone): the node's edges are the operands'. Returns out.
struct Recorder {
    KILN_DECL static Tensor& attach(Tensor& out, std::shared_ptr<Node> node, const std::vector<const Tensor*>& operands);
};

/// A library op with a hand-written backward: out = forward() (run with recording off), and when
/// an operand requires grad, `backward(grad, node)` gives each operand's gradient. The way an op
/// outside the table (embedding, cat, a fused kernel) joins autograd.
template <class Forward>
Tensor record_call(std::string name, const std::vector<const Tensor*>& operands, Forward&& forward, FnNode::Fn backward,
                   const std::source_location& loc) {
    bool need = false;
    if (grad_mode())
        for (const Tensor* t : operands) need = need || (t->defined() && t->requires_grad());
    if (!need) return forward();
    Tensor out;
    {
        const no_grad off;
        out = forward();
    }
    return Recorder::attach(out, std::make_shared<FnNode>(std::move(name), loc, std::move(backward)), operands);
}

/// g summed over the dims it was broadcast along, to `shape` (the gradient of a broadcast operand).
KILN_DECL Tensor sum_to(const Tensor& g, const Shape& shape);

/// Runs backward from `roots` with their gradients: each node once, after every node that feeds
/// it, accumulating into the leaves' grad(); or, when `inputs` is given, returning the gradients
/// of those tensors instead (kiln::grad) without touching any grad().
KILN_DECL std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                           const std::vector<Tensor>& inputs, const std::source_location& loc);

}  // namespace detail

/// Calls hook(grad) whenever a backward pass has finished accumulating into leaf's grad(): after
/// the last gradient that pass sends it (torch's Tensor.register_post_accumulate_grad_hook). The
/// hook runs on the thread that runs backward, with recording off; under kiln::compile it runs
/// while the step is traced, so what it does is recorded into the program. Returns an id for
/// remove_post_accumulate_grad_hook. GradError unless leaf is a leaf that requires grad.
KILN_DECL int register_post_accumulate_grad_hook(Tensor& leaf, std::function<void(const Tensor&)> hook,
                                                 std::source_location loc = std::source_location::current());
/// Removes a hook registered on leaf (an unknown id does nothing).
KILN_DECL void remove_post_accumulate_grad_hook(const Tensor& leaf, int id);
/// Gives leaf's gradient its memory: whenever backward finds leaf.grad() undefined, it writes the
/// gradient into `buffer` and makes `buffer` the grad (a gradient that exists is added to where it
/// is, as always). DataParallel makes every gradient a view of its bucket this way, so the
/// all-reduce works in place (torch's gradient_as_bucket_view). An undefined buffer removes it.
/// GradError unless leaf is a leaf that requires grad; ShapeError / DTypeError / DeviceError
/// unless buffer matches leaf.
KILN_DECL void set_grad_buffer(Tensor& leaf, const Tensor& buffer, std::source_location loc = std::source_location::current());
namespace detail {
/// Where the backward pass running on this thread was called (the user's backward() or grad()
/// line), for errors raised by hooks and callbacks; nullptr outside a backward pass.
KILN_DECL const std::source_location* backward_location();
}  // namespace detail

/// Runs f once the backward pass running on this thread has finished, after every gradient was
/// accumulated (torch's Variable._execution_engine.queue_callback); callbacks run in the order they
/// were queued. GradError outside a backward pass.
KILN_DECL void queue_callback(std::function<void()> f, std::source_location loc = std::source_location::current());

/// Gradients of `output` (a scalar, or with `grad_output` of its shape) with respect to `inputs`,
/// returned instead of accumulated into grad() (torch.autograd.grad). An input the output does
/// not depend on gets an undefined tensor.
inline std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs, const Tensor& grad_output = {},
                                std::source_location loc = std::source_location::current()) {
    return detail::run_backward({output}, {grad_output}, inputs, loc);
}

}  // namespace kiln::autograd

namespace kiln {

/// JAX's grad: a function returning the gradients of f (which returns a scalar Tensor) with
/// respect to its Tensor arguments `argnums` (default: the first), in argument order. It mutates nothing: the
/// arguments are detached copies of the handles, marked to require grad inside the call.
///   auto df = kiln::grad([](const Tensor& x) { return kiln::sum(x * x); });
///   Tensor g = df(x)[0];  // 2 x
template <class F>
auto value_and_grad(F f, std::vector<int> argnums = {0}) {
    return [f = std::move(f), argnums](const auto&... args) {
        std::vector<Tensor> marked;
        auto prep = [&](int i, const auto& a) -> decltype(auto) {
            using A = std::remove_cvref_t<decltype(a)>;
            if constexpr (std::is_same_v<A, Tensor>) {
                for (int k : argnums)
                    if (k == i) {
                        Tensor t = a.detach();
                        t.requires_grad_();
                        marked.push_back(t);
                        return t;
                    }
                return a.detach();
            } else {
                return a;
            }
        };
        const enable_grad on;
        auto call = [&](auto&&... prepared) { return f(prepared...); };
        auto tup = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return std::tuple{prep(static_cast<int>(I), args)...};  // left to right: `marked` in argument order
        }(std::index_sequence_for<decltype(args)...>{});
        const Tensor value = std::apply(call, tup);
        std::vector<Tensor> grads = autograd::grad(value, marked);
        return std::pair<Tensor, std::vector<Tensor>>{value.detach(), std::move(grads)};
    };
}
template <class F>
auto grad(F f, std::vector<int> argnums = {0}) {
    return [vg = value_and_grad(std::move(f), std::move(argnums))](const auto&... args) { return vg(args...).second; };
}

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/autograd/autograd_impl.hpp"
#endif
