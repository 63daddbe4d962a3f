"""Every kernels/*.cu file run on the CUDA emulator against NumPy, launched as the backend does.

Kernel names and launch shapes come from kernel_specs. Expected values are computed here in
float64 NumPy (or bit-exactly with ml_dtypes for casts); tolerances allow for g++ not
contracting multiply-adds as NVRTC does and for float32 accumulation of 16-bit inputs.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from emu_helpers import NP_DTYPE, kernel, ptr

from needle.backend_cuda import kernel_specs as K
from needle.backend_ndarray import primitives as P

DTYPES = K.FLOAT_DTYPES
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-5, "float64": 1e-11}


def rand(shape, dtype: str, lo: float = -1.0, hi: float = 1.0, seed: int = 0) -> np.ndarray:
    """Random values of ``dtype`` (exactly representable, so references see the same input)."""
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(NP_DTYPE[dtype])


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def close(got: np.ndarray, want: np.ndarray, dtype: str, atol_scale: float = 1.0) -> None:
    np.testing.assert_allclose(f64(got), f64(want), rtol=RTOL[dtype],
                               atol=RTOL[dtype] * atol_scale, equal_nan=True)


def launch_ewise(k, n: int, args) -> None:
    grid, block = K.ewise_launch(n)
    k((grid,), (block,), args)


# ---------------------------------------------------------------------- strided.cu
VIEWS = [((3, 4, 5), (1, 3, 12), 0),          # a transposed (5, 4, 3) buffer
         ((2, 3), (20, 2), 7),                 # a strided slice with an offset
         ((4, 1, 6), (6, 0, 1), 0)]            # a broadcast axis (stride 0)


def _view(base: np.ndarray, shape, strides, offset) -> np.ndarray:
    item = base.itemsize
    return np.lib.stride_tricks.as_strided(base[offset:], shape, [s * item for s in strides])


@pytest.mark.parametrize("width", sorted(K.BITS_CTYPE))
@pytest.mark.parametrize("shape,strides,offset", VIEWS)
def test_strided_copies(width, shape, strides, offset):
    dt = np.dtype(f"u{width}")
    base = np.arange(1, 61, dtype=dt) * 3
    meta = np.array(K.view_meta(shape, strides, offset), dtype=np.int64)
    n = math.prod(shape)
    out = np.zeros(n, dt)
    launch_ewise(kernel("strided.cu", K.strided_name("compact", width)), n,
                 (ptr(base), ptr(out), ptr(meta), np.int64(n)))
    np.testing.assert_array_equal(out, _view(base, shape, strides, offset).ravel())
    if 0 in strides:
        return  # writing through a broadcast view is ill-defined
    src = (np.arange(n, dtype=dt) + 100).astype(dt)
    target = base.copy()
    launch_ewise(kernel("strided.cu", K.strided_name("ewise_setitem", width)), n,
                 (ptr(src), ptr(target), ptr(meta), np.int64(n)))
    want = base.copy()
    _view(want, shape, strides, offset)[...] = src.reshape(shape)
    np.testing.assert_array_equal(target, want)
    target = base.copy()
    launch_ewise(kernel("strided.cu", K.strided_name("scalar_setitem", width)), n,
                 (dt.type(7), ptr(target), ptr(meta), np.int64(n)))
    want = base.copy()
    _view(want, shape, strides, offset)[...] = 7
    np.testing.assert_array_equal(target, want)


# ---------------------------------------------------------------------- ewise.cu
NUMPY_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                "pow": np.power, "maximum": np.maximum, "eq": np.equal, "ne": np.not_equal,
                "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
NUMPY_UNARY = {"neg": np.negative, "log": np.log, "exp": np.exp, "tanh": np.tanh,
               "sqrt": np.sqrt, "abs": np.abs, "sin": np.sin, "cos": np.cos}


def acc_scalar(dtype: str, v: float):
    return np.float64(v) if K.ACC_DTYPE[dtype] == "float64" else np.float32(v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(P.EWISE_BINARY))
def test_ewise_binary_and_scalar(dtype, op):
    n = 700
    a, b = rand(n, dtype, 0.5, 2.0, 1), rand(n, dtype, 0.5, 2.0, 2)
    b[::7] = a[::7]  # equal pairs for the comparisons
    a[5], b[6] = np.nan, np.nan  # NaN-propagating maximum, NaN comparisons
    cmp = op in P.COMPARISONS
    out_dt = np.bool_ if cmp else NP_DTYPE[dtype]
    for scalar in (False, True):
        out = np.zeros(n, out_dt)
        k = kernel("ewise.cu", K.binary_name(op, dtype, scalar), dtype)
        rhs = acc_scalar(dtype, 1.25) if scalar else ptr(b)
        launch_ewise(k, n, (ptr(a), rhs, ptr(out), np.int64(n)))
        want = NUMPY_BINARY[op](f64(a), f64(1.25) if scalar else f64(b))
        if cmp:
            np.testing.assert_array_equal(out, want)
        else:
            close(out, want.astype(NP_DTYPE[dtype]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(P.EWISE_UNARY))
def test_ewise_unary(dtype, op):
    n = 600
    a = rand(n, dtype, 0.1, 3.0, 3)
    if op in ("neg", "abs", "sin", "cos", "tanh", "exp"):
        a = rand(n, dtype, -3.0, 3.0, 3)
    out = np.zeros(n, NP_DTYPE[dtype])
    launch_ewise(kernel("ewise.cu", K.unary_name(op, dtype), dtype), n,
                 (ptr(a), ptr(out), np.int64(n)))
    close(out, NUMPY_UNARY[op](f64(a)).astype(NP_DTYPE[dtype]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ewise_where(dtype):
    n = 300
    cond = np.random.default_rng(4).random(n) < 0.5
    a, b = rand(n, dtype, seed=5), rand(n, dtype, seed=6)
    out = np.zeros(n, NP_DTYPE[dtype])
    launch_ewise(kernel("ewise.cu", K.typed_name("ewise_where", dtype), dtype), n,
                 (ptr(cond), ptr(a), ptr(b), ptr(out), np.int64(n)))
    np.testing.assert_array_equal(out.view(np.uint8), np.where(cond, a, b).view(np.uint8))


def _cast_inputs(src: str) -> np.ndarray:
    """Values that exercise rounding: ties, subnormals, overflow, inf, nan, signed zero."""
    rng = np.random.default_rng(7)
    vals = np.concatenate([rng.normal(0, 100, 400), rng.normal(0, 1e-6, 100),
                           [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e6, -1e6,
                            1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8,
                            6e-8, 3e-8, 1e-40, 3.4e38]])
    with np.errstate(over="ignore"):
        return vals.astype(NP_DTYPE[src])


@pytest.mark.parametrize("src,dst", [(s, d) for s in DTYPES for d in DTYPES if s != d])
def test_ewise_astype_bit_exact(src, dst):
    a = _cast_inputs(src)
    n = a.size
    out = np.zeros(n, NP_DTYPE[dst])
    launch_ewise(kernel("ewise.cu", K.astype_name(src, dst), src), n,
                 (ptr(a), ptr(out), np.int64(n)))
    with np.errstate(over="ignore", invalid="ignore"):
        want = a.astype(NP_DTYPE[dst])  # ml_dtypes / NumPy: round to nearest even
    same = (out.view(f"u{out.itemsize}") == want.view(f"u{out.itemsize}"))
    both_nan = np.isnan(f64(out)) & np.isnan(f64(want))
    bad = ~(same | both_nan)
    assert not bad.any(), f"{src}->{dst}: {a[bad][:5]} -> {out[bad][:5]}, want {want[bad][:5]}"


# ---------------------------------------------------------------------- reduce.cu
def reduce_rows(op: str, a: np.ndarray, src: str, dst: str, base: str, num_sms: int):
    """The backend's launch protocol: reduce_launch, then a second pass over the partials."""
    rows, size = a.shape
    launch = K.reduce_launch(rows, size, num_sms)
    out = np.zeros(rows, NP_DTYPE[dst])
    if launch["kind"] == "thread":
        k = kernel("reduce.cu", K.reduce_name("thread", op, src, dst), base)
        k((launch["grid_rows"],), (launch["block"],), (ptr(a), ptr(out), np.int64(rows),
                                                   np.int64(size)))
        return out, launch
    chunks = launch["chunks"]
    tdt = dst if chunks == 1 else K.ACC_DTYPE[base]
    target = out if chunks == 1 else np.zeros(rows * chunks, NP_DTYPE[tdt])
    k = kernel("reduce.cu", K.reduce_name("block", op, src, tdt), base)
    k((launch["grid_rows"], chunks), (launch["block"],),
      (ptr(a), ptr(target), np.int64(rows), np.int64(size), np.int64(launch["chunk"])))
    if chunks > 1:
        out, _ = reduce_rows(op, target.reshape(rows, chunks), tdt, dst, base, num_sms)
    return out, launch


# (rows, size, num_sms): one thread per row, one block per row, two passes over chunks
LAUNCHES = {"thread": (140, 9, 4), "block": (5, 300, 132), "two_pass": (2, 5000, 4)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_reduce_launches(dtype, op, launch):
    rows, size, sms = LAUNCHES[launch]
    a = rand((rows, size), dtype, seed=8)
    if op == "max":
        a[0, size // 2] = np.nan  # numpy.max propagates NaN
        a[-1, :] = -np.inf
    acc = K.ACC_DTYPE[dtype]
    out, got_launch = reduce_rows(op, a, dtype, acc, dtype, sms)
    assert got_launch["kind"] == launch.split("_")[0] or (launch == "two_pass"
                                                          and got_launch["chunks"] > 1)
    want = f64(a).sum(1) if op == "sum" else f64(a).max(1)
    close(out, want, acc, atol_scale=size ** 0.5)
    if dtype != acc:  # the (dtype -> dtype) instantiation rounds once at the end
        out16, _ = reduce_rows(op, a, dtype, dtype, dtype, sms)
        close(out16, want.astype(NP_DTYPE[dtype]), dtype, atol_scale=size ** 0.5)


# ---------------------------------------------------------------------- softmax.cu
def _rows_with_inf(dtype: str, rows: int = 5, cols: int = 77) -> np.ndarray:
    x = rand((rows, cols), dtype, -4, 4, 9)
    x[1, ::3] = -np.inf        # some -inf entries
    x[2, :] = -np.inf          # an all -inf row
    x[3, :40] = -np.inf        # -inf in the lanes of the first warps only
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows(dtype):
    x = _rows_with_inf(dtype)
    rows, cols = x.shape
    y = np.zeros_like(x)
    kernel("softmax.cu", K.typed_name("softmax_rows", dtype), dtype)(
        (rows,), (K.row_block(cols),), (ptr(x), ptr(y), np.int64(rows), np.int64(cols)))
    with np.errstate(invalid="ignore"):
        e = np.exp(f64(x) - f64(x).max(1, keepdims=True))
        want = e / e.sum(1, keepdims=True)
    close(y, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 77, 3000])
def test_logsumexp_rows(dtype, cols):
    x = _rows_with_inf(dtype, cols=cols) if cols > 40 else rand((4, cols), dtype, seed=10)
    rows = x.shape[0]
    y = np.zeros(rows, NP_DTYPE[dtype])
    kernel("softmax.cu", K.typed_name("logsumexp_rows", dtype), dtype)(
        (rows,), (K.row_block(cols),), (ptr(x), ptr(y), np.int64(rows), np.int64(cols)))
    with np.errstate(divide="ignore", invalid="ignore"):
        m = f64(x).max(1)
        want = np.where(np.isneginf(m), -np.inf,
                        m + np.log(np.exp(f64(x) - m[:, None]).sum(1)))
    close(y, want, dtype)


# ---------------------------------------------------------------------- matmul.cu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["naive", "tiled"])
@pytest.mark.parametrize("dims", [(2, 37, 19, 45), (1, 130, 9, 129)])
def test_matmul(dtype, mode, dims):
    batch, m, n, p = dims
    a, b = rand((batch, m, n), dtype, seed=11), rand((batch, n, p), dtype, seed=12)
    c = np.zeros((batch, m, p), NP_DTYPE[dtype])
    grid, block = K.matmul_launch(batch, m, p, mode)
    kernel("matmul.cu", K.typed_name("matmul_" + mode, dtype), dtype)(
        grid, block, (ptr(a), ptr(b), ptr(c), np.int32(m), np.int32(n), np.int32(p)))
    close(c, f64(a) @ f64(b), dtype, atol_scale=n ** 0.5)


# ---------------------------------------------------------------------- layernorm.cu
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_forward_and_backward(dtype):
    rows, cols, eps = 6, 70, 1e-5
    acc = NP_DTYPE[K.ACC_DTYPE[dtype]]
    x, w, b = rand((rows, cols), dtype, -2, 2, 13), rand(cols, dtype, seed=14), \
        rand(cols, dtype, seed=15)
    dy = rand((rows, cols), dtype, seed=16)
    y = np.zeros_like(x)
    mean, rstd = np.zeros(rows, acc), np.zeros(rows, acc)
    block = (K.row_block(cols),)
    kernel("layernorm.cu", K.typed_name("layernorm_fwd", dtype), dtype)(
        (rows,), block, (ptr(x), ptr(w), ptr(b), ptr(y), ptr(mean), ptr(rstd), np.int64(rows),
                         np.int64(cols), acc.type(eps)))
    xd = f64(x)
    mu, var = xd.mean(1), xd.var(1)
    rs = 1 / np.sqrt(var + eps)
    xhat = (xd - mu[:, None]) * rs[:, None]
    close(mean, mu, K.ACC_DTYPE[dtype])
    close(rstd, rs, K.ACC_DTYPE[dtype])
    close(y, xhat * f64(w) + f64(b), dtype, atol_scale=4)
    dx = np.zeros_like(x)
    kernel("layernorm.cu", K.typed_name("layernorm_bwd_dx", dtype), dtype)(
        (rows,), block, (ptr(dy), ptr(x), ptr(w), ptr(mean), ptr(rstd), ptr(dx), np.int64(rows),
                         np.int64(cols)))
    g = f64(dy) * f64(w)
    want_dx = rs[:, None] * (g - g.mean(1, keepdims=True)
                             - xhat * (g * xhat).mean(1, keepdims=True))
    close(dx, want_dx, dtype, atol_scale=8)
    rows_per = 4
    chunks = math.ceil(rows / rows_per)
    dw_part, db_part = np.zeros((chunks, cols), acc), np.zeros((chunks, cols), acc)
    kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb", dtype), dtype)(
        (math.ceil(cols / 32), chunks), (32,),
        (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(dw_part), ptr(db_part), np.int64(rows),
         np.int64(cols), np.int64(rows_per)))
    close(dw_part.sum(0), (f64(dy) * xhat).sum(0), K.ACC_DTYPE[dtype], atol_scale=8)
    close(db_part.sum(0), f64(dy).sum(0), K.ACC_DTYPE[dtype], atol_scale=8)


# ---------------------------------------------------------------------- dropout.cu
def splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 (Steele, Lea & Flood 2014) on uint64 arrays, wrapping like C."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout(dtype):
    n, prob, seed, offset = 2000, 0.3, 1234567, 99
    idx = np.uint64(offset) + np.arange(n, dtype=np.uint64)
    u_want = (splitmix64(np.uint64(seed) ^ splitmix64(idx)) >> np.uint64(40)).astype(
        np.float32) * np.float32(1 / 16777216)
    u = np.zeros(n, np.float32)
    launch_ewise(kernel("dropout.cu", "dropout_uniform", dtype), n,
                 (ptr(u), np.int64(n), np.uint64(seed), np.uint64(offset)))
    np.testing.assert_array_equal(u, u_want)
    x = rand(n, dtype, seed=21)
    y, mask = np.zeros_like(x), np.zeros(n, np.bool_)
    # scale in the accumulation type: float64 data is scaled by the exact double 1 / (1 - p)
    # (regression: a float scale made float64 dropout 2e-8 off)
    scale = NP_DTYPE[K.ACC_DTYPE[dtype]].type(1 / (1 - prob))
    launch_ewise(kernel("dropout.cu", K.typed_name("dropout_fwd", dtype), dtype), n,
                 (ptr(x), ptr(y), ptr(mask), np.int64(n), np.float32(prob), scale,
                  np.uint64(seed), np.uint64(offset)))
    np.testing.assert_array_equal(mask, u_want >= np.float32(prob))
    close(y, np.where(mask, f64(x) / (1 - prob), 0), dtype)
    dy, dx = rand(n, dtype, seed=22), np.zeros_like(x)
    launch_ewise(kernel("dropout.cu", K.typed_name("dropout_bwd", dtype), dtype), n,
                 (ptr(dy), ptr(mask), ptr(dx), np.int64(n), scale))
    close(dx, np.where(mask, f64(dy) / (1 - prob), 0), dtype)


def test_bfloat16_dtype_is_ml_dtypes():
    """The bfloat16 buffers above hold ml_dtypes.bfloat16 bits, as the backend stores them."""
    assert NP_DTYPE["bfloat16"] == np.dtype(ml_dtypes.bfloat16)
