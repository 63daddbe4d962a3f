// Optimizer steps over many parameters in one launch, in the style of PyTorch's fused and
// foreach optimizers (multi_tensor_apply, apex's amp_C): a device table lists each tensor's
// pointers and size, each block updates one chunk of one tensor. Parameters and state are
// updated in place; the hyperparameters (float64, rounded here to the accumulator type as the
// host rounds them for adam_step) and each parameter's step count live on the device, so the
// launch arguments stay the same from step to step while the table does.
//
// Table (int64): for tensor k, words FIELDS*k ... FIELDS*k+5 are the addresses of the
// parameter, its gradient, its two state buffers (Adam m, v; SGD u, unused), its size n and
// its slot (its index in the step counts); then ntensors+1 words: the first chunk of each
// tensor (a prefix sum of ceil(n / chunk)), the last being the number of blocks.
#include "adam.cu"

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

// adam.cu's step on chunk (block - first[k]) of each tensor k; m, v in the accumulator type.
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
