// Optimizer steps over many parameters in one launch, in the style of PyTorch's fused and
// foreach optimizers (multi_tensor_apply, apex's amp_C): a device table lists each tensor's
// pointers and size, each block updates one chunk of one tensor. Parameters and state are
// updated in place; the hyperparameters (float64, rounded here to the accumulator type as the
// host would) and each parameter's step count live on the device, so the
// launch arguments stay the same from step to step while the table does.
//
// Table (int64): for tensor k, words FIELDS*k ... FIELDS*k+5 are the addresses of the
// parameter, its gradient, its two state buffers (Adam m, v; SGD u, unused), its size n and
// its slot (its index in the step counts); then ntensors+1 words: the first chunk of each
// tensor (a prefix sum of ceil(n / chunk)), the last being the number of blocks.
#include "common.cuh"

// Adam / AdamW, one element (Kingma & Ba, arXiv:1412.6980;
// decoupled weight decay: Loshchilov & Hutter, arXiv:1711.05101).
//   g  = grad + wd * p            (Adam, L2 in the gradient: the course's hw2 Adam)
//   m  = b1 * m + omb1 * g          omb_i = 1 - b_i
//   v  = b2 * v + omb2 * g^2
//   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)        bc_i = 1 - b_i^t
//   AdamW instead: g = grad, and p -= lr * wd * p before the update.
// The composed step (Adam.step) reads and writes p, m, v about ten times; this reads each once.
// State m, v and the hyperparameters are in the accumulator type (float32 for half/bfloat16
// parameters). omb_i = 1 - b_i comes from the host: formed here from a float b2 = 0.999 it
// would be 1.3e-5 off, while bc2 = 1 - b2^t is exact.
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

#define NDL_MT_FIELDS 6

// The tensor whose chunks hold block b: the largest k with first[k] <= b.
__device__ __forceinline__ int mt_tensor_of(const long long* table, int ntensors, long long b) {
  const long long* first = table + NDL_MT_FIELDS * ntensors;
  int lo = 0, hi = ntensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Before an Adam step: count it for each tensor in the table, and its bias corrections
// bc[2 slot] = 1 - b1^t, bc[2 slot + 1] = 1 - b2^t in double (the host's 1 - b ** t).
// hyper = [lr, b1, 1 - b1, b2, 1 - b2, eps, wd].
__global__ void multi_tensor_adam_count(const long long* table, int ntensors, long long* steps,
                                        const double* hyper, double* bc) {
  for (long long k = ndl::global_id(); k < ntensors; k += ndl::grid_stride()) {
    const long long slot = table[NDL_MT_FIELDS * k + 5];
    const long long t = steps[slot] + 1;
    steps[slot] = t;
    bc[2 * slot] = 1.0 - pow(hyper[1], (double)t);
    bc[2 * slot + 1] = 1.0 - pow(hyper[3], (double)t);
  }
}

// adam_element on chunk (block - first[k]) of each tensor k; m, v in the accumulator type.
template <typename T>
__global__ void multi_tensor_adam(const long long* table, int ntensors, long long chunk,
                                  const double* hyper, const double* bc, int decoupled) {
  typedef acc_t<T> A;
  const int k = mt_tensor_of(table, ntensors, blockIdx.x);
  const long long* e = table + NDL_MT_FIELDS * k;
  T* p = reinterpret_cast<T*>(e[0]);
  const T* grad = reinterpret_cast<const T*>(e[1]);
  A* m = reinterpret_cast<A*>(e[2]);
  A* v = reinterpret_cast<A*>(e[3]);
  const long long n = e[4], slot = e[5];
  const long long begin = ((long long)blockIdx.x - table[NDL_MT_FIELDS * ntensors + k]) * chunk;
  const long long end = begin + chunk < n ? begin + chunk : n;
  const A lr = (A)hyper[0], b1 = (A)hyper[1], omb1 = (A)hyper[2], b2 = (A)hyper[3];
  const A omb2 = (A)hyper[4], eps = (A)hyper[5], wd = (A)hyper[6];
  const A bc1 = (A)bc[2 * slot], bc2 = (A)bc[2 * slot + 1];
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    adam_element(p, grad, m, v, i, lr, b1, omb1, b2, omb2, eps, wd, bc1, bc2, decoupled);
  }
}

// The course's SGD (hw2) on chunk (block - first[k]) of each tensor k, as its composed ops:
//   g = grad + w * wd (when wd != 0);  u = u * mom + g * (1 - mom), g = u (when mom != 0,
//   u starting at 0);  p = w - g * lr.   hyper = [lr, mom, 1 - mom, wd]; u accumulator-typed.
template <typename T>
__global__ void multi_tensor_sgd(const long long* table, int ntensors, long long chunk,
                                 const double* hyper) {
  typedef acc_t<T> A;
  const int k = mt_tensor_of(table, ntensors, blockIdx.x);
  const long long* e = table + NDL_MT_FIELDS * k;
  T* p = reinterpret_cast<T*>(e[0]);
  const T* grad = reinterpret_cast<const T*>(e[1]);
  A* u = reinterpret_cast<A*>(e[2]);
  const long long n = e[4];
  const long long begin = ((long long)blockIdx.x - table[NDL_MT_FIELDS * ntensors + k]) * chunk;
  const long long end = begin + chunk < n ? begin + chunk : n;
  const A lr = (A)hyper[0], mom = (A)hyper[1], omm = (A)hyper[2], wd = (A)hyper[3];
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A w = ndl::to_acc(p[i]);
    A g = ndl::to_acc(grad[i]);
    if (wd != (A)0) g = g + w * wd;
    if (mom != (A)0) {
      g = u[i] * mom + g * omm;
      u[i] = g;
    }
    p[i] = ndl::from_acc<T>(w - g * lr);
  }
}
