// Matrix multiply kernels for teaching: out[b] = A[b] @ B[b], A (m, n), B (n, p), row-major.
//
// matmul_naive: one thread per output element, every operand read from global memory
//   (2 * n loads per output; memory bound).
// matmul_tiled: shared-memory tiling with register blocking (Volkov & Demmel, "Benchmarking
//   GPUs to tune dense linear algebra", SC 2008; the scheme CUTLASS builds on). A block computes
//   a BM x BN tile of C, stepping through n in slices of BK: it stages the A and B slices in
//   shared memory, and each thread computes a TM x TN sub-tile from registers, so each loaded
//   value is reused TM (or TN) times. Arithmetic intensity grows from O(1) to O(TM*TN/(TM+TN)).
// The default path is cuBLAS (cupy.matmul); these stay for teaching and the benchmark.
#include "common.cuh"

#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
// (BM / TM) * (BN / TN) = 256 threads per block.

// C[b] = A[b] @ B[b] for batch b = blockIdx.z: one thread per element C[b][row][col] (row from
// the y, col from the x dimension of the grid), accumulating in Acc<T> from global memory.
template <typename T>
__global__ void matmul_naive(const T* A, const T* B, T* C, int m, int n, int p) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  typedef typename ndl::Acc<T>::type Acc;
  const long long b = blockIdx.z;
  A += b * m * n;
  B += b * n * p;
  C += b * m * p;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= p) return;
  Acc acc = Acc(0);
  for (int k = 0; k < n; ++k)
    acc += ndl::to_acc(A[(long long)row * n + k]) * ndl::to_acc(B[(long long)k * p + col]);
  C[(long long)row * p + col] = ndl::from_acc<T>(acc);
  // END YOUR SOLUTION
}

// The same product, a BM x BN tile of C per block of 256 threads, each thread a TM x TN sub-tile
// in registers, stepping through n in BK-wide slices of A and B staged in shared memory.
template <typename T>
__global__ void __launch_bounds__(256) matmul_tiled(const T* A, const T* B, T* C, int m, int n,
                                                    int p) {
  // BEGIN YOUR SOLUTION (hw3.cuda.backend)
  typedef typename ndl::Acc<T>::type Acc;
  __shared__ Acc As[BK][BM];  // A slice, transposed so a thread reads TM consecutive rows
  __shared__ Acc Bs[BK][BN];
  const long long b = blockIdx.z;
  A += b * m * n;
  B += b * n * p;
  C += b * m * p;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  const int tid = threadIdx.x;
  const int ty = tid / (BN / TN), tx = tid % (BN / TN);  // this thread's sub-tile
  Acc acc[TM][TN];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = Acc(0);
  Acc ra[TM], rb[TN];

  for (int k0 = 0; k0 < n; k0 += BK) {
    // Stage A[row0:row0+BM, k0:k0+BK] and B[k0:k0+BK, col0:col0+BN]; zero outside the matrix.
    for (int e = tid; e < BM * BK; e += 256) {
      const int r = e / BK, k = e % BK;
      const int gr = row0 + r, gk = k0 + k;
      As[k][r] = (gr < m && gk < n) ? ndl::to_acc(A[(long long)gr * n + gk]) : Acc(0);
    }
    for (int e = tid; e < BK * BN; e += 256) {
      const int k = e / BN, c = e % BN;
      const int gk = k0 + k, gc = col0 + c;
      Bs[k][c] = (gk < n && gc < p) ? ndl::to_acc(B[(long long)gk * p + gc]) : Acc(0);
    }
    __syncthreads();
    for (int k = 0; k < BK; ++k) {
      for (int i = 0; i < TM; ++i) ra[i] = As[k][ty * TM + i];
      for (int j = 0; j < TN; ++j) rb[j] = Bs[k][tx * TN + j];
      for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty * TM + i;
    if (r >= m) break;
    for (int j = 0; j < TN; ++j) {
      const int c = col0 + tx * TN + j;
      if (c < p) C[(long long)r * p + c] = ndl::from_acc<T>(acc[i][j]);
    }
  }
  // END YOUR SOLUTION
}
