// cuBLASLt's first use in a process, split: handle, heuristic, first matmul (lazy module load), a second shape
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
using C = std::chrono::steady_clock;
static double ms(C::time_point t) { return std::chrono::duration<double, std::milli>(C::now() - t).count(); }
static void mm(cublasLtHandle_t h, int m, int n, int k, cudaDataType_t dt, void* ws, const char* what) {
    auto t = C::now();
    cublasLtMatmulDesc_t op; cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, dt, m, k, m); cublasLtMatrixLayoutCreate(&b, dt, k, n, k); cublasLtMatrixLayoutCreate(&c, dt, m, n, m);
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    size_t wss = 32 << 20; cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wss, sizeof wss);
    cublasLtMatmulHeuristicResult_t r; int nr = 0;
    cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &nr);
    double th = ms(t); t = C::now();
    size_t es = dt == CUDA_R_32F ? 4 : 2;
    void *pa, *pb, *pc; cudaMalloc(&pa, (size_t)m * k * es); cudaMalloc(&pb, (size_t)k * n * es); cudaMalloc(&pc, (size_t)m * n * es);
    float one = 1, zero = 0;
    cublasLtMatmul(h, op, &one, pa, a, pb, b, &zero, pc, c, pc, c, &r.algo, ws, wss, 0);
    cudaDeviceSynchronize();
    std::printf("%s %dx%dx%d: heuristic %.2f ms, first matmul + sync %.2f ms\n", what, m, n, k, th, ms(t));
    t = C::now();
    cublasLtMatmul(h, op, &one, pa, a, pb, b, &zero, pc, c, pc, c, &r.algo, ws, wss, 0);
    cudaDeviceSynchronize();
    std::printf("   again %.3f ms\n", ms(t));
}
int main() {
    auto t = C::now();
    cudaFree(0);
    std::printf("context %.2f ms\n", ms(t)); t = C::now();
    cublasLtHandle_t h; cublasLtCreate(&h);
    std::printf("cublasLtCreate %.2f ms\n", ms(t));
    void* ws; cudaMalloc(&ws, 32 << 20);
    mm(h, 40, 24, 40, CUDA_R_32F, ws, "f32 small");
    mm(h, 4096, 64, 1024, CUDA_R_32F, ws, "f32 mlp");
    mm(h, 40, 24, 40, CUDA_R_16BF, ws, "bf16 small");
    mm(h, 4096, 64, 1024, CUDA_R_16BF, ws, "bf16 mlp");
    mm(h, 1024, 64, 4096, CUDA_R_16BF, ws, "bf16 mlp2");
}
