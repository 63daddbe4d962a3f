"""The NumPy CPU backend: needle's named array primitives over flat 1-D buffers.

This module *is* the backend contract. ``NDArray`` (ndarray.py) does all shape, stride and
view arithmetic in Python and calls only the functions below, each of which works on flat
``Array`` buffers plus, for the strided ones, a (shape, strides, offset) description.
A new backend (see ``needle/backend_cuda``) implements ``Array(size, dtype)``, ``from_numpy``,
``to_numpy`` and the required primitives of ``primitives.py``, where each one's parameters and
the buffers it reads and writes are declared; it may offer the optional ones.
Strides and offsets are counted in elements, not bytes. The ``out`` of an elementwise or
scalar primitive may be one of its inputs (in-place update, as ``a += b``).
"""
from typing import Any, Callable, Dict, Iterable, Sequence, Tuple

import numpy as np

from ..process_state import switches
from . import adam_cpu
from . import primitives as P
from .fused_elementwise_cpu import fused_elementwise  # noqa: F401  (optional primitive; see there)

if adam_cpu.AVAILABLE:  # the one optional step of fused_ops.py this backend offers
    multi_tensor_adam = adam_cpu.multi_tensor_adam

__device_name__ = "cpu"
# The course's tiled-layout exercise: matmul_tiled multiplies operands stored as
# (rows/T, cols/T, T, T) blocks of T x T. NDArray routes 2-D products whose dims are all
# multiples of T through it only when TILED_MATMUL is set (the course's route): here BLAS on
# the untiled layout is faster, and re-tiling costs two copies per operand.
__tile_size__ = 8
TILED_MATMUL = False

# The primitive lists are declared in primitives.py (with each one's parameters, reads and
# writes); tests/backend_ndarray/test_backend_contract.py checks both backends against them.
PRIMITIVES, OPTIONAL_PRIMITIVES = P.PRIMITIVES, P.OPTIONAL_PRIMITIVES

# The allocation hook: process_state.switches.alloc_cpu, set while a MemoryTracker or the
# profiler listens (called with each new Array); None otherwise: one attribute test.
ALLOC_SWITCH = "alloc_cpu"


class Array:
    """A flat buffer of ``size`` elements of one dtype (a 1-D numpy array underneath)."""

    __slots__ = ("array", "size", "dtype", "__weakref__")

    def __init__(self, size: int, dtype: Any = np.float32):
        self.array = np.empty(size, dtype=dtype)
        if switches.alloc_cpu is not None:
            switches.alloc_cpu(self)
        self.size = size  # plain attributes, not properties: read on every op
        self.dtype = self.array.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer."""
        return self.array.nbytes

    def ptr(self) -> int:
        """Address of the first element."""
        return self.array.ctypes.data


def _strided(a: Array, shape: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """A numpy view of ``a`` described by element shape/strides/offset (no copy)."""
    item = a.array.itemsize
    return np.lib.stride_tricks.as_strided(
        a.array[offset:], shape=tuple(shape), strides=tuple(s * item for s in strides)
    )


def fill(out: Array, val: Any) -> None:
    """Set every element of ``out`` to ``val``."""
    out.array.fill(val)


def compact(a: Array, out: Array, shape: Tuple[int, ...], strides: Tuple[int, ...],
            offset: int) -> None:
    """Copy the strided view (shape, strides, offset) of ``a`` into compact ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.views)
    np.copyto(out.array.reshape(shape), _strided(a, shape, strides, offset))
    ### END YOUR SOLUTION


def ewise_setitem(a: Array, out: Array, shape: Tuple[int, ...], strides: Tuple[int, ...],
                  offset: int) -> None:
    """Write compact ``a`` into the strided view (shape, strides, offset) of ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.setitem)
    _strided(out, shape, strides, offset)[...] = a.array[: int(np.prod(shape))].reshape(shape)
    ### END YOUR SOLUTION


def scalar_setitem(size: int, val: Any, out: Array, shape: Tuple[int, ...],
                   strides: Tuple[int, ...], offset: int) -> None:
    """Write the scalar ``val`` into the strided view (shape, strides, offset) of ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.setitem)
    _strided(out, shape, strides, offset)[...] = val
    ### END YOUR SOLUTION


def elementwise_functions(rows: Iterable[P.Primitive]) -> Dict[str, Callable[..., None]]:
    """ewise_<op> and scalar_<op> for elementwise rows of the primitive table: the row's ufunc
    written into ``out`` (a scalar cast to ``a``'s dtype as NumPy's unsafe casting does)."""
    return {p.name: _ufunc_primitive(getattr(np, p.ufunc), p) for p in rows}


def _ufunc_primitive(ufunc: np.ufunc, p: P.Primitive) -> Callable[..., None]:
    def ewise(a: Array, b: Array, out: Array) -> None:
        ufunc(a.array, b.array, out=out.array)

    def scalar(a: Array, val: Any, out: Array) -> None:
        ufunc(a.array, val, out=out.array, casting="unsafe")

    def unary(a: Array, out: Array) -> None:
        ufunc(a.array, out=out.array)
    fn = scalar if p.scalar >= 0 else ewise if p.arity == 3 else unary
    fn.__name__, fn.__doc__ = p.name, f"out = {p.formula()} elementwise."
    return fn


globals().update(elementwise_functions(p for p in P.TABLE.values() if p.family))


def ewise_strided(name: str, a: Array, a_view: Tuple[Tuple[int, ...], Tuple[int, ...], int],
                  b: Array, b_view: Tuple[Tuple[int, ...], Tuple[int, ...], int],
                  out: Array) -> None:
    """out = a <name> b on strided views (shape, strides, offset) of equal shape.

    Optional fast path: with it, broadcast (stride-0) and transposed operands are read in place
    instead of being compacted into a full-size copy first. A backend without it (the CUDA one)
    gets compacted operands and ``ewise_<name>``.
    """
    ufunc = getattr(np, P.TABLE["ewise_" + name].ufunc)
    ufunc(_strided(a, *a_view), _strided(b, *b_view), out=out.array.reshape(a_view[0]))


def ewise_where(cond: Array, a: Array, b: Array, out: Array) -> None:
    """out = a where cond else b, elementwise over same-sized compact buffers."""
    np.copyto(out.array, b.array)
    np.copyto(out.array, a.array, where=cond.array)


def ewise_astype(a: Array, out: Array) -> None:
    """Convert ``a`` elementwise into ``out``'s dtype."""
    out.array[:] = a.array.astype(out.array.dtype, copy=False)


def matmul(a: Array, b: Array, out: Array, batch: int, m: int, n: int, p: int,
           trans_a: bool = False, trans_b: bool = False) -> None:
    """out[i] = op(a[i]) @ op(b[i]) for ``batch`` products of (m, n) @ (n, p) matrices.

    ``a`` holds compact (m, n) matrices, or (n, m) ones when ``trans_a`` (op = transpose);
    likewise ``b`` with ``trans_b``. BLAS reads transposed operands without a copy.
    """
    ### BEGIN YOUR SOLUTION (hw3.ndarray.matmul)
    x = a.array.reshape(batch, n, m).transpose(0, 2, 1) if trans_a else \
        a.array.reshape(batch, m, n)
    y = b.array.reshape(batch, p, n).transpose(0, 2, 1) if trans_b else \
        b.array.reshape(batch, n, p)
    # a vector-matrix product (m or p == 1) goes to BLAS gemv, which sums in another order
    # for a transposed matrix: copy it, so results equal np.matmul's bit for bit
    if trans_b and m == 1:
        y = np.ascontiguousarray(y)
    if trans_a and p == 1:
        x = np.ascontiguousarray(x)
    if a.array.dtype.kind == "V":
        # bfloat16 (ml_dtypes): numpy has no bf16 BLAS, accumulate in float32 as tensor cores do
        res = np.matmul(x.astype(np.float32), y.astype(np.float32))
        out.array[:] = res.reshape(-1).astype(out.array.dtype)
    elif batch == 1:
        np.matmul(x[0], y[0], out=out.array.reshape(m, p))
    else:
        np.matmul(x, y, out=out.array.reshape(batch, m, p))
    ### END YOUR SOLUTION


def matmul_tiled(a: Array, b: Array, out: Array, m: int, n: int, p: int) -> None:
    """out = a @ b for (m, n) @ (n, p) matrices stored in the tiled layout.

    Each operand is compact with shape (rows/T, cols/T, T, T), T = ``__tile_size__``: element
    (i, j) of the matrix is ``x[i // T, j // T, i % T, j % T]``. Block (I, J) of the product is
    ``out[I, J] = sum_K a[I, K] @ b[K, J]`` (T x T blocks; in the course's C++ each block product
    is a cache-resident triple loop). NumPy reassembles the blocks and makes one BLAS call, so
    the result equals ``np.matmul`` on the untiled matrices bit for bit.
    """
    t = __tile_size__
    ### BEGIN YOUR SOLUTION (hw3.ndarray.matmul_tiled)
    x = a.array.reshape(m // t, n // t, t, t).transpose(0, 2, 1, 3).reshape(m, n)
    y = b.array.reshape(n // t, p // t, t, t).transpose(0, 2, 1, 3).reshape(n, p)
    res = np.matmul(x, y).reshape(m // t, t, p // t, t)
    out.array.reshape(m // t, p // t, t, t)[...] = res.transpose(0, 2, 1, 3)
    ### END YOUR SOLUTION


def reduce_sum(a: Array, out: Array, reduce_size: int, inner_size: int = 1) -> None:
    """Sum compact ``a``, viewed as (outer, reduce_size, inner_size), over its middle axis.

    With ``inner_size == 1`` (the course's form) each consecutive block of ``reduce_size``
    elements is summed into one element of ``out``.
    """
    ### BEGIN YOUR SOLUTION (hw3.ndarray.reductions)
    if reduce_size == 0:
        out.array.fill(0)
        return
    if inner_size == 1:
        np.add.reduce(a.array.reshape(-1, reduce_size), axis=1, out=out.array)
    else:
        np.add.reduce(a.array.reshape(-1, reduce_size, inner_size), axis=1,
                      out=out.array.reshape(-1, inner_size))
    ### END YOUR SOLUTION


def reduce_max(a: Array, out: Array, reduce_size: int, inner_size: int = 1) -> None:
    """Max of compact ``a``, viewed as (outer, reduce_size, inner_size), over its middle axis
    (ValueError when reduce_size is 0: an empty max has no identity)."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.reductions)
    if reduce_size == 0:
        raise ValueError("max over an empty axis has no identity")
    np.maximum.reduce(a.array.reshape(-1, reduce_size, inner_size), axis=1,
                      out=out.array.reshape(-1, inner_size))
    ### END YOUR SOLUTION


def take_rows(a: Array, idx: Array, out: Array, row_size: int) -> None:
    """Row i of ``out`` = row ``idx[i]`` of ``a``, both viewed as rows of ``row_size``.

    The caller has checked that every index lies in range (``functions.take_rows``)."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.gather_scatter)
    # mode="clip": the indices are already checked, and np.take's default mode="raise"
    # writes through a temporary copy of ``out`` (3x slower for a 4 MiB one-hot)
    np.take(a.array.reshape(-1, row_size), idx.array, axis=0,
            out=out.array.reshape(-1, row_size), mode="clip")
    ### END YOUR SOLUTION


def scatter_add_rows(src: Array, idx: Array, out: Array, row_size: int) -> None:
    """Row ``idx[i]`` of ``out`` += row i of ``src`` (repeats accumulate): take_rows' adjoint."""
    ### BEGIN YOUR SOLUTION (hw3.ndarray.gather_scatter)
    np.add.at(out.array.reshape(-1, row_size), idx.array, src.array.reshape(-1, row_size))
    ### END YOUR SOLUTION


def from_numpy(a: np.ndarray, out: Array) -> None:
    """Copy a numpy array (any layout) into compact ``out``."""
    out.array[:] = np.asarray(a).reshape(-1)


def to_numpy(a: Array, shape: Tuple[int, ...], strides: Tuple[int, ...], offset: int) -> np.ndarray:
    """A numpy copy of the strided view (shape, strides, offset) of ``a``."""
    return _strided(a, shape, strides, offset).copy()
