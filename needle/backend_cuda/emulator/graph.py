"""Stream capture and CUDA graphs in the emulator: CuPy's ``cupy.cuda.Stream`` with
``begin_capture`` / ``end_capture`` and ``cupy.cuda.Graph.launch``. While a stream captures, its
work is recorded, not run, and ``Graph.launch`` replays the record; CUDA's capture rules are
``CaptureError``s naming the call and needle's line (README.md, "Stream capture and CUDA
graphs"). A value passed by value to a captured kernel is frozen into the graph, as on a GPU.
"""
import itertools
import os
import sys
import threading
import weakref
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from . import counts
from .errors import EmulatorError


class CaptureError(EmulatorError):
    """Work a CUDA stream capture or graph launch does not allow (see the module docstring)."""


_STATE = threading.local()  # the current stream of each host thread, as CUDA keeps one
_PTRS = itertools.count(1)
_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__))
_NEEDLE_DIR = os.path.dirname(os.path.dirname(_EMULATOR_DIR))


def where(depth: int = 3) -> str:
    """needle's innermost lines outside the emulator on the stack (the op that made the call,
    then its callers): ``file:line in function <- ...``."""
    f: Any = sys._getframe(1)
    found: List[str] = []
    while f is not None and len(found) < depth:
        path = os.path.abspath(f.f_code.co_filename)
        if path.startswith(_NEEDLE_DIR) and not path.startswith(_EMULATOR_DIR):
            rel = os.path.relpath(path, os.path.dirname(_NEEDLE_DIR))
            found.append(f"{rel}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(found) or "outside needle"


class Stream:
    """``cupy.cuda.Stream``: a CUDA stream (the emulator runs every stream's work in order at
    once); ``with stream:`` makes it the thread's current stream, which launches go to."""

    null: "Stream"  # the legacy default stream (set below)

    def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
        self.ptr = 0 if null else next(_PTRS)
        self.non_blocking = non_blocking
        self._record: Optional[List["_Call"]] = None
        self._previous: List["Stream"] = []

    def __enter__(self) -> "Stream":
        self._previous.append(current_stream())
        _STATE.stream = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _STATE.stream = self._previous.pop()

    def begin_capture(self, mode: Any = None) -> None:
        """Record the work pushed to this stream from now on instead of running it."""
        if self.ptr == 0:
            raise CaptureError("cudaErrorStreamCaptureUnsupported: capture may not be initiated "
                               "on the legacy default stream (use cupy.cuda.Stream(non_blocking"
                               "=True))")
        if self._record is not None:
            raise CaptureError("cudaErrorIllegalState: the stream is already capturing")
        self._record = []

    def end_capture(self) -> "Graph":
        """Stop capturing; the recorded work as a graph."""
        if self._record is None:
            raise CaptureError("cudaErrorIllegalState: end_capture on a stream not capturing")
        calls, self._record = self._record, None
        return Graph(calls)


Stream.null = Stream(null=True)


def current_stream() -> Stream:
    """The calling thread's current stream (the null stream unless one was entered)."""
    return getattr(_STATE, "stream", Stream.null)


def refuse(what: str, rule: str) -> None:
    """Raise ``CaptureError`` for ``what`` when the current stream captures (``rule``: why)."""
    if current_stream()._record is not None:
        raise CaptureError(f"{what} during CUDA stream capture ({rule}), at {where()}: "
                           f"do it before the capture")


def host_wait(what: str) -> None:
    """A host synchronisation: an error during capture, else counted."""
    refuse(what, "a host synchronisation cannot be captured")
    counts.record("sync", what)


def record(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Record ``fn(*args, **kwargs)`` when the current stream captures (True), else False.
    Device arrays among the arguments are kept as addresses: the graph does not keep them alive."""
    rec = current_stream()._record
    if rec is None:
        return False
    rec.append(_Call(name, fn, args, kwargs, where()))
    return True


class _Address:
    """A device array as a graph keeps it: its buffer (weakly), offset, shape, strides, dtype."""

    __slots__ = ("root", "offset", "shape", "strides", "dtype", "cls", "device_id")

    def __init__(self, a: np.ndarray) -> None:
        root = a
        while True:  # through views, and through as_strided's holder of its base
            b = root.base
            if not isinstance(b, np.ndarray):
                b = getattr(b, "base", None)
            if not isinstance(b, np.ndarray):
                break
            root = b
        self.root = weakref.ref(root)
        self.offset = (a.__array_interface__["data"][0]
                       - root.__array_interface__["data"][0])
        self.shape, self.strides, self.dtype, self.cls = a.shape, a.strides, a.dtype, type(a)
        self.device_id = getattr(a, "_device_id", 0)

    def array(self, call: "_Call") -> np.ndarray:
        root = self.root()
        if root is None:
            raise CaptureError(f"Graph.launch: {call.name} (captured at {call.at}) uses a "
                               f"device buffer freed after the capture (a GPU would read and "
                               f"write freed memory): keep every buffer a graph uses alive")
        flat = np.ndarray.__new__(np.ndarray, (root.nbytes,), np.uint8, buffer=root)
        view = np.ndarray.__new__(self.cls, self.shape, self.dtype, buffer=flat,
                                  offset=self.offset, strides=self.strides)
        view._device_id = self.device_id  # type: ignore[attr-defined]
        return view


def _freeze(x: Any) -> Any:
    if isinstance(x, np.ndarray) and x.dtype != object and hasattr(x, "_device_id"):
        return _Address(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_freeze(v) for v in x)
    return x


def _thaw(x: Any, call: "_Call") -> Any:
    if isinstance(x, _Address):
        return x.array(call)
    if isinstance(x, (tuple, list)):
        return type(x)(_thaw(v, call) for v in x)
    return x


class _Call:
    """One captured call: what it ran, its arguments (arrays as addresses), where needle made it."""

    def __init__(self, name: str, fn: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: dict, at: str) -> None:
        self.name, self.fn, self.at = name, fn, at
        self.args = _freeze(args)
        self.kwargs = {k: _freeze(v) for k, v in kwargs.items()}

    def bind(self) -> Tuple[tuple, dict]:
        return _thaw(self.args, self), {k: _thaw(v, self) for k, v in self.kwargs.items()}


class Graph:
    """``cupy.cuda.Graph``: captured work, replayed in order by ``launch``."""

    def __init__(self, calls: List[_Call]) -> None:
        self._calls = calls

    def launch(self, stream: Optional[Stream] = None) -> None:
        """Run the captured work (one launch: the calls inside are the graph's, not counted)."""
        bound = [c.bind() for c in self._calls]  # every buffer checked before anything runs
        refuse("Graph.launch", "launching a graph into a capture is not emulated")
        counts.record("graph", "Graph.launch")
        with counts.quiet():
            for call, (args, kwargs) in zip(self._calls, bound):
                call.fn(*args, **kwargs)
