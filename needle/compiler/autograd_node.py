"""Compiled results that carry a graph: the compiled forward is one autograd node.

AOTAutograd's split (Ansel et al., "PyTorch 2", ASPLOS 2024, sec. 4): trace the forward (F),
then the backward of its results (B). The forward program returns the results and the arrays of F
that B reads (fresh each call, so several graphs may be alive at once); the results hang from
one ``CompiledGraph`` node whose gradient runs the backward program, and the engine does the rest
(hooks, accumulation, upstream graphs). Its gradients are constants: no ``create_graph``.
"""
import contextlib
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from .. import ops
from ..autograd import (
    Tensor,
    TensorOp,
    TensorTuple,
    Value,
    compute_gradient_of_variables,
    find_topo_sort,
    is_grad_enabled,
    no_grad,
)
from ..backend_ndarray import NDArray, full
from . import checks
from .capture import Recorder, Trace
from .replay import Program
from .results import flatten, leaf_ref, meta, resolve, source, unflatten, unpack


class CompiledGraph(TensorOp):
    """The node of one compiled call; its gradient runs the (compiled) backward."""

    def __init__(self, backward: Callable[[List[Any]], List[NDArray]]) -> None:
        self.backward = backward  # [gradient handle per result] -> [NDArray per input]

    def compute(self, *args: NDArray) -> NDArray:
        raise RuntimeError("a compiled call's node is built with its data, never recomputed")

    def gradient(self, out_grad: Value, node: Value) -> Tuple[Tensor, ...]:
        data = out_grad.realize_cached_data()
        grads = list(data) if isinstance(data, tuple) else [data]
        # each gradient's buffer laid out compactly from its start (copied when it is not)
        return tuple(Tensor.make_const(g)
                     for g in self.backward([g.compact()._handle for g in grads]))


def node_outputs(op: CompiledGraph, inputs: Sequence[Tensor], datas: List[NDArray]
                 ) -> List[Tensor]:
    """The results of one compiled call: outputs of a node ``op(*inputs)`` holding ``datas``."""
    if len(datas) == 1:
        out = Tensor.__new__(Tensor)
        out._init(op, inputs, cached_data=datas[0], requires_grad=True)
        return [out]
    tup = TensorTuple.__new__(TensorTuple)
    tup._init(op, inputs, cached_data=tuple(datas), requires_grad=True)
    return [ops.tuple_get_item(tup, i) for i in range(len(datas))]


def wants_graph(result: Any, trace: Trace) -> bool:
    """True when grad is on, a result needs a gradient, and ``fn`` did not call ``backward``."""
    tensors: List[Tensor] = []
    flatten(result, tensors)
    if not is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    for node in find_topo_sort(tensors):
        g = node.grad if node.op is None else None
        if g is not None and trace.index_of(g.realize_cached_data()._handle) is not None:
            return False  # backward ran inside
    return True


@contextlib.contextmanager
def _args_as_leaves(args: tuple) -> Iterator[None]:
    """Tensor arguments that came out of a graph look like leaves for the block: the
    backward traced here stops at them (the engine continues upstream from the node)."""
    cut = [(a, a.op, a.inputs) for a in args if isinstance(a, Tensor) and a.op is not None]
    for a, _, _ in cut:
        a.op, a.inputs = None, ()
    try:
        yield
    finally:
        for a, op, inputs in cut:
            a.op, a.inputs = op, inputs


def trace_backward(device: Any, roots: List[Tensor], leaves: List[Tensor]
                   ) -> Tuple[Trace, List[Any], List[Optional[NDArray]]]:
    """(trace, gradient-input handles, leaf gradients) of ``roots``' backward, with ones as
    the roots' gradients; the leaves' ``.grad`` and hooks are left as they were."""
    gs = [full(r.shape, 1, dtype=r.dtype, device=device) for r in roots]
    root: Value
    g: Value
    if len(roots) == 1:
        root, g = roots[0], Tensor.make_const(gs[0])
    else:
        root, g = ops.make_tuple(*roots), TensorTuple.make_const(tuple(gs))
    kept = [(x.grad, x._hooks) for x in leaves]
    rec = Recorder(device)
    try:
        for x in leaves:  # no DDP hook may fire while tracing
            x.grad, x._hooks = None, None
        with rec, no_grad():
            compute_gradient_of_variables(root, g)
        grads = [None if x.grad is None else x.grad.realize_cached_data() for x in leaves]
    finally:
        for x, (grad, hooks) in zip(leaves, kept):
            x.grad, x._hooks = grad, hooks
    return rec.trace, [a._handle for a in gs], grads


def backward_problem(btrace: Trace) -> Optional[str]:
    """Why the traced backward cannot be replayed, or None."""
    if btrace.data_read is not None:
        return f"the backward reads tensor data in Python at {btrace.data_read}"
    for s in btrace.steps:
        if s.write >= 0 and not btrace.internal[s.write]:
            return f"the backward writes into an array it did not allocate ({s.name})"
    return None


class GraphProgram:
    """The compiled pair: forward program, backward program and how to feed and unpack them."""

    def __init__(self) -> None:
        self.forward: Optional[Program] = None
        self.backward: Optional[Program] = None
        self.f_roles: List[Tuple[int, tuple]] = []  # forward inputs: (buffer, (kind, j))
        self.b_roles: List[tuple] = []              # backward inputs after the gradients
        self.n_results = 0
        self.n_saved = 0
        self.diff: List[int] = []                   # results that are node outputs
        self.grad_meta: List[tuple] = []            # (shape, strides, offset) per gradient
        self.device: Any = None


def _backward_roles(btrace: Trace, g_handles: List[Any], ftrace: Trace, saved: List[int],
                    owners: dict) -> List[tuple]:
    """(buffer, role) for each array the backward reads from outside: ('g', i), ('saved', j),
    or the argument, leaf or attribute it belongs to; an array closed over gets none (the
    program keeps it as a constant)."""
    g_ids = {id(h): i for i, h in enumerate(g_handles)}
    saved_ids = {id(ftrace.arrays[b]): j for j, b in enumerate(saved)}
    roles = []
    for b, arr in enumerate(btrace.arrays):
        if btrace.internal[b]:
            continue
        if id(arr) in g_ids:
            roles.append((b, ("g", g_ids[id(arr)])))
        elif id(arr) in saved_ids:
            roles.append((b, ("saved", saved_ids[id(arr)])))
        elif id(arr) in owners:
            roles.append((b, owners[id(arr)]))
    return roles


def _results(tree: Any, datas: List[NDArray], diff: List[int], op: CompiledGraph,
             inputs: List[Tensor]) -> Any:
    """The call's value: node outputs for the differentiable results, constants otherwise."""
    outs = node_outputs(op, inputs, [datas[i] for i in diff])
    tensors = [Tensor.make_const(d) for d in datas]
    for i, t in zip(diff, outs):
        tensors[i] = t
    return unflatten(tree, tensors)


def record(cf: Any, entry: Any, args: tuple, box: list, ftrace: Trace, device: Any) -> Any:
    """A recording call of ``cf`` whose results need a graph; ``box`` holds the result."""
    tensors: List[Tensor] = []
    tree = flatten(box[0], tensors)
    if ftrace.data_read is not None:
        cf._data_dependent(entry, ftrace)
        return box.pop()
    if any(t.requires_grad and t.op is None for t in tensors):
        entry.eager_reason = "it returns a tensor argument or parameter unchanged"
        return box.pop()
    diff = [i for i, t in enumerate(tensors) if t.requires_grad]
    with _args_as_leaves(args):
        roots = [tensors[i] for i in diff]
        leaves = [n for n in find_topo_sort(roots)
                  if isinstance(n, Tensor) and n.op is None and n.requires_grad]
        btrace, g_handles, grads = trace_backward(device, roots, leaves)
    problem = backward_problem(btrace)
    if problem is not None:
        entry.eager_reason = problem
        cf._say(problem + "; running eagerly")
        return box.pop()
    leaves = [x for x, g in zip(leaves, grads) if g is not None]
    grads = [g for g in grads if g is not None]
    outs = [t.realize_cached_data() for t in tensors]
    del tensors, roots
    box.clear()  # drops the eager graph: what stays referenced must be saved or state
    for h in g_handles + [g._handle for g in grads]:
        btrace.buffer(h)
    for o in outs:
        ftrace.buffer(o._handle)
    saved = sorted({ftrace.index_of(a) for a in btrace.arrays} - {None})
    saved = [b for b in saved if ftrace.internal[b]]
    g_bufs = [btrace.index_of(h) for h in g_handles]
    grad_bufs = [btrace.index_of(g._handle) for g in grads]
    grad_meta = [(g.shape, g.strides, g.offset) for g in grads]
    keep = [ftrace.index_of(o._handle) for o in outs] + saved
    problem, states = checks.check_arrays(ftrace, keep, others=[btrace])
    entry.states_seen = [(o, k) for o, k, _ in states]
    # this call's backward: the traced one, this call's arrays as its constants
    now = Program(btrace, device, g_bufs, grad_bufs, fusion=False)
    value = _results(tree, outs, diff, CompiledGraph(
        lambda gs: unpack(now.run(gs), grad_meta, device)), leaves)
    if problem is not None:
        cf._retry(entry, problem)
        return value
    owners = checks.owners(args, leaves)
    f_roles = checks.roles(ftrace, args, leaves, entry.pre_owners)
    owners.update({id(ftrace.arrays[b]): r for b, r in f_roles if r[0] == "attr"})
    b_roles = [r for r in _backward_roles(btrace, g_handles, ftrace, saved, owners)
               if r[1][0] != "g"]  # the gradients come first, in order
    refs = [leaf_ref(x, args) for x in leaves]
    comparable = (ftrace.signature(), btrace.signature(), tuple(f_roles), tuple(b_roles),
                  tuple(r if r[0] == "arg" else id(r[1]) for r in refs),
                  tuple(meta(o) for o in outs), tuple(grad_meta), tuple(saved),
                  tuple((id(o), k, meta(d)) for o, k, d in states))
    if not cf._same_as_last(entry, comparable):
        return value
    gp = GraphProgram()
    gp.f_roles, gp.n_results, gp.n_saved, gp.diff = f_roles, len(outs), len(saved), diff
    gp.grad_meta, gp.device = grad_meta, device
    gp.b_roles = [r for _, r in b_roles]
    in_bufs = ([b for b, _ in f_roles], g_bufs + [b for b, _ in b_roles])
    _compile(cf, entry, gp, (ftrace, btrace), in_bufs, saved, grad_bufs, outs, states)
    entry.leaves, entry.tree = refs, tree
    entry.attr_meta = checks.attr_meta(f_roles + b_roles)
    entry.leaf_meta = [meta(x.realize_cached_data()) for x in leaves]
    return value


def _compile(cf: Any, entry: Any, gp: GraphProgram, traces: Tuple[Trace, Trace],
             in_bufs: Tuple[List[int], List[int]], saved: List[int], grad_bufs: List[int],
             outs: List[NDArray], states: list) -> None:
    """Build the forward and backward programs into ``gp`` and make ``entry`` replay them."""
    t0 = time.perf_counter()
    ftrace, btrace = traces
    out_arrays = [o._handle for o in outs] + [ftrace.arrays[b] for b in saved] + \
        [d._handle for _, _, d in states]
    gp.forward = Program(ftrace, gp.device, in_bufs[0],
                         [ftrace.index_of(h) for h in out_arrays], fusion=cf.fusion)
    gp.backward = Program(btrace, gp.forward.device, in_bufs[1], grad_bufs, fusion=cf.fusion)
    entry.program, entry.roles, entry.graph = gp.forward, gp.f_roles, gp
    entry.outs = [(o.shape, o.strides, o.offset) for o in outs]
    entry.states = [(o, k) for o, k, _ in states]
    entry.state_meta = [(d.shape, d.strides, d.offset) for _, _, d in states]
    entry.compile_s = time.perf_counter() - t0
    cf.compiles += 1
    cf._say(f"compiled in {entry.compile_s * 1e3:.0f} ms: forward {gp.forward.stats()}, "
            f"backward {gp.backward.stats()}")


def replay(cf: Any, entry: Any, args: tuple) -> Any:
    """A call of ``cf`` replaying the forward program; the result's node holds the backward."""
    gp: GraphProgram = entry.graph
    leaves = [resolve(r, args) for r in entry.leaves]
    fixed = {r: source(r, args, leaves).realize_cached_data()._handle
             for r in [r for _, r in gp.f_roles] + gp.b_roles if r[0] != "saved"}
    arrays = gp.forward.run([fixed[r] for _, r in gp.f_roles])
    device = gp.forward.device
    n, s = gp.n_results, gp.n_saved
    datas = unpack(arrays[:n], entry.outs, device)
    saved = arrays[n:n + s]
    for (obj, name), d in zip(entry.states, unpack(arrays[n + s:], entry.state_meta, device)):
        setattr(obj, name, Tensor.make_const(d))
    rest = [saved[r[1]] if r[0] == "saved" else fixed[r] for r in gp.b_roles]
    backward, grad_meta = gp.backward, gp.grad_meta
    op = CompiledGraph(lambda gs: unpack(backward.run(list(gs) + rest), grad_meta, device))
    return _results(entry.tree, datas, gp.diff, op, leaves)


def explain(entry: Any, limit: Optional[int] = None) -> str:
    """The forward program's dump, then the backward program's."""
    gp: GraphProgram = entry.graph
    return ("forward (returns the results and the arrays the backward reads):\n"
            + gp.forward.explain(limit=limit) + "\nbackward (run by the result's node):\n"
            + gp.backward.explain(limit=limit))
