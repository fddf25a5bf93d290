#include <kiln/kiln.hpp>

int main() {
  kiln::Tensor x = kiln::arange(0, 8, 1, kiln::DType::f32);
  kiln::Tensor y = x * 2.0f + 1.0f;
  return (y.item<float>(3) == 7.0f) ? 0 : 1;
}
