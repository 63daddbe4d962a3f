// Fused softmax and logsumexp over the last axis: one block per row.
//
// The unfused version (needle.backend_cuda.fused.softmax_naive) launches max, subtract, exp,
// sum and divide kernels and reads or writes the row ~8 times. Here each row is read once when
// it fits in the block's registers (4 elements a thread; else twice):
// pass 1 keeps a running (max m, sum s) pair per thread with the "online softmax" update
//   m' = max(m, x),  s' = s * exp(m - m') + exp(x - m')
// (Milakov & Gimelshein, "Online normalizer calculation for softmax", arXiv:1805.02867),
// merged across the block; pass 2 writes exp(x - m) / s (or m + log s for logsumexp).
#include "common.cuh"

namespace ndl {

// Merge two (max, sum) pairs; an all -inf side contributes nothing.
template <typename A> __device__ __forceinline__ void merge(A& m, A& s, A m2, A s2) {
  const A mn = m > m2 ? m : m2;
  if (mn == -A(NDL_INF)) return;  // both empty
  s = s * m_exp(m - mn) + s2 * m_exp(m2 - mn);
  m = mn;
}

// Fold x into the running (max m, sum s) pair of one thread.
template <typename A> __device__ __forceinline__ void online_add(A& m, A& s, A v) {
  if (v > m) {
    s = s * m_exp(m - v) + A(1);
    m = v;
  } else if (!(v == -A(NDL_INF))) {  // -inf adds 0 (and exp(-inf - -inf) would be NaN)
    s += m_exp(v - m);
  }
}

// Merge every thread's (m, s) into the row's, returned in every thread (``*m_out``,
// ``*s_out``): reduce.cu's reduce_rows_block tree (hw3.cuda.backend) over pairs, ``merge``
// combining them. Calls follow one another (one per row). blockDim.x is a multiple of 32, at
// most 1024.
template <typename A> __device__ void block_merge(A m, A s, A* m_out, A* s_out) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  __shared__ A sm[32], ss[32];
  for (int off = 16; off > 0; off >>= 1)
    merge(m, s, __shfl_down_sync(0xffffffffu, m, off), __shfl_down_sync(0xffffffffu, s, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? sm[lane] : -A(NDL_INF);
    s = lane < nwarps ? ss[lane] : A(0);
    for (int off = 16; off > 0; off >>= 1)
      merge(m, s, __shfl_down_sync(0xffffffffu, m, off), __shfl_down_sync(0xffffffffu, s, off));
    if (lane == 0) { sm[0] = m; ss[0] = s; }
  }
  __syncthreads();
  *m_out = sm[0];
  *s_out = ss[0];
  __syncthreads();
  // END YOUR SOLUTION
}

// Row max and sum of exp(x - max) over the block, reading the row from memory.
template <typename T, typename A>
__device__ void row_stats(const T* x, long long cols, A* m_out, A* s_out) {
  A m = -A(NDL_INF), s = A(0);
  for (long long j = threadIdx.x; j < cols; j += blockDim.x) online_add(m, s, to_acc(x[j]));
  block_merge(m, s, m_out, s_out);
}

}  // namespace ndl

// y[r, :] = softmax(x[r, :]) for a compact (rows, cols) buffer.
template <typename T>
__global__ void softmax_rows(const T* x, T* y, long long rows, long long cols) {
  typedef typename ndl::Acc<T>::type A;
  const bool in_registers = cols <= ndl::ROW_REGS * (long long)blockDim.x;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    A m, s;
    if (in_registers) {
      A v[ndl::ROW_REGS], mt = -A(NDL_INF), st = A(0);
      ndl::load_row(xr, cols, v, -A(NDL_INF));
#pragma unroll
      for (int u = 0; u < ndl::ROW_REGS; ++u) ndl::online_add(mt, st, v[u]);
      ndl::block_merge(mt, st, &m, &s);
      const A inv = A(1) / s;
#pragma unroll
      for (int u = 0; u < ndl::ROW_REGS; ++u) {
        const long long j = threadIdx.x + (long long)u * blockDim.x;
        if (j < cols) y[r * cols + j] = ndl::from_acc<T>(ndl::m_exp(v[u] - m) * inv);
      }
      continue;
    }
    ndl::row_stats<T, A>(xr, cols, &m, &s);
    const A inv = A(1) / s;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
      y[r * cols + j] = ndl::from_acc<T>(ndl::m_exp(ndl::to_acc(xr[j]) - m) * inv);
  }
}

// y[r] = log(sum(exp(x[r, :]))) computed stably.
template <typename T>
__global__ void logsumexp_rows(const T* x, T* y, long long rows, long long cols) {
  typedef typename ndl::Acc<T>::type A;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    A m, s;
    ndl::row_stats<T, A>(x + r * cols, cols, &m, &s);
    if (threadIdx.x == 0)
      y[r] = ndl::from_acc<T>((m == -A(NDL_INF) || m == A(NDL_INF)) ? m : m + ndl::m_log(s));
  }
}
