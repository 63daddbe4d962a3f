"""``CompiledFunction``: a function with a program cache keyed by its arguments' signature."""
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..autograd import Tensor, find_topo_sort, is_grad_enabled
from ..backend_ndarray import NDArray, cpu
from . import autograd_node, checks
from .capture import DataDependentError, Recorder, Trace
from .compiled_module import CompiledModule
from .graph_mode import GraphReplay
from .replay import Program
from .results import flatten, graphless, leaf_ref, meta, resolve, source, unflatten, unpack

MAX_RECORDINGS = 3  # recordings that may disagree before a signature runs eagerly for good
# "reduce-overhead" (PyTorch's name): a program on a CUDA device replayed as one CUDA graph
MODES = ("default", "reduce-overhead")
_CHANGED = object()  # _replay_graph: a leaf's layout changed (the full guard runs)


class _Entry:
    """The cache entry of one input signature: recordings so far, then a program (or eager)."""

    def __init__(self) -> None:
        self.program: Optional[Program] = None
        self.eager_reason: Optional[str] = None
        self.last: Optional[tuple] = None  # comparable form of the previous recording
        self.tries = 0
        self.roles: List[checks.Role] = []
        self.leaves: List[tuple] = []      # leaf tensors with grads, as leaf_ref
        self.leaf_meta: List[tuple] = []
        self.outs: List[tuple] = []        # (shape, strides, offset) of each output NDArray
        self.states: List[tuple] = []      # (object, attribute) of tensors stored as state
        self.tree: Any = None
        self.n_results = 0
        self.compile_s = 0.0
        self.graph: Optional[autograd_node.GraphProgram] = None  # results carry a graph
        self.cuda_graph: Optional[GraphReplay] = None  # mode="reduce-overhead"
        self.last_leaf_datas: List[Any] = []  # the leaves' arrays at the last graph replay
        self.graph_results: Optional[tuple] = None  # (arrays, grads, states, result)
        self.state_meta: List[tuple] = []
        self.attr_meta: List[tuple] = []   # ((object, name), meta) of attributes read
        self.states_seen: List[tuple] = []  # (object, name) the last recording replaced
        self.pre_owners: Dict[int, tuple] = {}


class _Recording(NamedTuple):
    """What one recording call produced: its trace, results and leaves with gradients."""

    trace: Trace
    tree: Any             # the result's structure (results.flatten)
    leaves: List[Tensor]  # leaf tensors whose .grad the call set
    outs: List[NDArray]   # result arrays, then the leaves' gradients
    value: Any            # what this call returns


class CompiledFunction:
    """``fn`` with a program cache keyed by its arguments' shapes, dtypes and devices."""

    def __init__(self, fn: Callable, fusion: bool = True, fallback: bool = True,
                 debug: bool = False, guard: Optional[Callable[[], Any]] = None,
                 mode: str = "default") -> None:
        if mode not in MODES:
            raise ValueError(f"needle.compile: mode={mode!r}; expected one of {MODES}")
        self.fn = fn
        self.mode = mode
        self.guard = guard  # () -> extra state the program depends on (a module's modes)
        self.fusion = fusion
        self.fallback = fallback
        self.debug = debug
        self.cache: Dict[tuple, _Entry] = {}
        self.compiles = 0   # programs built (a new signature, or a guard that failed)
        self.recordings = 0
        self.replays = 0
        self.eager_calls = 0
        self._last_key: Optional[tuple] = None

    # ------------------------------------------------------------------ guards
    def key(self, args: tuple) -> tuple:
        """The guard: shape, strides, dtype and device of each tensor argument, else its value;
        grad mode (results carry a graph only with it on), and ``guard()`` when given."""
        out: List[tuple] = []
        for a in args:
            if isinstance(a, Tensor):
                d = a.realize_cached_data()
                out.append(("T", meta(d), repr(d.device), a.requires_grad))
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
        if entry.program is not None:
            gm = entry.cuda_graph
            if gm is not None and gm.reason is None and gm.graph is not None:
                fast = self._replay_graph(entry, gm, args)
                if fast is not _CHANGED:
                    return fast
            changed = self._changed(entry, args)
            if not changed:
                return self._replay(entry, args)
            self._say(f"guard failed: leaf or attribute tensor(s) {changed} changed "
                      f"shape/dtype/layout; tracing again")
            self.cache[key] = entry = _Entry()
        return self._record(entry, args)

    @staticmethod
    def _changed(entry: _Entry, args: tuple) -> list:
        """Leaves (by index) and attributes (by name) whose layout the program did not see."""
        leaves = [resolve(r, args) for r in entry.leaves]
        changed: list = [i for i, (t, m) in enumerate(zip(leaves, entry.leaf_meta))
                         if meta(t.realize_cached_data()) != m]
        changed += [f"{type(o).__name__}.{k}" for (o, k), m in entry.attr_meta
                    if meta(getattr(o, k).realize_cached_data()) != m]
        return changed

    def _diff(self, key: tuple) -> str:
        old = self._last_key
        parts = [f"arg{i}: {o[1][:1] if o[0] == 'T' else o} -> {n[1][:1] if n[0] == 'T' else n}"
                 if o[0] not in ("grad", "guard") else f"{o[0]}: {o[1]} -> {n[1]}"
                 for i, (o, n) in enumerate(zip(old, key)) if o != n]
        return "; ".join(parts) or f"{len(old)} -> {len(key)} arguments"

    def _device(self, args: tuple) -> Any:
        devs = {a.device for a in args if isinstance(a, Tensor)}
        return devs.pop() if len(devs) == 1 else (cpu() if not devs else None)

    # ------------------------------------------------------------------ recording
    def _record(self, entry: _Entry, args: tuple) -> Any:
        """Run ``fn`` eagerly under a recorder; build a program once a recording can be replayed."""
        device = self._device(args)
        if device is None:
            entry.eager_reason = "tensor arguments on several devices"
            return self.fn(*args)
        trace, box = self._trace(entry, args, device)
        if autograd_node.wants_graph(box[0], trace):
            return autograd_node.record(self, entry, args, box, trace, device)
        rec = self._collect(trace, box.pop())
        checked = self._check(entry, rec, args)
        if checked is not None:
            self._build(entry, rec, device, *checked)
        return rec.value

    def _trace(self, entry: _Entry, args: tuple, device: Any) -> Tuple[Trace, list]:
        """Step 1: call ``fn`` under a Recorder; (trace, [result])."""
        self.recordings += 1
        # tensors that earlier recordings saw the function replace on objects (state, such
        # as BatchNorm's running mean): this call reads their current values
        entry.pre_owners = {id(getattr(o, k).realize_cached_data()._handle): ("attr", (o, k))
                            for o, k in entry.states_seen
                            if isinstance(getattr(o, k, None), Tensor)}
        rec = Recorder(device, execute=True)
        with rec:
            box = [self.fn(*args)]  # a list, so that a callee can drop the graph it holds
        return rec.trace, box

    @staticmethod
    def _collect(trace: Trace, result: Any) -> _Recording:
        """The recording's results and leaf gradients, as constants (what a replay gives)."""
        tensors: List[Tensor] = []
        tree = flatten(result, tensors)
        leaves = [n for n in find_topo_sort(tensors) if isinstance(n, Tensor) and n.op is None
                  and n.requires_grad and n.grad is not None]
        for leaf in leaves:  # gradients as constants: what a replay returns too
            leaf.grad = Tensor.make_const(leaf.grad.realize_cached_data())
        outs = [t.realize_cached_data() for t in tensors] + \
            [leaf.grad.realize_cached_data() for leaf in leaves]
        detached = [t if t.op is None or not t.requires_grad else graphless(d)
                    for t, d in zip(tensors, outs)]
        return _Recording(trace, tree, leaves, outs, unflatten(tree, detached))

    def _check(self, entry: _Entry, rec: _Recording, args: tuple
               ) -> Optional[Tuple[List[checks.Role], List[tuple], list]]:
        """Step 2: (roles, leaf refs, state) when the recording can become a program, else None
        (the function read data, an array escaped, or this recording differs from the last)."""
        trace = rec.trace
        if trace.data_read is not None:
            self._data_dependent(entry, trace)
            return None
        problem, states = checks.check_arrays(
            trace, [trace.index_of(o._handle) for o in rec.outs])
        entry.states_seen = [(o, k) for o, k, _ in states]
        if problem is not None:
            self._retry(entry, problem)
            return None
        roles = checks.roles(trace, args, rec.leaves, entry.pre_owners)
        refs = [leaf_ref(x, args) for x in rec.leaves]
        comparable = (trace.signature(), tuple(roles),
                      tuple(r if r[0] == "arg" else id(r[1]) for r in refs),
                      tuple(meta(o) for o in rec.outs),
                      tuple((id(o), k, meta(d)) for o, k, d in states))
        if not self._same_as_last(entry, comparable):
            return None
        return roles, refs, states

    def _build(self, entry: _Entry, rec: _Recording, device: Any,
               roles: List[checks.Role], refs: List[tuple], states: list) -> None:
        """Step 3: the program (fusion, buffers, kernels), and what a replay needs to bind."""
        t0 = time.perf_counter()
        trace = rec.trace
        outs = rec.outs + [d for _, _, d in states]
        for o in outs:
            trace.buffer(o._handle)
        out_bufs = [trace.index_of(o._handle) for o in outs]
        program = Program(trace, device, [b for b, _ in roles], out_bufs, fusion=self.fusion)
        entry.program, entry.roles = program, roles
        entry.attr_meta = checks.attr_meta(roles)
        entry.leaves = refs
        entry.leaf_meta = [meta(x.realize_cached_data()) for x in rec.leaves]
        entry.outs = [(o.shape, o.strides, o.offset) for o in outs]
        entry.states = [(o, k) for o, k, _ in states]
        entry.tree = rec.tree
        entry.n_results = len(outs) - len(rec.leaves) - len(states)
        if self.mode == "reduce-overhead":
            per_call = [r[0] == "arg" or (r[0] == "leaf" and refs[r[1]][0] == "arg")
                        for _, r in roles]
            first = len(rec.outs)  # states follow the results and the leaves' gradients
            state = [(k, first + j) for j, (o, name, _) in enumerate(states)
                     for k, (_, r) in enumerate(roles) if r == ("attr", (o, name))]
            entry.cuda_graph = GraphReplay(program, per_call, state)
        entry.compile_s = time.perf_counter() - t0
        self.compiles += 1
        self._say(f"compiled in {entry.compile_s * 1e3:.0f} ms: {program.stats()}")

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
        """True when this recording equals the previous one (then the program can be built)."""
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

    # ------------------------------------------------------------------ replaying
    def _replay_graph(self, entry: _Entry, gm: GraphReplay, args: tuple) -> Any:
        """A replay as one CUDA graph launch, with the least Python around it: leaves and
        inputs read inline, the guard on leaves reduced to identity (a leaf's array unchanged
        since the last call cannot have a new layout), and the results' tensors made once
        per capture (their buffers are the graph's: the same every call). ``_CHANGED`` when
        a leaf's array changed: the full guard decides."""
        leaves = [args[r[1]] if r[0] == "arg" else r[1] for r in entry.leaves]
        datas = [t.cached_data if t.cached_data is not None else t.realize_cached_data()
                 for t in leaves]
        last = entry.last_leaf_datas
        if len(last) != len(datas) or any(a is not b for a, b in zip(datas, last)):
            if self._changed(entry, args):
                return _CHANGED
            entry.last_leaf_datas = datas
        inputs = []
        for _, (kind, j) in entry.roles:
            t = args[j] if kind == "arg" else leaves[j] if kind == "leaf" else getattr(*j)
            d = t.cached_data if t.cached_data is not None else t.realize_cached_data()
            inputs.append(d._handle)
        self.replays += 1
        arrays = gm.run(inputs)
        wrapped = entry.graph_results
        if wrapped is None or wrapped[0] is not arrays:  # the first replay of this capture
            wrapped = entry.graph_results = (arrays, *self._wrap(entry, arrays))
        _, grads, states, result = wrapped
        for leaf, g in zip(leaves, grads):  # (inline, as _replay's: this is the hot path)
            leaf.grad = g
        for (obj, name), s in zip(entry.states, states):
            setattr(obj, name, s)
        return result

    def _wrap(self, entry: _Entry, arrays: List[Any]) -> Tuple[list, list, Any]:
        """(leaf gradients, states, the result) as tensors around a replay's output arrays."""
        datas = unpack(arrays, entry.outs, entry.program.device)
        n, k = entry.n_results, len(entry.leaves)
        return ([Tensor.make_const(d) for d in datas[n:n + k]],
                [Tensor.make_const(d) for d in datas[n + k:]],
                unflatten(entry.tree, [graphless(d) for d in datas[:n]]))

    def _replay(self, entry: _Entry, args: tuple) -> Any:
        self.replays += 1
        if entry.graph is not None:
            return autograd_node.replay(self, entry, args)
        leaves = [resolve(r, args) for r in entry.leaves]
        inputs = [source(r, args, leaves).realize_cached_data()._handle for _, r in entry.roles]
        gm = entry.cuda_graph
        arrays = gm.run(inputs) if gm is not None and gm.reason is None else \
            entry.program.run(inputs)
        grads, states, result = self._wrap(entry, arrays)
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        for (obj, name), s in zip(entry.states, states):
            setattr(obj, name, s)
        return result

    # ------------------------------------------------------------------ reporting
    def _entry(self, args: tuple) -> Optional[_Entry]:
        """The cache entry of ``args``'s signature (the last one called when omitted)."""
        return self.cache.get(self.key(args) if args else self._last_key)

    def program(self, *args: Any) -> Optional[Program]:
        """The program for ``args``'s signature (the last one called when omitted), if built."""
        entry = self._entry(args)
        return entry.program if entry is not None else None

    def explain(self, *args: Any, limit: Optional[int] = None) -> str:
        """The traced tape before fusion and the kernels after, for a signature."""
        entry = self._entry(args)
        if entry is None:
            return "not traced yet: call the compiled function first"
        if entry.eager_reason is not None:
            return f"runs eagerly: {entry.eager_reason}"
        if entry.program is None:
            return "recorded once; the program is built on the next call with this signature"
        if entry.graph is not None:
            return autograd_node.explain(entry, limit=limit)
        text = entry.program.explain(limit=limit)
        if entry.cuda_graph is not None:
            text = entry.cuda_graph.explain() + "\n" + text
        elif self.mode == "reduce-overhead":
            text = ("CUDA graph mode off (the results carry an autograd graph: backward() "
                    "runs outside the compiled function): plain replay\n" + text)
        return text

    def compile_seconds(self) -> float:
        """Seconds spent building programs (fusion, buffers, kernel lookup), all signatures."""
        return sum(e.compile_s for e in self.cache.values())


def compile(fn: Optional[Callable] = None, *, fusion: bool = True, fallback: bool = True,
            debug: bool = False, mode: str = "default") -> Any:
    """Compile ``fn`` (or ``@compile(debug=True)``); a module gives a ``CompiledModule``.
    ``mode="reduce-overhead"`` replays a program on a CUDA device as one CUDA graph
    (``graph_mode.py``: results are overwritten by the next call)."""
    if fn is None:
        return lambda f: compile(f, fusion=fusion, fallback=fallback, debug=debug, mode=mode)
    for flag, value in (("fusion", fusion), ("fallback", fallback), ("debug", debug)):
        if not isinstance(value, bool):  # fusion="no" is truthy: it would fuse
            raise TypeError(f"needle.compile: {flag} must be True or False, got {value!r}")
    if not callable(fn):
        raise TypeError(f"needle.compile: expected a function or a module, got "
                        f"{type(fn).__name__} {fn!r:.60}")

    def make(f: Callable, guard: Optional[Callable[[], Any]] = None) -> CompiledFunction:
        return CompiledFunction(f, fusion=fusion, fallback=fallback, debug=debug, guard=guard,
                                mode=mode)
    if all(hasattr(fn, a) for a in ("parameters", "modules", "train")):
        return CompiledModule(fn, make)
    return make(fn)
