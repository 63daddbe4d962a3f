// Strided copies: compact, ewise_setitem, scalar_setitem (the course's hw3 CUDA exercise).
//
// A strided view is (shape, strides, offset), all counted in elements. Element i of the compact
// (row-major) order lives at  offset + sum_d idx_d * strides[d]  where idx is i written in the
// mixed radix given by shape. Copying does not look at the bits, so the kernels are instantiated
// per element *width* (1, 2, 4, 8 bytes) and serve every dtype.
//
// ``meta`` is a small device array of long longs: [ndim, offset, shape[0..ndim), strides[0..ndim)].
#include "common.cuh"

#define NDL_MAX_DIMS 32

namespace ndl {

// Load the view description into shared memory once per block.
__device__ __forceinline__ int load_meta(const long long* meta, long long* s_shape,
                                         long long* s_strides, long long* offset) {
  const int ndim = (int)meta[0];
  for (int d = threadIdx.x; d < ndim; d += blockDim.x) {
    s_shape[d] = meta[2 + d];
    s_strides[d] = meta[2 + ndim + d];
  }
  *offset = meta[1];
  __syncthreads();
  return ndim;
}

// Position in the strided buffer of the i-th element in row-major order.
__device__ __forceinline__ long long strided_index(long long i, int ndim, const long long* shape,
                                                   const long long* strides, long long offset) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  long long idx = offset;
  for (int d = ndim - 1; d >= 0; --d) {
    const long long s = shape[d];
    idx += (i % s) * strides[d];
    i /= s;
  }
  return idx;
  // END YOUR SOLUTION
}

}  // namespace ndl

// out[i] = a[strided_index(i)] for i in [0, n): gather a view into a compact buffer.
template <typename T>
__global__ void compact(const T* a, T* out, const long long* meta, long long n) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  __shared__ long long s_shape[NDL_MAX_DIMS], s_strides[NDL_MAX_DIMS];
  long long offset;
  const int ndim = ndl::load_meta(meta, s_shape, s_strides, &offset);
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[i] = a[ndl::strided_index(i, ndim, s_shape, s_strides, offset)];
  // END YOUR SOLUTION
}

// out[strided_index(i)] = a[i]: scatter a compact buffer into a view.
template <typename T>
__global__ void ewise_setitem(const T* a, T* out, const long long* meta, long long n) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  __shared__ long long s_shape[NDL_MAX_DIMS], s_strides[NDL_MAX_DIMS];
  long long offset;
  const int ndim = ndl::load_meta(meta, s_shape, s_strides, &offset);
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[ndl::strided_index(i, ndim, s_shape, s_strides, offset)] = a[i];
  // END YOUR SOLUTION
}

// out[strided_index(i)] = val (val is the element's bit pattern).
template <typename T>
__global__ void scalar_setitem(T val, T* out, const long long* meta, long long n) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  __shared__ long long s_shape[NDL_MAX_DIMS], s_strides[NDL_MAX_DIMS];
  long long offset;
  const int ndim = ndl::load_meta(meta, s_shape, s_strides, &offset);
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())
    out[ndl::strided_index(i, ndim, s_shape, s_strides, offset)] = val;
  // END YOUR SOLUTION
}
