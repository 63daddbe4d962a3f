"""The cuBLAS path of the CUDA matmul: one ``gemmStridedBatchedEx`` per product, transposed
operands read as stored, every float dtype, against NumPy in float64."""
import ml_dtypes
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA device")]
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("dtype", sorted(TOL))
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_gemm_reads_transposed_operands_in_place(dtype, trans_a, trans_b, batch):
    rng = np.random.default_rng(batch + 2 * trans_a + 4 * trans_b)
    m, n, p = 5, 7, 3
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a = rng.standard_normal((batch, n, m) if trans_a else (batch, m, n)).astype(np_dt)
    b = rng.standard_normal((batch, p, n) if trans_b else (batch, n, p)).astype(np_dt)
    dev = ndl.cuda()
    ha, hb = NDArray(a, device=dev), NDArray(b, device=dev)
    out = NDArray.make((batch, m, p), device=dev, dtype=dtype)
    dev.matmul(ha._handle, hb._handle, out._handle, batch, m, n, p, trans_a, trans_b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.transpose(0, 2, 1) if trans_a else a64) @ (b64.transpose(0, 2, 1) if trans_b
                                                          else b64)
    np.testing.assert_allclose(out.numpy().astype(np.float64), want, rtol=TOL[dtype],
                               atol=TOL[dtype] * 10)


@pytest.mark.skipif(not getattr(ndl.cuda().mod, "EMULATED", False),
                    reason="counted at the emulator's CuPy surface")
def test_a_transposed_product_is_one_cublas_call_and_no_copy():
    from needle.backend_cuda.emulator import counts
    dev = ndl.cuda()
    x = NDArray(np.ones((4, 6), np.float32), device=dev)
    w = NDArray(np.ones((5, 6), np.float32), device=dev)
    with counts.counting() as c:
        x @ w.permute((1, 0))
    assert c.by_kind["library"] == {"cublas.gemmStridedBatchedEx": 1}
    assert c.total("launch") == 0 and c.total("alloc") <= 1  # the result only (or pooled)
