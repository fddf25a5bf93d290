// An expression with eight nested multiply-adds, evaluated once: how an expression's fused loop
// grows with its depth (each add's operands must be compiled once, not once per arm of a branch).
#include <kiln/kiln.hpp>

kiln::Tensor nested_adds(const kiln::Tensor& a, const kiln::Tensor& b, const kiln::Tensor& c) {
    return (((((((a * b + c) * a + b) * c + a) * b + c) * a + b) * c + a) * b + c) * a + b;
}
