"""The CUDA backend: needle's array primitives on GPU buffers, with kernels from kernels/*.cu.

Implements the primitives ``needle/backend_ndarray/primitives.py`` declares. Floating
dtypes (float16, bfloat16, float32, float64) run needle's own kernels; integer and bool
buffers (indices, masks) use CuPy's ufuncs. Matmul goes to cuBLAS by default; set
``NEEDLE_CUDA_MATMUL=tiled`` (or ``set_matmul_kernel("tiled")``) to run the teaching kernel.
``ndl.cuda(i)`` holds ``for_device(i)``: the same functions, allocating on GPU i.
"""
import functools
import inspect
import math
import os
from typing import Any, Callable, Dict, Iterable, Tuple

import numpy as np

from ..backend_ndarray import primitives as P
from ..process_state import switches
from . import _runtime as rt
from . import buffer_pool, dlpack_cuda, emulator
from . import conv_cuda as conv
from . import fused_ops_cuda as fused
from . import kernel_specs as K
from ._runtime import cp, memory_stats, reset_peak_memory  # noqa: F401
from .emulator import cupy_module
from .fused_elementwise_cuda import fused_elementwise

__device_name__ = "cuda"
# True when kernels run on the CPU (NEEDLE_CUDA_EMULATOR, see emulator/): ndl.cuda()'s repr says so
EMULATED = emulator.active()

_FLOATS = frozenset(K.FLOAT_DTYPES)
_U16 = np.dtype(np.uint16)  # bfloat16's storage
_POOL_FREE, _POOL_HELD, _FULL_CHECK = buffer_pool.FREE, buffer_pool.HELD, buffer_pool.FULL_CHECK
_PEAK = rt.PEAK
_EWISE_SHAPES: Dict[int, Tuple[int, int]] = {}
_MATMUL_MODE = [rt.matmul_mode_from_env()]
_REDUCE_MODE = rt.REDUCE_MODE


def available(index: int = 0) -> bool:
    """True when GPU ``index`` exists and CuPy can talk to it."""
    return 0 <= index < rt.device_count()


device_count = rt.device_count  # GPUs this process sees (emulated ones under the emulator)


# The allocation hook, process_state.switches.alloc_cuda (as the NumPy backend's alloc_cpu).
ALLOC_SWITCH = "alloc_cuda"


class Array:
    """A flat buffer of ``size`` elements on one GPU (a 1-D CuPy array underneath)."""

    __slots__ = ("array", "size", "dtype", "device_index", "known_range", "pooled",
                 "__weakref__")

    default_index = 0  # the GPU a buffer goes to when no device_index is given

    def __init__(self, size: int, dtype: Any = np.float32, device_index: Any = None):
        if device_index is None:
            device_index = self.default_index
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        size = int(size)
        if dt is rt.BF16 or dt == rt.BF16:
            rt.check_bfloat16(device_index)
            store = _U16
        else:
            store = dt
        self.pooled = False  # until the buffer is this Array's (an allocation may raise)
        pooled = buffer_pool.ON and not (
            EMULATED and os.environ.get(_FULL_CHECK[0]) == _FULL_CHECK[1])
        free = _POOL_FREE.get((device_index, store, size)) if pooled else None
        buf = None
        if free:  # a buffer an Array of this key left (buffer_pool.py)
            try:
                buf = free.pop()
                _POOL_HELD[device_index] -= buf.nbytes
            except IndexError:  # another thread (a virtual rank) took the last one first
                pass
        if buf is None:
            with rt.device(device_index):
                try:
                    buf = cp.empty(size, dtype=store)
                except MemoryError:  # CuPy's OutOfMemoryError too: free what waits, retry
                    buffer_pool.release(device_index)
                    buf = cp.empty(size, dtype=store)
        self.array = buf
        self.pooled = pooled
        # the peak of bytes in use, sampled at every allocation (rt.memory_stats reports it)
        used = cp.get_default_memory_pool().used_bytes() - _POOL_HELD.get(device_index, 0)
        if used > _PEAK.get(device_index, 0):
            _PEAK[device_index] = used
        self.size = size  # plain attributes, not properties: read on every op
        self.dtype = dt  # the NumPy dtype (bfloat16 from ml_dtypes; stored as uint16 bits)
        self.device_index = device_index
        # (min, max) of an integer buffer uploaded from the host, until something writes it:
        # index checks read it instead of the device (no synchronisation)
        self.known_range: Any = None
        if switches.alloc_cuda is not None:
            switches.alloc_cuda(self)

    def __del__(self) -> None:
        # not an Array made around another's memory, nor one dying with the interpreter
        if getattr(self, "pooled", False) and _POOL_HELD is not None:
            buf, index = self.array, self.device_index
            held = _POOL_HELD.get(index, 0) + buf.nbytes
            if held <= buffer_pool.LIMIT_BYTES:  # else CuPy's pool takes it back
                _POOL_HELD[index] = held
                _POOL_FREE.setdefault((index, buf.dtype, buf.size), []).append(buf)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer."""
        return self.array.nbytes

    def ptr(self) -> int:
        """Device address of the first element."""
        return self.array.data.ptr


def _launch_ewise(filename: str, name: str, dtype: str, n: int, args: Tuple, index: int) -> None:
    shape = _EWISE_SHAPES.get(n)
    if shape is None:  # (grid, block) per size: sizes repeat every step
        if len(_EWISE_SHAPES) > 4096:
            _EWISE_SHAPES.clear()
        shape = _EWISE_SHAPES[n] = K.ewise_launch(n)
    grid, block = shape
    rt.launch(rt.kernel(filename, name, dtype, index), (grid,), (block,), args, index)


def fill(out: Array, val: Any) -> None:
    """Set every element of ``out`` to ``val``."""
    with rt.device(out.device_index):
        out.array.fill(np.array(val, dtype=out.dtype).view(out.array.dtype)[()])


# ---------------------------------------------------------------------- strided copies
def _strided(kernel: str, src: Any, out: Array, shape, strides, offset) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    meta = rt.view_meta(shape, strides, offset, out.device_index)
    name = K.strided_name(kernel, out.array.itemsize)
    _launch_ewise("strided.cu", name, "", n, (src, out.array, meta, np.int64(n)),
                  out.device_index)


def compact(a: Array, out: Array, shape: Tuple[int, ...], strides: Tuple[int, ...],
            offset: int) -> None:
    """Copy the strided view (shape, strides, offset) of ``a`` into compact ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.cuda.backend)
    _strided("compact", a.array, out, shape, strides, offset)
    ### END YOUR SOLUTION


def ewise_setitem(a: Array, out: Array, shape: Tuple[int, ...], strides: Tuple[int, ...],
                  offset: int) -> None:
    """Write compact ``a`` into the strided view (shape, strides, offset) of ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.cuda.backend)
    _strided("ewise_setitem", a.array, out, shape, strides, offset)
    ### END YOUR SOLUTION


def scalar_setitem(size: int, val: Any, out: Array, shape: Tuple[int, ...],
                   strides: Tuple[int, ...], offset: int) -> None:
    """Write the scalar ``val`` into the strided view (shape, strides, offset) of ``out``."""
    ### BEGIN YOUR SOLUTION (hw3.cuda.backend)
    bits = np.array(val, dtype=out.dtype).view(np.dtype(f"u{out.dtype.itemsize}"))[()]
    _strided("scalar_setitem", bits, out, shape, strides, offset)
    ### END YOUR SOLUTION


# ---------------------------------------------------------------------- elementwise
def _cupy_into(ufunc: Any, args: Tuple, out: Array) -> None:
    """Integer/bool path: a CuPy ufunc written into ``out`` (cast like NumPy's unsafe)."""
    with rt.device(out.device_index):
        try:
            ufunc(*args, out=out.array)
        except TypeError:  # output dtype the ufunc will not cast to
            out.array[...] = ufunc(*args)


def elementwise_functions(rows: Iterable[P.Primitive]) -> Dict[str, Callable[..., None]]:
    """ewise_<op> and scalar_<op> for elementwise rows of the primitive table: for float
    dtypes the ewise.cu kernel of the row's functor (its expression in C), else the row's CuPy
    ufunc."""
    return {p.name: _elementwise(p) for p in rows}


def _elementwise(p: P.Primitive) -> Callable[..., None]:
    ufunc, compare = getattr(cp, p.ufunc), p.family == "compare"

    def primitive(*args: Any) -> None:
        *ins, out = args
        n, dt = out.size, rt.DTYPE_NAME[ins[0].dtype]
        if n == 0:
            return
        if dt in _FLOATS and (compare or out.dtype == ins[0].dtype):
            vals = [rt.scalar_arg(x, dt) if i == p.scalar else x.array
                    for i, x in enumerate(ins)]
            _launch_ewise("ewise.cu", K.elementwise_name(p, dt), dt, n,
                          (*vals, out.array, np.int64(n)), out.device_index)
        else:
            vals = [x if i == p.scalar else x.array for i, x in enumerate(ins)]
            _cupy_into(ufunc, tuple(vals), out)
    primitive.__name__ = p.name
    primitive.__doc__ = f"out = {p.formula()} elementwise."
    primitive.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in p.params])
    return primitive


globals().update(elementwise_functions(p for p in P.TABLE.values() if p.family))


def ewise_strided(name: str, a: Array, a_view: Tuple[Tuple[int, ...], Tuple[int, ...], int],
                  b: Array, b_view: Tuple[Tuple[int, ...], Tuple[int, ...], int],
                  out: Array) -> None:
    """out = a <name> b on strided views (shape, strides, offset) of one shape, each read in
    place (a broadcast operand is not first compacted to full size); float dtypes, else the
    operands are compacted for ``ewise_<name>``."""
    n = out.size
    if n == 0:
        return
    p, dt, idx = P.TABLE["ewise_" + name], rt.DTYPE_NAME[a.dtype], out.device_index
    if dt in _FLOATS and (p.family == "compare" or out.dtype == a.dtype):
        _launch_ewise("ewise_strided.cu", K.strided_binary_name(p, dt), dt, n,
                      (a.array, rt.view_meta(*a_view, idx), b.array, rt.view_meta(*b_view, idx),
                       out.array, np.int64(n)), idx)
        return
    ins = []
    for x, (shape, strides, offset) in ((a, a_view), (b, b_view)):
        c = Array(n, x.dtype, idx)
        compact(x, c, shape, strides, offset)
        ins.append(c)
    globals()["ewise_" + name](ins[0], ins[1], out)


def ewise_where(cond: Array, a: Array, b: Array, out: Array) -> None:
    """out = a where cond else b, elementwise over same-sized compact buffers."""
    n = out.size
    if n == 0:
        return
    dt = rt.DTYPE_NAME[out.dtype]
    if dt in _FLOATS:
        _launch_ewise("ewise.cu", K.typed_name("ewise_where", dt), dt, n,
                      (cond.array, a.array, b.array, out.array, np.int64(n)), out.device_index)
    else:
        with rt.device(out.device_index):
            cp.copyto(out.array, b.array)
            cp.copyto(out.array, a.array, where=cond.array)


def _float_cast(src: Any, src_dt: str, dst: Any, dst_dt: str, index: int) -> None:
    n = src.size
    _launch_ewise("ewise.cu", K.astype_name(src_dt, dst_dt), src_dt, n,
                  (src, dst, np.int64(n)), index)


def ewise_astype(a: Array, out: Array) -> None:
    """Convert ``a`` elementwise into ``out``'s dtype."""
    if out.size == 0:
        return
    src, dst, idx = rt.DTYPE_NAME[a.dtype], rt.DTYPE_NAME[out.dtype], out.device_index
    with rt.device(out.device_index):
        if src == dst:
            cp.copyto(out.array, a.array)
        elif src in _FLOATS and dst in _FLOATS:
            _float_cast(a.array, src, out.array, dst, idx)
        elif src == "bfloat16":  # bf16 -> int/bool through float32
            tmp = cp.empty(a.size, dtype=np.float32)
            _float_cast(a.array, src, tmp, "float32", idx)
            out.array[...] = tmp.astype(out.array.dtype)
        elif dst == "bfloat16":
            _float_cast(a.array.astype(np.float32), "float32", out.array, dst, idx)
        else:
            out.array[...] = a.array.astype(out.array.dtype)


# ---------------------------------------------------------------------- matmul
def set_matmul_kernel(mode: str) -> None:
    """Choose the matmul path: "cublas" (default), "tiled" or "naive" (teaching kernels)."""
    if mode not in ("cublas", "tiled", "naive"):
        raise ValueError(f"unknown matmul kernel {mode!r}; expected cublas, tiled or naive")
    _MATMUL_MODE[0] = mode


def get_matmul_kernel() -> str:
    """The current matmul path."""
    return _MATMUL_MODE[0]


# cudaDataType and cublasComputeType_t of each float dtype: (data type, compute type, the
# alpha / beta scalars in the compute type). Half types compute in float32, as CuPy's matmul.
_ONE_ZERO = {t: (np.ones((), t), np.zeros((), t)) for t in (np.float32, np.float64)}
_GEMM_TYPES = {np.dtype(np.float32): (0, 68, _ONE_ZERO[np.float32]),
               np.dtype(np.float64): (1, 70, _ONE_ZERO[np.float64]),
               np.dtype(np.float16): (2, 68, _ONE_ZERO[np.float32]),
               rt.BF16: (14, 68, _ONE_ZERO[np.float32])}
_OP_N, _OP_T, _GEMM_DEFAULT = 0, 1, -1


@functools.lru_cache(maxsize=None)
def _cublas() -> Any:
    """CuPy's cuBLAS bindings (loaded on the first GEMM: a CuPy without cuBLAS still imports)."""
    return cupy_module("cupy_backends.cuda.libs.cublas")


def _gemm(a: Array, b: Array, out: Array, batch: int, m: int, n: int, p: int, trans_a: bool,
          trans_b: bool) -> None:
    """out[i] = op(a[i]) @ op(b[i]) by one cuBLAS ``gemmStridedBatchedEx`` call (no CuPy
    matmul in between: its argument handling cost more host time than the GEMM launch).

    Row-major C = A @ B is column-major C^T = B^T @ A^T, so B is passed first; a transposed
    operand is read as it is stored (op T).
    """
    dtype, compute, (one, zero) = _GEMM_TYPES[out.dtype]
    cublas = _cublas()
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    cublas.gemmStridedBatchedEx(
        handle, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, p, m, n,
        one.ctypes.data, b.array.data.ptr, dtype, n if trans_b else p, n * p,
        a.array.data.ptr, dtype, m if trans_a else n, m * n,
        zero.ctypes.data, out.array.data.ptr, dtype, p, m * p, batch, compute, _GEMM_DEFAULT)


def _transposed(a: Array, batch: int, rows: int, cols: int) -> Array:
    """A compact copy of the (batch, rows, cols) matrices of ``a``, each transposed."""
    t = Array(batch * rows * cols, a.dtype, a.device_index)
    with rt.device(a.device_index):
        src = a.array[: batch * rows * cols].reshape(batch, rows, cols)
        t.array.reshape(batch, cols, rows)[...] = src.transpose(0, 2, 1)
    return t


def matmul(a: Array, b: Array, out: Array, batch: int, m: int, n: int, p: int,
           trans_a: bool = False, trans_b: bool = False) -> None:
    """out[i] = op(a[i]) @ op(b[i]) for ``batch`` (m, n) @ (n, p) products.

    ``a`` holds compact (m, n) matrices, or (n, m) ones when ``trans_a`` (op = transpose);
    likewise ``b``. cuBLAS reads transposed operands as they are; the teaching kernels take
    row-major operands, so those get a transposed copy first.
    """
    if batch * m * p == 0:
        return
    if n == 0:
        fill(out, 0)
        return
    dt, mode = rt.DTYPE_NAME[out.dtype], _MATMUL_MODE[0]
    if (trans_a or trans_b) and mode != "cublas":
        a = _transposed(a, batch, n, m) if trans_a else a
        b = _transposed(b, batch, p, n) if trans_b else b
        trans_a = trans_b = False
    with rt.device(out.device_index):
        if mode != "cublas" and dt in _FLOATS:
            ### BEGIN YOUR SOLUTION (hw3.cuda.backend)
            name = K.typed_name("matmul_" + mode, dt)
            k = rt.kernel("matmul.cu", name, dt, out.device_index)
            step = 65535  # gridDim.z limit: launch the batch in slices
            for s in range(0, batch, step):
                nb = min(step, batch - s)
                grid, block = K.matmul_launch(nb, m, p, mode)
                rt.launch(k, grid, block, (a.array[s * m * n:], b.array[s * n * p:],
                                           out.array[s * m * p:], np.int32(m), np.int32(n),
                                           np.int32(p)), out.device_index)
            ### END YOUR SOLUTION
        elif out.dtype in _GEMM_TYPES:
            _gemm(a, b, out, batch, m, n, p, trans_a, trans_b)
        else:  # integer matrices: CuPy's matmul
            x = a.array[: batch * m * n]
            x = x.reshape(batch, n, m).transpose(0, 2, 1) if trans_a else x.reshape(batch, m, n)
            y = b.array[: batch * n * p]
            y = y.reshape(batch, p, n).transpose(0, 2, 1) if trans_b else y.reshape(batch, n, p)
            cp.matmul(x, y, out=out.array.reshape(batch, m, p))


# ---------------------------------------------------------------------- reductions
def _reduce_rows(src: Any, src_dt: str, dst: Any, dst_dt: str, rows: int, size: int, op: str,
                 base: str, index: int) -> None:
    """dst[r] = op over src[r*size:(r+1)*size], two passes when rows are few and long.

    ``base`` is the array dtype; partials of the first pass are kept in its accumulator type.
    """
    launch = K.reduce_launch(rows, size, rt.num_sms(index))
    if launch["kind"] == "thread":
        k = rt.kernel("reduce.cu", K.reduce_name("thread", op, src_dt, dst_dt), base, index)
        rt.launch(k, (launch["grid_rows"],), (launch["block"],),
                  (src, dst, np.int64(rows), np.int64(size)), index)
        return
    chunks = launch["chunks"]
    if chunks == 1:
        target, target_dt = dst, dst_dt
    else:
        target_dt = K.ACC_DTYPE[base]
        target_buf = Array(rows * chunks, np.dtype(target_dt), index)  # needle's pool
        target = target_buf.array
    k = rt.kernel("reduce.cu", K.reduce_name("block", op, src_dt, target_dt), base, index)
    rt.launch(k, (launch["grid_rows"], chunks), (launch["block"],),
              (src, target, np.int64(rows), np.int64(size), np.int64(launch["chunk"])), index)
    if chunks > 1:
        _reduce_rows(target, target_dt, dst, dst_dt, rows, chunks, op, base, index)


def _reduce(op: str, a: Array, out: Array, reduce_size: int) -> None:
    """out[r] = op ('sum' or 'max') of block r of compact ``a`` (``reduce_size`` consecutive
    elements), by the reduce.cu kernels for float dtypes (CuPy for the others)."""
    rows = out.size
    if rows == 0:
        return
    dt = rt.DTYPE_NAME[a.dtype]
    with rt.device(out.device_index):
        if dt in _FLOATS and out.dtype == a.dtype:
            ### BEGIN YOUR SOLUTION (hw3.cuda.backend)
            _reduce_rows(a.array, dt, out.array, dt, rows, reduce_size, op, dt,
                         out.device_index)
            ### END YOUR SOLUTION
        else:
            f = cp.sum if op == "sum" else cp.max
            f(a.array[: rows * reduce_size].reshape(rows, reduce_size), axis=1, out=out.array)


def set_reduce_kernel(mode: str) -> None:
    """Choose the float reductions, fused softmax / logsumexp and layer-norm forward: "fast"
    (default: reduce_fast.cu, middle axes read in place, and norm_fast.cu) or "course" (the hw3
    exercises reduce.cu, after a transposed copy for middle axes, softmax.cu and layernorm.cu)."""
    _REDUCE_MODE[0] = rt.reduce_mode(mode, f"set_reduce_kernel({mode!r})")


def get_reduce_kernel() -> str:
    """The current reduction, softmax and layer-norm path ("fast" or "course")."""
    return _REDUCE_MODE[0]


def _fast_reduce(op: str, src: Any, src_dt: str, dst: Any, dst_dt: str, outer: int,
                 size: int, inner: int, base: str, index: int) -> None:
    """dst = op over the middle axis of compact (outer, size, inner) ``src`` by reduce_fast.cu;
    few long rows go through partials in the accumulator type (a second pass)."""
    launch = K.fast_reduce_launch(outer, size, inner, np.dtype(src.dtype).itemsize,
                              rt.num_sms(index))
    kind, chunks = launch["kind"], launch["chunks"]
    target, target_dt, part = dst, dst_dt, None
    if chunks > 1:
        target_dt = K.ACC_DTYPE[base]
        part = Array(outer * chunks, np.dtype(target_dt), index)  # needle's pool
        target = part.array
    k = rt.kernel("reduce_fast.cu", K.fast_reduce_name(kind, op, src_dt, target_dt), base,
                  index)
    sizes = (outer, size, inner) if kind == "cols" else (outer, size)
    extra = (launch["chunk"],) if kind == "rows_wide" else ()
    rt.launch(k, launch["grid"], launch["block"],
              (src, target, *(np.int64(v) for v in sizes + extra)), index)
    if part is not None:
        _fast_reduce(op, target, target_dt, dst, dst_dt, outer, chunks, 1, base, index)


def _reduce_middle(op: str, a: Array, out: Array, reduce_size: int, inner_size: int) -> None:
    """``op`` over the middle axis of compact (outer, reduce_size, inner_size) ``a``: the fast
    kernels for float arrays (set_reduce_kernel), else the course's path."""
    dt = rt.DTYPE_NAME.get(a.dtype)
    if _REDUCE_MODE[0] == "fast" and dt in _FLOATS and out.dtype == a.dtype and out.size:
        with rt.device(out.device_index):
            _fast_reduce(op, a.array, dt, out.array, dt, out.size // inner_size, reduce_size,
                         inner_size, dt, out.device_index)
        return
    if inner_size > 1:  # (outer, inner, reduce): the reduced axis last
        a = _transposed(a, a.size // (reduce_size * inner_size), reduce_size, inner_size)
    _reduce(op, a, out, reduce_size)


def reduce_sum(a: Array, out: Array, reduce_size: int, inner_size: int = 1) -> None:
    """Sum compact ``a``, viewed as (outer, reduce_size, inner_size), over its middle axis."""
    if reduce_size == 0:
        fill(out, 0)
        return
    _reduce_middle("sum", a, out, reduce_size, inner_size)


def reduce_max(a: Array, out: Array, reduce_size: int, inner_size: int = 1) -> None:
    """Max of compact ``a``, viewed as (outer, reduce_size, inner_size), over its middle axis."""
    if reduce_size == 0:
        raise ValueError("max over an empty axis has no identity")
    _reduce_middle("max", a, out, reduce_size, inner_size)


# ---------------------------------------------------------------------- embedding rows
def take_rows(a: Array, idx: Array, out: Array, row_size: int) -> None:
    """Row i of ``out`` = row ``idx[i]`` of ``a``, both viewed as rows of ``row_size``."""
    if out.size == 0:
        return
    # a gather moves bits: bfloat16's uint16 storage needs no conversion
    with rt.device(out.device_index):
        cp.take(a.array.reshape(-1, row_size), idx.array, axis=0,
                out=out.array.reshape(-1, row_size))


def scatter_add_rows(src: Array, idx: Array, out: Array, row_size: int) -> None:
    """Row ``idx[i]`` of ``out`` += row i of ``src`` (repeats accumulate): take_rows' adjoint."""
    if src.size == 0:
        return
    if out.dtype == rt.BF16:
        raise TypeError("scatter_add_rows: bfloat16 tables are not supported on cuda (CuPy has "
                        "no bfloat16 atomics); keep embedding tables in float32")
    cupyx = cupy_module("cupyx")
    with rt.device(out.device_index):
        cupyx.scatter_add(out.array.reshape(-1, row_size), idx.array,
                          src.array.reshape(-1, row_size))


# ---------------------------------------------------------------------- host transfers
def from_numpy(a: np.ndarray, out: Array) -> None:
    """Copy a numpy array (any layout) into compact ``out``."""
    host = np.ascontiguousarray(np.asarray(a).reshape(-1), dtype=out.dtype)
    if host.size == 0:
        return
    with rt.device(out.device_index):
        out.array.set(host.view(out.array.dtype))
    out.known_range = (int(host.min()), int(host.max())) if host.dtype.kind in "iu" else None


def to_numpy(a: Array, shape: Tuple[int, ...], strides: Tuple[int, ...], offset: int
             ) -> np.ndarray:
    """A numpy copy of the strided view (shape, strides, offset) of ``a``."""
    n = math.prod(shape)
    if n == 0:
        return np.empty(shape, dtype=a.dtype)
    with rt.device(a.device_index):
        if (offset == 0 and n == a.size
                and tuple(strides) == _compact_strides(tuple(shape))):
            src = a.array
        else:
            tmp = Array(n, a.dtype, a.device_index)
            compact(a, tmp, shape, strides, offset)
            src = tmp.array
        host = src.get()
    return host.view(a.dtype).reshape(shape)


def _compact_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


# ---------------------------------------------------------------------- per-GPU binding
def _array_on(index: int) -> type:
    """``Array`` allocating on GPU ``index``: a class, as the CPU backend's ``Array`` is, so
    ``isinstance(x, device.Array)`` works (needle.compile's tracer relies on it)."""
    class DeviceArray(Array):
        __slots__ = ()
        default_index = index
    DeviceArray.__name__ = DeviceArray.__qualname__ = "Array"
    DeviceArray.__doc__ = f"A new buffer of ``size`` elements on GPU {index}."
    return DeviceArray


class DeviceBackend:
    """This module's primitives bound to GPU ``index``: ``Array`` allocates there."""

    def __init__(self, index: int):
        self.index = index
        self.__name__ = __name__
        self.__dict__.update(_PRIMITIVES)
        self.Array = _array_on(index)

    def __repr__(self) -> str:
        return f"<needle CUDA backend on GPU {self.index}>"


_PRIMITIVES: Dict[str, Any] = {}
_BOUND: Dict[int, DeviceBackend] = {}


def for_device(index: int) -> DeviceBackend:
    """The backend object ``ndl.cuda(index)`` uses."""
    if index not in _BOUND:
        _BOUND[index] = DeviceBackend(index)
    return _BOUND[index]


_PRIMITIVES.update({name: globals()[name] for name in (
    "fill", "compact", "ewise_setitem", "scalar_setitem", "ewise_strided", "ewise_where",
    "ewise_astype",
    "matmul", "reduce_sum", "reduce_max", "take_rows", "scatter_add_rows", "from_numpy",
    "to_numpy", "available",
    "memory_stats", "reset_peak_memory", "set_matmul_kernel", "get_matmul_kernel",
    "set_reduce_kernel", "get_reduce_kernel", "device_count",
    *(p.name for p in P.TABLE.values() if p.family))})
# Optional fused primitives (needle.backend_ndarray.fused_ops uses them when a device has them).
_PRIMITIVES.update({name: getattr(fused, name) for name in fused.__all__})
# Convolution and batch norm as a GPU does them (fused_ops.conv2d, fused_ops.batch_norm).
_PRIMITIVES.update({name: getattr(conv, name) for name in conv.__all__})
# needle.compile's fused kernels: the CPU primitive's expressions as ElementwiseKernels
_PRIMITIVES.update(fused_elementwise=fused_elementwise)
# DLPack exchange (needle.backend_ndarray.dlpack calls these for a CUDA array)
def wrap_dlpack(obj: Any, bfloat16: bool, index: int) -> Tuple[Any, tuple, tuple, int]:
    """dlpack_cuda.wrap_dlpack with GPU ``index``'s Array (dlpack_cuda imports no backend)."""
    return dlpack_cuda.wrap_dlpack(obj, bfloat16, index, for_device(index).Array)


_PRIMITIVES.update(dlpack_view=dlpack_cuda.dlpack_view, wrap_dlpack=wrap_dlpack)
_PRIMITIVES.update(__device_name__=__device_name__, EMULATED=EMULATED)
# needle.compile(mode="reduce-overhead") may capture a program as a CUDA graph (graphs.py)
_PRIMITIVES.update(GRAPHS=True)
# cuBLAS, not the course's tiled route (NDArray.__matmul__ reads the flag on every matmul)
_PRIMITIVES.update(TILED_MATMUL=False)
