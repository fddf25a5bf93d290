// Probe (session 11): what programmatic dependent launch saves per kernel boundary on this GPU.
// A chain of 100 small dependent kernels captured in a CUDA graph, launched plainly or with
// cudaLaunchAttributeProgrammaticStreamSerialization (each kernel waits on griddepcontrol first,
// then lets its dependent launch); median time per kernel over 20 graph replays.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
template <bool PDL>
__global__ void step(float* x, int n) {
    if (PDL) asm volatile("griddepcontrol.wait;\n griddepcontrol.launch_dependents;" ::: "memory");
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = x[i] * 0.999f + 1.f;
}
int main() {
    float* x; const int nmax = 1 << 22; cudaMalloc(&x, nmax * 4); cudaMemset(x, 0, nmax * 4);
    cudaStream_t s; cudaStreamCreate(&s);
    for (int n : {2048, 1 << 16, 1 << 20}) for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraph_t g; cudaGraphExec_t ge;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        const int blocks = std::min(1056, (n + 255) / 256);
        for (int k = 0; k < 100; ++k) {
            cudaLaunchConfig_t c{}; c.gridDim = blocks; c.blockDim = 256; c.stream = s;
            cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[0].val.programmaticStreamSerializationAllowed = 1;
            c.attrs = a; c.numAttrs = pdl;
            if (pdl) cudaLaunchKernelEx(&c, step<true>, x, n); else cudaLaunchKernelEx(&c, step<false>, x, n);
        }
        cudaStreamEndCapture(s, &g);
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) { printf("instantiate failed\n"); return 1; }
        std::vector<float> t;
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        for (int r = 0; r < 23; ++r) { cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 3) t.push_back(ms * 1000 / 100); }
        std::sort(t.begin(), t.end());
        printf("n=%d %s: %.2f us per kernel (graph of 100)\n", n, pdl ? "PDL  " : "plain", t[t.size() / 2]);
        printf("  err: %s\n", cudaGetErrorString(cudaGetLastError()));
    }
}
