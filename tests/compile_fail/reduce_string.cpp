// A reduction of something that is not a tensor must not compile, with kiln's own message.
// expect: kiln: reductions take a Tensor or a tensor expression
#include <kiln/kiln.hpp>

#include <string>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto s = kiln::max(std::string("x"), 0);
#else
    auto s = kiln::max(x, 0);
#endif
    (void)s;
}
