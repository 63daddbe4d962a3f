"""The recorder: one per profiled thread, fed by the hooks (``hooks.py``) while it is active.

It keeps a stack of the ranges open now (ops, modules, ``record_function``, data loading,
optimizer steps), so every event knows its parent: an op knows the module that called it,
an allocation the op that made it, a kernel launch the op that launched it. Host ranges nest
properly by construction (a range closes before its parent), which the Chrome trace needs.

The virtual cluster runs one rank per thread of one process, so recorders are looked up by
thread (``current()``): each rank's events go to its own recorder.
"""
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import events as ev
from .events import Event, MemorySample, Peak, RankRecord

perf_ns = time.perf_counter_ns
_BY_THREAD: Dict[int, "Recorder"] = {}


def current() -> Optional["Recorder"]:
    """The recorder of the calling thread, None when it is not being profiled."""
    return _BY_THREAD.get(threading.get_ident())


def _shapes(inputs: Sequence[Any]) -> Tuple[Any, ...]:
    """Input shapes, without computing lazy inputs (an unrealised one shows as None). Tuples,
    not lists: Python's garbage collector stops scanning tuples of ints, and a long recording
    holds many."""
    return tuple(getattr(getattr(x, "cached_data", None), "shape", None) for x in inputs)


class Recorder:
    """Events, memory samples and peaks of one thread, and the stack of open ranges."""

    def __init__(self, record_shapes: bool = True, max_events: int = 2_000_000) -> None:
        self.thread = threading.get_ident()
        self.record_shapes = record_shapes
        self.max_events = max_events
        self.events: List[Event] = []
        self.samples: List[MemorySample] = []
        self.peaks: Dict[str, Peak] = {}
        self.current_bytes: Dict[str, int] = {}
        self.allocated = 0       # bytes allocated since start (all devices), for per-op deltas
        self.freed = 0
        self.dropped = 0
        self.ops = 0
        self.overhead_ns = 0     # time spent in this recorder's own bookkeeping (hooks' cost)
        self.active = False
        self._stack: List[list] = []                 # [name, cat, t0, alloc0, freed0, args]
        self._module_names: List[Dict[int, str]] = []  # one name map per root module call
        self._modules: List[str] = []                # paths of the modules being called

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Receive this thread's hooks from now on."""
        self.active = True
        _BY_THREAD[self.thread] = self

    def stop(self) -> None:
        """Receive nothing more; close ranges still open (their end is now)."""
        while self._stack:
            self.close()
        self.active = False
        if _BY_THREAD.get(self.thread) is self:
            del _BY_THREAD[self.thread]

    def record(self, rank: int = 0, offset_ns: int = 0) -> RankRecord:
        """What was recorded, as one rank's ``RankRecord``."""
        per_op = self.overhead_ns / self.ops if self.ops else 0.0
        return RankRecord(rank, list(self.events), list(self.samples), dict(self.peaks),
                          offset_ns, per_op, self.ops, self.dropped)

    # ------------------------------------------------------------------ ranges
    def add(self, event: Event) -> None:
        """Keep ``event`` (or count it as dropped past ``max_events``)."""
        if len(self.events) < self.max_events:
            self.events.append(event)
        else:
            self.dropped += 1

    def open(self, name: str, cat: str, args: Optional[Dict[str, Any]] = None) -> None:
        """Start a range; it ends at the matching ``close``."""
        self._stack.append([name, cat, perf_ns(), self.allocated, self.freed, args or {}])

    def close(self) -> int:
        """End the innermost range; its end time (ns)."""
        name, cat, t0, alloc0, freed0, args = self._stack.pop()
        t1 = perf_ns()
        args["bytes_allocated"] = self.allocated - alloc0
        args["bytes_freed"] = self.freed - freed0
        if "module" not in args:  # the calling module; in backward, the forward's module
            if self._modules:
                args["module"] = self._modules[-1]
            elif self._stack and "module" in self._stack[-1][5]:
                args["module"] = self._stack[-1][5]["module"]
        self.add(Event(name, cat, t0, t1 - t0, args))
        return t1

    def close_through(self, name: str, cat: str) -> None:
        """Close ranges up to and including the innermost one called ``name`` of ``cat`` (a
        range left open inside it ends with it, so the trace still nests)."""
        while any(f[0] == name and f[1] == cat for f in self._stack):
            top = self._stack[-1]
            self.close()
            if top[0] == name and top[1] == cat:
                return

    def instant(self, name: str, cat: str, args: Dict[str, Any]) -> None:
        """A point in time (e.g. a gradient bucket launched)."""
        self.add(Event(name, cat, perf_ns(), -1, args))

    def innermost(self) -> str:
        """The name of the innermost open range ("" outside any)."""
        return self._stack[-1][0] if self._stack else ""

    # ------------------------------------------------------------------ ops and modules
    def op(self, make: Callable, op: Any, inputs: Tuple[Any, ...]) -> Any:
        """Run ``make(op, inputs)`` (the op's dispatch) as a timed "op" range."""
        t_in = perf_ns()
        args: Dict[str, Any] = {}
        if self.record_shapes:
            args["input_shapes"] = _shapes(inputs)
        cat = ev.OP
        self.open(type(op).__name__, cat, args)
        t0 = self._stack[-1][2]
        try:
            out = make(op, inputs)
        finally:
            t1 = self.close()
        data = out.cached_data  # args is the closed event's own dict: fill in the result
        if data is not None and hasattr(data, "dtype"):
            args["dtype"], args["device"] = str(data.dtype), str(data.device)
        if self._modules:
            out._prof_module = self._modules[-1]  # backward groups its ops under it
        self.ops += 1
        self.overhead_ns += (perf_ns() - t_in) - (t1 - t0)
        return out

    def backward(self, op: Any, out_grad: Any, node: Any) -> Any:
        """Run ``op.gradient`` as a "backward" range named after the op, under its module."""
        t_in = perf_ns()
        args = {"module": getattr(node, "_prof_module", "")}
        self.open(type(op).__name__ + "Backward", ev.BACKWARD, args)
        t0 = self._stack[-1][2]
        try:
            return op.gradient(out_grad, node)
        finally:
            t1 = self.close()
            self.overhead_ns += (perf_ns() - t_in) - (t1 - t0)

    def module(self, module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Run ``module.forward`` as a "module" range named by its path in the root module."""
        t_in = perf_ns()
        path = self._enter_module(module)
        self.open(path, ev.MODULE, {"module": path})
        t0 = self._stack[-1][2]
        try:
            return module.forward(*args, **kwargs)
        finally:
            t1 = self.close()
            self._modules.pop()
            if not self._modules:
                self._module_names.pop()
            self.overhead_ns += (perf_ns() - t_in) - (t1 - t0)

    def _enter_module(self, module: Any) -> str:
        """The module's display path ("layers.0 (Linear)"); the outermost call names the rest."""
        cls = type(module).__name__
        if not self._modules:  # a root call: name its tree as named_modules() does
            self._module_names.append({id(m): n for n, m in module.named_modules()})
        name = self._module_names[-1].get(id(module), "")
        path = f"{name} ({cls})" if name else (cls if not self._modules
                                                 else f"{self._modules[-1]}/{cls}")
        self._modules.append(path)
        return path

    # ------------------------------------------------------------------ memory
    def alloc(self, device: str, nbytes: int) -> None:
        """A buffer of ``nbytes`` was allocated on ``device``; mark a new peak."""
        if not self.active:
            return
        ts = perf_ns()
        now = self.current_bytes.get(device, 0) + nbytes
        self.current_bytes[device] = now
        self.allocated += nbytes
        self.samples.append(MemorySample(ts, device, now))
        peak = self.peaks.get(device)
        if peak is None or now > peak.allocated:
            self.peaks[device] = Peak(device, now, ts, self.innermost())
        self.overhead_ns += perf_ns() - ts

    def free(self, device: str, nbytes: int) -> None:
        """A buffer allocated while recording was freed."""
        if not self.active:
            return
        ts = perf_ns()
        now = self.current_bytes.get(device, 0) - nbytes
        self.current_bytes[device] = now
        self.freed += nbytes
        self.samples.append(MemorySample(ts, device, now))
        self.overhead_ns += perf_ns() - ts

    # ------------------------------------------------------------------ kernels, messages
    def kernel(self, launch: Callable, k: Any, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any], index: int, emulated: bool) -> None:
        """Run ``launch(k, grid, block, args, index)`` timed, as a "kernel" event."""
        t0 = perf_ns()
        launch(k, grid, block, args, index)
        t1 = perf_ns()
        info = {"grid": tuple(grid), "block": tuple(block), "device": f"cuda:{index}",
                "emulated": emulated, "op": self.innermost(),
                "time": "run on the CPU emulator" if emulated else "host launch (asynchronous)"}
        self.add(Event(getattr(k, "name", type(k).__name__), ev.KERNEL, t0, t1 - t0, info))

    def comm(self, record: Sequence[Any]) -> None:
        """A finished ledger record (name, algorithm, label, sent, received, messages, seconds,
        peer) as a "comm" event ending now."""
        t1 = perf_ns()
        dur = int(record[6] * 1e9)
        args = {"algorithm": record[1], "label": record[2], "bytes_sent": int(record[3]),
                "bytes_recv": int(record[4]), "messages": int(record[5]),
                "peer": record[7] if len(record) > 7 else None, "during": self.innermost()}
        self.add(Event(record[0], ev.COMM, t1 - dur, dur, args))
