typedef unsigned short kiln_u16;
template <class T, int N> struct __align__(sizeof(T) * N) kiln_vec { T v[N]; };
extern "C" __global__ void __launch_bounds__(256) kiln_ew_c351d778b6bef7fe(const int* __restrict__ a0, int* __restrict__ out, long long n, long long z0, long long z1, long long z2, long long s0_0, long long s0_1, long long s0_2) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if ((long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z <= 135168ll) asm volatile("griddepcontrol.launch_dependents;");

  typedef int idx_t;
  const idx_t nvec = (idx_t)(n / 1);
  const idx_t step = (idx_t)gridDim.x * blockDim.x;
  for (idx_t t0 = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; t0 < nvec; t0 += step * 1) {
    #pragma unroll
    for (int u = 0; u < 1; ++u) {
      const idx_t t = t0 + u * step;
      if (t >= nvec) break;
      const idx_t i = t * 1;
      kiln_vec<int, 1> o0_;
      #pragma unroll
      for (int e = 0; e < 1; ++e) {
      { idx_t r_ = i + e;
        const idx_t c2 = r_ % (idx_t)z2; r_ /= (idx_t)z2;
        const idx_t c1 = r_ % (idx_t)z1; r_ /= (idx_t)z1;
        const idx_t c0 = r_;
        const int x0 = a0[(idx_t)0 + c0 * (idx_t)s0_0 + c1 * (idx_t)s0_1 + c2 * (idx_t)s0_2];
        const int v0 = (int)((-((int)(x0))));
        o0_.v[e] = (int)(v0);
      }
      }
      *(kiln_vec<int, 1>*)(out + i) = o0_;
    }
  }
}

