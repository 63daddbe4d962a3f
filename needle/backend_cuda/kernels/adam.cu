// One fused Adam / AdamW step over a flat parameter (Kingma & Ba, arXiv:1412.6980;
// decoupled weight decay: Loshchilov & Hutter, arXiv:1711.05101).
//   g  = grad + wd * p            (Adam, L2 in the gradient: the course's hw2 Adam)
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g^2
//   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)        bc_i = 1 - b_i^t
//   AdamW instead: g = grad, and p -= lr * wd * p before the update.
// The composed version reads and writes p, m, v about ten times; this reads each once.
// State m, v is kept in the accumulator type (float32 for half/bfloat16 parameters).
#include "common.cuh"

template <typename T>
__global__ void adam_step(T* p, const T* grad, typename ndl::Acc<T>::type* m,
                          typename ndl::Acc<T>::type* v, long long n, float lr, float b1,
                          float b2, float eps, float wd, float bc1, float bc2, int decoupled) {
  typedef typename ndl::Acc<T>::type A;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride()) {
    A w = ndl::to_acc(p[i]);
    A g = ndl::to_acc(grad[i]);
    if (decoupled) {
      w -= A(lr) * A(wd) * w;
    } else {
      g += A(wd) * w;
    }
    const A mi = A(b1) * m[i] + (A(1) - A(b1)) * g;
    const A vi = A(b2) * v[i] + (A(1) - A(b2)) * g * g;
    m[i] = mi;
    v[i] = vi;
    w -= A(lr) * (mi / A(bc1)) / (ndl::m_sqrt(vi / A(bc2)) + A(eps));
    p[i] = ndl::from_acc<T>(w);
  }
}
