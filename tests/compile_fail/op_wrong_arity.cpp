// A binary op called with one operand must not compile, with kiln's own message.
// expect: kiln: wrong number of operands for this op
#include <kiln/kiln.hpp>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = kiln::add(x);
#else
    auto e = kiln::add(x, x);
#endif
    (void)e;
}
