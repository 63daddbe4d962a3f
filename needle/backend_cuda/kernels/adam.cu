// One fused Adam / AdamW step over a flat parameter (Kingma & Ba, arXiv:1412.6980;
// decoupled weight decay: Loshchilov & Hutter, arXiv:1711.05101).
//   g  = grad + wd * p            (Adam, L2 in the gradient: the course's hw2 Adam)
//   m  = b1 * m + omb1 * g          omb_i = 1 - b_i
//   v  = b2 * v + omb2 * g^2
//   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)        bc_i = 1 - b_i^t
//   AdamW instead: g = grad, and p -= lr * wd * p before the update.
// The composed version reads and writes p, m, v about ten times; this reads each once.
// State m, v and the hyperparameters are in the accumulator type (float32 for half/bfloat16
// parameters). omb_i = 1 - b_i comes from the host: formed here from a float b2 = 0.999 it
// would be 1.3e-5 off, while bc2 = 1 - b2^t is exact.
// multi_tensor.cu runs adam_element over many parameters in one launch.
#pragma once
#include "common.cuh"

template <typename T>
using acc_t = typename ndl::Acc<T>::type;

// The step above for element i of one parameter.
template <typename T>
__device__ __forceinline__ void adam_element(T* p, const T* grad, acc_t<T>* m, acc_t<T>* v,
                                             long long i, acc_t<T> lr, acc_t<T> b1,
                                             acc_t<T> omb1, acc_t<T> b2, acc_t<T> omb2,
                                             acc_t<T> eps, acc_t<T> wd, acc_t<T> bc1,
                                             acc_t<T> bc2, int decoupled) {
  typedef acc_t<T> A;
  A w = ndl::to_acc(p[i]);
  A g = ndl::to_acc(grad[i]);
  if (decoupled) {
    w -= lr * wd * w;
  } else {
    g += wd * w;
  }
  const A mi = b1 * m[i] + omb1 * g;
  const A vi = b2 * v[i] + omb2 * g * g;
  m[i] = mi;
  v[i] = vi;
  w -= lr * (mi / bc1) / (ndl::m_sqrt(vi / bc2) + eps);
  p[i] = ndl::from_acc<T>(w);
}

template <typename T>
__global__ void adam_step(T* p, const T* grad, acc_t<T>* m, acc_t<T>* v, long long n,
                          acc_t<T> lr, acc_t<T> b1, acc_t<T> omb1, acc_t<T> b2, acc_t<T> omb2,
                          acc_t<T> eps, acc_t<T> wd, acc_t<T> bc1, acc_t<T> bc2,
                          int decoupled) {
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride()) {
    adam_element(p, grad, m, v, i, lr, b1, omb1, b2, omb2, eps, wd, bc1, bc2, decoupled);
  }
}
