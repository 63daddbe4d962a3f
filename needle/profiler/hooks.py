"""Installing the profiler's hooks into the library, and the one object they all call.

The library calls ``process_state.switches.profiler`` (this module's ``DISPATCH``, None while
nothing is profiled: one attribute test per call) at op dispatch, ``Op.gradient_as_tuple``,
``nn.Module.__call__``, ``DataLoader``, ``Optimizer.step``, gradient buckets, compiled programs,
every kernel launch (real or emulated) and every communication ledger record; and
``switches.alloc_cpu`` / ``alloc_cuda`` (shared with ``needle.memory.MemoryTracker``) at
every allocation.
They are set while at least one recorder is active in the process and reset to None by the
last one to stop.
"""
import contextlib
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..process_state import switches
from . import events as ev
from . import recorder
from .recorder import current

_LOCK = threading.Lock()
_USERS = [0]  # recorders active in this process
_PROBES: List["_MemoryProbe"] = []


class Dispatch:
    """What the library's hooks call; each method hands the call to this thread's recorder.

    The three per-op hooks are the recorder's own functions (one call each, no method of
    this object in between): ``op`` (an op's dispatch, ``TensorOp.__call__``), ``backward``
    (an op's gradient during backward, ``Op.gradient_as_tuple``) and ``module`` (a module
    call, ``Module.__call__``).
    """

    op = staticmethod(recorder.record_op)
    backward = staticmethod(recorder.record_backward)
    module = staticmethod(recorder.record_module)

    @contextlib.contextmanager
    def range(self, name: str, cat: str, args: Optional[Dict[str, Any]] = None
              ) -> Iterator[None]:
        """A named range (data loading, an optimizer step, ``record_function``)."""
        rec = current()
        if rec is None:
            yield
            return
        rec.open(name, cat, args)
        try:
            yield
        finally:
            rec.close()

    def instant(self, name: str, cat: str, args: Dict[str, Any]) -> None:
        """A point in time (a gradient bucket launched)."""
        rec = current()
        if rec is not None:
            rec.instant(name, cat, args)

    def program(self, program: Any, inputs: Any, run: Callable[[Any, Any], Any]) -> Any:
        """A compiled program's run, each of its steps (fused kernels included) timed."""
        rec = current()
        if rec is None:
            return run(program, inputs)
        saved = program.bound
        program.bound = [(_timed_step(fn, flat), flat, holes) for fn, flat, holes in saved]
        rec.open(f"compiled program ({len(saved)} steps)", ev.PROGRAM)
        try:
            return run(program, inputs)
        finally:
            rec.close()
            program.bound = saved

    def launch(self, launch: Callable, k: Any, grid: Any, block: Any, args: Any,
               index: int) -> None:
        """A CUDA kernel launch (``backend_cuda._runtime.launch``)."""
        rec = current()
        if rec is None:
            launch(k, grid, block, args, index)
            return
        rec.kernel(launch, k, grid, block, args, index, _emulated())

    def comm(self, record: Any) -> None:
        """A communication ledger record (``Ledger.add``)."""
        rec = current()
        if rec is not None:
            rec.comm(record)


DISPATCH = Dispatch()


def _timed_step(fn: Callable, flat: List[Any]) -> Callable:
    """``fn`` as a timed "program_step" event: "fused_elementwise: <expression>" for a fused one."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if "fused" in name and flat:
        name = f"{name}: {str(flat[0])[:60]}"

    def timed(*args: Any) -> Any:
        rec = current()
        if rec is None:
            return fn(*args)
        rec.open(name, ev.PROGRAM_STEP, {"fused": "fused" in name})
        try:
            return fn(*args)
        finally:
            rec.close()
    return timed


def _emulated() -> bool:
    backend = sys.modules.get("needle.backend_cuda.ndarray_backend_cuda")
    return bool(getattr(backend, "EMULATED", False))


class _MemoryProbe:
    """Told of every new buffer of one backend (as a ``MemoryTracker`` is); reports it, and its
    release, to the allocating thread's recorder."""

    def __init__(self, backend: Any, device: str) -> None:
        self._backend, self.device = backend, device
        self._on_alloc = recorder.alloc_hook(backend.Array, device)


def _backends() -> List[Tuple[Any, str]]:
    """(backend module, device name) of the CPU backend and, if loaded, the CUDA one."""
    found = [(sys.modules["needle.backend_ndarray.ndarray_backend_numpy"], "cpu")]
    cuda = sys.modules.get("needle.backend_cuda.ndarray_backend_cuda")
    if cuda is not None:
        found.append((cuda, "cuda"))
    return found


def install() -> None:
    """Turn the hooks on (the first active recorder does it)."""
    from ..memory import tracker  # here: importing needle.memory costs every `import needle`
    with _LOCK:
        _USERS[0] += 1
        switches.profiler = DISPATCH
        if _USERS[0] > 1:
            return
        for backend, device in _backends():
            probe = _MemoryProbe(backend, device)
            _PROBES.append(probe)
            tracker.attach(probe)  # the backend's only listener: called with no loop between


def uninstall() -> None:
    """Turn the hooks off again once no recorder is active."""
    from ..memory import tracker
    with _LOCK:
        _USERS[0] -= 1
        if _USERS[0] > 0:
            return
        switches.profiler = None
        while _PROBES:
            tracker.detach(_PROBES.pop())
