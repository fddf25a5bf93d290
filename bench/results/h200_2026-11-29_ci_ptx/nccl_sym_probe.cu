// NCCL all-reduce, 2 GPUs in one process: ordinary cudaMalloc buffers against ncclMemAlloc buffers
// registered as a symmetric window (NCCL >= 2.27's symmetric kernels). f32 and bf16, sum and avg.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
typedef int Res; typedef void* Comm; typedef void* Win;
#define F(ret, name, args) typedef ret (*name##_t) args; name##_t name;
F(Res, ncclCommInitAll, (Comm*, int, const int*))
F(Res, ncclAllReduce, (const void*, void*, size_t, int, int, Comm, cudaStream_t))
F(Res, ncclGroupStart, ())
F(Res, ncclGroupEnd, ())
F(Res, ncclMemAlloc, (void**, size_t))
F(Res, ncclCommWindowRegister, (Comm, void*, size_t, Win*, int))
F(Res, ncclGetVersion, (int*))
F(const char*, ncclGetErrorString, (Res))
#define CK(x) do { Res r_ = (x); if (r_) { printf("%s: %s\n", #x, ncclGetErrorString(r_)); exit(1); } } while (0)
#define CC(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
int main(int argc, char** argv) {
  const char* lib = getenv("NCCL_LIB") ? getenv("NCCL_LIB") : "libnccl.so.2";
  void* h = dlopen(lib, RTLD_NOW);
  if (!h) { printf("dlopen %s: %s\n", lib, dlerror()); return 1; }
#define L(name) name = (name##_t)dlsym(h, #name); if (!name) { printf("no %s\n", #name); return 1; }
  L(ncclCommInitAll) L(ncclAllReduce) L(ncclGroupStart) L(ncclGroupEnd) L(ncclMemAlloc) L(ncclCommWindowRegister) L(ncclGetVersion) L(ncclGetErrorString)
  int v; ncclGetVersion(&v); printf("NCCL %d (%s)\n", v, lib);
  const int n = 2; int devs[2] = {0, 1}; Comm comm[2];
  CK(ncclCommInitAll(comm, n, devs));
  const size_t maxb = 32u << 20;
  void* plain[2]; void* sym[2]; Win win[2]; cudaStream_t st[2]; cudaEvent_t e0, e1;
  for (int i = 0; i < n; ++i) {
    CC(cudaSetDevice(i)); CC(cudaMalloc(&plain[i], maxb)); CC(cudaMemset(plain[i], 0, maxb));
    CK(ncclMemAlloc(&sym[i], maxb)); CC(cudaMemset(sym[i], 0, maxb)); CC(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  }
  CK(ncclGroupStart());
  for (int i = 0; i < n; ++i) CK(ncclCommWindowRegister(comm[i], sym[i], maxb, &win[i], 1 /*NCCL_WIN_COLL_SYMMETRIC*/));
  CK(ncclGroupEnd());
  CC(cudaSetDevice(0)); CC(cudaEventCreate(&e0)); CC(cudaEventCreate(&e1));
  const double mbs[] = {1, 2, 4, 7.1, 9.4, 11.8, 18.9, 28};
  const int dts[] = {7, 9}; const char* dtn[] = {"f32", "bf16"};
  const int ops[] = {0, 4}; const char* opn[] = {"sum", "avg"};
  for (int d = 0; d < 2; ++d) for (int o = 0; o < 2; ++o) for (double mb : mbs) {
    size_t bytes = (size_t)(mb * (1 << 20)) & ~(size_t)255; size_t count = bytes / (d == 0 ? 4 : 2);
    double t[2];
    for (int m = 0; m < 2; ++m) {
      void** buf = m ? sym : plain;
      auto run = [&](int it) { for (int k = 0; k < it; ++k) { CK(ncclGroupStart()); for (int i = 0; i < n; ++i) CK(ncclAllReduce(buf[i], buf[i], count, dts[d], ops[o], comm[i], st[i])); CK(ncclGroupEnd()); } };
      run(10); for (int i = 0; i < n; ++i) { CC(cudaSetDevice(i)); CC(cudaStreamSynchronize(st[i])); }
      CC(cudaSetDevice(0)); CC(cudaEventRecord(e0, st[0])); const int it = 100; run(it); CC(cudaSetDevice(0)); CC(cudaEventRecord(e1, st[0]));
      for (int i = 0; i < n; ++i) { CC(cudaSetDevice(i)); CC(cudaStreamSynchronize(st[i])); }
      float ms; CC(cudaEventElapsedTime(&ms, e0, e1)); t[m] = ms * 1e3 / it;
    }
    printf("%-4s %s %5.1f MB: plain %7.1f us (%6.1f GB/s)  symmetric %7.1f us (%6.1f GB/s)\n", dtn[d], opn[o], mb, t[0], bytes / t[0] / 1e3, t[1], bytes / t[1] / 1e3);
  }
  return 0;
}
