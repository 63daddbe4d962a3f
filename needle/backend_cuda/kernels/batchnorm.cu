// Batch normalization of (N, C, H, W) images per channel (Ioffe & Szegedy, arXiv:1502.03167),
// statistics over the R = N * H * W rows, in four kernels instead of ~60 elementwise ones:
//   forward:  bn_fwd_partials  per (channel, row chunk): count, mean, M2 (Welford);
//             bn_fwd_apply     each block merges its channels' partials (Chan et al.) into
//                              mean and rstd = 1 / sqrt(var + eps) (biased var, as the course),
//                              writes y = xhat * w + b for its chunk; chunk 0 also saves mean,
//                              rstd and the new running statistics
//                              (1 - momentum) * running + momentum * batch.
//   backward: bn_bwd_partials  per (channel, chunk): sum dy, sum dy * xhat;
//             bn_bwd_apply     dx = w * rstd * (dy - sum(dy) / R - xhat * sum(dy * xhat) / R),
//                              chunk 0 also writes dw = sum(dy * xhat), db = sum(dy).
// Every array is read and written through its strides (an NHWC buffer seen as NCHW needs no
// copy). A block is 32 channels x 8 row lanes; every sum runs in a fixed order (no atomics).
#include "common.cuh"

// Strides (in elements, of the N, C, H, W axes) and offset of one array.
#define NDL_STRIDES(p) long long p##0, long long p##1, long long p##2, long long p##3, \
                       long long p##off
// Element (row r, channel c) of an array with strides prefix p; hw = H * W.
#define NDL_AT(p, r, c)                                                              \
  (p##off + ((r) / hw) * p##0 + (c) * p##1 + (((r) % hw) / W) * p##2 + ((r) % W) * p##3)

namespace ndl {
// (count, mean, M2) of a merged with b (Chan, Golub & LeVeque, 1979).
template <typename A> __device__ __forceinline__ void chan_merge(A& n, A& mean, A& m2, A nb,
                                                                 A mb, A m2b) {
  if (nb == A(0)) return;
  const A tot = n + nb, d = mb - mean;
  mean += d * nb / tot;
  m2 += m2b + d * d * n * nb / tot;
  n = tot;
}
}  // namespace ndl

template <typename T>
__global__ void bn_fwd_partials(const T* x, NDL_STRIDES(x), long long C, long long hw,
                                long long W, long long rows, long long rows_per,
                                typename ndl::Acc<T>::type* part_mean,
                                typename ndl::Acc<T>::type* part_m2) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A sn[8][32], sm[8][32], sq[8][32];
  const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
  const long long r0 = (long long)blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
  A n = A(0), mean = A(0), m2 = A(0);
  if (c < C)
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) {  // Welford
      const A v = ndl::to_acc(x[NDL_AT(x, r, c)]);
      n += A(1);
      const A d = v - mean;
      mean += d / n;
      m2 += d * (v - mean);
    }
  sn[threadIdx.y][threadIdx.x] = n;
  sm[threadIdx.y][threadIdx.x] = mean;
  sq[threadIdx.y][threadIdx.x] = m2;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < 8; ++k)
      ndl::chan_merge(n, mean, m2, sn[k][threadIdx.x], sm[k][threadIdx.x], sq[k][threadIdx.x]);
    part_mean[blockIdx.y * C + c] = mean;
    part_m2[blockIdx.y * C + c] = m2;
  }
}

template <typename T>
__global__ void bn_fwd_apply(const T* x, NDL_STRIDES(x), T* y, NDL_STRIDES(y), const T* w,
                             const T* b, const T* running_mean, const T* running_var,
                             T* new_mean, T* new_var, long long C, long long hw, long long W,
                             long long rows, long long rows_per, long long chunks,
                             const typename ndl::Acc<T>::type* part_mean,
                             const typename ndl::Acc<T>::type* part_m2,
                             typename ndl::Acc<T>::type* mean_out,
                             typename ndl::Acc<T>::type* rstd_out,
                             typename ndl::Acc<T>::type momentum,
                             typename ndl::Acc<T>::type eps) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A s_mean[32], s_rstd[32];
  const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
  if (threadIdx.y == 0 && c < C) {
    A n = A(0), mean = A(0), m2 = A(0);
    for (long long k = 0; k < chunks; ++k)
      ndl::chan_merge(n, mean, m2, A(min(rows_per, rows - k * rows_per)), part_mean[k * C + c],
                      part_m2[k * C + c]);
    const A var = m2 / A(rows);
    const A rstd = A(1) / ndl::m_sqrt(var + eps);
    s_mean[threadIdx.x] = mean;
    s_rstd[threadIdx.x] = rstd;
    if (blockIdx.y == 0) {
      mean_out[c] = mean;
      rstd_out[c] = rstd;
      const A keep = A(1) - momentum;
      new_mean[c] = ndl::from_acc<T>(ndl::to_acc(running_mean[c]) * keep + mean * momentum);
      new_var[c] = ndl::from_acc<T>(ndl::to_acc(running_var[c]) * keep + var * momentum);
    }
  }
  __syncthreads();
  if (c >= C) return;
  const A mean = s_mean[threadIdx.x], rstd = s_rstd[threadIdx.x];
  const A wc = ndl::to_acc(w[c]), bc = ndl::to_acc(b[c]);
  const long long r0 = (long long)blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
  for (long long r = r0 + threadIdx.y; r < r1; r += 8)
    y[NDL_AT(y, r, c)] =
        ndl::from_acc<T>((ndl::to_acc(x[NDL_AT(x, r, c)]) - mean) * rstd * wc + bc);
}

template <typename T>
__global__ void bn_bwd_partials(const T* dy, NDL_STRIDES(g), const T* x, NDL_STRIDES(x),
                                long long C, long long hw, long long W, long long rows,
                                long long rows_per, const typename ndl::Acc<T>::type* mean,
                                const typename ndl::Acc<T>::type* rstd,
                                typename ndl::Acc<T>::type* part_dy,
                                typename ndl::Acc<T>::type* part_dyx) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A s1[8][32], s2[8][32];
  const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
  const long long r0 = (long long)blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
  A sd = A(0), sdx = A(0);
  if (c < C) {
    const A mu = mean[c], rs = rstd[c];
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
      const A g = ndl::to_acc(dy[NDL_AT(g, r, c)]);
      sd += g;
      sdx += g * (ndl::to_acc(x[NDL_AT(x, r, c)]) - mu) * rs;
    }
  }
  s1[threadIdx.y][threadIdx.x] = sd;
  s2[threadIdx.y][threadIdx.x] = sdx;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < 8; ++k) {
      sd += s1[k][threadIdx.x];
      sdx += s2[k][threadIdx.x];
    }
    part_dy[blockIdx.y * C + c] = sd;
    part_dyx[blockIdx.y * C + c] = sdx;
  }
}

template <typename T>
__global__ void bn_bwd_apply(const T* dy, NDL_STRIDES(g), const T* x, NDL_STRIDES(x), T* dx,
                             NDL_STRIDES(d), const T* w, T* dw, T* db, long long C,
                             long long hw, long long W, long long rows, long long rows_per,
                             long long chunks, const typename ndl::Acc<T>::type* mean,
                             const typename ndl::Acc<T>::type* rstd,
                             const typename ndl::Acc<T>::type* part_dy,
                             const typename ndl::Acc<T>::type* part_dyx) {
  typedef typename ndl::Acc<T>::type A;
  __shared__ A s_dy[32], s_dyx[32];
  const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
  if (threadIdx.y == 0 && c < C) {
    A sd = A(0), sdx = A(0);
    for (long long k = 0; k < chunks; ++k) {
      sd += part_dy[k * C + c];
      sdx += part_dyx[k * C + c];
    }
    s_dy[threadIdx.x] = sd;
    s_dyx[threadIdx.x] = sdx;
    if (blockIdx.y == 0) {
      dw[c] = ndl::from_acc<T>(sdx);
      db[c] = ndl::from_acc<T>(sd);
    }
  }
  __syncthreads();
  if (c >= C) return;
  const A mu = mean[c], rs = rstd[c], scale = ndl::to_acc(w[c]) * rs;
  const A mdy = s_dy[threadIdx.x] / A(rows), mdyx = s_dyx[threadIdx.x] / A(rows);
  const long long r0 = (long long)blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
  for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
    const A xhat = (ndl::to_acc(x[NDL_AT(x, r, c)]) - mu) * rs;
    dx[NDL_AT(d, r, c)] =
        ndl::from_acc<T>(scale * (ndl::to_acc(dy[NDL_AT(g, r, c)]) - mdy - xhat * mdyx));
  }
}
