// where() takes a condition and two values; two operands must not compile.
// expect: kiln: wrong number of operands for this op
#include <kiln/kiln.hpp>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = kiln::where(x > 0.0, x);
#else
    auto e = kiln::where(x > 0.0, x, 0.0);
#endif
    (void)e;
}
