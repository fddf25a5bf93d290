// An op on plain numbers only has nothing to evaluate: it must not compile.
// expect: kiln: an op needs at least one Tensor or expression operand
#include <kiln/kiln.hpp>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = kiln::maximum(1.0, 2.0);
#else
    auto e = kiln::maximum(x, 2.0);
#endif
    (void)e;
}
