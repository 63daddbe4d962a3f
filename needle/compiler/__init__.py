"""Graph compilation: ``needle.compile(fn)`` and ``with needle.lazy():``.

``compile(fn)`` turns a function of tensors (a forward pass, or a whole loss + ``backward``)
into a cached plan, in the way ``torch.compile`` or a CUDA graph does, in four steps:

1. **trace** (``capture.py``): call ``fn`` eagerly while recording every device primitive it
   runs: forward, backward, the masks gradients compute, the broadcast copies;
2. **check**: the trace must not have read tensor data into Python (then control flow may
   depend on it: the function runs eagerly from then on, or ``fallback=False`` raises), two
   recordings must agree (no fresh random numbers or counters baked in), and no array the
   function computed may stay referenced by something other than its results (state kept
   in Python, e.g. BatchNorm's running statistics, cannot be replayed);
3. **fuse** (``fusion.py``): maximal elementwise chains, and a chain feeding a reduction,
   become one ``fused_elementwise`` kernel each, so their intermediates are never written;
4. **replay** (``plan.py``): later calls with the same input shapes/dtypes/devices (the guard)
   run the plan on the new inputs, with no autograd graph and no Python op dispatch; a new
   shape compiles again (``compiles`` counts it; ``debug=True`` prints why).

Results behave as eager ones. A function that calls ``backward`` itself sets the ``.grad``
of the leaf tensors its backward reached, replay after replay, and returns results without a
graph. Otherwise, with grad mode on, results that require a gradient carry a graph: one node
whose gradient is a compiled backward plan (``autograd_node.py``), so ``compiled(x).backward()``
gives eager's gradients. ``compile(module)`` returns a ``CompiledModule``
(``compiled_module.py``), called like the module and trained like it.
``lazy()`` defers primitives instead and runs them, fused, when data is read or the block ends.
"""
import contextlib
import gc
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..autograd import Tensor, find_topo_sort, is_grad_enabled
from ..backend_ndarray import NDArray, cpu
from . import autograd_node
from .capture import DataDependentError, Recorder, Trace, alive_elsewhere
from .compiled_module import CompiledModule
from .plan import Plan
from .results import flatten as _flatten
from .results import graphless as _graphless
from .results import leaf_ref as _leaf_ref
from .results import meta as _meta
from .results import resolve as _resolve
from .results import source as _source
from .results import unflatten as _unflatten

__all__ = ["compile", "lazy", "CompiledFunction", "CompiledModule", "DataDependentError",
           "Plan"]

MAX_RECORDINGS = 3  # recordings that may disagree before a signature runs eagerly for good


class _Entry:
    """The cache entry of one input signature: recordings so far, then a plan (or eager)."""

    def __init__(self) -> None:
        self.plan: Optional[Plan] = None
        self.eager_reason: Optional[str] = None
        self.last: Optional[tuple] = None  # comparable form of the previous recording
        self.tries = 0
        self.roles: List[Tuple[str, int]] = []
        self.leaves: List[tuple] = []      # leaf tensors with grads, as _leaf_ref
        self.leaf_meta: List[tuple] = []
        self.outs: List[tuple] = []        # (shape, strides, offset) of each output NDArray
        self.states: List[tuple] = []      # (object, attribute) of tensors stored as state
        self.tree: Any = None
        self.n_results = 0
        self.compile_s = 0.0
        self.graph: Optional[autograd_node.GraphPlan] = None  # results carry a graph
        self.state_meta: List[tuple] = []
        self.attr_meta: List[tuple] = []   # ((object, name), meta) of attributes read
        self.states_seen: List[tuple] = []  # (object, name) the last recording replaced
        self.pre_owners: Dict[int, tuple] = {}


def _attribute_owners(arr: Any) -> Iterator[Tuple[Any, str, NDArray]]:
    """(object, attribute, NDArray) for each ``object.attribute`` Tensor whose data is ``arr``."""
    for nd in gc.get_referrers(arr):
        if type(nd) is not NDArray or nd._handle is not arr:
            continue
        for t in gc.get_referrers(nd):
            if not isinstance(t, Tensor) or t.cached_data is not nd:
                continue
            for d in gc.get_referrers(t):
                # Python 3.11+ may keep attributes inline: the referrer is then the object
                objs = [d] if type(d) is not dict else [
                    o for o in gc.get_referrers(d) if getattr(o, "__dict__", None) is d]
                for obj in objs:
                    attrs = getattr(obj, "__dict__", None)
                    if type(attrs) is not dict or isinstance(obj, type):
                        continue
                    for k, v in list(attrs.items()):
                        if v is t:
                            yield obj, k, nd


class CompiledFunction:
    """``fn`` with a plan cache keyed by its arguments' shapes, dtypes and devices."""

    def __init__(self, fn: Callable, fusion: bool = True, fallback: bool = True,
                 debug: bool = False, guard: Optional[Callable[[], Any]] = None) -> None:
        self.fn = fn
        self.guard = guard  # () -> extra state the plan depends on (a module's modes)
        self.fusion = fusion
        self.fallback = fallback
        self.debug = debug
        self.cache: Dict[tuple, _Entry] = {}
        self.compiles = 0   # plans built (a new signature, or a guard that failed)
        self.recordings = 0
        self.replays = 0
        self.eager_calls = 0
        self._last_key: Optional[tuple] = None

    # ------------------------------------------------------------------ guards
    def key(self, args: tuple) -> tuple:
        """The guard: shape, strides, dtype and device of each tensor argument, else its value;
        grad mode (results carry a graph only with it on), and ``guard()`` when given."""
        out = []
        for a in args:
            if isinstance(a, Tensor):
                d = a.realize_cached_data()
                out.append(("T", _meta(d), repr(d.device), a.requires_grad))
            else:
                try:
                    hash(a)
                    out.append(("V", type(a).__name__, a))
                except TypeError:
                    out.append(("id", id(a)))
        out.append(("grad", is_grad_enabled()))
        if self.guard is not None:
            out.append(("guard", self.guard()))
        return tuple(out)

    def _say(self, msg: str) -> None:
        if self.debug:
            print(f"[needle.compile {getattr(self.fn, '__name__', 'fn')}] {msg}")

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any) -> Any:
        key = self.key(args)
        entry = self.cache.get(key)
        if entry is None:
            entry = self.cache[key] = _Entry()
            if self._last_key is not None:
                self._say(f"new signature, tracing: {self._diff(key)}")
        self._last_key = key
        if entry.eager_reason is not None:
            self.eager_calls += 1
            return self.fn(*args)
        if entry.plan is not None:
            leaves = [_resolve(r, args) for r in entry.leaves]
            changed = [i for i, (t, m) in enumerate(zip(leaves, entry.leaf_meta))
                       if _meta(t.realize_cached_data()) != m]
            changed += [f"{type(o).__name__}.{k}" for (o, k), m in entry.attr_meta
                        if _meta(getattr(o, k).realize_cached_data()) != m]
            if not changed:
                return self._replay(entry, args)
            self._say(f"guard failed: leaf or attribute tensor(s) {changed} changed "
                      f"shape/dtype/layout; tracing again")
            self.cache[key] = entry = _Entry()
        return self._record(entry, args)

    def _diff(self, key: tuple) -> str:
        old = self._last_key
        parts = [f"arg{i}: {o[1][:1] if o[0] == 'T' else o} -> {n[1][:1] if n[0] == 'T' else n}"
                 if o[0] not in ("grad", "guard") else f"{o[0]}: {o[1]} -> {n[1]}"
                 for i, (o, n) in enumerate(zip(old, key)) if o != n]
        return "; ".join(parts) or f"{len(old)} -> {len(key)} arguments"

    def _device(self, args: tuple) -> Any:
        devs = {a.device for a in args if isinstance(a, Tensor)}
        return devs.pop() if len(devs) == 1 else (cpu() if not devs else None)

    def _record(self, entry: _Entry, args: tuple) -> Any:
        device = self._device(args)
        if device is None:
            entry.eager_reason = "tensor arguments on several devices"
            return self.fn(*args)
        self.recordings += 1
        # tensors that earlier recordings saw the function replace on objects (state, such
        # as BatchNorm's running mean): this call reads their current values
        entry.pre_owners = {id(getattr(o, k).realize_cached_data()._handle): ("attr", (o, k))
                            for o, k in entry.states_seen
                            if isinstance(getattr(o, k, None), Tensor)}
        rec = Recorder(device, execute=True)
        with rec:
            box = [self.fn(*args)]  # a list, so that a callee can drop the graph it holds
        if autograd_node.wants_graph(box[0], rec.trace):
            return autograd_node.record(self, entry, args, box, rec.trace, device)
        result = box.pop()
        trace = rec.trace
        tensors: List[Tensor] = []
        tree = _flatten(result, tensors)
        leaves = [n for n in find_topo_sort(tensors) if n.op is None and n.requires_grad
                  and n.grad is not None]
        for leaf in leaves:  # gradients as constants: what a replay returns too
            leaf.grad = Tensor.make_const(leaf.grad.realize_cached_data())
        outs = [t.realize_cached_data() for t in tensors] + \
            [leaf.grad.realize_cached_data() for leaf in leaves]
        detached = [t if t.op is None or not t.requires_grad else _graphless(d)
                    for t, d in zip(tensors, outs)]
        value = _unflatten(tree, detached)
        del result, tensors
        if trace.data_read is not None:
            self._data_dependent(entry, trace)
            return value
        problem, states = self._check_arrays(
            trace, [trace.index_of(o._handle) for o in outs])
        entry.states_seen = [(o, k) for o, k, _ in states]
        if problem is not None:
            self._retry(entry, problem)
            return value
        roles = self._roles(trace, args, leaves, entry.pre_owners)
        refs = [_leaf_ref(x, args) for x in leaves]
        comparable = (trace.signature(), tuple(roles),
                      tuple(r if r[0] == "arg" else id(r[1]) for r in refs),
                      tuple(_meta(o) for o in outs),
                      tuple((id(o), k, _meta(d)) for o, k, d in states))
        if not self._same_as_last(entry, comparable):
            return value
        t0 = time.perf_counter()
        outs = outs + [d for _, _, d in states]
        for o in outs:
            trace.buffer(o._handle)
        out_bufs = [trace.index_of(o._handle) for o in outs]
        in_bufs = [b for b, _ in roles]
        plan = Plan(trace, device, in_bufs, out_bufs, fusion=self.fusion)
        entry.plan, entry.roles = plan, roles
        entry.attr_meta = self._attr_meta(roles)
        entry.leaves = refs
        entry.leaf_meta = [_meta(x.realize_cached_data()) for x in leaves]
        entry.outs = [(o.shape, o.strides, o.offset) for o in outs]
        entry.states = [(o, k) for o, k, _ in states]
        entry.tree, entry.n_results = tree, len(outs) - len(leaves) - len(states)
        entry.compile_s = time.perf_counter() - t0
        self.compiles += 1
        self._say(f"compiled in {entry.compile_s * 1e3:.0f} ms: {plan.stats()}")
        return value

    @staticmethod
    def _attr_meta(roles: List[Tuple[int, tuple]]) -> List[tuple]:
        """((object, name), meta) of each attribute tensor read: part of the guard."""
        return [(r[1], _meta(getattr(*r[1]).realize_cached_data()))
                for _, r in roles if r[0] == "attr"]

    def _data_dependent(self, entry: _Entry, trace: Trace) -> None:
        """The function read data into Python: run it eagerly from now on, or raise."""
        msg = (f"needle.compile: {getattr(self.fn, '__name__', 'fn')} reads tensor "
               f"data in Python at {trace.data_read} (e.g. .numpy(), .item(), "
               f"a comparison used in an if): its control flow may depend on the "
               f"data, so it cannot be compiled")
        if not self.fallback:
            raise DataDependentError(msg)
        entry.eager_reason = msg
        self._say(msg + "; running eagerly")

    def _retry(self, entry: _Entry, problem: str) -> None:
        """A recording that cannot be compiled: record again, or give up after a few."""
        self._say(problem)
        entry.tries += 1
        if entry.tries >= MAX_RECORDINGS:
            entry.eager_reason = problem
            self._say("giving up: running eagerly")

    def _same_as_last(self, entry: _Entry, comparable: tuple) -> bool:
        """True when this recording equals the previous one (then the plan can be built)."""
        if entry.last == comparable:
            return True
        if entry.last is not None:
            entry.tries += 1
            self._say("two recordings differ (a random draw, a counter or a "
                      "Python-side value changed between calls); recording again")
            if entry.tries >= MAX_RECORDINGS:
                entry.eager_reason = "recordings keep differing"
        entry.last = comparable
        return False

    def _check_arrays(self, trace: Trace, keep: List[Optional[int]],
                      others: Tuple[Trace, ...] = ()) -> Tuple[Optional[str], list]:
        """(problem or None, state): ``state`` lists the (object, attribute, NDArray) of
        tensors the function stored on objects (``self.probs = ...``): a replay stores the
        new values there too. Any other array still referenced (besides ``keep`` and the
        ``others`` traces) is a problem."""
        keep = [k for k in keep if k is not None]
        escaped = alive_elsewhere(trace, keep, others)
        if escaped:
            gc.collect()
            escaped = alive_elsewhere(trace, keep, others)
        states = []
        for b in escaped:
            owners = list(_attribute_owners(trace.arrays[b]))
            if not owners:
                return (f"an array computed inside the function (%{b}) is still referenced "
                        f"after it returned, not as an object's tensor attribute (a cache? "
                        f"a list?), so a replay could not update it"), []
            states += owners
        return None, states

    @staticmethod
    def _owners(args: tuple, leaves: List[Tensor]) -> Dict[int, tuple]:
        """id(buffer) -> ("arg", k) or ("leaf", j) for the arguments' and leaves' buffers."""
        owners: Dict[int, tuple] = {}
        for j, leaf in reversed(list(enumerate(leaves))):
            owners[id(leaf.realize_cached_data()._handle)] = ("leaf", j)
        for k, a in reversed(list(enumerate(args))):
            if isinstance(a, Tensor):
                owners[id(a.realize_cached_data()._handle)] = ("arg", k)
        return owners

    @classmethod
    def _roles(cls, trace: Trace, args: tuple, leaves: List[Tensor], pre: Dict[int, tuple]
               ) -> List[Tuple[int, tuple]]:
        """For each buffer read from outside the trace: (buffer, where it comes from)."""
        owners = dict(pre)
        owners.update(cls._owners(args, leaves))
        roles = []
        for b, arr in enumerate(trace.arrays):
            if trace.internal[b]:
                continue
            if id(arr) in owners:
                roles.append((b, owners[id(arr)]))
                continue
            for obj, name, _ in _attribute_owners(arr):
                roles.append((b, ("attr", (obj, name))))
                break
        return roles

    def _replay(self, entry: _Entry, args: tuple) -> Any:
        self.replays += 1
        if entry.graph is not None:
            return autograd_node.replay(self, entry, args)
        leaves = [_resolve(r, args) for r in entry.leaves]
        inputs = [_source(r, args, leaves).realize_cached_data()._handle for _, r in entry.roles]
        arrays = entry.plan.run(inputs)
        device = entry.plan.device
        datas = [NDArray.make(shape, strides=strides, device=device, handle=h, offset=off)
                 for h, (shape, strides, off) in zip(arrays, entry.outs)]
        n = entry.n_results
        for ref, d in zip(entry.leaves, datas[n:n + len(entry.leaves)]):
            _resolve(ref, args).grad = Tensor.make_const(d)
        for (obj, name), d in zip(entry.states, datas[n + len(entry.leaves):]):
            setattr(obj, name, Tensor.make_const(d))
        return _unflatten(entry.tree, [_graphless(d) for d in datas[:n]])

    # ------------------------------------------------------------------ reporting
    def plan(self, *args: Any) -> Optional[Plan]:
        """The plan for ``args``'s signature (the last one called when omitted), if built."""
        key = self.key(args) if args else self._last_key
        entry = self.cache.get(key)
        return entry.plan if entry is not None else None

    def explain(self, *args: Any, limit: Optional[int] = None) -> str:
        """The traced tape before fusion and the kernels after, for a signature."""
        key = self.key(args) if args else self._last_key
        entry = self.cache.get(key)
        if entry is None:
            return "not traced yet: call the compiled function first"
        if entry.eager_reason is not None:
            return f"runs eagerly: {entry.eager_reason}"
        if entry.plan is None:
            return "recorded once; the plan is built on the next call with this signature"
        if entry.graph is not None:
            return autograd_node.explain(entry, limit=limit)
        return entry.plan.explain(limit=limit)

    def compile_seconds(self) -> float:
        """Seconds spent building plans (fusion, buffers, kernel lookup), all signatures."""
        return sum(e.compile_s for e in self.cache.values())


def compile(fn: Optional[Callable] = None, *, fusion: bool = True, fallback: bool = True,
            debug: bool = False) -> Any:
    """Compile ``fn`` (also usable as ``@compile`` or ``@compile(debug=True)``); see module doc.

    A module (anything with ``parameters``, ``modules`` and ``train``) gives a
    ``CompiledModule``: called like the module, trained like it."""
    if fn is None:
        return lambda f: compile(f, fusion=fusion, fallback=fallback, debug=debug)

    def make(f: Callable, guard: Optional[Callable[[], Any]] = None) -> CompiledFunction:
        return CompiledFunction(f, fusion=fusion, fallback=fallback, debug=debug, guard=guard)
    if all(hasattr(fn, a) for a in ("parameters", "modules", "train")):
        return CompiledModule(fn, make)
    return make(fn)


class _Lazy:
    """The state of one ``lazy()`` block: the queue of primitives and the plans it ran."""

    def __init__(self, device: Any, fusion: bool) -> None:
        self.device = device
        self.fusion = fusion
        self.plans: List[Plan] = []
        self.recorder = Recorder(device, execute=False, on_read=self.flush)

    def flush(self) -> None:
        """Run the queued primitives, fused, in place."""
        trace = self.recorder.trace
        if not trace.steps:
            return
        self.recorder.trace = Trace()
        keep = alive_elsewhere(trace, [])
        plan = Plan(trace, self.device, [], keep, fusion=self.fusion, in_place=True,
                    lookup=self.recorder.original)
        plan.run([])
        self.plans.append(plan)

    def explain(self, limit: Optional[int] = None) -> str:
        """Every flushed plan's dump."""
        return "\n".join(p.explain(limit=limit) for p in self.plans) or "nothing ran"


@contextlib.contextmanager
def lazy(device: Any = None, fusion: bool = True) -> Iterator[_Lazy]:
    """Defer the device's primitives in this block; run them fused on a read or at the end."""
    state = _Lazy(device if device is not None else cpu(), fusion)
    with state.recorder:
        try:
            yield state
        finally:
            state.flush()
