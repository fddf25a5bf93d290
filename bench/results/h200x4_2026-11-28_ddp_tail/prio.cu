// Is a stream's priority captured into the kernel nodes of a CUDA graph?
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
__global__ void k(float* p) { p[threadIdx.x] += 1; }
int main() {
    int lo, hi; cudaDeviceGetStreamPriorityRange(&lo, &hi);
    cudaStream_t s; cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi);
    float* p; cudaMalloc(&p, 1024);
    cudaGraph_t g; cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    k<<<1, 32, 0, s>>>(p);
    cudaStreamEndCapture(s, &g);
    size_t n = 0; cudaGraphGetNodes(g, nullptr, &n);
    cudaGraphNode_t nodes[8]; cudaGraphGetNodes(g, nodes, &n);
    cudaLaunchAttributeValue v{};
    cudaError_t e = cudaGraphKernelNodeGetAttribute(nodes[0], cudaLaunchAttributePriority, &v);
    printf("priority range least %d greatest %d; stream priority %d; captured node priority %d (%s)\n", lo, hi, hi, v.priority, cudaGetErrorString(e));
    return 0;
}
