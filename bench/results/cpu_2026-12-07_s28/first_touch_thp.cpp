#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/mman.h>
int main(int argc, char** argv) {
    const size_t n = 64ull << 20;
    for (int rep = 0; rep < 4; ++rep) {
        for (int mode = 0; mode < 2; ++mode) {
            auto t0 = std::chrono::steady_clock::now();
            char* p;
            if (mode == 0) p = (char*)::operator new(n, std::align_val_t{64});
            else { p = (char*)::operator new(n, std::align_val_t{2 << 20}); madvise(p, n, MADV_HUGEPAGE); }
            for (size_t i = 0; i < n; i += 64) ((volatile float*)(p + i))[0] = 1.f;  // write every line
            auto t1 = std::chrono::steady_clock::now();
            for (size_t i = 0; i < n; i += 64) ((volatile float*)(p + i))[0] = 2.f;
            auto t2 = std::chrono::steady_clock::now();
            std::printf("mode %d: first touch %.2f ms, second %.2f ms\n", mode,
                        std::chrono::duration<double, std::milli>(t1 - t0).count(), std::chrono::duration<double, std::milli>(t2 - t1).count());
            ::operator delete(p, std::align_val_t{mode == 0 ? 64 : 2 << 20});
        }
    }
}
