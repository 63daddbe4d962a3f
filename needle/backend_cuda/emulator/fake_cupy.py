"""The part of CuPy needle's CUDA backend uses, over NumPy on host memory (the emulator's CuPy).

Only what ``needle/backend_cuda/*.py`` and ``backend_ndarray/dlpack.py`` call is here. Device
buffers are NumPy arrays of the ``ndarray`` subclass below: ``.data.ptr`` is their host address,
which ``module.load_module``'s kernels read and write as a GPU kernel reads device memory.
CuPy's own checks that catch host-code bugs are kept: a NumPy array passed where a device array
is expected raises TypeError, ``set`` checks dtype and shape, ``ElementwiseKernel`` checks its
parameter types (see ``elementwise.py``). cuBLAS and CuPy's ufuncs are NumPy's: they run on the
CPU's math library, not the GPU's.
"""
import math
import os
import threading
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...backend_ndarray import primitives as P
from . import counts, elementwise, graph, memcheck
from .cublas import cublas  # noqa: F401  (cupy_backends.cuda.libs.cublas)

# CuPy's ufuncs and reductions are NumPy's (``ndarray.__array_ufunc__`` checks the operands):
# the reductions and gathers the backend calls, and (``__getattr__``) each elementwise op's ufunc
_NUMPY_FUNCTIONS = ("matmul", "max", "sum", "take")


def _run(kind: str, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` recorded when the current stream captures (None), else counted as
    one ``kind`` event named ``name`` and run (what it does inside is not counted again)."""
    if graph.record(name, fn, *args, **kwargs):
        return None
    counts.record(kind, name)
    with counts.quiet():
        return fn(*args, **kwargs)


def _library(name: str) -> Any:
    """NumPy's ``name``, counted as one CuPy library call (``counts``) where it is called."""
    f = getattr(np, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out is None:
            graph.refuse(f"cupy.{name} (a new device array)", _ALLOC_RULE)
            return _run("library", f"cupy.{name}", f, *args, **kwargs)
        for x in args + (out,):
            _check_device(x, f"cupy.{name}")
        _run("library", f"cupy.{name}", f, *args, **kwargs)
        return out
    call.__name__ = name
    return call


globals().update({name: _library(name) for name in _NUMPY_FUNCTIONS})


def __getattr__(name: str) -> Any:
    """``cupy.<ufunc>`` for the ufunc of a row of the primitive table: NumPy's (read when asked,
    so that a row added to the table is here too)."""
    if any(ufunc == name for _, ufunc, _ in P.ELEMENTWISE):
        return getattr(np, name)  # counted by ndarray.__array_ufunc__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (not emulated)")

# Device 0 of the emulator: an H100-like device (sm_90, 132 SMs); kernels see only these numbers.
_ATTRIBUTES = {"MultiProcessorCount": 132, "MaxThreadsPerBlock": 1024,
               "MaxSharedMemoryPerBlock": 48 * 1024, "WarpSize": 32}
_COMPUTE_CAPABILITY = "90"
DEVICES_ENV = "NEEDLE_CUDA_EMULATOR_DEVICES"


def _device_count() -> int:
    """Emulated devices: ``NEEDLE_CUDA_EMULATOR_DEVICES`` (default 1), read on each call."""
    raw = os.environ.get(DEVICES_ENV, "").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{DEVICES_ENV}={raw!r}; expected a whole number of devices >= 1")
    return int(raw)


# The current device of each thread, as the CUDA runtime keeps one per host thread.
_STATE = threading.local()


def _current() -> int:
    return getattr(_STATE, "device", 0)


class MemoryPool:
    """Bytes of live stand-in buffers on each device, read for the current device as CuPy's
    pool does (no caching: freed bytes go back to the OS at once)."""

    def __init__(self) -> None:
        self._used: Dict[int, int] = {}

    def _track(self, owner: np.ndarray, device_id: int) -> None:
        graph.refuse(f"a device allocation of {owner.nbytes} bytes", _ALLOC_RULE)
        counts.record("alloc", "buffer")
        self._used[device_id] = self._used.get(device_id, 0) + owner.nbytes
        weakref.finalize(owner, self._release, owner.nbytes, device_id)

    def _release(self, nbytes: int, device_id: int) -> None:
        self._used[device_id] -= nbytes

    def used_bytes(self) -> int:
        """Bytes held by live buffers on the current device."""
        return self._used.get(_current(), 0)

    def total_bytes(self) -> int:
        """Bytes reserved by the pool on the current device (== used: nothing is cached)."""
        return self.used_bytes()

    def free_bytes(self) -> int:
        """Cached free bytes (always 0)."""
        return 0


_POOL = MemoryPool()
_ALLOC_RULE = "cudaMalloc cannot be captured: allocate before the capture"
_COPY_RULE = "a synchronous host-device copy cannot be captured"


def get_default_memory_pool() -> MemoryPool:
    """The pool every stand-in buffer is counted in."""
    return _POOL


class MemoryPointer:
    """A device address (here a host address) inside an owning buffer."""

    def __init__(self, owner: np.ndarray, ptr: int, device_id: int = 0):
        self.mem, self.ptr, self.device_id = owner, ptr, device_id

    def __add__(self, offset: int) -> "MemoryPointer":
        return MemoryPointer(self.mem, self.ptr + int(offset), self.device_id)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class ndarray(np.ndarray):
    """A device array: a NumPy array on host memory with CuPy's ``.data.ptr``, get and set."""

    _device_id: int = 0  # the emulated device holding the buffer (set per instance)

    def __new__(cls, shape: Any, dtype: Any = float, memptr: Optional[MemoryPointer] = None,
                strides: Optional[Sequence[int]] = None) -> "ndarray":
        if memptr is None:
            return np.ndarray.__new__(cls, shape, dtype, strides=strides)
        root = memptr.mem
        flat = np.ndarray.__new__(np.ndarray, (root.nbytes,), np.uint8, buffer=root)
        view = np.ndarray.__new__(cls, shape, dtype, buffer=flat,
                                  offset=memptr.ptr - _address(root), strides=strides)
        view._device_id = memptr.device_id
        return view

    def __array_finalize__(self, obj: Any) -> None:
        if self.base is None:  # a new allocation (not a view): on the current device
            self._device_id = _current()
            _POOL._track(self, self._device_id)
        else:
            self._device_id = getattr(obj, "_device_id", _current())

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out", ())
        for x in inputs + tuple(out):
            _check_device(x, f"cupy.{ufunc.__name__}")
        inputs = tuple(x.view(np.ndarray) if isinstance(x, ndarray) else x for x in inputs)
        name = f"cupy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        if out:
            kwargs["out"] = tuple(x.view(np.ndarray) for x in out)
            _run("library", name, getattr(ufunc, method), *inputs, **kwargs)
            return out[0] if len(out) == 1 else out
        graph.refuse(f"cupy.{ufunc.__name__} (a new device array)", _ALLOC_RULE)
        return _to_device(_run("library", name, getattr(ufunc, method), *inputs, **kwargs))

    @property
    def data(self) -> MemoryPointer:  # type: ignore[override]
        """The buffer's address (CuPy's ``MemoryPointer``)."""
        return MemoryPointer(_root(self), _address(self), self._device_id)

    @property
    def device(self) -> "Device":  # type: ignore[override]
        """The device holding the buffer."""
        return Device(self._device_id)

    def get(self) -> np.ndarray:
        """A NumPy copy on the host (a device-to-host copy: the host waits for the GPU)."""
        return np.array(self._host_read("ndarray.get"), copy=True)

    def _host_read(self, what: str) -> Any:
        """The buffer as NumPy sees it, counted as a device-to-host copy and a wait (refused
        during a stream capture)."""
        graph.refuse(what, _COPY_RULE)
        counts.record("d2h", what)
        counts.record("sync", what)
        return self.view(np.ndarray)

    def __bool__(self) -> bool:
        return bool(self._host_read("bool(ndarray)"))

    def __float__(self) -> float:
        return float(self._host_read("float(ndarray)"))

    def __int__(self) -> int:
        return int(self._host_read("int(ndarray)"))

    def item(self) -> Any:  # type: ignore[override]
        """The element as a Python scalar (a device-to-host copy)."""
        return self._host_read("ndarray.item").item()

    def fill(self, value: Any) -> None:
        """Set every element (one CuPy kernel)."""
        _run("library", "ndarray.fill", np.ndarray.fill, self, value)

    def astype(self, dtype: Any, order: Any = None, casting: Any = None,  # type: ignore[override]
               subok: Any = None, copy: Any = None) -> Any:
        """A converted copy (one CuPy kernel and a new buffer)."""
        graph.refuse("ndarray.astype (a new device array)", _ALLOC_RULE)
        return _to_device(_run("library", "ndarray.astype", self.view(np.ndarray).astype, dtype,
                               order=order or "K", casting=casting or "unsafe",
                               copy=True if copy is None else copy))

    def __setitem__(self, key: Any, value: Any) -> None:
        _run("library", "ndarray.__setitem__", np.ndarray.__setitem__, self, key, value)

    def set(self, arr: np.ndarray) -> None:
        """Copy the host array ``arr`` in (CuPy's checks: a NumPy array, same dtype and shape)."""
        if not isinstance(arr, np.ndarray) or isinstance(arr, ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        graph.refuse("ndarray.set", _COPY_RULE)
        counts.record("h2d", "ndarray.set")
        self.view(np.ndarray)[...] = arr


def _check_device(x: Any, where: str) -> None:
    """CuPy refuses host arrays where device arrays go (implicit transfers are errors), and
    arrays of another device than the current one (a GPU kernel cannot read them)."""
    if isinstance(x, ndarray):
        if x._device_id != _current():
            raise ValueError(f"{where}: array device must be same as the current device: "
                             f"array device = {x._device_id} while current = {_current()}")
    elif isinstance(x, np.ndarray):
        raise TypeError(f"{where}: Unsupported type {type(x)} (a host array where a device "
                        f"array is expected)")


def _to_device(res: Any) -> Any:
    if isinstance(res, tuple):
        return tuple(_to_device(r) for r in res)
    if isinstance(res, np.ndarray) and not isinstance(res, ndarray):
        if res.base is None:
            _POOL._track(res, _current())
        return res.view(ndarray)  # on the current device (__array_finalize__)
    return res


def empty(shape: Any, dtype: Any = float) -> ndarray:
    """An uninitialised device array (poisoned and tracked under full memory checking)."""
    out = ndarray(shape, dtype)
    memcheck.on_empty(out)
    return out


def asarray(a: Any, dtype: Any = None) -> ndarray:
    """``a`` on the device (a copy of a host array, ``a`` itself for a device array)."""
    if isinstance(a, ndarray) and (dtype is None or a.dtype == dtype):
        return a
    graph.refuse("cupy.asarray of host memory", _COPY_RULE)
    host = np.asarray(a, dtype=dtype)
    counts.record("h2d", "cupy.asarray")
    out = empty(host.shape, host.dtype)
    out.view(np.ndarray)[...] = host
    return out


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = None) -> None:
    """``numpy.copyto`` between device arrays."""
    for x in (dst, src, where):
        _check_device(x, "cupy.copyto")
    _run("library", "cupy.copyto", np.copyto, dst, src, casting=casting,
         where=True if where is None else where)


def from_dlpack(array: Any) -> ndarray:
    """A device array over a DLPack producer's host memory (kDLCPU only: the device is host)."""
    return np.from_dlpack(array).view(ndarray)


def _as_strided(x: ndarray, shape: Tuple[int, ...], strides: Tuple[int, ...]) -> ndarray:
    # subok keeps the subclass at run time; NumPy's stubs type the result as a plain ndarray
    return np.lib.stride_tricks.as_strided(  # type: ignore[return-value]
        x, shape=shape, strides=strides, subok=True)


lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))


# ---------------------------------------------------------------------- cupy.cuda
class Device:
    """``cupy.cuda.Device``: one of ``_device_count()`` emulated devices (H100-like numbers);
    as a context manager it makes itself current and restores the previous one on exit."""

    def __init__(self, device: Optional[int] = None):
        index = _current() if device is None else int(device)
        if not 0 <= index < _device_count():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {index} (the "
                               f"emulator has {_device_count()}; {DEVICES_ENV} sets the count)")
        self.id = index
        self.attributes = dict(_ATTRIBUTES)
        self.compute_capability = _COMPUTE_CAPABILITY
        self._previous: List[int] = []

    def __enter__(self) -> "Device":
        self._previous.append(_current())
        _STATE.device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _STATE.device = self._previous.pop()

    def use(self) -> None:
        """Make this the current device of the calling thread."""
        _STATE.device = self.id

    def synchronize(self) -> None:
        """Wait for all of the device's work (a host synchronisation)."""
        graph.host_wait("Device.synchronize")

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id} (emulated)>"


cuda = types.SimpleNamespace(
    Device=Device, runtime=types.SimpleNamespace(getDeviceCount=_device_count),
    get_current_stream=lambda device_id=-1: graph.current_stream(), Stream=graph.Stream,
    Graph=graph.Graph, device=types.SimpleNamespace(get_cublas_handle=lambda: 0))


# ---------------------------------------------------------------------- cupyx
def _scatter_add(a: ndarray, slices: Any, value: Any) -> None:
    for x in (a, slices, value):
        _check_device(x, "cupyx.scatter_add")
    _run("library", "cupyx.scatter_add", lambda a, s, v: np.add.at(
        a.view(np.ndarray), np.asarray(s), np.asarray(v)), a, slices, value)


cupyx = types.SimpleNamespace(scatter_add=_scatter_add)

# ---------------------------------------------------------------------- kernels
class RawKernel:
    """A compiled kernel: ``k(grid, block, args, shared_mem=0)`` runs it on the CPU."""

    def __init__(self, function: Any, name: str):
        self._function, self.name = function, name

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *,
                 shared_mem: int = 0) -> None:
        for x in args:
            _check_device(x, f"kernel {self.name}")
        _run("launch", self.name, self._execute, tuple(grid), tuple(block), tuple(args),
             shared_mem)

    def _execute(self, grid: tuple, block: tuple, args: tuple, shared_mem: int) -> None:
        if counts.executing():
            self._function(grid, block, args, shared_mem=shared_mem)


class RawModule:
    """``cupy.RawModule(code=..., options=..., name_expressions=...)`` built by the emulator."""

    def __init__(self, code: str, *, options: Sequence[str] = (),
                 name_expressions: Sequence[str] = ()):
        from .module import load_module
        self._module = load_module(code, tuple(name_expressions), options=tuple(options))

    def get_function(self, name: str) -> RawKernel:
        """The kernel ``name`` (a name expression or an ``extern "C"`` name)."""
        return RawKernel(self._module.get_function(name), name)


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name)``, with CuPy's checks
    (parameter dtypes, devices, the broadcast output shape); its source is ``elementwise.py``'s."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel"):
        self.ins, self.outs = elementwise.params(in_params), elementwise.params(out_params)
        self.operation, self.name = operation, name
        self._built: Dict[Tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        n_in = len(self.ins)
        is_array, shape = self._check(args)
        result = args[n_in] if len(self.outs) == 1 else args[n_in:]
        size = math.prod(shape)
        if size:
            _run("launch", self.name, self._launch, args, is_array, shape, size)
        return result

    def _check(self, args: Sequence[Any]) -> Tuple[Tuple[bool, ...], Tuple[int, ...]]:
        """CuPy's argument checks; (which arguments are arrays, the broadcast shape)."""
        n_in, n_all = len(self.ins), len(self.ins) + len(self.outs)
        if len(args) != n_all:
            raise TypeError(f"Wrong number of arguments for {self.name!r}. It must be "
                            f"{n_all} (outputs are not allocated by the emulator), "
                            f"but given {len(args)}.")
        declared = self.ins + self.outs
        is_array = tuple(isinstance(a, ndarray) for a in args)
        for p, a, arr in zip(declared, args, is_array):
            if isinstance(a, np.ndarray) and not arr:
                raise TypeError(f"{self.name}: Unsupported type {type(a)} for {p.name}")
            if arr and a.dtype != p.dtype:
                raise TypeError(f"Type is mismatched. {p.name} {a.dtype.type} {p.dtype.type}")
            if arr:  # as CuPy: every array on the current device
                _check_device(a, f"{self.name} ({p.name})")
        if not all(is_array[n_in:]):
            raise TypeError("Output arguments must be cupy.ndarray")
        shape = np.broadcast_shapes(*(a.shape for a, arr in zip(args, is_array) if arr))
        for p, a in zip(self.outs, args[n_in:]):
            if a.shape != shape:
                raise ValueError(f"Out shape is mismatched: {p.name} is {a.shape}, the "
                                 f"broadcast shape is {shape}")
        return is_array, shape

    def _launch(self, args: Sequence[Any], is_array: Tuple[bool, ...], shape: Tuple[int, ...],
                size: int) -> None:
        declared = self.ins + self.outs
        views = [np.broadcast_to(a, shape, subok=True) for a, arr in zip(args, is_array) if arr]
        # (uncounted: CuPy passes the shape and strides as arguments, no copy)
        meta = asarray(np.array(list(shape) + [s for v in views for s in v.strides],
                                dtype=np.int64))
        kernel_args = [a if arr else p.dtype.type(a) for p, a, arr in zip(declared, args, is_array)]
        grid = min(math.ceil(size / elementwise.BLOCK), 0x7FFFFFFF)
        self._kernel(is_array, len(shape))((grid,), (elementwise.BLOCK,),
                                           (*kernel_args, meta, np.int64(size)))

    def _kernel(self, is_array: Tuple[bool, ...], ndim: int) -> Any:
        key = (is_array, ndim)
        if key not in self._built:
            src = elementwise.kernel_source(self.name, self.ins, self.outs, is_array,
                                           self.operation, ndim)
            self._built[key] = RawModule(code=src, name_expressions=(self.name,)).get_function(
                self.name)
        return self._built[key]
