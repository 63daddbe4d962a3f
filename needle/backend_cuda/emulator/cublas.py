"""The part of cuBLAS needle's CUDA backend calls directly (its GEMMs), over NumPy on host
memory, for the emulator's CuPy (``fake_cupy.cublas``)."""
import ctypes
import types

import numpy as np

from . import counts, graph

_OP_N, _OP_T = 0, 1
_COMPUTE = {68: np.float32, 70: np.float64}  # CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F
_C_TYPE = {68: ctypes.c_float, 70: ctypes.c_double}


def _data_type(code: int) -> np.dtype:
    """cudaDataType code -> the NumPy dtype of the elements (R_32F, R_64F, R_16F, R_16BF)."""
    import ml_dtypes
    types_ = {0: np.float32, 1: np.float64, 2: np.float16, 14: ml_dtypes.bfloat16}
    if code not in types_:
        raise NotImplementedError(f"the emulator's cuBLAS has no cudaDataType {code}")
    return np.dtype(types_[code])


def _matrices(ptr: int, dtype: np.dtype, rows: int, cols: int, ld: int, stride: int,
              batch: int) -> np.ndarray:
    """Column-major (rows, cols) matrices at ``ptr`` (leading dimension ``ld``) as a
    (batch, rows, cols) view."""
    item = dtype.itemsize
    count = (batch - 1) * stride + (cols - 1) * ld + rows if batch and cols and rows else 0
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * (max(count, 1) * item)).from_address(ptr))
    return np.lib.stride_tricks.as_strided(buf.view(dtype), (batch, rows, cols),
                                           (stride * item, item, ld * item))


def _op(x: np.ndarray, op: int) -> np.ndarray:
    if op not in (_OP_N, _OP_T):
        raise NotImplementedError(f"the emulator's cuBLAS has no operation {op}")
    return x if op == _OP_N else x.transpose(0, 2, 1)


def _gemm_strided_batched_ex(handle: int, transa: int, transb: int, m: int, n: int, k: int,
                             alpha: int, A: int, Atype: int, lda: int, strideA: int, B: int,
                             Btype: int, ldb: int, strideB: int, beta: int, C: int,
                             Ctype: int, ldc: int, strideC: int, batchCount: int,
                             computeType: int, algo: int) -> None:
    """cublasGemmStridedBatchedEx (column-major C = alpha op(A) op(B) + beta C) in NumPy, for
    one data type in and out and a float32 / float64 compute type; alpha and beta are host
    pointers in the compute type. The arguments carry CuPy's names
    (``cupy_backends.cuda.libs.cublas``), checked by ``tests/backend_cuda/test_cupy_contract.py``
    on a machine where CuPy's cuBLAS loads."""
    if graph.record("cublas.gemmStridedBatchedEx", _gemm_strided_batched_ex, handle, transa,
                    transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
                    beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
        return  # captured: run by Graph.launch (operands are addresses, read then)
    counts.record("library", "cublas.gemmStridedBatchedEx")
    if not Atype == Btype == Ctype or computeType not in _COMPUTE:
        raise NotImplementedError("the emulator's cuBLAS takes one data type for A, B and C "
                                  "and a 32F or 64F compute type")
    if not counts.executing():  # kernel bodies skipped (counts.set_execute): cuBLAS's too
        return
    dt, acc = _data_type(Atype), _COMPUTE[computeType]
    al = _C_TYPE[computeType].from_address(alpha).value
    be = _C_TYPE[computeType].from_address(beta).value
    ka, kb = (m, k) if transa == _OP_N else (k, m), (k, n) if transb == _OP_N else (n, k)
    a = _op(_matrices(A, dt, *ka, lda, strideA, batchCount), transa).astype(acc)
    b = _op(_matrices(B, dt, *kb, ldb, strideB, batchCount), transb).astype(acc)
    c = _matrices(C, dt, m, n, ldc, strideC, batchCount)
    # the row-major product of the transposes (C^T = B^T A^T): the same NumPy matmul a
    # row-major caller's A @ B makes
    res = np.matmul(b.transpose(0, 2, 1), a.transpose(0, 2, 1)).transpose(0, 2, 1)
    if al != 1:
        res = res * acc(al)
    if be != 0:
        res += acc(be) * c.astype(acc)
    c[...] = res.astype(dt)


cublas = types.SimpleNamespace(setStream=lambda handle, stream: None,
                               gemmStridedBatchedEx=_gemm_strided_batched_ex)
