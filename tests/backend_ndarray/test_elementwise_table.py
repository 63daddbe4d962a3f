"""An elementwise op is one row of ``primitives.ELEMENTWISE``: each backend's functions, the CUDA
functors and the emulator's ufuncs are made from it.

The first test checks that each row's two spellings of the math (its NumPy ufunc and its
expression) agree. The others take rows the table does not have (``minimum``, ``square``) and
run them on the NumPy backend and on ``ndl.cuda()`` (the emulator where there is no GPU),
editing nothing but the table, against NumPy's own ``minimum`` and ``square``.
"""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import ndarray_backend_numpy as numpy_backend
from needle.backend_ndarray import primitives as P

NEW_ROWS = (("minimum", "minimum", "where(({0} < {1}) | ({0} != {0}), {0}, {1})"),
            ("square", "square", "{0} * {0}"))
WANT = {"ewise_minimum": lambda x, y: np.minimum(x, y),
        "scalar_minimum": lambda x, y: np.minimum(x, np.asarray(y, x.dtype)),
        "ewise_square": lambda x: np.square(x)}


def _inputs(dtype: str, n: int = 257):
    """Two arrays with equal pairs, NaNs (floats) and signed zeros, and a scalar."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 4).astype(dtype)
    y = (rng.standard_normal(n) * 4).astype(dtype)
    y[::5] = x[::5]
    if np.dtype(dtype).kind == "f":
        x[3], y[4], x[7], y[7] = np.nan, np.nan, -0.0, 0.0
    return x, y, (1.5 if np.dtype(dtype).kind == "f" else 2)


def _namespace() -> dict:
    return {f: getattr(np, f) for f in P.FUNCTIONS}


@pytest.mark.parametrize("row", P.ELEMENTWISE, ids=lambda r: r[0])
def test_each_row_ufunc_and_expression_agree(row):
    name, ufunc, expr = row
    x, y, _ = _inputs("float64")
    if name in ("log", "sqrt", "pow"):
        x = np.abs(x) + 0.5  # inside the domain (NaN stays NaN)
    y = np.clip(y, -3, 3)  # finite powers
    args = (x, y) if "{1}" in expr else (x,)
    with np.errstate(all="ignore"):
        want = getattr(np, ufunc)(*args)
        got = eval(expr.format("x", "y"), _namespace(), {"x": x, "y": y})  # noqa: S307
    np.testing.assert_array_equal(got, want)
    for p in P.elementwise(*row):
        assert P.TABLE[p.name] == p, f"{p.name} is not in the primitive table as its row says"


def _run(backend, fns, name, arrays, scalar, dtype):
    """``name`` from ``fns`` on ``backend``'s buffers of the NumPy ``arrays``."""
    bufs = []
    for x in arrays:
        buf = backend.Array(x.size, dtype)
        backend.from_numpy(x, buf)
        bufs.append(buf)
    out = backend.Array(arrays[0].size, dtype)
    args = (bufs[0], scalar) if name.startswith("scalar_") else tuple(bufs)
    fns[name](*args, out)
    return backend.to_numpy(out, (out.size,), (1,), 0)


def _check_new_rows(backend, make, dtypes):
    rows = [p for row in NEW_ROWS for p in P.elementwise(*row)]
    fns = make(rows)
    assert sorted(fns) == sorted(WANT)
    for dtype in dtypes:
        x, y, c = _inputs(dtype)
        for name, want in WANT.items():
            ins = (x,) if name == "ewise_square" else (x, y)
            got = _run(backend, fns, name, ins, c, dtype)
            expect = want(x, c) if name.startswith("scalar_") else want(*ins)
            np.testing.assert_array_equal(got, expect, err_msg=f"{name} on {dtype}")


def test_a_new_row_runs_on_the_numpy_backend():
    _check_new_rows(numpy_backend, numpy_backend.elementwise_functions,
                    ("float32", "float64", "int32"))


@pytest.fixture
def table_with_new_rows(monkeypatch):
    """The elementwise table holding NEW_ROWS only (ewise.cu is then built with their functors
    alone: a third of the compile time of the whole table, whose rows test_emu_kernels.py
    covers); the compiled kernel modules are dropped before and after, so that ewise.cu is
    built from the table in force."""
    from needle.backend_cuda import _runtime as rt

    def drop_modules():
        rt.kernel.cache_clear()
        rt._module.cache_clear()
    monkeypatch.setattr(P, "ELEMENTWISE", NEW_ROWS)
    drop_modules()
    yield
    monkeypatch.undo()
    drop_modules()


@pytest.mark.cuda
@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU (or NEEDLE_CUDA_EMULATOR=1)")
def test_a_new_row_runs_on_the_cuda_backend(table_with_new_rows):
    """float32 runs the functor generated into ewise.cu, int32 the CuPy ufunc."""
    from needle.backend_cuda import ndarray_backend_cuda as cuda_backend
    _check_new_rows(cuda_backend, cuda_backend.elementwise_functions,
                    ("float32", "int32"))
