#include "../../../hand_cpu.hpp"
extern "C" void kiln_kernel(void* const* ptr, const int64_t*, const int64_t*, const double*, int64_t inner, int64_t b, int64_t e) {
    kiln_bench_hand::softmax_rows(static_cast<const float*>(ptr[0]), static_cast<float*>(ptr[1]), inner, b, e);
}
