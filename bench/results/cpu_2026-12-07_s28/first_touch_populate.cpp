#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
int main(int argc, char** argv) {
    const size_t n = 64ull << 20;
    for (int rep = 0; rep < 3; ++rep) {
        for (int mode = 0; mode < 3; ++mode) {
            auto t0 = std::chrono::steady_clock::now();
            char* p = (char*)mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (mode == 1 ? MAP_POPULATE : 0), -1, 0);
            int r = 0;
            if (mode == 2) r = madvise(p, n, MADV_POPULATE_WRITE);
            auto tm = std::chrono::steady_clock::now();
            for (size_t i = 0; i < n; i += 64) ((volatile float*)(p + i))[0] = 1.f;
            auto t1 = std::chrono::steady_clock::now();
            std::printf("mode %d (r=%d): populate %.2f ms, first touch total %.2f ms\n", mode, r,
                        std::chrono::duration<double, std::milli>(tm - t0).count(), std::chrono::duration<double, std::milli>(t1 - t0).count());
            munmap(p, n);
        }
    }
}
