"""MemoryTracker: bytes of live array storage, its peak, and what it was spent on.

Exact: each backend buffer allocated while it is active is reported through the backend's
allocation hook (``switches.alloc_cpu`` or ``alloc_cuda`` of ``needle.process_state``, named by
the backend's ``ALLOC_SWITCH``; None otherwise: one attribute test per allocation), and a
``weakref.finalize`` reports its release; views share a buffer, counted once. Allocations and
frees are kept as events, so ``classify(...)`` can label buffers after the fact and
``peak_by_category()`` replay them. Buffers allocated before the tracker started are not seen
(``bytes_of`` counts them).
"""
import sys
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from ..autograd import Tensor
from ..backend_ndarray import BackendDevice, NDArray, cpu
from ..process_state import switches

__all__ = ["MemoryTracker", "bytes_of", "buffers_of", "CATEGORIES"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
_ACTIVE: List[Any] = []  # MemoryTrackers and other listeners (attach)


def _set_hook(backend: Any) -> None:
    """The backend's allocation hook: None with no listener, the one listener's own
    ``_on_alloc`` (no loop in between), else a loop over that backend's listeners."""
    calls = tuple(t._on_alloc for t in _ACTIVE if t._backend is backend)

    def each(buf: Any) -> None:
        for call in calls:
            call(buf)
    setattr(switches, backend.ALLOC_SWITCH,
            None if not calls else calls[0] if len(calls) == 1 else each)


def attach(listener: Any) -> None:
    """Report every new buffer of ``listener._backend`` (a backend module) to
    ``listener._on_alloc(buf)`` until ``detach`` (trackers and ``needle.profiler`` use it)."""
    _ACTIVE.append(listener)
    _set_hook(listener._backend)


def detach(listener: Any) -> None:
    """Stop reporting to ``listener``; the hook goes back to None when no one else listens."""
    _ACTIVE.remove(listener)
    _set_hook(listener._backend)


def buffers_of(items: Iterable[Any]) -> Dict[int, Any]:
    """The distinct backend buffers (by id) behind Tensors / NDArrays, nested lists and dicts."""
    out: Dict[int, Any] = {}
    stack = list(items) if not isinstance(items, (Tensor, NDArray)) else [items]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            data = item.cached_data
            if data is not None:
                stack.append(data)
        elif isinstance(item, NDArray):
            out[id(item._handle)] = item._handle
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return out


def bytes_of(items: Iterable[Any]) -> int:
    """Bytes of the distinct buffers behind ``items`` (shared buffers counted once)."""
    return sum(b.array.nbytes if hasattr(b, "array") else b.nbytes
               for b in buffers_of(items).values())


class MemoryTracker:
    """Context manager reporting current and peak bytes of live array storage on ``device``."""

    def __init__(self, device: Optional[BackendDevice] = None, timeline: bool = False):
        self.device = device if device is not None else cpu()
        if not isinstance(self.device, BackendDevice):
            raise TypeError(f"MemoryTracker: device must be a needle BackendDevice, got "
                            f"{type(self.device).__name__} {self.device!r}")
        if not self.device.enabled():
            raise ValueError(f"MemoryTracker: device {self.device!r} is not enabled")
        self.keep_timeline = timeline
        # the module that defines the device's Array holds the allocation hook
        self._backend = sys.modules[self.device.Array.__module__]
        self.current_bytes = 0
        self.peak_bytes = 0
        self.num_allocs = 0
        self._events: List[Tuple[int, int]] = []       # (key, +/- nbytes) in order
        self._size: Dict[int, int] = {}                 # key -> nbytes (live and dead)
        self._label: Dict[int, str] = {}                # key -> category
        self._live: Dict[int, Any] = {}                 # key -> weakref to the buffer
        self._tag: Optional[str] = None
        self._next_key = 0

    # ------------------------------------------------------------------ hooking
    def __enter__(self) -> "MemoryTracker":
        attach(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        detach(self)

    def _on_alloc(self, buf: Any) -> None:
        nbytes = buf.array.nbytes
        key = self._next_key
        self._next_key += 1
        self.num_allocs += 1
        self._size[key] = nbytes
        if self._tag is not None:
            self._label[key] = self._tag
        self._live[key] = weakref.ref(buf)
        weakref.finalize(buf, self._on_free, key)
        self._events.append((key, nbytes))
        self.current_bytes += nbytes
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes

    def _on_free(self, key: int) -> None:
        nbytes = self._size[key]
        self._live.pop(key, None)
        self._events.append((key, -nbytes))
        self.current_bytes -= nbytes

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now (e.g. before the step to measure)."""
        self.peak_bytes = self.current_bytes
        self._events.append((-1, 0))  # a no-op event marking where the new peak starts

    # ------------------------------------------------------------------ categories
    @contextmanager
    def tag(self, category: str) -> Iterator[None]:
        """Label the buffers allocated inside the block with ``category``."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")
        prev, self._tag = self._tag, category
        try:
            yield
        finally:
            self._tag = prev

    def classify(self, parameters: Iterable[Tensor] = (), optimizer: Any = None,
                 activations: Iterable[Any] = ()) -> None:
        """Label live buffers: parameters, their ``.grad``, optimizer state, given activations."""
        params = list(parameters)
        if optimizer is not None and not params:
            params = list(getattr(optimizer, "params", []))
        state = [v for k, v in vars(optimizer).items() if k != "params"] if optimizer is not None \
            else []
        groups = [("activations", buffers_of(list(activations))),
                  ("optimizer_state", buffers_of(state)),
                  ("gradients", buffers_of([p.grad for p in params if p.grad is not None])),
                  ("parameters", buffers_of(params))]
        by_buffer = {}
        for category, bufs in groups:  # later groups win (a parameter is never "activation")
            for bid in bufs:
                by_buffer[bid] = category
        for key, ref in self._live.items():
            buf = ref()
            if buf is not None and id(buf) in by_buffer:
                self._label[key] = by_buffer[id(buf)]

    def category_of(self, key: int) -> str:
        """The label of allocation ``key`` (``activations`` when unlabelled)."""
        return self._label.get(key, "activations")

    def peak_by_category(self) -> Dict[str, int]:
        """Bytes per category at the moment of the overall peak."""
        cur = dict.fromkeys(CATEGORIES, 0)
        at_peak = dict(cur)
        total = peak = 0
        for key, delta in self._events:
            cur[self.category_of(key)] += delta
            total += delta
            if total > peak:
                peak, at_peak = total, dict(cur)
        return at_peak

    def current_by_category(self) -> Dict[str, int]:
        """Bytes per category of the buffers alive now."""
        out = dict.fromkeys(CATEGORIES, 0)
        for key in self._live:
            out[self.category_of(key)] += self._size[key]
        return out

    def peak_excluding(self, *categories: str) -> int:
        """Peak of the live bytes not in ``categories`` (e.g. activations alone)."""
        total = peak = 0
        for key, delta in self._events:
            if self.category_of(key) not in categories:
                total += delta
                peak = max(peak, total)
        return peak

    def timeline(self) -> List[Tuple[int, int]]:
        """(event index, live bytes after it) for plotting; needs ``timeline=True``."""
        if not self.keep_timeline:
            raise ValueError("MemoryTracker(timeline=True) is needed to keep a timeline")
        out, total = [], 0
        for i, (_, delta) in enumerate(self._events):
            total += delta
            out.append((i, total))
        return out

    def __repr__(self) -> str:
        return (f"MemoryTracker({self.device!r}, current={self.current_bytes}, "
                f"peak={self.peak_bytes})")
