// The backend's default reductions, beside the course's reduce.cu (the hw3 exercise, selected
// by set_reduce_kernel("course") and by the graded tests). What reduce.cu's one-element loads
// and one block per row leave on the table (0.56-0.75x PyTorch's bandwidth on an H100):
//   * 16-byte loads: each thread reads W = 16 / sizeof(T) elements at once where the row
//     starts 16-byte aligned (four floats, eight halves, two doubles), the tail one by one;
//   * reduce_rows_warp: a warp per row for rows up to a few thousand elements: warp shuffles
//     only, no shared memory and no barrier;
//   * reduce_rows_wide: a block per (row, chunk) for long rows, one block-level combine;
//     few long rows take a second pass over the partials (fast_reduce_launch);
//   * reduce_cols: the middle axis of (outer, size, inner) read in place, 32 neighbouring
//     columns per block row (coalesced) and 8 rows of the reduced axis per block combined in
//     shared memory: no transposed copy first.
// Accumulation in float for half / bfloat16, as reduce.cu.
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

template <typename Op, typename A> __device__ __forceinline__ A warp_combine(A v) {
  for (int off = 16; off > 0; off >>= 1) v = Op::combine(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// W elements of T in one 16-byte load.
template <typename T> struct alignas(16) Pack {
  static constexpr int W = 16 / sizeof(T);
  T v[W];
};

// This thread's share (elements tid, tid + n_threads, ...) of row[0 .. n), accumulated.
template <typename Op, typename T, typename A>
__device__ __forceinline__ A partial(const T* row, long long n, long long tid,
                                     long long n_threads) {
  A acc = Op::template identity<A>();
  constexpr int W = Pack<T>::W;
  long long head = 0;
  if ((reinterpret_cast<unsigned long long>(row) & 15) == 0) {
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(row);
    const long long n_packs = n / W;
    for (long long k = tid; k < n_packs; k += n_threads) {
      const Pack<T> p = packs[k];
#pragma unroll
      for (int e = 0; e < W; ++e) acc = Op::combine(acc, (A)to_acc(p.v[e]));
    }
    head = n_packs * W;
  }
  for (long long j = head + tid; j < n; j += n_threads) acc = Op::combine(acc, (A)to_acc(row[j]));
  return acc;
}

}  // namespace ndl

// A warp per row (grid-strided over rows): out[r] = reduce(a[r*size .. r*size+size)).
template <typename TIn, typename TOut, typename Op>
__global__ void reduce_rows_warp(const TIn* a, TOut* out, long long rows, long long size) {
  typedef typename ndl::Acc<TIn>::type A;
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    A acc = ndl::partial<Op, TIn, A>(a + r * size, size, lane, 32);
    acc = ndl::warp_combine<Op>(acc);
    if (lane == 0) out[r] = ndl::from_acc<TOut>(acc);
  }
}

// Block (blockIdx.x, blockIdx.y) reduces chunk blockIdx.y (``chunk`` elements, a multiple of
// 16 bytes' worth) of row blockIdx.x, grid-strided over rows, into out[row * gridDim.y + chunk].
template <typename TIn, typename TOut, typename Op>
__global__ void reduce_rows_wide(const TIn* a, TOut* out, long long rows, long long size,
                                 long long chunk) {
  typedef typename ndl::Acc<TIn>::type A;
  __shared__ A warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const long long start = (long long)blockIdx.y * chunk;
  const long long n = min(size, start + chunk) - start;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    A acc = ndl::partial<Op, TIn, A>(a + r * size + start, n, threadIdx.x, blockDim.x);
    acc = ndl::warp_combine<Op>(acc);
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < n_warps ? warp_sums[lane] : Op::template identity<A>();
      acc = ndl::warp_combine<Op>(acc);
      if (lane == 0) out[r * gridDim.y + blockIdx.y] = ndl::from_acc<TOut>(acc);
    }
    __syncthreads();  // warp_sums is reused by the next row
  }
}

// out[o * inner + i] = reduce over j of a[(o * size + j) * inner + i]. Blocks of (32, 8):
// threadIdx.x walks 32 neighbouring columns, threadIdx.y splits the reduced axis in 8;
// blockIdx.x covers columns, blockIdx.y outer rows (grid-strided).
template <typename TIn, typename TOut, typename Op>
__global__ void reduce_cols(const TIn* a, TOut* out, long long outer, long long size,
                            long long inner) {
  typedef typename ndl::Acc<TIn>::type A;
  __shared__ A part[8][33];
  const long long i = (long long)blockIdx.x * 32 + threadIdx.x;
  for (long long o = blockIdx.y; o < outer; o += gridDim.y) {
    A acc = Op::template identity<A>();
    if (i < inner) {
      const TIn* col = a + o * size * inner + i;
      for (long long j = threadIdx.y; j < size; j += 8)
        acc = Op::combine(acc, (A)ndl::to_acc(col[j * inner]));
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {
      for (int y = 1; y < 8; ++y) acc = Op::combine(acc, part[y][threadIdx.x]);
      out[o * inner + i] = ndl::from_acc<TOut>(acc);
    }
    __syncthreads();  // part is reused by the next outer row
  }
}
