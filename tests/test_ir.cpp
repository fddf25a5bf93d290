// The ir layer, each pass and the guards, on hand-built graphs: ir::verify rejects each broken
// invariant, structural hashing and equality tell graphs apart (a constant view of the same memory
// with other strides included), each pass does its one rewrite and keeps the values, and
// TensorGuard passes and fails on exactly the changes it should.
#include <doctest/doctest.h>

#include <kiln/kiln.hpp>
#include <kiln/backends/cpu/graph_exec.hpp>
#include <kiln/cache/guards.hpp>
#include <kiln/ir/hash.hpp>
#include <kiln/ir/verify.hpp>
#include <kiln/passes/pipeline.hpp>

#include "test_util.hpp"

#include <string>
#include <vector>

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
namespace ir = kiln::ir;
namespace ops = kiln::ops;

int input(ir::Graph& g, Shape s, int index, DType dt = DType::f32) {
    ir::Node n;
    n.kind = ir::Kind::input;
    n.dtype = dt;
    n.shape = s;
    n.index = index;
    const int id = g.add(std::move(n));
    g.inputs.push_back(id);
    return id;
}

int scalar(ir::Graph& g, double v, DType dt = DType::f32) {
    ir::Node n;
    n.kind = ir::Kind::scalar;
    n.dtype = dt;
    n.value = v;
    return g.add(std::move(n));
}

int constant(ir::Graph& g, const Tensor& t) {
    ir::Node n;
    n.kind = ir::Kind::constant;
    n.dtype = t.dtype();
    n.shape = t.shape();
    n.tensor = t;
    return g.add(std::move(n));
}

template <class Op>
int ew(ir::Graph& g, std::vector<int> in, Shape s, DType dt = DType::f32) {
    ir::Node n;
    n.kind = ir::Kind::elementwise;
    n.op = ops::op_id<Op>;
    n.dtype = dt;
    n.ct = kiln::compute_dtype(dt);
    n.attr = dt;
    n.shape = s;
    n.in = std::move(in);
    return g.add(std::move(n));
}

int sum(ir::Graph& g, int x, unsigned mask, Shape s) {
    ir::Node n;
    n.kind = ir::Kind::reduce;
    n.rkind = ir::ReduceKind::sum;
    n.dtype = DType::f32;
    n.ct = DType::f32;
    n.mask = mask;
    n.keepdim = true;
    n.shape = s;
    n.in = {x};
    return g.add(std::move(n));
}

/// Runs g on the CPU program (each node its own kernel) with these inputs.
std::vector<Tensor> run(const ir::Graph& g, const std::vector<Tensor>& in) {
    const kiln::fuse::Plan plan = kiln::fuse::plan(g);
    kiln::detail::CpuGraphProgram prog(g, plan);
    return prog.run(in);
}

std::string verify_error(const ir::Graph& g) {
    try {
        ir::verify(g, "test");
    } catch (const kiln::InternalError& e) {
        return e.what();
    }
    return "";
}

/// The plan, one group per line (a failing check's context).
std::string plan_text(const ir::Graph& g, const kiln::fuse::Plan& p) {
    std::string s = ir::to_string(g);
    for (const auto& G : p.groups) {
        s += kiln::fuse::group_kind_name(G.kind) + std::string(" {");
        for (int j : G.nodes) s += " %" + std::to_string(j);
        s += " } ->";
        for (int j : G.outputs) s += " %" + std::to_string(j);
        s += " reads";
        for (int j : G.leaves) s += " %" + std::to_string(j);
        s += "\n";
    }
    return s;
}

}  // namespace

TEST_CASE("ir::verify accepts a well-formed graph and names each broken invariant") {
    ir::Graph g;
    const int x = input(g, {3, 4}, 0), b = input(g, {4}, 1);
    const int y = ew<ops::Add>(g, {x, b}, {3, 4});
    g.outputs = {y};
    CHECK(verify_error(g).empty());

    ir::Graph late = g;  // an operand that does not precede its user
    late[y].in = {x, y};
    CHECK(verify_error(late).find("%2 uses %2, which does not precede it") != std::string::npos);

    ir::Graph arity = g;
    arity[y].in = {x};
    CHECK(verify_error(arity).find("wrong number of operands") != std::string::npos);

    ir::Graph shape = g;
    shape[y].shape = {3, 5};
    CHECK(verify_error(shape).find("has shape (3, 5) but its operands broadcast to (3, 4)") != std::string::npos);

    ir::Graph nobcast;
    const int p = input(nobcast, {3, 4}, 0), q = input(nobcast, {5}, 1);
    nobcast.outputs = {ew<ops::Mul>(nobcast, {p, q}, {3, 4})};
    CHECK(verify_error(nobcast).find("do not broadcast") != std::string::npos);

    ir::Graph out = g;
    out.outputs = {7};
    CHECK(verify_error(out).find("output out of range") != std::string::npos);

    ir::Graph leaf = g;
    leaf[x].in = {b};
    CHECK(verify_error(leaf).find("does not precede") != std::string::npos);  // reported before the leaf rule
    ir::Graph leaf2 = g;
    leaf2[b].in = {x};
    CHECK(verify_error(leaf2).find("is a leaf with operands") != std::string::npos);
}

TEST_CASE("structural hash and equality: equal for the same computation, different for any change") {
    const Tensor w = kiln::randn({4, 4});
    auto build = [&](const Tensor& c, double k, DType dt) {
        ir::Graph g;
        const int x = input(g, {4, 4}, 0, dt);
        const int wc = constant(g, c);
        const int m = ew<ops::Mul>(g, {x, wc}, {4, 4}, dt);
        g.outputs = {ew<ops::Add>(g, {m, scalar(g, k, dt)}, {4, 4}, dt)};
        return g;
    };
    const ir::Graph a = build(w, 1.5, DType::f32), b = build(w, 1.5, DType::f32);
    CHECK(ir::structural_hash(a) == ir::structural_hash(b));
    CHECK(ir::structurally_equal(a, b));

    const ir::Graph other_scalar = build(w, 2.5, DType::f32);
    CHECK(ir::structural_hash(a) != ir::structural_hash(other_scalar));
    CHECK_FALSE(ir::structurally_equal(a, other_scalar));

    const ir::Graph other_dtype = build(w.to(DType::f64), 1.5, DType::f64);
    CHECK_FALSE(ir::structurally_equal(a, other_dtype));

    // the same memory seen with other strides (w and its transpose) is another constant
    const ir::Graph transposed = build(w.t(), 1.5, DType::f32);
    CHECK(transposed[1].tensor.storage() == a[1].tensor.storage());
    CHECK(ir::structural_hash(a) != ir::structural_hash(transposed));
    CHECK_FALSE(ir::structurally_equal(a, transposed));

    ir::Graph other_op = a;
    other_op[2].op = ops::op_id<ops::Sub>;
    CHECK(ir::structural_hash(a) != ir::structural_hash(other_op));
    CHECK_FALSE(ir::structurally_equal(a, other_op));

    ir::Graph other_outputs = a;
    other_outputs.outputs = {2};
    CHECK_FALSE(ir::structurally_equal(a, other_outputs));
}

TEST_CASE("a graph-breaking function whose segments collide on everything but a constant's strides runs each right") {
    // two traces whose segments differ only in which view of one square matrix they read: the
    // segment cache matches by full structural equality, not by the hash alone
    const Tensor w = kiln::randn({5, 5});
    auto f = kiln::compile([&](const Tensor& x, const Tensor& pick) {
        const bool t = pick.item<float>() > 0;  // a graph break: the value decides the branch
        return Tensor(kiln::matmul(x, t ? w.t() : w) * 2.0);
    });
    const Tensor x = kiln::randn({3, 5});
    const Tensor yes = kiln::ones({1}), no = kiln::zeros({1});
    CHECK(kiln_test::maxdiff(f(x, no), Tensor(kiln::matmul(x, w) * 2.0)) < 1e-5);
    CHECK(kiln_test::maxdiff(f(x, yes), Tensor(kiln::matmul(x, w.t()) * 2.0)) < 1e-5);
    CHECK(kiln_test::maxdiff(f(x, no), Tensor(kiln::matmul(x, w) * 2.0)) < 1e-5);
}

TEST_CASE("each pass does its rewrite and keeps the values") {
    const Tensor xv = kiln::randn({3, 4}), bv = kiln::randn({4});
    SUBCASE("fold_constants: an op over numbers becomes one number, rounded as the kernel would") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0);
        const int c = ew<ops::Mul>(g, {scalar(g, 2), scalar(g, 1.1)}, {});
        g.outputs = {ew<ops::Add>(g, {x, c}, {3, 4})};
        const ir::Graph f = kiln::passes::fold_constants(g);
        ir::verify(f, "fold_constants");
        CHECK(f[c].kind == ir::Kind::scalar);
        CHECK(f[c].value == static_cast<double>(2.0f * 1.1f));  // in f32, the node's compute type
        CHECK(kiln_test::maxdiff(run(f, {xv})[0], Tensor(xv + 2.2)) < 1e-6);
    }
    SUBCASE("eliminate_common_subexpressions: two equal nodes become one") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0), b = input(g, {4}, 1);
        const int s1 = ew<ops::Sin>(g, {x}, {3, 4}), s2 = ew<ops::Sin>(g, {x}, {3, 4});
        g.outputs = {ew<ops::Add>(g, {ew<ops::Mul>(g, {s1, s2}, {3, 4}), b}, {3, 4})};
        const ir::Graph e = kiln::passes::eliminate_common_subexpressions(g);
        ir::verify(e, "cse");
        int sins = 0;
        for (const auto& n : e.nodes) sins += n.kind == ir::Kind::elementwise && n.op == ops::op_id<ops::Sin>;
        CHECK(sins == 1);
        CHECK(kiln_test::maxdiff(run(e, {xv, bv})[0], Tensor(kiln::sin(xv) * kiln::sin(xv) + bv)) < 1e-6);
    }
    SUBCASE("eliminate_dead_code: a node nothing reads is dropped") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0);
        (void)ew<ops::Cos>(g, {x}, {3, 4});
        g.outputs = {ew<ops::Neg>(g, {x}, {3, 4})};
        const ir::Graph d = kiln::passes::eliminate_dead_code(g);
        ir::verify(d, "dce");
        CHECK(d.size() == 2);
        CHECK(kiln_test::maxdiff(run(d, {xv})[0], Tensor(-xv)) == 0);
    }
    SUBCASE("simplify: x + 0, x * 1, -(-x) and cast(cast(x)) are x; the op is matched by id") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0);
        const int a = ew<ops::Add>(g, {x, scalar(g, 0)}, {3, 4});
        const int m = ew<ops::Mul>(g, {a, scalar(g, 1)}, {3, 4});
        const int n2 = ew<ops::Neg>(g, {ew<ops::Neg>(g, {m}, {3, 4})}, {3, 4});
        g.outputs = {n2};
        const ir::Graph s = kiln::passes::eliminate_dead_code(kiln::passes::simplify(g));
        ir::verify(s, "simplify");
        CHECK(s.size() == 1);
        CHECK(s.outputs == std::vector<int>{0});
        // x + 0 is not x when the sum broadcasts x to another shape
        ir::Graph h;
        const int y = input(h, {4}, 0);
        const int z = input(h, {3, 4}, 1);
        const int zero = ew<ops::Mul>(h, {z, scalar(h, 0)}, {3, 4});
        h.outputs = {ew<ops::Add>(h, {y, zero}, {3, 4})};
        const ir::Graph hs = kiln::passes::simplify(h);
        CHECK(hs[hs.outputs[0]].shape == Shape{3, 4});
    }
    SUBCASE("simplify: the sum of a product of broadcast factors never forms the product") {
        ir::Graph g;
        const int a = input(g, {3, 1}, 0), b = input(g, {1, 4}, 1);
        const int p = ew<ops::Mul>(g, {a, b}, {3, 4});
        g.outputs = {sum(g, p, 0b11, {1, 1})};
        const ir::Graph s = kiln::passes::eliminate_dead_code(kiln::passes::simplify(g));
        ir::verify(s, "simplify");
        for (const auto& n : s.nodes) CHECK_FALSE((n.kind == ir::Kind::elementwise && n.shape == Shape{3, 4}));
        const Tensor av = kiln::randn({3, 1}), bw = kiln::randn({1, 4});
        CHECK(kiln_test::maxdiff(run(s, {av, bw})[0], kiln::sum(av * bw, {0, 1}, true)) < 1e-5);
    }
    SUBCASE("delay_waits: work that needs a wait moves after the work that does not; calls keep their order") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0);
        auto call = [&](const char* key, std::vector<int> in, bool waits) {
            auto op = std::make_shared<ir::CallOp>();
            op->key = key;
            op->waits = waits;
            op->shape = [](const std::vector<Shape>& s) { return s[0]; };
            op->run = [](const std::vector<Tensor>& t) { return t[0].clone(); };
            ir::Node n;
            n.kind = ir::Kind::call;
            n.dtype = DType::f32;
            n.shape = {3, 4};
            n.in = std::move(in);
            n.call = std::move(op);
            return g.add(std::move(n));
        };
        const int start = call("start", {x}, false);
        const int w = call("wait", {start}, true);
        const int after = ew<ops::Exp>(g, {w}, {3, 4});        // needs the wait: goes last
        const int indep = ew<ops::Sin>(g, {x}, {3, 4});        // does not: goes before the wait
        const int late_call = call("later call", {x}, false);  // a call after the wait stays after it
        g.outputs = {ew<ops::Add>(g, {after, indep}, {3, 4}), late_call};
        const ir::Graph d = kiln::passes::delay_waits(g);
        ir::verify(d, "delay_waits");
        std::vector<std::string> order;
        for (const auto& n : d.nodes)
            order.push_back(n.kind == ir::Kind::call ? n.call->key : n.kind == ir::Kind::elementwise ? (n.op == ops::op_id<ops::Sin> ? "sin" : n.op == ops::op_id<ops::Exp> ? "exp" : "add") : "x");
        CHECK(order == std::vector<std::string>{"x", "start", "sin", "wait", "exp", "later call", "add"});
        const auto out = run(d, {xv});
        CHECK(kiln_test::maxdiff(out[0], Tensor(kiln::exp(xv) + kiln::sin(xv))) < 1e-6);
        ir::Graph none;
        const int y = input(none, {3, 4}, 0);
        none.outputs = {ew<ops::Sin>(none, {y}, {3, 4})};
        CHECK(kiln::passes::delay_waits(none).size() == none.size());
    }
    SUBCASE("fold_call_epilogue: a residual add and a relu after a library op join it; a value read twice does not") {
        // a library op y = 2x with hooks for + z and relu, as conv2d has
        std::function<std::shared_ptr<const ir::CallOp>(bool, bool)> make = [&](bool res, bool relu) {
            auto op = std::make_shared<ir::CallOp>();
            op->key = std::string("twice") + (res ? ", residual" : "") + (relu ? ", relu" : "");
            op->shape = [](const std::vector<Shape>& s) { return s[0]; };
            op->run = [res, relu](const std::vector<Tensor>& t) {
                Tensor y = Tensor(t[0] * 2.0);
                if (res) y = Tensor(y + t[1]);
                return relu ? Tensor(kiln::relu(y)) : y;
            };
            if (!relu) op->with_relu = [=] { return make(res, true); };
            if (!relu && !res) op->with_residual = [=] { return make(true, false); };
            return std::shared_ptr<const ir::CallOp>(op);
        };
        auto call = [&](ir::Graph& g, int a) {
            ir::Node n;
            n.kind = ir::Kind::call;
            n.dtype = DType::f32;
            n.shape = g[a].shape;
            n.in = {a};
            n.call = make(false, false);
            return g.add(std::move(n));
        };
        auto keys = [](const ir::Graph& g) {
            std::vector<std::string> k;
            for (const auto& n : g.nodes)
                if (n.kind == ir::Kind::call) k.push_back(n.call->key);
            return k;
        };
        const Tensor zv = kiln::randn({3, 4});
        const Tensor x2 = Tensor(xv * 2.0);
        {  // relu(2x + z), z computed after the op: the folded op goes where the relu was
            ir::Graph g;
            const int x = input(g, {3, 4}, 0), zi = input(g, {3, 4}, 1);
            const int y = call(g, x);
            const int z = ew<ops::Sin>(g, {zi}, {3, 4});
            g.outputs = {ew<ops::Relu>(g, {ew<ops::Add>(g, {z, y}, {3, 4})}, {3, 4})};
            const ir::Graph f = kiln::passes::fold_call_epilogue(g);
            ir::verify(f, "fold_call_epilogue");
            CHECK(keys(f) == std::vector<std::string>{"twice, residual, relu"});
            CHECK(f.size() == g.size() - 2);
            CHECK(kiln_test::maxdiff(run(f, {xv, zv})[0], Tensor(kiln::relu(x2 + kiln::sin(zv)))) < 1e-6);
        }
        {  // relu(view(2x)): the relu joins the op, the view stays after it
            ir::Graph g;
            const int x = input(g, {3, 4}, 0);
            const int y = call(g, x);
            ir::Node v;
            v.kind = ir::Kind::view;
            v.dtype = DType::f32;
            v.shape = {4, 3};
            v.args = {1, 4};
            v.in = {y};
            const int vt = g.add(std::move(v));
            g.outputs = {ew<ops::Relu>(g, {vt}, {4, 3})};
            const ir::Graph f = kiln::passes::fold_call_epilogue(g);
            ir::verify(f, "fold_call_epilogue");
            CHECK(keys(f) == std::vector<std::string>{"twice, relu"});
            CHECK(kiln_test::maxdiff(run(f, {xv})[0], Tensor(kiln::relu(x2)).t()) < 1e-6);
        }
        {  // 2x read twice (the add and an output), and two ops added: the first takes the second as z
            ir::Graph g;
            const int x = input(g, {3, 4}, 0), zi = input(g, {3, 4}, 1);
            const int y = call(g, x);
            const int a = ew<ops::Add>(g, {y, zi}, {3, 4});
            g.outputs = {ew<ops::Relu>(g, {a}, {3, 4}), y};
            const ir::Graph f = kiln::passes::fold_call_epilogue(g);
            CHECK(f.size() == g.size());  // nothing folded
            ir::Graph h;
            const int hx = input(h, {3, 4}, 0), hz = input(h, {3, 4}, 1);
            const int c1 = call(h, hx), c2 = call(h, hz);
            h.outputs = {ew<ops::Relu>(h, {ew<ops::Add>(h, {c1, c2}, {3, 4})}, {3, 4})};
            const ir::Graph fh = kiln::passes::fold_call_epilogue(h);
            ir::verify(fh, "fold_call_epilogue");
            CHECK(keys(fh) == std::vector<std::string>{"twice", "twice, residual, relu"});
            CHECK(kiln_test::maxdiff(run(fh, {xv, zv})[0], Tensor(kiln::relu(x2 + zv * 2.0))) < 1e-6);
        }
    }
    SUBCASE("constant_layouts: a constant only library ops read is bound in the layout they name; other constants stay") {
        // a library op reading operand 1 as its transpose's rows (conv2d's weight channels-last)
        auto op = std::make_shared<ir::CallOp>();
        op->key = "matmul_t";
        op->shape = [](const std::vector<Shape>& s) { return Shape{s[0][0], s[1][0]}; };
        op->run = [](const std::vector<Tensor>& t) { return kiln::matmul(t[0], t[1].t()); };
        op->constant_layout = [](std::size_t i, const Tensor& t) { return i == 1 ? t.t().contiguous().t() : t; };
        auto call = [&](ir::Graph& g, int a, int b) {
            ir::Node n;
            n.kind = ir::Kind::call;
            n.dtype = DType::f32;
            n.shape = {3, 5};
            n.in = {a, b};
            n.call = op;
            return g.add(std::move(n));
        };
        const Tensor wv = kiln::randn({5, 4});
        const Tensor want = kiln::matmul(xv, wv.t());
        for (const bool other_reader : {false, true}) {
            CAPTURE(other_reader);
            ir::Graph g;
            const int x = input(g, {3, 4}, 0);
            const int w = constant(g, wv);
            const int y = call(g, x, w);
            g.outputs = {y};
            if (other_reader) g.outputs.push_back(ew<ops::Exp>(g, {w}, {5, 4}));  // an elementwise reader: w stays as captured
            const ir::Graph l = kiln::passes::constant_layouts(g);
            ir::verify(l, "constant_layouts");
            CHECK(l.size() == g.size());
            CHECK(l[w].tensor.is_same(wv) == other_reader);
            if (!other_reader) CHECK(l[w].tensor.strides() == kiln::Strides{1, 5});  // column-major: the transpose's rows
            CHECK(kiln_test::maxdiff(run(l, {xv})[0], want) < 1e-5);
            // the pipeline binds it only where the program owns its constants
            const ir::Graph plain = kiln::passes::run_pipeline(g);
            const ir::Graph owned = kiln::passes::run_pipeline(g, {}, {.owns_constants = true});
            for (const ir::Node& n : plain.nodes)
                if (n.kind == ir::Kind::constant) CHECK(n.tensor.is_same(wv));
            for (const ir::Node& n : owned.nodes)
                if (n.kind == ir::Kind::constant) CHECK(n.tensor.is_same(wv) == other_reader);
        }
    }
    SUBCASE("the pipeline runs them all, verified after each") {
        ir::Graph g;
        const int x = input(g, {3, 4}, 0);
        const int c = ew<ops::Exp>(g, {constant(g, bv)}, {4});
        const int s1 = ew<ops::Sin>(g, {x}, {3, 4}), s2 = ew<ops::Sin>(g, {x}, {3, 4});
        g.outputs = {ew<ops::Add>(g, {ew<ops::Mul>(g, {s1, s2}, {3, 4}), ew<ops::Mul>(g, {c, scalar(g, 1)}, {4})}, {3, 4})};
        std::vector<std::string> steps;
        const ir::Graph o = kiln::passes::run_pipeline(g, [&](const std::string& name, const ir::Graph&) { steps.push_back(name); });
        CHECK(steps.size() >= 4);
        CHECK(o.size() < g.size());
        CHECK(kiln_test::maxdiff(run(o, {xv})[0], Tensor(kiln::sin(xv) * kiln::sin(xv) + kiln::exp(bv))) < 1e-6);
    }
}

TEST_CASE("shape inference: torch.matmul's shapes and reductions' shapes, one rule for every caller") {
    using kiln::ir::matmul_shapes;
    const auto r = matmul_shapes(Shape{2, 1, 4, 3}, Shape{5, 3, 7});
    REQUIRE(r.ok());
    CHECK(r.batch == Shape{2, 5});
    CHECK((r.m == 4 && r.k == 3 && r.n == 7));
    CHECK(r.result == Shape{2, 5, 4, 7});
    CHECK(matmul_shapes(Shape{3}, Shape{3}).result == Shape{});             // dot
    CHECK(matmul_shapes(Shape{3}, Shape{2, 3, 5}).result == Shape{2, 5});   // vector @ batch
    CHECK(matmul_shapes(Shape{2, 4, 3}, Shape{3}).result == Shape{2, 4});   // batch @ vector
    CHECK(matmul_shapes(Shape{}, Shape{3}).error.find("at least 1 dim") != std::string::npos);
    CHECK(matmul_shapes(Shape{4, 3}, Shape{2, 5}).error.find("cannot be multiplied (3 != 2)") != std::string::npos);
    CHECK(matmul_shapes(Shape{2, 4, 3}, Shape{3, 3, 5}).error.find("batch dims (2,) and (3,) do not broadcast") != std::string::npos);
    // eager raises the rule's message, naming the op and the user's line
    std::string m;
    try {
        (void)kiln::matmul(kiln::ones({4, 3}), kiln::ones({2, 5}));
    } catch (const kiln::ShapeError& e) {
        m = e.what();
    }
    CHECK(m.find("matmul") != std::string::npos);
    CHECK(m.find("cannot be multiplied (3 != 2)") != std::string::npos);
    CHECK(m.find("test_ir.cpp") != std::string::npos);
    CHECK(kiln::ir::reduced_shape(Shape{2, 3, 4}, 0b101, false) == Shape{3});
    CHECK(kiln::ir::reduced_shape(Shape{2, 3, 4}, 0b101, true) == Shape{1, 3, 1});
    CHECK(kiln::ir::reduced_shape(Shape{2, 3, 4}, 0, false) == Shape{2, 3, 4});
}

TEST_CASE("TensorGuard: passes for the same tensor, fails on dtype, rank, size, layout; symbolic dims follow sizes >= 2") {
    using kiln::cache::TensorGuard;
    const Tensor t = kiln::randn({8, 16});
    const TensorGuard g = TensorGuard::of(t, {});
    CHECK(g.matches(kiln::randn({8, 16})));
    CHECK(g.mismatch(kiln::randn({8, 16})).empty());
    CHECK(g.mismatch(kiln::randn({8, 16}).to(DType::f64)) == "dtype was float32, now float64");
    CHECK(g.mismatch(kiln::randn({8, 16, 1})) == "rank was 2, now 3");
    CHECK(g.mismatch(kiln::randn({8, 17})) == "dim 1 was 16, now 17");
    CHECK(g.mismatch(kiln::randn({16, 8}).t()) == "was contiguous, now strided");
    // dim 0 symbolic: any size >= 2 passes, 0 and 1 stay specialized (they change broadcasting)
    const TensorGuard d = TensorGuard::of(t, {1, 0});
    CHECK(d.str() == "float32(s, 16) on cpu");
    CHECK(d.matches(kiln::randn({3, 16})));
    CHECK(d.matches(kiln::randn({1000, 16})));
    CHECK(d.mismatch(kiln::randn({1, 16})) == "dim 0 was symbolic, now 1");
    CHECK_FALSE(d.matches(kiln::randn({0, 16})));
    CHECK_FALSE(d.matches(kiln::randn({3, 15})));
    // a dim of size 1 is never made symbolic
    CHECK(TensorGuard::of(kiln::randn({1, 16}), {1, 1}).str() == "float32(1, s) on cpu");
}

namespace {

/// The CPU's steps, recording what the executor asks of a device; `issued` says whether every
/// step so far counts as issued (a device with launches still waiting for a compile says no).
struct RecordingSteps final : kiln::fuse::Steps {
    explicit RecordingSteps(const ir::Graph& g, bool issued_now) : inner(g), issued_now(issued_now) {}
    void kernel(std::size_t k, const kiln::fuse::Group& G, std::vector<Tensor>& vals) override {
        events.push_back("kernel " + std::to_string(k));
        inner.kernel(k, G, vals);
    }
    void flush() override { events.push_back("flush"); }
    bool issued() const override { return issued_now; }
    Tensor output(std::vector<Tensor>& vals, int id, const Shape& s, DType d) override { return inner.output(vals, id, s, d); }
    bool on_device(const Tensor& t) const override { return inner.on_device(t); }
    std::string name() const override { return "recording"; }

    kiln::detail::CpuSteps inner;
    bool issued_now;
    std::vector<std::string> events;
};

}  // namespace

TEST_CASE("peak_live (KILN_LOGS=memory): the live set at the peak of a run that drops each value after its last reader") {
    const Tensor x = kiln::randn({64, 64}), w = kiln::randn({64, 64});
    kiln::trace::Tracer tr(nullptr, true);
    ir::Graph g;
    int a_id = -1, b_id = -1;
    {
        kiln::trace::ActiveScope scope(&tr);
        const Tensor tx = tr.input(x), tw = tr.input(w);
        const Tensor a = kiln::matmul(tx, tw), b = kiln::matmul(a, tw), c = kiln::matmul(b, tw);
        const Tensor v = c.transpose(0, 1);  // a view: no memory of its own
        a_id = tr.node_of(a);
        b_id = tr.node_of(b);
        g = tr.graph();
        g.outputs = {tr.node_of(v)};
    }
    ir::Graph opt = kiln::passes::run_pipeline(g, {});
    const kiln::fuse::Plan plan = kiln::fuse::plan(opt);
    const kiln::fuse::MemoryPeak pk = kiln::fuse::peak_live(opt, plan, kiln::fuse::plan_memory(opt, plan, false));
    // a and b are live together once b is made (a dies after b's group); then b and the output c
    const std::size_t one = 64 * 64 * sizeof(float);
    CHECK(pk.bytes == 2 * one);
    REQUIRE(pk.live.size() == 2);
    CHECK(pk.pinned == 0);
    CHECK(std::find(pk.live.begin(), pk.live.end(), a_id) != pk.live.end());
    CHECK(std::find(pk.live.begin(), pk.live.end(), b_id) != pk.live.end());
    // the log names them
    std::vector<std::string> lines;
    kiln::debug::Logs::instance().set_sink([&](const std::string& l) { lines.push_back(l); });
    kiln::debug::Logs::instance().set("memory");
    auto f = kiln::compile([](const Tensor& p, const Tensor& q) { return kiln::matmul(kiln::matmul(kiln::matmul(p, q), q), q); });
    CHECK(kiln_test::maxdiff(f(x, w), kiln::matmul(kiln::matmul(kiln::matmul(x, w), w), w)) < 1e-2);
    kiln::debug::Logs::instance().set("");
    kiln::debug::Logs::instance().set_sink({});
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("[kiln:memory] peak of the values a call makes: 0.03125 MiB") == 0);
    CHECK(lines[0].find("matmul(") != std::string::npos);
}

TEST_CASE("the executor (fuse/execute.hpp): kernel steps to the device in plan order, host steps after a flush, releases only once issued") {
    const Tensor x = kiln::randn({8, 16}), w = kiln::randn({16, 16}), table = kiln::randn({10, 16});
    const Tensor ids = kiln::randint(0, 10, {8, 16}, DType::i64);
    kiln::trace::Tracer tr(nullptr, true);
    ir::Graph g;
    {
        kiln::trace::ActiveScope scope(&tr);
        const Tensor tx = tr.input(x), tw = tr.input(w), tt = tr.input(table), ti = tr.input(ids);
        const Tensor a = kiln::exp(tx * 0.1) * 2;                        // elementwise
        const Tensor m = kiln::matmul(a, tw);                             // matmul
        const Tensor r = kiln::softmax(m, -1);                            // row
        const Tensor v = r.transpose(0, 1).reshape({16 * 8});             // a view of a strided value: a copy
        const Tensor e = kiln::gather(tt, 0, ti);                         // a library call
        const Tensor o = Tensor(v.reshape({16, 8}).transpose(0, 1) + e);  // elementwise after all of them
        g = tr.graph();
        g.outputs = {tr.node_of(o)};
    }
    ir::Graph opt = kiln::passes::run_pipeline(g, {});
    const kiln::fuse::Plan plan = kiln::fuse::plan(opt);
    const kiln::fuse::MemoryPlan mem = kiln::fuse::plan_memory(opt, plan, false);
    const Tensor expected = Tensor(kiln::softmax(kiln::matmul(Tensor(kiln::exp(x * 0.1) * 2), w), -1) + kiln::gather(table, 0, ids));

    for (bool issued : {true, false}) {
        CAPTURE(issued);
        std::vector<Tensor> vals(static_cast<std::size_t>(opt.size()));
        const std::vector<Tensor> in{x, w, table, ids};
        for (std::size_t k = 0; k < opt.inputs.size(); ++k) vals[static_cast<std::size_t>(opt.inputs[k])] = in[k];
        for (int i = 0; i < opt.size(); ++i)
            if (opt[i].kind == ir::Kind::constant) vals[static_cast<std::size_t>(i)] = opt[i].tensor;
        RecordingSteps steps(opt, issued);
        const std::vector<Tensor> out = kiln::fuse::execute(opt, plan, mem, vals, steps);
        REQUIRE(out.size() == 1);
        CHECK(kiln_test::maxdiff(out[0], expected) < 1e-5);

        // every kernel group went to the device once, in plan order; each library call came after a flush
        std::vector<std::string> want;
        int calls = 0, dead = 0;
        for (std::size_t k = 0; k < plan.groups.size(); ++k) {
            const auto kind = plan.groups[k].kind;
            if (kind == kiln::fuse::Group::Kind::call) {
                want.push_back("flush");
                ++calls;
            } else if (kind != kiln::fuse::Group::Kind::view) {
                want.push_back("kernel " + std::to_string(k));
            }
        }
        std::vector<std::string> got = steps.events;
        REQUIRE(!got.empty());
        CHECK(got.back() == "flush");  // everything issued before the outputs are returned
        got.pop_back();
        // the events in order, where only flushes (a view copying a strided value flushes first) may
        // come between the expected ones
        std::vector<std::string> matched;
        for (const std::string& ev : got) {
            if (matched.size() < want.size() && ev == want[matched.size()]) matched.push_back(ev);
            else CHECK(ev == "flush");
        }
        CHECK(matched == want);
        CHECK(calls == 1);

        // the memory plan's dead values: dropped when every step so far was issued, kept otherwise
        for (const auto& d : mem.dead_after)
            for (int i : d) {
                ++dead;
                CHECK(vals[static_cast<std::size_t>(i)].defined() == !issued);
            }
        CHECK(dead >= 2);
    }
}

TEST_CASE("fuser: each write of a chain into views of one captured tensor stores its value straight into that memory") {
    // DataParallel's gradients are views of one bucket: backward writes them one after the other
    ir::Graph g;
    const int x = input(g, {3}, 0);
    Tensor memory = kiln::full({6}, -1.0);
    ir::Node c;
    c.kind = ir::Kind::constant;
    c.dtype = DType::f32;
    c.shape = {6};
    c.tensor = memory;
    const int m = g.add(std::move(c));
    auto write = [&g](int base, int v, std::int64_t offset) {
        ir::Node w;
        w.kind = ir::Kind::view_write;
        w.dtype = DType::f32;
        w.shape = {6};
        w.in = {base, v};
        w.args = {1};
        w.value = static_cast<double>(offset);
        return g.add(std::move(w));
    };
    const int v1 = ew<ops::Mul>(g, {x, x}, {3});
    const int w1 = write(m, v1, 0);
    const int v2 = ew<ops::Add>(g, {x, x}, {3});
    const int w2 = write(w1, v2, 3);
    g.outputs = {w2};
    ir::verify(g, "test");
    const kiln::fuse::Plan plan = kiln::fuse::plan(g);
    REQUIRE(plan.store_into.size() == static_cast<std::size_t>(g.size()));
    CHECK(plan.store_into[static_cast<std::size_t>(v1)] == w1);
    CHECK(plan.store_into[static_cast<std::size_t>(v2)] == w2);  // the chain's second write too
    const std::vector<Tensor> out = run(g, {kiln::arange(1, 4).to(DType::f32)});
    CHECK(out[0].is_same(memory));  // the result is the memory itself, written in place
    const std::vector<double> want{1, 4, 9, 2, 4, 6};
    for (int i = 0; i < 6; ++i) CHECK(memory.item<double>(i) == want[static_cast<std::size_t>(i)]);

    // then the memory's whole value replaced by one computed from it (DataParallel's bucket,
    // averaged after its chain of gradient writes): in place too, no copy of the memory
    const int half = scalar(g, 0.5);
    const int h = ew<ops::Mul>(g, {w2, half}, {6});
    const int w3 = write(w2, h, 0);
    g.outputs = {w3};
    ir::verify(g, "test");
    const kiln::fuse::Plan p2 = kiln::fuse::plan(g);
    const int gw3 = p2.group_of[static_cast<std::size_t>(w3)];
    REQUIRE(gw3 >= 0);
    CHECK(p2.groups[static_cast<std::size_t>(gw3)].in_place);
    memory.fill_(-1.0);
    const std::vector<Tensor> out2 = run(g, {kiln::arange(1, 4).to(DType::f32)});
    CHECK(out2[0].is_same(memory));
    for (int i = 0; i < 6; ++i) CHECK(memory.item<double>(i) == 0.5 * want[static_cast<std::size_t>(i)]);
}

TEST_CASE("fuser (CUDA's limits): BatchNorm's backward is two kernels, both column sums in one, the relu's gradient and x-hat recomputed") {
    // batch_norm_train's backward (nn/conv_impl.hpp) behind a relu, over channels-last values
    const std::int64_t N = 2, H = 3, W = 5, C = 4;
    const Tensor dy = kiln::randn({N, H, W, C}), y = kiln::randn({N, H, W, C}), x = kiln::randn({N, H, W, C});
    const Tensor mu = kiln::randn({C}), var = Tensor(kiln::abs(kiln::randn({C})) + 0.5), w = kiln::randn({C});
    kiln::trace::Tracer tr(nullptr, true);
    ir::Graph g;
    {
        kiln::trace::ActiveScope scope(&tr);
        const Tensor tdy = tr.input(dy), ty = tr.input(y), tx = tr.input(x), tmu = tr.input(mu), tvar = tr.input(var), tw = tr.input(w);
        const double n = static_cast<double>(N * H * W);
        const Tensor gr = Tensor(kiln::where(ty > 0, tdy, 0.0));
        const Tensor db = kiln::sum(gr, {0, 1, 2});
        const Tensor dw = kiln::sum(Tensor(gr * ((tx - tmu) * kiln::rsqrt(tvar + 1e-5))), {0, 1, 2});
        const Tensor dx((gr - db / n - (tx - tmu) * kiln::rsqrt(tvar + 1e-5) * (dw / n)) * (kiln::rsqrt(tvar + 1e-5) * tw));
        g = tr.graph();
        g.outputs = {tr.node_of(dx), tr.node_of(dw), tr.node_of(db)};
    }
    const ir::Graph opt = kiln::passes::run_pipeline(g, {});
    kiln::fuse::Limits cuda_like;
    cuda_like.column_rows = false;
    const kiln::fuse::Plan before = kiln::fuse::plan(opt, cuda_like);
    cuda_like.merge_reductions = cuda_like.recompute = true;
    const kiln::fuse::Plan after = kiln::fuse::plan(opt, cuda_like);
    INFO(plan_text(opt, before), plan_text(opt, after));
    CHECK(before.kernels() == 6);  // g, sum(g), rsqrt(var + eps), x-hat, sum(g * x-hat), dx
    REQUIRE(after.kernels() == 2);
    int reduce_outputs = 0;
    for (const auto& G : after.groups)
        if (G.kind == kiln::fuse::Group::Kind::reduce) reduce_outputs += static_cast<int>(G.outputs.size());
    CHECK(reduce_outputs == 2);
    // the values: both plans on the CPU's executor (which runs a reduce group's outputs one by one)
    const std::vector<Tensor> in{dy, y, x, mu, var, w};
    const std::vector<Tensor> want = kiln::detail::CpuGraphProgram(opt, before).run(in);
    const std::vector<Tensor> got = kiln::detail::CpuGraphProgram(opt, after).run(in);
    REQUIRE(got.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) CHECK(kiln_test::maxdiff(got[k], want[k]) < 1e-5);
}

TEST_CASE("fuser: recomputation stays out where it would read more, and sibling reductions that read each other stay apart") {
    // v of four operands read by three kernels that cannot join (sums over different axes, an
    // elementwise value): recomputing it in each would read 12 tensors where storing it reads and
    // writes 8; var = mean((a - mean(a))^2) reads the mean, while sum(v * 2) and mean(a) join
    const Tensor a = kiln::randn({64, 8}), b = kiln::randn({64, 8}), c = kiln::randn({64, 8}), d = kiln::randn({64, 8});
    kiln::trace::Tracer tr(nullptr, true);
    ir::Graph g;
    int v = -1, s1 = -1, m = -1, var = -1;
    {
        kiln::trace::ActiveScope scope(&tr);
        const Tensor ta = tr.input(a), tb = tr.input(b), tc = tr.input(c), td = tr.input(d);
        const Tensor tv = Tensor(ta * tb + tc * td);
        const Tensor ts1 = kiln::sum(Tensor(tv * 2.0), {0}), ts2 = kiln::sum(Tensor(kiln::exp(tv)), {1});
        const Tensor tm = kiln::mean(ta, {0}), tvar = kiln::mean(Tensor(kiln::square(ta - tm)), {0});
        const Tensor te = Tensor(tv + 1.0);
        g = tr.graph();
        g.outputs = {tr.node_of(ts1), tr.node_of(ts2), tr.node_of(te), tr.node_of(tvar)};
        v = tr.node_of(tv);
        s1 = tr.node_of(ts1);
        m = tr.node_of(tm);
        var = tr.node_of(tvar);
    }
    const ir::Graph& opt = g;  // (as traced: the node ids stay)
    kiln::fuse::Limits lim;
    lim.column_rows = false;
    lim.merge_reductions = lim.recompute = true;
    const kiln::fuse::Plan p = kiln::fuse::plan(opt, lim);
    INFO(plan_text(opt, p));
    const auto group = [&](int node) { return p.group_of[static_cast<std::size_t>(node)]; };
    CHECK(p.materialized[static_cast<std::size_t>(v)]);
    CHECK(group(s1) == group(m));
    CHECK(group(m) != group(var));
    const std::vector<Tensor> want = kiln::detail::CpuGraphProgram(opt, kiln::fuse::plan(opt)).run({a, b, c, d});
    const std::vector<Tensor> got = kiln::detail::CpuGraphProgram(opt, p).run({a, b, c, d});
    for (std::size_t k = 0; k < want.size(); ++k) CHECK(kiln_test::maxdiff(got[k], want[k]) < 1e-4);
}
