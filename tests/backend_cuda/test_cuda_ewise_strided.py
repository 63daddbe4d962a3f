"""The CUDA backend's ewise_strided: a binary op reads broadcast, transposed and sliced operands
in place (one launch, no compact copy), with the results of the compacted path."""
import ml_dtypes
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA device")]
def _np(x, dtype):
    return x.numpy().astype(np.float64) if dtype == "bfloat16" else x.numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64"])
@pytest.mark.parametrize("op", ["add", "mul", "maximum", "gt"])
def test_views_are_read_in_place_with_the_compacted_results(dtype, op):
    rng = np.random.default_rng(0)
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    dev = ndl.cuda()
    x = NDArray((rng.standard_normal((12, 6)) * 4).astype(np_dt), device=dev)
    y = NDArray((rng.standard_normal((5, 7)) * 4).astype(np_dt), device=dev)
    a, b = x[::2, 1:], y.permute((1, 0))[1:, :]                      # (6, 5) each
    f = {"add": lambda p, q: p + q, "mul": lambda p, q: p * q,
         "maximum": lambda p, q: p.maximum(q), "gt": lambda p, q: p > q}[op]
    got = f(a, b)
    want = f(a.compact(), b.compact())
    np.testing.assert_array_equal(_np(got, dtype), _np(want, dtype))
    bias = x[0:1, 1:].broadcast_to((6, 5))
    np.testing.assert_array_equal(_np(f(b, bias), dtype), _np(f(b.compact(), bias.compact()),
                                                            dtype))


@pytest.mark.skipif(not getattr(ndl.cuda().mod, "EMULATED", False),
                    reason="counted at the emulator's CuPy surface")
def test_a_broadcast_bias_add_is_one_launch():
    from needle.backend_cuda.emulator import counts
    dev = ndl.cuda()
    x = NDArray(np.ones((8, 4), np.float32), device=dev)
    bias = NDArray(np.arange(4, dtype=np.float32).reshape(1, 4), device=dev)
    x + bias.broadcast_to((8, 4))  # warm the view descriptions' cache
    with counts.counting() as c:
        out = x + bias.broadcast_to((8, 4))
    assert c.by_kind["launch"] == {"ewise_strided<float, float, ndl::Add>": 1}
    np.testing.assert_array_equal(out.numpy(), np.ones((8, 4)) + np.arange(4)[None, :])
