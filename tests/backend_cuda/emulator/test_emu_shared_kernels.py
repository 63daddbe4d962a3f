"""The kernels whose threads share memory, at sizes with many warps per block and many blocks
(a row wider than a block, rows split over several blocks), on both engines, under full memory
checking (uninitialised shared reads, shared-memory races, blocks in a shuffled order).

Expected values are computed here in float64 NumPy. Sizes are just large enough: more than one
warp and more than one block, every thread looping more than once where the kernel loops.
"""
import math

import numpy as np
import pytest

from needle.backend_cuda import kernel_specs as K
from needle.backend_cuda.emulator import fake_cupy as cp
from needle.backend_cuda.emulator.module import load_module

ENGINES = ["fiber", "threads"]


@pytest.fixture(autouse=True)
def _full_checks(monkeypatch):
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")


def kernel(filename: str, name: str, engine: str, dtype: str = "float32"):
    mod = load_module(K.named_source(filename), K.name_expressions(filename, dtype),
                      K.NVRTC_OPTIONS + K.include_options(), engine=engine)
    assert mod.check == "full"
    return mod.get_function(name)


def dev(a: np.ndarray):
    return cp.asarray(a)


def rand(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, shape).astype(np.float32)


@pytest.mark.parametrize("engine", ENGINES)
def test_softmax_rows_wider_than_a_block(engine):
    rows, cols = 3, 2100  # a 1024-thread block (32 warps), each thread loops over 2-3 columns
    x = rand(rows, cols, seed=1)
    y = dev(np.zeros_like(x))
    block = K.row_block(cols)
    assert block == 1024 and cols > block
    kernel("softmax.cu", K.typed_name("softmax_rows", "float32"), engine)(
        (rows,), (block,), (dev(x), y, np.int64(rows), np.int64(cols)))
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(y.get(), e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("engine", ENGINES)
def test_reduce_rows_split_over_blocks(engine):
    rows, size = 2, 5000
    launch = K.reduce_launch(rows, size, num_sms=4)
    assert launch["kind"] == "block" and launch["chunks"] > 1 and launch["block"] > 32
    a = rand(rows, size, seed=2)
    part = dev(np.zeros(rows * launch["chunks"], np.float32))
    k = kernel("reduce.cu", K.reduce_name("block", "sum", "float32", "float32"), engine)
    k((launch["grid_rows"], launch["chunks"]), (launch["block"],),
      (dev(a), part, np.int64(rows), np.int64(size), np.int64(launch["chunk"])))
    got = part.get().reshape(rows, launch["chunks"]).sum(1)
    np.testing.assert_allclose(got, a.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("engine", ENGINES)
def test_layernorm_forward_many_warps(engine):
    rows, cols, eps = 3, 1500, 1e-5
    x, w, b = rand(rows, cols, seed=3), rand(cols, seed=4), rand(cols, seed=5)
    y = dev(np.zeros_like(x))
    mean, rstd = dev(np.zeros(rows, np.float32)), dev(np.zeros(rows, np.float32))
    block = K.row_block(cols)
    assert block >= 256
    kernel("layernorm.cu", K.typed_name("layernorm_fwd", "float32"), engine)(
        (rows,), (block,), (dev(x), dev(w), dev(b), y, mean, rstd, np.int64(rows),
                            np.int64(cols), np.float32(eps)))
    xd = x.astype(np.float64)
    xhat = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + eps)
    np.testing.assert_allclose(y.get(), xhat * w + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_tiled_matmul_many_tiles(engine):
    m, n, p = 130, 20, 140  # 2 x 2 tiles of 128 x 128, three k-steps of 8 through shared
    a, b = rand(1, m, n, seed=6), rand(1, n, p, seed=7)
    c = dev(np.zeros((1, m, p), np.float32))
    grid, block = K.matmul_launch(1, m, p, "tiled")
    assert math.prod(grid) > 1 and math.prod(block) > 32
    kernel("matmul.cu", K.typed_name("matmul_tiled", "float32"), engine)(
        grid, block, (dev(a), dev(b), c, np.int32(m), np.int32(n), np.int32(p)))
    np.testing.assert_allclose(c.get(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
