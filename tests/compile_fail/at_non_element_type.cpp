// Element access needs a kiln element type: at<unsigned> must not compile, naming the concept.
// expect: satisfaction of .*Element<T>
#include <kiln/kiln.hpp>

int main() {
    const kiln::Tensor x = kiln::ones({3}, kiln::DType::i32);
#ifndef KILN_COMPILE_FAIL_CONTROL
    auto v = x.at<unsigned>({0});
#else
    auto v = x.at<std::int32_t>({0});
#endif
    (void)v;
}
