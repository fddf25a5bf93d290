// cast() takes a kiln operand; a std::string must not compile, and the diagnostic names the concept.
// expect: satisfaction of .*Operand<X>
#include <kiln/kiln.hpp>

#include <string>

int main() {
    const kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto e = kiln::cast(std::string("x"), kiln::DType::f16);
#else
    auto e = kiln::cast(x, kiln::DType::f16);
#endif
    (void)e;
}
