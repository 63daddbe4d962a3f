// Row reductions: out[r] = reduce(a[r * size : (r + 1) * size]) for a compact buffer.
//
// Three launch shapes, picked in Python by ``reduce_launch``:
//   * reduce_rows_thread: one thread per row, for short rows (size <= 32) and many rows;
//   * reduce_rows_block: one block per (row, chunk), a shared-memory tree reduction within
//     the block (warp shuffles, then one value per warp);
//   * two passes when there are few rows but each is long: pass 1 writes one partial per
//     (row, chunk) in the accumulator type, pass 2 reduces those partials.
// Accumulation happens in float for half/bfloat16 inputs.
#include "common.cuh"

namespace ndl {

struct SumOp {
  template <typename A> __device__ static A identity() { return A(0); }
  template <typename A> __device__ static A combine(A x, A y) { return x + y; }
};

// NaN-propagating max, like numpy.max.
struct MaxOp {
  template <typename A> __device__ static A identity() { return -A(NDL_INF); }
  template <typename A> __device__ static A combine(A x, A y) {
    return (x != x || x > y) ? x : y;
  }
};

template <typename Op, typename A> __device__ __forceinline__ A warp_reduce(A v) {
  for (int off = 16; off > 0; off >>= 1) v = Op::combine(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace ndl

// One thread per row: out[r] = reduce(a[r*size .. r*size+size)).
template <typename TIn, typename TOut, typename Op>
__global__ void reduce_rows_thread(const TIn* a, TOut* out, long long rows, long long size) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  typedef typename ndl::Acc<TIn>::type A;
  for (long long r = ndl::global_id(); r < rows; r += ndl::grid_stride()) {
    A acc = Op::template identity<A>();
    const TIn* row = a + r * size;
    for (long long j = 0; j < size; ++j) acc = Op::combine(acc, (A)ndl::to_acc(row[j]));
    out[r] = ndl::from_acc<TOut>(acc);
  }
  // END YOUR SOLUTION
}

// Block (blockIdx.x, blockIdx.y) reduces chunk blockIdx.y of row blockIdx.x (grid-strided over
// rows) into out[row * gridDim.y + chunk]. blockDim.x is a multiple of 32, at most 1024.
template <typename TIn, typename TOut, typename Op>
__global__ void reduce_rows_block(const TIn* a, TOut* out, long long rows, long long size,
                                  long long chunk) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  typedef typename ndl::Acc<TIn>::type A;
  __shared__ A smem[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const long long start = (long long)blockIdx.y * chunk;
  const long long stop = min(size, start + chunk);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const TIn* row = a + r * size;
    A acc = Op::template identity<A>();
    for (long long j = start + threadIdx.x; j < stop; j += blockDim.x)
      acc = Op::combine(acc, (A)ndl::to_acc(row[j]));
    acc = ndl::warp_reduce<Op>(acc);
    if (lane == 0) smem[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = (lane < nwarps) ? smem[lane] : Op::template identity<A>();
      acc = ndl::warp_reduce<Op>(acc);
      if (lane == 0) out[r * gridDim.y + blockIdx.y] = ndl::from_acc<TOut>(acc);
    }
    __syncthreads();  // smem is reused by the next row
  }
  // END YOUR SOLUTION
}
