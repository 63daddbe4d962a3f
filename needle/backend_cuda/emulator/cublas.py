"""The part of cuBLAS needle's CUDA backend calls directly (bfloat16 GEMM), over NumPy on host
memory, for the emulator's CuPy (``fake_cupy.cublas``)."""
import ctypes
import types

import numpy as np

from . import counts

_R16BF, _COMPUTE_32F, _OP_N, _OP_T = 14, 68, 0, 1


def _host_matrices(ptr: int, rows: int, cols: int, ld: int, stride: int, batch: int
                   ) -> np.ndarray:
    """Column-major bfloat16 (rows, cols) matrices at ``ptr`` as a (batch, cols, rows) view."""
    import ml_dtypes
    count = (batch - 1) * stride + (cols - 1) * ld + rows if batch and cols and rows else 0
    buf = np.ctypeslib.as_array((ctypes.c_uint16 * (count if count > 0 else 1)).from_address(ptr))
    return np.lib.stride_tricks.as_strided(buf.view(ml_dtypes.bfloat16), (batch, cols, rows),
                                           (stride * 2, ld * 2, 2))


def _gemm_strided_batched_ex(handle: int, transa: int, transb: int, m: int, n: int, k: int,
                             alpha: int, A: int, Atype: int, lda: int, strideA: int, B: int,
                             Btype: int, ldb: int, strideB: int, beta: int, C: int,
                             Ctype: int, ldc: int, strideC: int, batchCount: int,
                             computeType: int, algo: int) -> None:
    """cublasGemmStridedBatchedEx for bfloat16 in, float32 compute (column-major), in NumPy.
    The arguments carry CuPy's names (``cupy_backends.cuda.libs.cublas``), checked by
    ``tests/backend_cuda/test_cupy_contract.py`` on a machine where CuPy's cuBLAS loads."""
    counts.record("library", "cublas.gemmStridedBatchedEx")
    if (Atype, Btype, Ctype, computeType) != (_R16BF, _R16BF, _R16BF, _COMPUTE_32F):
        raise NotImplementedError("the emulator's cuBLAS does bfloat16 GEMM with fp32 compute")
    if transa != _OP_N or transb != _OP_N:
        raise NotImplementedError("the emulator's cuBLAS GEMM takes untransposed operands")
    al = np.ctypeslib.as_array((ctypes.c_float * 1).from_address(alpha))[0]
    be = np.ctypeslib.as_array((ctypes.c_float * 1).from_address(beta))[0]
    # column-major (rows, cols) = row-major (cols, rows): C^T = B^T @ A^T
    at = _host_matrices(A, m, k, lda, strideA, batchCount).astype(np.float32)  # (batch, k, m)
    bt = _host_matrices(B, k, n, ldb, strideB, batchCount).astype(np.float32)  # (batch, n, k)
    ct = _host_matrices(C, m, n, ldc, strideC, batchCount)  # (batch, n, m)
    res = al * (bt @ at)
    if be != 0:
        res += be * ct.astype(np.float32)
    ct[...] = res.astype(ct.dtype)


cublas = types.SimpleNamespace(setStream=lambda handle, stream: None,
                               gemmStridedBatchedEx=_gemm_strided_batched_ex)
