// Shared helpers for needle's CUDA kernels: element types, accumulator types, launch loops.
//
// Storage types are the CUDA C names of needle dtypes: float, double, __half (float16) and
// __nv_bfloat16 (bfloat16). Arithmetic on 16-bit types is done in float ("Acc" type) and
// rounded once on store, which is what PyTorch does for its elementwise kernels too.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// +infinity without <math.h> (NVRTC has no standard headers).
#define NDL_INF __int_as_float(0x7f800000)

namespace ndl {

// Accumulator type: the type arithmetic is carried out in.
template <typename T> struct Acc { typedef T type; };
template <> struct Acc<__half> { typedef float type; };
template <> struct Acc<__nv_bfloat16> { typedef float type; };

// Widen a stored value to its accumulator type.
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round an accumulator value into a storage type: from_acc<T>(v).
template <typename T> __device__ __forceinline__ T from_acc(float v);
template <typename T> __device__ __forceinline__ T from_acc(double v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ float from_acc<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double from_acc<double>(float v) { return (double)v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(double v) {
  return __double2half(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}
template <> __device__ __forceinline__ bool from_acc<bool>(float v) { return v != 0.0f; }
template <> __device__ __forceinline__ bool from_acc<bool>(double v) { return v != 0.0; }

// Math overloads so one functor body serves float and double accumulators.
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return cos(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

// Global thread index and grid-stride step, in 64-bit so arrays over 2^31 elements work.
__device__ __forceinline__ long long global_id() {
  return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() { return (long long)blockDim.x * gridDim.x; }

// A row of at most ROW_REGS * blockDim.x elements, loaded once into each thread's registers
// (element threadIdx.x + u * blockDim.x in v[u], ``pad`` past the row's end): the loads are
// issued together, and a kernel making several passes over the row reads it from memory once.
constexpr int ROW_REGS = 4;
template <typename T, typename A>
__device__ __forceinline__ void load_row(const T* x, long long cols, A (&v)[ROW_REGS], A pad) {
#pragma unroll
  for (int u = 0; u < ROW_REGS; ++u) {
    const long long j = threadIdx.x + (long long)u * blockDim.x;
    v[u] = j < cols ? to_acc(x[j]) : pad;
  }
}

}  // namespace ndl
