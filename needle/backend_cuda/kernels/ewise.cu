// Elementwise and scalar ops over compact buffers of n elements (grid-stride loops).
//
// Each op is a functor applied in the accumulator type (float for half/bfloat16): struct ndl::Add
// and friends, one per row of needle/backend_ndarray/primitives.py's ELEMENTWISE table, are that
// row's expression in C, appended below this file by kernel_specs.source (functors()). Binary ops
// write T (comparisons write bool); unary ops write T.
#include "common.cuh"

namespace ndl {

// Store an op result (accumulator value or bool) into TOut.
template <typename TOut> __device__ __forceinline__ TOut store_result(bool v) { return v; }
template <typename TOut> __device__ __forceinline__ TOut store_result(float v) {
  return from_acc<TOut>(v);
}
template <typename TOut> __device__ __forceinline__ TOut store_result(double v) {
  return from_acc<TOut>(v);
}

}  // namespace ndl

// out[i] = op(a[i], b[i])
template <typename T, typename TOut, typename Op>
__global__ void ewise_binary(const T* a, const T* b, TOut* out, long long n) {
  Op op;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = ndl::store_result<TOut>(op(ndl::to_acc(a[i]), ndl::to_acc(b[i])));
}

// out[i] = op(a[i], val)
template <typename T, typename TOut, typename Op>
__global__ void scalar_binary(const T* a, typename ndl::Acc<T>::type val, TOut* out,
                              long long n) {
  Op op;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = ndl::store_result<TOut>(op(ndl::to_acc(a[i]), val));
}

// out[i] = op(a[i])
template <typename T, typename Op>
__global__ void ewise_unary(const T* a, T* out, long long n) {
  Op op;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = ndl::from_acc<T>(op(ndl::to_acc(a[i])));
}

// out[i] = cond[i] ? a[i] : b[i]
template <typename T>
__global__ void ewise_where(const bool* cond, const T* a, const T* b, T* out, long long n) {
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = cond[i] ? a[i] : b[i];
}

// out[i] = (TOut) a[i] between floating types (rounded to nearest even).
template <typename TIn, typename TOut>
__global__ void ewise_astype(const TIn* a, TOut* out, long long n) {
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = ndl::from_acc<TOut>(ndl::to_acc(a[i]));
}
