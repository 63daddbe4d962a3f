"""NDArray against NumPy: strided views (permuted, sliced, stepped, broadcast) and every dtype.

The property tests build the same chain of views on a NumPy array and on an NDArray and
compare compact/numpy/elementwise/reductions/setitem/matmul on the (non-contiguous) result.
"""
import importlib.util
from typing import Any, List, Tuple

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import needle as ndl
import needle.backend_ndarray as nd
from needle.backend_cuda import emulator
from needle.backend_ndarray import to_numpy_dtype

pytestmark = [pytest.mark.hw3, pytest.mark.ndarray]

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]
FLOATS = ["float32", "float64", "float16", "bfloat16"]
NUMERIC = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
EPS = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}

View = List[Tuple[str, Any]]


def random_values(shape: Tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Values exactly representable in every dtype: multiples of 1/4 in [-2, 2], small ints."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-4, 5, size=shape).astype(dtype)
    return (rng.integers(-8, 9, size=shape) / 4).astype(to_numpy_dtype(dtype))


def tol(dtype: str, size: int = 1) -> dict:
    """assert_allclose tolerances for ``dtype`` results accumulated over ``size`` terms."""
    if dtype not in EPS:
        return {"rtol": 0, "atol": 0}
    return {"rtol": 4 * EPS[dtype], "atol": 2 * EPS[dtype] * max(size, 1)}


def as64(a: Any) -> np.ndarray:
    """Values as float64 (bool and bfloat16 included), for comparisons."""
    return np.asarray(a).astype(np.float64)


@st.composite
def slices(draw: Any, n: int) -> slice:
    """Any slice of an axis of length ``n``: negative, out-of-range and missing bounds, steps."""
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
    return slice(draw(bound), draw(bound), draw(step))


@st.composite
def views(draw: Any, shape: Tuple[int, ...], broadcast: bool = True, reshape: bool = True
          ) -> View:
    """A chain of 1-3 view operations valid for an array of ``shape``."""
    ops: View = []
    cur = np.empty(shape)
    kinds = ["permute", "slice", "int"] + (["broadcast"] if broadcast else []) + (
        ["reshape"] if reshape else [])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        if kind == "permute":
            arg: Any = tuple(draw(st.permutations(range(cur.ndim))))
        elif kind == "slice":
            arg = tuple(draw(slices(n)) for n in cur.shape)
        elif kind == "int":
            if cur.ndim < 2 or 0 in cur.shape:
                continue
            axis = draw(st.integers(0, cur.ndim - 1))
            n = cur.shape[axis]
            arg = (slice(None),) * axis + (draw(st.integers(-n, n - 1)),)
        elif kind == "broadcast":
            lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
            arg = lead + tuple(draw(st.integers(1, 3)) if s == 1 else s for s in cur.shape)
        else:  # reshape: flatten, or split the last axis
            if cur.ndim and cur.shape[-1] % 2 == 0 and cur.shape[-1] and draw(st.booleans()):
                arg = cur.shape[:-1] + (2, cur.shape[-1] // 2)
            else:
                arg = (-1,)
        ops.append((kind, arg))
        cur = apply_view(cur, ops[-1:], numpy=True)
    return ops


def apply_view(x: Any, ops: View, numpy: bool) -> Any:
    """Apply a chain of view operations to a NumPy array or an NDArray."""
    for kind, arg in ops:
        if kind == "permute":
            x = np.transpose(x, arg) if numpy else x.permute(arg)
        elif kind in ("slice", "int"):
            x = x[arg]
        elif kind == "broadcast":
            x = np.broadcast_to(x, arg) if numpy else x.broadcast_to(arg)
        else:
            x = np.reshape(x, arg) if numpy else x.reshape(arg)
    return x


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)
seeds = st.integers(0, 2 ** 32 - 1)


@st.composite
def viewed(draw: Any, dtypes: List[str] = DTYPES, broadcast: bool = True,
           reshape: bool = True) -> Tuple[np.ndarray, nd.NDArray, View, np.ndarray]:
    """(numpy base, NDArray base, view ops, numpy view) for a random array and view chain."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes)
    base = random_values(shape, dtype, draw(seeds))
    ops = draw(views(shape, broadcast=broadcast, reshape=reshape))
    return base, nd.array(base, dtype=dtype), ops, apply_view(base, ops, numpy=True)


# ---------------------------------------------------------------------- property tests
@pytest.mark.hypothesis
@given(viewed())
def test_views_match_numpy(case: Any) -> None:
    base, a, ops, want = case
    v = apply_view(a, ops, numpy=False)
    assert v.shape == want.shape
    assert v.dtype == a.dtype
    np.testing.assert_array_equal(as64(v.numpy()), as64(want))
    if all(kind != "reshape" for kind, _ in ops):
        assert v._handle is a._handle  # a view, no copy
    c = v.compact()
    assert c.is_compact() and c.strides == nd.NDArray.compact_strides(c.shape)
    np.testing.assert_array_equal(as64(c.numpy()), as64(want))
    np.testing.assert_array_equal(as64(a.numpy()), as64(base))  # the base is untouched


@pytest.mark.hypothesis
@given(viewed(), st.sampled_from(["add", "sub", "mul", "div", "maximum", "eq", "ne", "lt", "le",
                                   "gt", "ge"]),
       st.data())
def test_elementwise_on_views_match_numpy(case: Any, op: str, data: Any) -> None:
    base, a, ops, want = case
    v = apply_view(a, ops, numpy=False)
    dtype = v.dtype
    assume(not (dtype == "bool" and op in ("sub", "div")))  # NumPy refuses these too
    # the other operand: a permuted (non-compact) array of a shape that broadcasts against v
    shape = tuple(data.draw(st.sampled_from([s, 1])) for s in want.shape)
    shape = shape[data.draw(st.integers(0, len(shape))):]
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    other_np = random_values(tuple(shape[p] for p in perm), dtype, data.draw(seeds))
    inv = tuple(np.argsort(perm))
    other = nd.array(other_np, dtype=dtype).permute(inv)
    other_np = np.transpose(other_np, inv)
    if op == "div":
        other_np = np.where(other_np == 0, 1, other_np).astype(other_np.dtype)
        other = nd.array(np.ascontiguousarray(other_np), dtype=dtype)
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "maximum": np.maximum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
          "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}[op]
    nd_fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
             "div": lambda x, y: x / y, "maximum": lambda x, y: x.maximum(y),
             "eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
             "le": lambda x, y: x <= y, "gt": lambda x, y: x > y,
             "ge": lambda x, y: x >= y}[op]
    got = nd_fn(v, other)
    ref = fn(want, other_np)
    assert got.shape == ref.shape
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        assert got.dtype == "bool"
    elif op == "div" and dtype.startswith("int"):
        assert got.dtype == "float32"  # true division of ints
    else:
        assert got.dtype == dtype
    np.testing.assert_allclose(as64(got.numpy()), as64(ref), **tol(got.dtype))
    # a python int keeps the array's dtype (NEP 50); bool arrays compute in int64, as NumPy
    scalar = data.draw(st.integers(1, 3))
    got, ref = nd_fn(v, scalar), fn(want, scalar)
    if op != "div":
        assert got.dtype == ref.dtype.name
    np.testing.assert_allclose(as64(got.numpy()), as64(ref), **tol(got.dtype))


@pytest.mark.hypothesis
@given(viewed(dtypes=FLOATS), st.sampled_from(["exp", "log", "tanh", "neg", "sqrt"]))
def test_unary_on_views_match_numpy(case: Any, op: str) -> None:
    _, a, ops, want = case
    v = apply_view(a, ops, numpy=False)
    if op in ("log", "sqrt"):  # positive inputs: |x| + 0.5
        v = (v * v).sqrt() + 0.5 if op == "log" else v * v
        want = np.abs(want) + np.asarray(0.5, dtype=want.dtype) if op == "log" else want * want
    got = {"exp": nd.exp, "log": nd.log, "tanh": nd.tanh, "neg": lambda x: -x,
           "sqrt": nd.sqrt}[op](v)
    ref = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "neg": np.negative,
           "sqrt": np.sqrt}[op](want)
    assert got.dtype == v.dtype
    np.testing.assert_allclose(as64(got.numpy()), as64(ref), **tol(got.dtype, 4))


@st.composite
def axes_for(draw: Any, ndim: int) -> Any:
    """None, an int (maybe negative) or a tuple of distinct axes."""
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or ndim == 0:
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(a - ndim if draw(st.booleans()) else a for a in axes)


@pytest.mark.hypothesis
@given(viewed(), st.data(), st.booleans())
def test_reductions_on_views_match_numpy(case: Any, data: Any, keepdims: bool) -> None:
    _, a, ops, want = case
    v = apply_view(a, ops, numpy=False)
    axis = data.draw(axes_for(v.ndim))
    got = v.sum(axis=axis, keepdims=keepdims)
    ref = np.sum(as64(want), axis=axis, keepdims=keepdims)
    assert got.shape == np.shape(ref)
    reduced = want.size // max(int(np.prod(np.shape(ref))), 1)
    np.testing.assert_allclose(as64(got.numpy()), ref, **tol(v.dtype, reduced))
    if want.size:
        got = v.max(axis=axis, keepdims=keepdims)
        ref = np.max(want, axis=axis, keepdims=keepdims)
        assert got.shape == ref.shape and got.dtype == v.dtype
        np.testing.assert_array_equal(as64(got.numpy()), as64(ref))


@pytest.mark.hypothesis
@given(viewed(broadcast=False, reshape=False), st.data())
def test_setitem_through_views_matches_numpy(case: Any, data: Any) -> None:
    base, a, ops, want = case
    base = base.copy()
    want = apply_view(base, ops, numpy=True)  # a writable numpy view of our copy
    v = apply_view(a, ops, numpy=False)
    idx = tuple(data.draw(slices(n)) for n in want.shape)
    target = want[idx]
    kind = data.draw(st.sampled_from(["scalar", "array", "broadcast"]))
    if kind == "scalar":
        value_np = random_values((), a.dtype, data.draw(seeds))
        v[idx] = value_np.item()
        target[...] = value_np
    else:
        shape = target.shape if kind == "array" else tuple(
            data.draw(st.sampled_from([s, 1])) for s in target.shape)
        perm = tuple(data.draw(st.permutations(range(len(shape)))))
        src_np = random_values(tuple(shape[p] for p in perm), a.dtype, data.draw(seeds))
        inv = tuple(np.argsort(perm))
        v[idx] = nd.array(src_np, dtype=a.dtype).permute(inv)  # a non-compact source
        target[...] = np.transpose(src_np, inv)
    np.testing.assert_array_equal(as64(a.numpy()), as64(base))
    np.testing.assert_array_equal(as64(v.numpy()), as64(want))


@st.composite
def matmul_operands(draw: Any, dtype: str, batch: Tuple[int, ...], rows: int, cols: int
                    ) -> Tuple[np.ndarray, nd.NDArray]:
    """A (batch..., rows, cols) operand that is compact, transposed, stepped or broadcast."""
    layout = draw(st.sampled_from(["compact", "transposed", "stepped", "broadcast"]))
    shape = batch + (rows, cols)
    if layout == "compact":
        x = random_values(shape, dtype, draw(seeds))
        return x, nd.array(x, dtype=dtype)
    if layout == "transposed":
        x = random_values(batch + (cols, rows), dtype, draw(seeds))
        axes = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
        return np.transpose(x, axes), nd.array(x, dtype=dtype).permute(axes)
    if layout == "stepped":
        x = random_values(batch + (2 * rows, cols + 1), dtype, draw(seeds))
        idx = (Ellipsis, slice(None, None, -2), slice(1, None))
        return x[idx], nd.array(x, dtype=dtype)[idx]
    x = random_values((1,) * len(batch) + (rows, cols), dtype, draw(seeds))
    return np.broadcast_to(x, shape), nd.array(x, dtype=dtype).broadcast_to(shape)


@pytest.mark.hypothesis
@given(st.sampled_from(NUMERIC), st.lists(st.integers(1, 3), max_size=2).map(tuple),
       st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.booleans(), st.data())
def test_matmul_on_views_matches_numpy(dtype: str, batch: Tuple[int, ...], m: int, n: int,
                                       p: int, b_2d: bool, data: Any) -> None:
    a_np, a = data.draw(matmul_operands(dtype, batch, m, n))
    b_np, b = data.draw(matmul_operands(dtype, () if b_2d else batch, n, p))
    got = a @ b
    ref = np.matmul(as64(a_np), as64(b_np))
    assert got.shape == ref.shape and got.dtype == dtype
    np.testing.assert_allclose(as64(got.numpy()), ref, **tol(dtype, 4 * n))


@pytest.mark.hypothesis
@given(st.sampled_from(DTYPES), st.sampled_from(DTYPES), shapes, seeds)
def test_astype_matches_numpy(src: str, dst: str, shape: Tuple[int, ...], seed: int) -> None:
    x = random_values(shape, src, seed)
    got = nd.array(x, dtype=src).permute(tuple(range(len(shape)))[::-1]).astype(dst)
    assert got.dtype == dst
    want = np.transpose(x).astype(to_numpy_dtype(dst))
    np.testing.assert_array_equal(as64(got.numpy()), as64(want))


# ---------------------------------------------------------------------- unit tests
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_round_trip_and_fill(dtype: str) -> None:
    x = random_values((2, 3), dtype, 1)
    a = nd.array(x, dtype=dtype)
    assert a.dtype == dtype and a.numpy().dtype == to_numpy_dtype(dtype)
    np.testing.assert_array_equal(a.numpy(), x)
    f = nd.full((2, 2), 1, dtype=dtype)
    assert f.dtype == dtype
    np.testing.assert_array_equal(as64(f.numpy()), np.ones((2, 2)))
    a.fill(0)
    np.testing.assert_array_equal(as64(a.numpy()), np.zeros((2, 3)))
    e = nd.empty((3,), dtype=dtype)
    assert e.shape == (3,) and e.dtype == dtype


def test_array_defaults_and_copies() -> None:
    assert nd.array([1, 2]).dtype == "float32"  # python lists default to float32, as needle
    assert nd.array(np.arange(3)).dtype == "int64"  # numpy arrays keep their dtype
    x = np.arange(6.0).reshape(2, 3)
    a = nd.array(x)
    x[0, 0] = 100.0
    assert a.numpy()[0, 0] == 0.0  # a copy, not a view of the numpy buffer
    b = nd.NDArray(a)
    b[0, 0] = 7.0
    assert a.numpy()[0, 0] == 0.0


def test_make_strides_offset_and_views() -> None:
    assert nd.NDArray.compact_strides((2, 3, 4)) == (12, 4, 1)
    a = nd.array(np.arange(24.0).reshape(2, 3, 4))
    assert (a.shape, a.strides, a.offset, a.ndim, a.size) == ((2, 3, 4), (12, 4, 1), 0, 3, 24)
    assert a.device == nd.cpu() and isinstance(a._handle.ptr(), int) and a.is_compact()
    m = nd.NDArray.make((3, 2), strides=(1, 3), device=nd.cpu(), handle=a._handle, offset=4)
    np.testing.assert_array_equal(m.numpy(), np.arange(24.0)[4:10].reshape(2, 3).T)
    assert not m.is_compact()
    s = a.as_strided((4, 2), (1, 12))
    np.testing.assert_array_equal(s.numpy(), np.arange(24.0).reshape(2, 12)[:, :4].T)
    sl = a[1, 1:, ::-2]
    assert sl.shape == (2, 2) and sl.strides == (4, -2) and sl.offset == 12 + 4 + 3
    assert sl._handle is a._handle and not sl.is_compact()
    r = a.reshape((6, 4))
    assert r._handle is a._handle  # reshape of a compact array is a view
    t = a.permute((2, 0, 1))
    assert t.strides == (1, 12, 4) and t._handle is a._handle
    np.testing.assert_array_equal(t.reshape((4, 6)).numpy(),
                                  np.arange(24.0).reshape(2, 3, 4).transpose(2, 0, 1)
                                  .reshape(4, 6))
    bc = nd.array(np.arange(3.0)).reshape((3, 1)).broadcast_to((2, 3, 4))
    assert bc.strides == (0, 1, 0)
    np.testing.assert_array_equal(bc.numpy(), np.broadcast_to(np.arange(3.0)[:, None], (2, 3, 4)))


def test_flip_and_pad() -> None:
    x = np.arange(24.0).reshape(2, 3, 4)
    a = nd.array(x)
    for axes in [None, 0, (1,), (0, 2), (-1,)]:
        np.testing.assert_array_equal(a.flip(axes).numpy(), np.flip(x, axes))
        np.testing.assert_array_equal(nd.flip(a[:, ::2], axes).numpy(), np.flip(x[:, ::2], axes))
    pads = ((1, 0), (0, 2), (2, 1))
    np.testing.assert_array_equal(a.pad(pads).numpy(), np.pad(x, pads))
    np.testing.assert_array_equal(a.permute((2, 1, 0)).pad(pads).numpy(),
                                  np.pad(x.transpose(2, 1, 0), pads))


def test_module_functions() -> None:
    x = np.random.rand(3, 4) + 0.5
    y = np.random.rand(3, 4)
    a, b = nd.array(x, dtype="float64"), nd.array(y, dtype="float64")
    for got, want in [(nd.maximum(a, b), np.maximum(x, y)), (nd.log(a), np.log(x)),
                      (nd.exp(a), np.exp(x)), (nd.tanh(a), np.tanh(x)),
                      (nd.sum(a, 1), x.sum(1)), (nd.sum(a, (0, 1), keepdims=True),
                                                 x.sum((0, 1), keepdims=True)),
                      (nd.max(a, 0), x.max(0)), (nd.flip(a, (0,)), x[::-1]),
                      (nd.reshape(a, (2, 6)), x.reshape(2, 6)),
                      (nd.broadcast_to(nd.array(y[:1], dtype="float64"), (3, 4)),
                       np.broadcast_to(y[:1], (3, 4))),
                      (nd.stack([a, b], 1), np.stack([x, y], 1)),
                      (nd.where(a > b, a, b), np.where(x > y, x, y)),
                      (nd.full((2,), 3.5), np.full(2, 3.5)), (nd.transpose(a), x.T),
                      (a ** 2, x ** 2), (2 - a, 2 - x), (1 / a, 1 / x), (2 ** a, 2 ** x)]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    parts = nd.split(a, 1)
    assert len(parts) == 4
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(p.numpy(), x[:, i])


def test_devices_and_random() -> None:
    assert nd.default_device() == nd.cpu() == ndl.cpu()
    assert nd.cpu() in nd.all_devices() and nd.cuda() in nd.all_devices()
    assert nd.cpu().enabled() and isinstance(nd.cuda().enabled(), bool)
    if importlib.util.find_spec("cupy") is None:  # no CuPy: a GPU device only if emulated
        assert nd.cuda().enabled() is emulator.active()
    np.random.seed(5)
    r1 = nd.cpu().randn(3, 2)
    np.random.seed(5)
    assert np.array_equal(r1.numpy(), np.random.randn(3, 2).astype(np.float32))  # global RNG
    u = nd.cpu().rand(100).numpy()
    assert u.min() >= 0 and u.max() < 1 and u.std() > 0.1
    oh = nd.cpu().one_hot(4, nd.array(np.array([3, 0, 3])))
    np.testing.assert_array_equal(oh.numpy(), np.eye(4)[[3, 0, 3]])
    assert nd.cpu().full((2,), 7, dtype="int32").numpy().tolist() == [7, 7]
    assert nd.cpu().empty((2, 2), dtype="float64").dtype == "float64"
    a = nd.array([1.0, 2.0])
    assert a.to(nd.cpu()) is a


def test_comparisons_return_bool_and_promotion() -> None:
    a = nd.array(np.array([1, 2, 3], dtype=np.int32))
    b = nd.array(np.array([1.5, 2.0, 0.5]), dtype="float32")
    assert (a < b).dtype == "bool" and (a == 2).dtype == "bool"
    np.testing.assert_array_equal((a < b).numpy(), [True, False, False])
    assert (a + b).dtype == "float32"  # PyTorch's promotion: an int never widens a float
    assert (a + 1).dtype == "int32"
    assert (a * 1.5).dtype == "float32"  # a float scalar makes an int array float
    assert (nd.array(np.ones(2), dtype="bfloat16") + nd.array(np.ones(2), dtype="float64")
            ).dtype == "float64"


@pytest.mark.parametrize("dtype,scalar,op", [
    ("float32", 2, "add"), ("float32", 0.5, "mul"), ("int32", 3, "mul"), ("int32", 2, "div"),
    ("int32", 1.5, "add"), ("bool", 2, "add"), ("float64", 4.0, "sub")])
def test_inplace_scalar_ops_match_out_of_place(dtype, scalar, op):
    """``a op= s`` gives what ``a op s`` gives (values and dtype); in place only when the dtype
    is unchanged."""
    import operator
    fns = {"add": (operator.add, operator.iadd), "mul": (operator.mul, operator.imul),
           "div": (operator.truediv, operator.itruediv), "sub": (operator.sub, operator.isub)}
    plain, inplace = fns[op]
    src = np.array([0, 1, 2, 3]).astype(dtype)
    expected = plain(nd.array(src, dtype=dtype), scalar)
    a = nd.array(src, dtype=dtype)
    handle = a._handle
    a = inplace(a, scalar)
    assert a.dtype == expected.dtype
    np.testing.assert_array_equal(a.numpy(), expected.numpy())
    assert (a._handle is handle) == (expected.dtype == dtype)
