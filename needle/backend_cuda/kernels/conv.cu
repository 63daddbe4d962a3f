// Convolution as a GPU does it (Chellapilla et al., 2006: "High performance convolutional
// neural networks for document processing"): im2col with implicit zero padding and stride, one
// GEMM forward; backward two GEMMs and one col2im. No padded, dilated or flipped copies.
//
// x is an (N, H, W, C) view read through its strides (an NCHW array seen as NHWC needs no
// copy). cols is the compact (N * Ho * Wo, KH * KW * C) matrix whose row (n, oh, ow) holds the
// window at (oh * stride - pad, ow * stride - pad), zeros outside the image:
//   forward:  y = cols @ w            (w as (KH * KW * C, Co))
//   backward: dw = cols^T @ dy,  dcols = dy @ w^T,  dx = col2im(dcols)
#include "common.cuh"

// A 4-D view (sizes n0..n3, strides s0..s3 in elements, offset) comes as nine arguments.
#define NDL_VIEW4 long long n0, long long n1, long long n2, long long n3, long long s0, \
                  long long s1, long long s2, long long s3, long long offset
// cols[(n, oh, ow), (kh, kw, c)] = x[n, oh*stride + kh - pad, ow*stride + kw - pad, c] or 0.
template <typename T>
__global__ void conv_im2col(const T* x, T* cols, NDL_VIEW4, long long ho, long long wo,
                            long long kh_, long long kw_, long long stride, long long pad) {
  const long long C = n3, total = n0 * ho * wo * kh_ * kw_ * C;
  for (long long i = ndl::global_id(); i < total; i += ndl::grid_stride()) {
    long long t = i / C;
    const long long c = i - t * C;
    const long long kw = t % kw_;
    t /= kw_;
    const long long kh = t % kh_;
    t /= kh_;
    const long long ow = t % wo;
    t /= wo;
    const long long oh = t % ho, n = t / ho;
    const long long h = oh * stride + kh - pad, w = ow * stride + kw - pad;
    cols[i] = (h >= 0 && h < n1 && w >= 0 && w < n2)
                  ? x[offset + n * s0 + h * s1 + w * s2 + c * s3]
                  : ndl::from_acc<T>(0.0f);
  }
}

// The adjoint of conv_im2col, one thread per element of dx (a gather: every window holding
// x[n, h, w, c] adds its entry of dcols, in a fixed order: no atomics, no zero fill).
// dx is written through its view (so it may keep the layout of x).
template <typename T>
__global__ void conv_col2im(const T* dcols, T* dx, NDL_VIEW4, long long ho, long long wo,
                            long long kh_, long long kw_, long long stride, long long pad) {
  typedef typename ndl::Acc<T>::type A;
  const long long C = n3, total = n0 * n1 * n2 * C;
  const long long row = kh_ * kw_ * C;
  for (long long i = ndl::global_id(); i < total; i += ndl::grid_stride()) {
    long long t = i / C;
    const long long c = i - t * C;
    const long long w = t % n2;
    t /= n2;
    const long long h = t % n1, n = t / n1;
    A acc = A(0);
    for (long long kh = 0; kh < kh_; ++kh) {
      const long long hh = h + pad - kh;  // = oh * stride for the window holding h
      if (hh < 0 || hh % stride) continue;
      const long long oh = hh / stride;
      if (oh >= ho) continue;
      for (long long kw = 0; kw < kw_; ++kw) {
        const long long ww = w + pad - kw;
        if (ww < 0 || ww % stride) continue;
        const long long ow = ww / stride;
        if (ow >= wo) continue;
        acc += ndl::to_acc(dcols[((n * ho + oh) * wo + ow) * row + (kh * kw_ + kw) * C + c]);
      }
    }
    dx[offset + n * s0 + h * s1 + w * s2 + c * s3] = ndl::from_acc<T>(acc);
  }
}

// y[r, c] += bias[c] in place for a compact (rows, cols) y.
template <typename T>
__global__ void conv_bias_add(T* y, const T* bias, long long rows, long long cols) {
  const long long total = rows * cols;
  for (long long i = ndl::global_id(); i < total; i += ndl::grid_stride())
    y[i] = ndl::from_acc<T>(ndl::to_acc(y[i]) + ndl::to_acc(bias[i % cols]));
}

// out[chunk * cols + c] = the sum of rows [chunk * rows_per, (chunk + 1) * rows_per) of column
// c of a compact (rows, cols) a, chunk = blockIdx.y: block (32, 8) per 32 columns, each of the
// 8 lanes summing its rows in order, then the lanes in order. Many rows take two passes (the
// chunks' sums in the accumulation type, then their sum).
template <typename TIn, typename TOut>
__global__ void column_sum(const TIn* a, TOut* out, long long rows, long long cols,
                           long long rows_per) {
  typedef typename ndl::Acc<TIn>::type A;
  __shared__ A part[8][32];
  const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
  const long long r0 = (long long)blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
  A s = A(0);
  if (c < cols)
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) s += ndl::to_acc(a[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    A t = A(0);
    for (int k = 0; k < 8; ++k) t += part[k][threadIdx.x];
    out[blockIdx.y * cols + c] = ndl::from_acc<TOut>(t);
  }
}
