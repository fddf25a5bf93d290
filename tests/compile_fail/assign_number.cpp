// Tensor::assign takes a Tensor or an expression; a plain number must not compile (use fill_).
// expect: kiln::Tensor::assign takes a Tensor or a tensor expression
#include <kiln/kiln.hpp>

int main() {
    kiln::Tensor x = kiln::ones({3});
#ifndef KILN_COMPILE_FAIL_CONTROL
    x.assign(2.0);
#else
    x.assign(x * 2.0);
#endif
}
