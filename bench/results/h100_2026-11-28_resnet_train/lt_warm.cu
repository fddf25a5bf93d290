// Session 9: can a second process skip cuBLASLt's heuristic (80-110 ms on its first call per type)
// by reusing the algorithm bytes a first process stored? Modes: save (heuristic, store the algo),
// load (read the algo, first matmul without any heuristic or AlgoCheck), check (AlgoCheck first).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
using C = std::chrono::steady_clock;
static double ms(C::time_point t) { return std::chrono::duration<double, std::milli>(C::now() - t).count(); }
static void mm(cublasLtHandle_t h, const std::string& mode, int m, int n, int k, cudaDataType_t dt, bool epi, void* ws, const char* what) {
    auto t = C::now();
    cublasLtMatmulDesc_t op; cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    size_t es = dt == CUDA_R_32F ? 4 : 2;
    void *pa, *pb, *pc, *bias; cudaMalloc(&pa, (size_t)m * k * es); cudaMalloc(&pb, (size_t)k * n * es); cudaMalloc(&pc, (size_t)m * n * es); cudaMalloc(&bias, m * es);
    if (epi) {
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_GELU_BIAS;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, dt, m, k, m); cublasLtMatrixLayoutCreate(&b, dt, k, n, k); cublasLtMatrixLayoutCreate(&c, dt, m, n, m);
    size_t wss = 32 << 20;
    cublasLtMatmulAlgo_t algo;
    std::string file = std::string("/tmp/algo_") + what;
    double th = 0;
    if (mode == "save") {
        cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wss, sizeof wss);
        cublasLtMatmulHeuristicResult_t r; int nr = 0;
        cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &nr);
        algo = r.algo;
        FILE* f = std::fopen(file.c_str(), "wb"); std::fwrite(&algo, sizeof algo, 1, f); std::fclose(f);
        th = ms(t);
    } else {
        FILE* f = std::fopen(file.c_str(), "rb"); if (!f || std::fread(&algo, sizeof algo, 1, f) != 1) { std::printf("no %s\n", file.c_str()); return; } std::fclose(f);
        if (mode == "check") {
            cublasLtMatmulHeuristicResult_t r;
            int st = cublasLtMatmulAlgoCheck(h, op, a, b, c, c, &algo, &r);
            std::printf("  check status %d\n", st);
        }
        th = ms(t);
    }
    t = C::now();
    float one = 1, zero = 0;
    int st = cublasLtMatmul(h, op, &one, pa, a, pb, b, &zero, pc, c, pc, c, &algo, ws, wss, 0);
    cudaDeviceSynchronize();
    std::printf("%s %s %dx%dx%d: setup %.2f ms, first matmul + sync %.2f ms (status %d, %s)\n", mode.c_str(), what, m, n, k, th, ms(t), st,
                cudaGetErrorString(cudaGetLastError()));
    t = C::now();
    cublasLtMatmul(h, op, &one, pa, a, pb, b, &zero, pc, c, pc, c, &algo, ws, wss, 0);
    cudaDeviceSynchronize();
    std::printf("   again %.3f ms\n", ms(t));
}
int main(int argc, char** argv) {
    std::string mode = argc > 1 ? argv[1] : "save";
    auto t0 = C::now(), t = t0;
    cudaFree(0);
    std::printf("context %.2f ms\n", ms(t)); t = C::now();
    cublasLtHandle_t h; cublasLtCreate(&h);
    std::printf("cublasLtCreate %.2f ms\n", ms(t));
    void* ws; cudaMalloc(&ws, 32 << 20);
    mm(h, mode, 4096, 64, 1024, CUDA_R_32F, false, ws, "f32_mlp");
    mm(h, mode, 1024, 64, 4096, CUDA_R_32F, true, ws, "f32_gelu");
    mm(h, mode, 4096, 64, 1024, CUDA_R_16BF, false, ws, "bf16_mlp");
    mm(h, mode, 1024, 64, 4096, CUDA_R_16BF, true, ws, "bf16_gelu");
    std::printf("total %.2f ms\n", ms(t0));
}
