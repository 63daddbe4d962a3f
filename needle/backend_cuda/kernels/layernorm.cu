// Fused layer norm (Ba, Kiros & Hinton, arXiv:1607.06450) over the last axis, forward and
// backward, one block per row. With xhat = (x - mean) * rstd and rstd = 1 / sqrt(var + eps):
//   forward:  y = xhat * w + b
//   backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w
//             dw = sum_rows(dy * xhat),  db = sum_rows(dy)
// The unfused version (fused.layer_norm_naive) builds the same from ~10 separate kernels.
#include "common.cuh"

namespace ndl {

// Sum of ``v`` over a warp with shuffles (all 32 lanes must be active).
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Sum of ``v`` over the whole block, returned in every thread: reduce.cu's reduce_rows_block
// tree (hw3.cuda.backend), for a sum. ``smem`` holds 32 A; calls follow one another with the
// same ``smem``. blockDim.x is a multiple of 32, at most 1024.
template <typename A> __device__ A block_sum(A v, A* smem) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = (threadIdx.x < nwarps) ? smem[threadIdx.x] : A(0);
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) smem[0] = v;
  __syncthreads();
  return smem[0];
  // END YOUR SOLUTION
}

}  // namespace ndl

// Per row r: mean[r], rstd[r] (float32 for low-precision T), y[r, :]. eps comes in the
// accumulation type: a float eps would round 1e-5 for float64 rows (rstd off by 1e-8).
template <typename T>
__global__ void layernorm_fwd(const T* x, const T* w, const T* b, T* y,
                              typename ndl::Acc<T>::type* mean_out,
                              typename ndl::Acc<T>::type* rstd_out, long long rows,
                              long long cols, typename ndl::Acc<T>::type eps) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A smem[32];
  const bool in_registers = cols <= ndl::ROW_REGS * (long long)blockDim.x;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    if (in_registers) {  // the same sums in the same order, from one read of the row
      A v[ndl::ROW_REGS], s = A(0), q = A(0);
      ndl::load_row(xr, cols, v, A(0));
#pragma unroll
      for (int u = 0; u < ndl::ROW_REGS; ++u) s += v[u];
      const A mean = ndl::block_sum(s, smem) / A(cols);
#pragma unroll
      for (int u = 0; u < ndl::ROW_REGS; ++u) {
        const A d = v[u] - mean;
        if (threadIdx.x + (long long)u * blockDim.x < cols) q += d * d;
      }
      const A rstd = A(1) / ndl::m_sqrt(ndl::block_sum(q, smem) / A(cols) + A(eps));
#pragma unroll
      for (int u = 0; u < ndl::ROW_REGS; ++u) {
        const long long j = threadIdx.x + (long long)u * blockDim.x;
        if (j < cols)
          y[r * cols + j] = ndl::from_acc<T>((v[u] - mean) * rstd * ndl::to_acc(w[j]) +
                                             ndl::to_acc(b[j]));
      }
      if (threadIdx.x == 0) {
        mean_out[r] = mean;
        rstd_out[r] = rstd;
      }
      continue;
    }
    A s = A(0);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += ndl::to_acc(xr[j]);
    const A mean = ndl::block_sum(s, smem) / A(cols);
    A q = A(0);  // second pass over the (cached) row: sum of squared deviations, stable
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
      const A d = ndl::to_acc(xr[j]) - mean;
      q += d * d;
    }
    const A rstd = A(1) / ndl::m_sqrt(ndl::block_sum(q, smem) / A(cols) + A(eps));
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
      const A xhat = (ndl::to_acc(xr[j]) - mean) * rstd;
      y[r * cols + j] = ndl::from_acc<T>(xhat * ndl::to_acc(w[j]) + ndl::to_acc(b[j]));
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// dx for each row (one block per row).
template <typename T>
__global__ void layernorm_bwd_dx(const T* dy, const T* x, const T* w,
                                 const typename ndl::Acc<T>::type* mean,
                                 const typename ndl::Acc<T>::type* rstd, T* dx, long long rows,
                                 long long cols) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A smem[32];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * cols;
    const A mu = mean[r], rs = rstd[r];
    A sg = A(0), sgx = A(0);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
      const A g = ndl::to_acc(dy[base + j]) * ndl::to_acc(w[j]);
      sg += g;
      sgx += g * (ndl::to_acc(x[base + j]) - mu) * rs;
    }
    const A mg = ndl::block_sum(sg, smem) / A(cols);
    const A mgx = ndl::block_sum(sgx, smem) / A(cols);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
      const A g = ndl::to_acc(dy[base + j]) * ndl::to_acc(w[j]);
      const A xhat = (ndl::to_acc(x[base + j]) - mu) * rs;
      dx[base + j] = ndl::from_acc<T>(rs * (g - mg - xhat * mgx));
    }
  }
}

// Partial column sums for dw, db: block (bx, by) sums rows [by*rows_per, (by+1)*rows_per) for
// columns bx*blockDim.x + threadIdx.x into dw_part[by, col], db_part[by, col] (coalesced).
template <typename T>
__global__ void layernorm_bwd_dwdb(const T* dy, const T* x, const typename ndl::Acc<T>::type* mean,
                                   const typename ndl::Acc<T>::type* rstd,
                                   typename ndl::Acc<T>::type* dw_part,
                                   typename ndl::Acc<T>::type* db_part, long long rows,
                                   long long cols, long long rows_per) {
  typedef typename ndl::Acc<T>::type A;
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const long long r0 = (long long)blockIdx.y * rows_per;
  const long long r1 = min(rows, r0 + rows_per);
  A sw = A(0), sb = A(0);
  for (long long r = r0; r < r1; ++r) {
    const A g = ndl::to_acc(dy[r * cols + c]);
    sw += g * (ndl::to_acc(x[r * cols + c]) - mean[r]) * rstd[r];
    sb += g;
  }
  dw_part[blockIdx.y * cols + c] = sw;
  db_part[blockIdx.y * cols + c] = sb;
}

// dw[c], db[c] = the sums over chunks of dw_part[:, c], db_part[:, c] (one thread per column,
// chunks in order): the second pass of layernorm_bwd_dwdb, written straight into dw and db.
template <typename T>
__global__ void layernorm_bwd_dwdb_sum(const typename ndl::Acc<T>::type* dw_part,
                                       const typename ndl::Acc<T>::type* db_part,
                                       typename ndl::Acc<T>::type* dw,
                                       typename ndl::Acc<T>::type* db, long long chunks,
                                       long long cols) {
  typedef typename ndl::Acc<T>::type A;
  for (long long c = ndl::global_id(); c < cols; c += ndl::grid_stride()) {
    A sw = A(0), sb = A(0);
    for (long long k = 0; k < chunks; ++k) {
      sw += dw_part[k * cols + c];
      sb += db_part[k * cols + c];
    }
    dw[c] = sw;
    db[c] = sb;
  }
}
