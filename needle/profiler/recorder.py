"""The recorder: one per profiled thread, fed by the hooks (``hooks.py``) while it is active.

Recording is the hot path, so it only logs raw fields and builds nothing: an op extends a flat
list by ``op name, start ns, end ns, input shapes, module, dtype, device, bookkeeping end ns``,
a gradient or a module call likewise, an allocation by ``ns, device, +bytes`` and its release
by ``ns, device, -bytes``. No dicts, strings, events or stack lookups per op: names, argument
dicts, bytes per event, memory peaks and which op launched a kernel are all worked out from the
raw logs when the recording is asked for (``build.py``). torch.profiler does the same (its C++
recorder keeps raw records and builds ``FunctionEvent`` objects afterwards).

The logs are flat lists of numbers and strings, and input shapes are interned (a training loop
repeats them), so recording leaves nothing behind for Python's garbage collector to scan: a
tuple per op would be, and collecting them cost more than the recording itself.

What is still tracked as it happens: the module ops are attributed to (``_mod``), kept as one
attribute so that a gradient can name its forward op's module, and a stack of the named ranges
open now (``record_function``, steps, data loading, optimizer steps, compiled programs), which
``close_through`` needs. Ops, gradients and module calls nest by construction (each ends before
its caller), so their nesting is rebuilt from the times.

The virtual cluster runs one rank per thread of one process, so recorders are looked up by
thread (``current()``): each rank's events go to its own recorder.
"""
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .build import build_record
from .events import GRAD_FIELDS, MODULE_FIELDS, OP_FIELDS, RankRecord

perf_ns = time.perf_counter_ns
_BY_THREAD: Dict[int, "ThreadRecorder"] = {}
_lookup = _BY_THREAD.get
_MEMORY_BY_THREAD: Dict[int, "ThreadRecorder"] = {}  # those of them recording memory
_memory_lookup = _MEMORY_BY_THREAD.get
_ident = threading.get_ident
_weakref = weakref.ref


def current() -> Optional["ThreadRecorder"]:
    """The recorder of the calling thread, None when it is not being profiled."""
    return _lookup(_ident())


def _shapes(inputs: Sequence[Any]) -> Tuple[Any, ...]:
    """Input shapes, without computing lazy inputs (an unrealised one shows as None)."""
    return tuple(getattr(getattr(x, "cached_data", None), "shape", None) for x in inputs)


class ThreadRecorder:
    """Raw logs of one thread's ops, gradients, module calls, ranges and memory."""

    def __init__(self, record_shapes: bool = True, max_events: int = 2_000_000,
                 profile_memory: bool = True) -> None:
        self.thread = threading.get_ident()
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.max_events = max_events       # per log (ops, gradients, modules, ranges, ...)
        self.op_cap = max_events * OP_FIELDS
        # flat: OP_FIELDS, GRAD_FIELDS, MODULE_FIELDS, MEMORY_FIELDS entries per record
        self.ops: List[Any] = []           # op name, t0, t1, shapes, module, dtype, device, t2
        self.grads: List[Any] = []         # op name, t0, t1, module, t2
        self.modules: List[Any] = []       # path, t0, t1, t2
        self.memory: List[Any] = []        # ns, device, +bytes allocated or -bytes freed
        self.shapes: Dict[tuple, tuple] = {}  # input shapes, interned
        self.ranges: List[tuple] = []      # (name, cat, t0, t1, args, module)
        self.kernels: List[tuple] = []     # (name, t0, t1, grid, block, device index, emulated)
        self.comms: List[tuple] = []       # (ledger record, t1)
        self.instants: List[tuple] = []    # (name, cat, ts, args)
        self.dropped = 0
        self.active = False
        self._mod: Optional[str] = None    # the module ops are attributed to now
        self._fwd: Optional[str] = None    # the module whose forward runs now
        self._stack: List[tuple] = []      # open ranges: (name, cat, t0, args)
        self._root: Any = None             # the outermost module being called
        self._paths: Dict[int, str] = {}   # id(module) -> display path, in ``_root``'s tree
        self._trees: Dict[int, Tuple[Any, Dict[int, str]]] = {}  # cached per root module
        self._fresh = False                # ``_paths`` worked out during this root call
        self._live: Dict[int, Tuple[Any, str, int]] = {}  # buffers allocated, still alive
        self._on_free = self._free_callback()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Receive this thread's hooks from now on."""
        self.active = True
        _BY_THREAD[self.thread] = self
        if self.profile_memory:
            _MEMORY_BY_THREAD[self.thread] = self

    def stop(self) -> None:
        """Receive nothing more; close ranges still open (their end is now)."""
        while self._stack:
            self.close()
        self.active = False
        for by_thread in (_BY_THREAD, _MEMORY_BY_THREAD):
            if by_thread.get(self.thread) is self:
                del by_thread[self.thread]
        self._live.clear()  # releases after the recording are not reported
        self._trees.clear()
        self._root = None

    def record(self, rank: int = 0, offset_ns: int = 0) -> RankRecord:
        """What was recorded, as one rank's ``RankRecord`` (built now, from the raw logs)."""
        return build_record(self, rank, offset_ns)

    def _keep(self, log: List[tuple], item: tuple) -> None:
        if len(log) < self.max_events:
            log.append(item)
        else:
            self.dropped += 1

    # ------------------------------------------------------------------ named ranges
    def open(self, name: str, cat: str, args: Optional[Dict[str, Any]] = None) -> None:
        """Start a range; it ends at the matching ``close``."""
        self._stack.append((name, cat, perf_ns(), args))

    def close(self) -> int:
        """End the innermost range; its end time (ns)."""
        name, cat, t0, args = self._stack.pop()
        t1 = perf_ns()
        self._keep(self.ranges, (name, cat, t0, t1, args, self._mod))
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
        self._keep(self.instants, (name, cat, perf_ns(), args))

    # ------------------------------------------------------------------ modules
    def module_path(self, module: Any, parent: Optional[str]) -> str:
        """The module's display path ("layers.0 (Linear)"); the outermost call names the rest
        as ``named_modules()`` does (each root's names are worked out once per recording)."""
        if parent is None:  # a root call
            tree = self._trees.get(id(module))
            self._fresh = tree is None or tree[0] is not module
            if tree is None or self._fresh:
                tree = self._trees[id(module)] = (module, _tree_paths(module))
            self._root, self._paths = module, tree[1]
        path = self._paths.get(id(module))
        if path is None and not self._fresh:  # added to the tree since: name it again (once
            self._fresh = True                # per root call, as named_modules() would)
            tree = self._trees[id(self._root)] = (self._root, _tree_paths(self._root))
            self._paths = tree[1]
            path = self._paths.get(id(module))
        return path if path is not None else f"{parent}/{type(module).__name__}"

    # ------------------------------------------------------------------ memory
    def _free_callback(self) -> Callable[[Any], None]:
        """The weakref callback logging a buffer's release (a closure: no cycle to self)."""
        live, memory = self._live, self.memory

        def freed(ref: Any) -> None:
            entry = live.pop(id(ref), None)
            if entry is not None:
                memory.extend((perf_ns(), entry[1], -entry[2]))
        return freed

    # ------------------------------------------------------------------ kernels, messages
    def kernel(self, launch: Callable, k: Any, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any], index: int, emulated: bool) -> None:
        """Run ``launch(k, grid, block, args, index)`` timed, as a "kernel" event."""
        t0 = perf_ns()
        launch(k, grid, block, args, index)
        t1 = perf_ns()
        self._keep(self.kernels, (getattr(k, "name", None) or type(k).__name__, t0, t1,
                                  tuple(grid), tuple(block), index, emulated))

    def comm(self, record: Sequence[Any]) -> None:
        """A finished ledger record (name, algorithm, label, sent, received, messages, seconds,
        peer) as a "comm" event ending now."""
        self._keep(self.comms, (tuple(record), perf_ns()))


def _tree_paths(root: Any) -> Dict[int, str]:
    """id(module) -> "name (Class)" for every module under ``root`` ("Class" for the root)."""
    return {id(m): f"{n} ({type(m).__name__})" if n else type(m).__name__
            for n, m in root.named_modules()}


# ---------------------------------------------------------------------- the hot path
# What ``switches.profiler.op/backward/module`` are while profiling (``hooks.Dispatch``):
# plain functions (one call each), this thread's recorder looked up by thread id.

def record_op(make: Callable, op: Any, inputs: Tuple[Any, ...]) -> Any:
    """Run ``make(op, inputs)`` (the op's dispatch), logged as a timed "op" event."""
    rec = _lookup(_ident())
    if rec is None:
        return make(op, inputs)
    t0 = perf_ns()
    out = make(op, inputs)
    t1 = perf_ns()
    mod = rec._mod
    if mod is not None:
        out._prof_module = mod  # backward groups its gradient under it
    data = out.cached_data
    ops = rec.ops
    if len(ops) < rec.op_cap:
        shapes = None
        if rec.record_shapes:
            try:  # most ops: one or two realised inputs, shapes interned (no garbage to scan)
                n = len(inputs)
                shapes = ((inputs[0].cached_data.shape, inputs[1].cached_data.shape) if n == 2
                          else (inputs[0].cached_data.shape,) if n == 1 else _shapes(inputs))
                shapes = rec.shapes.setdefault(shapes, shapes)
            except (AttributeError, TypeError):  # an unrealised input; an unhashable shape
                shapes = _shapes(inputs)
        ops += (type(op).__name__, t0, t1, shapes, mod, getattr(data, "dtype", None),
                getattr(data, "device", None), perf_ns())
    else:
        rec.dropped += 1
    return out


def record_backward(op: Any, out_grad: Any, node: Any) -> Any:
    """Run ``op.gradient``, logged as a "backward" range named after the op, its ops under the
    forward op's module."""
    rec = _lookup(_ident())
    if rec is None:
        return op.gradient(out_grad, node)
    mod = getattr(node, "_prof_module", "")
    prev = rec._mod
    if rec._fwd is None:  # (inside a module's forward, its ops stay that module's)
        rec._mod = mod
    t0 = perf_ns()
    try:
        return op.gradient(out_grad, node)
    finally:
        t1 = perf_ns()
        rec._mod = prev
        grads = rec.grads
        if len(grads) < rec.max_events * GRAD_FIELDS:
            grads += (type(op).__name__, t0, t1, mod, perf_ns())
        else:
            rec.dropped += 1


def record_module(module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Run ``module.forward``, logged as a "module" range named by its path in the root."""
    rec = _lookup(_ident())
    if rec is None:
        return module.forward(*args, **kwargs)
    t_in = perf_ns()
    prev_mod, prev_fwd = rec._mod, rec._fwd
    path = rec._mod = rec._fwd = rec.module_path(module, prev_fwd)
    t0 = perf_ns()
    try:
        return module.forward(*args, **kwargs)
    finally:
        t1 = perf_ns()
        rec._mod, rec._fwd = prev_mod, prev_fwd
        modules = rec.modules
        if len(modules) < rec.max_events * MODULE_FIELDS:
            modules += (path, t0, t1, perf_ns() + (t0 - t_in))
        else:
            rec.dropped += 1


def alloc_hook(array: Any, device: str) -> Callable[[Any], None]:
    """The hook told of each new buffer of one backend (its ``Array`` class, ``device`` its
    name): logs ``ns, device, bytes`` to the allocating thread's recorder, and its release
    through a weakref callback. A GPU buffer knows its GPU ("cuda:1"). Only buffers of
    ``array`` are logged."""
    if hasattr(array, "device_index"):
        names: Dict[int, str] = {}

        def on_alloc(buf: Any) -> None:
            rec = _memory_lookup(_ident())
            if rec is None or not isinstance(buf, array):  # another backend's
                return
            index = buf.device_index
            name = names.get(index) or names.setdefault(index, f"{device}:{index}")
            nbytes = buf.array.nbytes
            rec.memory.extend((perf_ns(), name, nbytes))
            ref = _weakref(buf, rec._on_free)
            rec._live[id(ref)] = (ref, name, nbytes)
        return on_alloc

    def on_alloc_one_device(buf: Any) -> None:
        rec = _memory_lookup(_ident())
        if rec is None or not isinstance(buf, array):  # another backend's
            return
        nbytes = buf.array.nbytes
        rec.memory.extend((perf_ns(), device, nbytes))
        ref = _weakref(buf, rec._on_free)
        rec._live[id(ref)] = (ref, device, nbytes)
    return on_alloc_one_device
