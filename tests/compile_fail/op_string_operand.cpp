// An elementwise op with a std::string operand must not compile, with kiln's own message.
// expect: kiln: operands must be kiln::Tensor, a kiln expression, or a C.. number
#include <kiln/kiln.hpp>

#include <string>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = kiln::exp(std::string("x"));
#else
    auto e = kiln::exp(x);
#endif
    (void)e;
    (void)x;
}
