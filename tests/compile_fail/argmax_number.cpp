// argmax of a plain number must not compile, with kiln's own message.
// expect: kiln: reductions take a Tensor or a tensor expression
#include <kiln/kiln.hpp>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto s = kiln::argmax(2);
#else
    auto s = kiln::argmax(x);
#endif
    (void)s;
}
