// Operators need kiln operands on both sides (or a number on one): Tensor + std::string must not
// compile, and the diagnostic names the constraint.
// expect: satisfaction of .*BinaryOperands<A, B>
#include <kiln/kiln.hpp>

#include <string>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = x + std::string("1");
#else
    auto e = x + 1;
#endif
    (void)e;
}
