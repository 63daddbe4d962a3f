"""Graph capture: record every device primitive a function calls (a tape of kernels).

Not needle's op graph: it misses work a training step does on NDArrays (gradients' masks,
``compact`` copies of broadcasts). Every computation is a call of a named primitive
(``backend_ndarray/primitives.py``) on flat buffers, so that tape is the graph, as a CUDA graph
records kernels. ``Recorder`` swaps recording wrappers into a device's primitive table;
``execute=True`` (``compile``) also runs each call, ``execute=False`` (``lazy``) only queues it.
"""
import contextlib
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..backend_ndarray import primitives
from ..backend_ndarray.primitives import ViewSpec

# (shape, strides, offset) of a strided read, in elements; None for a flat whole-buffer read.
View = Optional[Tuple[Tuple[int, ...], Tuple[int, ...], int]]

class DataDependentError(RuntimeError):
    """The traced function read tensor values into Python (its control flow may depend on them)."""


class Step:
    """One recorded primitive call: what it reads (buffer, view) and the buffer it writes."""

    __slots__ = ("name", "args", "reads", "write", "partial", "const")

    def __init__(self, name: str, args: tuple, reads: List[Tuple[int, View]], write: int,
                 partial: bool, const: Any = None) -> None:
        self.name = name          # primitive name, e.g. "ewise_add"
        self.args = args          # the call's arguments, buffers replaced by ``Buf(i)``
        self.reads = reads        # [(buffer index, view)] in argument order
        self.write = write        # buffer index written (-1 for none)
        self.partial = partial    # True when only part of ``write`` is overwritten
        self.const = const        # from_numpy's host array (a copy)

    def __repr__(self) -> str:
        return f"Step({self.name}, reads={self.reads}, write={self.write})"


class Buf(int):
    """A buffer index standing in for an ``Array`` argument in ``Step.args``."""


def _view(a: tuple, spec: ViewSpec) -> View:
    """The (shape, strides, offset) a declared read goes through, None for a flat read."""
    if spec is None:
        return None
    shape, strides, offset = a[spec] if isinstance(spec, int) else (a[k] for k in spec)
    return (tuple(shape), tuple(strides), int(offset))


def access(name: str, a: tuple) -> Tuple[List[Tuple[int, View]], int, bool]:
    """(reads, write, partial) of primitive ``name`` on ``a``, as ``primitives.py`` declares."""
    p = primitives.lookup(name)
    if p is None or p.opaque:
        # a device's fused kernels: every buffer is read and may be written
        bufs = [x for x in a if isinstance(x, Buf)]
        return [(b, None) for b in bufs], (bufs[-1] if bufs else -1), True
    reads = [(a[k], _view(a, spec)) for k, spec in p.reads]
    return reads, (a[p.write] if p.write >= 0 else -1), p.partial


class Trace:
    """The tape of one call: steps, and for every buffer its size, dtype and origin."""

    def __init__(self) -> None:
        self.steps: List[Step] = []
        self.arrays: List[Any] = []       # buffer index -> the Array seen while recording
        self.internal: List[bool] = []    # True when allocated during the recording
        self._index: Dict[int, int] = {}  # id(Array) -> buffer index
        self.data_read: Optional[str] = None  # where the function read data, if it did

    def buffer(self, arr: Any, internal: bool = False) -> Buf:
        """The index of ``arr``, registering it on first sight."""
        i = self._index.get(id(arr))
        if i is None:
            i = self._index[id(arr)] = len(self.arrays)
            self.arrays.append(arr)  # held, so that ids stay unique while recording
            self.internal.append(internal)
        return Buf(i)

    def index_of(self, arr: Any) -> Optional[int]:
        """The buffer index of ``arr`` when the trace has seen it."""
        return self._index.get(id(arr))

    def size(self, i: int) -> int:
        return self.arrays[i].size

    def dtype(self, i: int) -> np.dtype:
        return np.dtype(self.arrays[i].dtype)

    def signature(self) -> List[tuple]:
        """A comparable summary (names, scalar arguments, buffer indices, constants)."""
        out = []
        for s in self.steps:
            args = tuple(_hashable(x) for x in s.args)
            out.append((s.name, args, None if s.const is None else s.const.tobytes()))
        return out


def _hashable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(y) for y in x)
    if isinstance(x, np.ndarray):
        return ("ndarray", x.shape, x.dtype.str, x.tobytes())
    if isinstance(x, np.generic):
        return (x.dtype.str, x.item())
    return x


# Functions whose reads of data only decide whether to raise (index bounds checks); the program
# repeats their check on every replay (``replay.py``), so they do not stop compilation.
VALIDATORS = ("_row_indices",)


def _validating() -> bool:
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return False
        if f.f_code.co_name in VALIDATORS:
            return True
        f = f.f_back
    return False


def _caller() -> str:
    """file:line of the first frame outside needle's engine (where data was read)."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename.replace("\\", "/")
        if "/needle/" not in path or "/needle/nn/" in path or "/apps/" in path:
            return f"{path}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "?"


class Recorder:
    """Context manager recording the primitive calls made on ``device`` into ``self.trace``.

    ``execute=False`` only queues calls; ``to_numpy`` (the one way data reaches Python) then calls
    ``on_read`` first, which must run the queue."""

    def __init__(self, device: Any, execute: bool = True, on_read: Any = None) -> None:
        self.device = device
        self.execute = execute
        self.on_read = on_read
        self.trace = Trace()
        self._saved: Dict[str, Any] = {}

    def __enter__(self) -> "Recorder":
        d = self.device.__dict__
        if d.get("_needle_recorder") is not None:
            raise RuntimeError("needle.compile: a trace is already recording on this device "
                               "(nested compile/lazy blocks are not supported)")
        names = [n for n in primitives.TABLE if n in d]  # the device's optional ones too
        d["_needle_recorder"] = self
        for name in names:
            self._saved[name] = d[name]
            d[name] = self._wrap(name, d[name])
        for name in primitives.UNRECORDED:
            if name in d:
                self._saved[name] = d[name]
                d[name] = self._refuse(name, d[name])
        self._saved["Array"] = d["Array"]
        d["Array"] = self._wrap_alloc(d["Array"])
        return self

    def __exit__(self, *exc: Any) -> None:
        d = self.device.__dict__
        d.update(self._saved)
        d["_needle_recorder"] = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The device's own primitives inside the block: what runs there is not recorded
        (``BackendDevice.constant``: a cached constant is a leaf, like a parameter)."""
        d = self.device.__dict__
        wrapped = {k: d[k] for k in self._saved}
        d.update(self._saved)
        d["_needle_recorder"] = None
        try:
            yield
        finally:
            d.update(wrapped)
            d["_needle_recorder"] = self

    def original(self, name: str) -> Any:
        """The device's own primitive ``name`` (not the recording wrapper)."""
        return self._saved.get(name) or self.device.__dict__[name]

    def _wrap_alloc(self, array_cls: Any) -> Any:
        def alloc(size: int, *args: Any, **kw: Any) -> Any:
            arr = array_cls(size, *args, **kw)
            self.trace.buffer(arr, internal=True)
            return arr
        return alloc

    def _refuse(self, name: str, fn: Any) -> Any:
        """``fn``, run, and the recording marked as not replayable (as a data read is)."""
        def run(*args: Any) -> Any:
            if self.trace.data_read is None:
                self.trace.data_read = (f"{name} (an optimizer step, whose buffers a program "
                                        f"cannot rebind: call it outside the compiled function)")
            return fn(*args)
        return run

    def _wrap(self, name: str, fn: Any) -> Any:
        cls = self.device.Array

        def recorded(*args: Any) -> Any:
            trace = self.trace
            if name == "to_numpy":
                if self.on_read is not None:
                    self.on_read()
                elif trace.data_read is None and not _validating():
                    trace.data_read = _caller()
                return fn(*args)
            sub = tuple(trace.buffer(x) if isinstance(x, cls) else x for x in args)
            const = None
            if name == "from_numpy":
                const = np.array(args[0], copy=True)
                sub = (const,) + sub[1:]
            reads, write, partial = access(name, sub)
            trace.steps.append(Step(name, sub, reads, write, partial, const))
            if self.execute:
                return fn(*args)
            return None
        return recorded


def alive_elsewhere(trace: Trace, keep: Sequence[int], others: Sequence[Trace] = ()
                    ) -> List[int]:
    """Internal buffers that something besides the trace, the ``others`` traces that read
    them, and ``keep`` still references."""
    kept = set(keep)
    out, arrays = [], trace.arrays
    for i in range(len(arrays)):
        if not trace.internal[i] or i in kept:
            continue
        # two references are ours: the list's and getrefcount's argument
        ours = 2 + sum(t.index_of(arrays[i]) is not None for t in others)
        if sys.getrefcount(arrays[i]) > ours:
            out.append(i)
    return out
