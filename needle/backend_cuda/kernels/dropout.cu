// Fused dropout (Srivastava et al., JMLR 2014), inverted scaling: y = x * keep / (1 - p).
//
// Random numbers come from a counter-based generator: uniform(i) = hash(seed, offset + i), so no
// random array is stored and the forward pass can be replayed exactly from (seed, offset).
// The hash is SplitMix64 (Steele, Lea & Flood, OOPSLA 2014); production frameworks use Philox
// (Salmon et al., SC 2011), same idea with stronger statistics.
// The unfused version draws a random array, compares, multiplies and divides (4 kernels and a
// stored float mask).
#include "common.cuh"

namespace ndl {

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform float in [0, 1) from the top 24 bits of the hash.
__device__ __forceinline__ float uniform(unsigned long long seed, unsigned long long i) {
  return (float)(splitmix64(seed ^ splitmix64(i)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ndl

// y[i] = keep ? x[i] * scale : 0 with keep = uniform >= p; mask[i] = keep. scale = 1 / (1 - p)
// comes in the accumulation type: a float scale would be 2e-8 off for float64 data.
template <typename T>
__global__ void dropout_fwd(const T* x, T* y, bool* mask, long long n, float p,
                            typename ndl::Acc<T>::type scale, unsigned long long seed,
                            unsigned long long offset) {
  typedef typename ndl::Acc<T>::type A;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride()) {
    const bool keep = ndl::uniform(seed, offset + (unsigned long long)i) >= p;
    mask[i] = keep;
    y[i] = ndl::from_acc<T>(keep ? ndl::to_acc(x[i]) * scale : A(0));
  }
}

// dx[i] = mask[i] ? dy[i] * scale : 0
template <typename T>
__global__ void dropout_bwd(const T* dy, const bool* mask, T* dx, long long n,
                            typename ndl::Acc<T>::type scale) {
  typedef typename ndl::Acc<T>::type A;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    dx[i] = ndl::from_acc<T>(mask[i] ? ndl::to_acc(dy[i]) * scale : A(0));
}

// Exact-RNG reference for tests: u[i] = uniform(seed, offset + i) as float32.
__global__ void dropout_uniform(float* u, long long n, unsigned long long seed,
                                unsigned long long offset) {
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    u[i] = ndl::uniform(seed, offset + (unsigned long long)i);
}
