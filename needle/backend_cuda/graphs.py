"""CUDA graphs: a stretch of needle's CUDA work captured once and replayed with one launch
(PyTorch's ``torch.cuda.CUDAGraph`` and ``with torch.cuda.graph(g):``).

    g = CUDAGraph()
    with graph(g):        # runs nothing: each kernel, cuBLAS call and copy is recorded
        opt.step()
    g.replay()            # the recorded work again, one launch; host bookkeeping as eager

A graph keeps device addresses, so the buffers it reads and writes must live and stay put:
every buffer allocated during the capture belongs to the graph (it never returns to needle's
pool, so nothing else is handed its memory: PyTorch's private graph pool), and what existed
before the capture must be kept alive by the caller. What cannot be captured raises (on a
GPU as on the emulator, which enforces CUDA's rules: ``emulator/graph.py``): a new CuPy
allocation (run the work once before capturing, so that needle's pool holds what it asks
for), a host synchronisation, a host-device copy.

Values a capture read on the host (a learning rate baked into the hyperparameters on the
device) are ``watch``ed: a replay after one changed raises, naming it. Host bookkeeping that
an eager call does (an optimizer's step counts) registers ``on_replay`` and runs per replay.
"""
import contextlib
from typing import Any, Callable, Iterator, List, Tuple

from .. import numbers
from ..backend_ndarray import capture_hooks
from ..process_state import switches
from . import _runtime as rt
from . import buffer_pool
from ._runtime import cp


class GraphError(RuntimeError):
    """A replay whose capture no longer holds (a watched host value changed)."""


class CUDAGraph:
    """Captured CUDA work (``with graph(g):``), replayed by ``replay()``."""

    def __init__(self) -> None:
        self.device_index = 0
        self.reset()

    def replay(self) -> None:
        """Run the captured work again: one graph launch on the device's stream."""
        if self._graph is None:
            raise GraphError("CUDAGraph.replay: nothing captured (use `with graph(g): ...`)")
        for name, get, value in self._checks:
            now = get()
            if now != value:
                raise GraphError(f"{name} changed after the CUDA graph was captured ({value!r} "
                                 f"-> {now!r}): the graph holds the old value; capture again "
                                 f"(or put the value on the device)")
        for fn in self._on_replay:
            fn()
        with rt.device(self.device_index):
            self._graph.launch(cp.cuda.Stream.null)

    def reset(self) -> None:
        """Drop the captured work and the buffers it owned."""
        self._graph: Any = None
        self._kept: List[Any] = []  # buffers made during the capture: the graph's own
        self._checks: List[Tuple[str, Callable[[], Any], Any]] = []
        self._on_replay: List[Callable[[], None]] = []
        self._on_end: List[Callable[[], None]] = []


@contextlib.contextmanager
def _owning(kept: List[Any]) -> Iterator[None]:
    """Every Array made inside keeps its buffer out of needle's pool, in ``kept`` instead."""
    previous = switches.alloc_cuda

    def own(arr: Any) -> None:
        arr.pooled = False
        kept.append(arr.array)
        if previous is not None:
            previous(arr)
    switches.alloc_cuda = own
    try:
        yield
    finally:
        switches.alloc_cuda = previous


@contextlib.contextmanager
def warm_up() -> Iterator[None]:
    """Run the work to capture once inside this first: buffers are not reused within it, as
    in a capture (a graph owns each buffer it makes), and at the end they wait in needle's
    pool, so that the capture finds every buffer it asks for there (no CuPy allocation)."""
    kept: List[Any] = []
    rt.HOLD_CACHES[0] += 1
    try:
        with _owning(kept):
            yield
    finally:
        rt.HOLD_CACHES[0] -= 1
    for buf in kept:
        key = (buf.device.id, buf.dtype, buf.size)
        buffer_pool.FREE.setdefault(key, []).append(buf)
        buffer_pool.HELD[key[0]] = buffer_pool.HELD.get(key[0], 0) + buf.nbytes


@contextlib.contextmanager
def graph(g: CUDAGraph, device_index: int = 0) -> Iterator[CUDAGraph]:
    """Capture the CUDA work of the block into ``g`` (nothing inside runs). Run the same work
    once under ``warm_up()`` just before, so that needle's pool holds what it asks for."""
    if not isinstance(g, CUDAGraph):
        raise TypeError(f"graph: expected a CUDAGraph to capture into, got {type(g).__name__}")
    device_index = numbers.count_arg(device_index, "graph: device_index", lo=0)  # '0', 1.5
    if capture_hooks.CURRENT[0] is not None:
        raise GraphError("CUDA graph captures do not nest")
    g.reset()
    g.device_index = device_index
    with rt.device(device_index):
        stream = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device(device_index).synchronize()  # work before the capture is done first
        rt.CAPTURE_KEEP[0] = g._kept
        capture_hooks.CURRENT[0] = g
        rt.HOLD_CACHES[0] += 1
        try:
            with _owning(g._kept), stream:
                stream.begin_capture()
                try:
                    yield g
                finally:
                    captured = stream.end_capture()
        finally:
            rt.CAPTURE_KEEP[0] = None
            capture_hooks.CURRENT[0] = None
            rt.HOLD_CACHES[0] -= 1
            for fn in g._on_end:  # host bookkeeping the capture did for work not run
                fn()
    g._graph = captured
