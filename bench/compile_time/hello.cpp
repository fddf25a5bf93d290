// The README's hello world, as a new user writes it: one header, sin + cos, a sum.
#include <kiln/kiln.hpp>

#include <iostream>

int main() {
    kiln::Tensor x = kiln::randn({1024});
    kiln::Tensor y = kiln::sin(x) + kiln::cos(x);
    std::cout << kiln::sum(y).item<float>() << "\n";
}
