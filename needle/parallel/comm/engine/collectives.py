"""The communicator's table: one ``Spec`` per collective, one ``Method`` per algorithm of
``select.ALGORITHMS`` (the one table of the algorithms; a ``Spec`` checks it has each).

A ``Method`` glues an algorithm generator (``ring.py``, ``latency_bound.py``,
``hierarchical.py``) to a call: the scratch it borrows, and whether the argument check rides
inside its data messages (``buffers``) or beside them (``metadata.overlapped``).
"""
import math
from collections.abc import Hashable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from ..algorithms import latency_bound as lb
from ..algorithms.hierarchical import hierarchical_allreduce
from ..algorithms.reference import chunk_bounds
from ..algorithms.ring import DEPTH, ring_allgather, ring_allreduce, ring_reduce_scatter_full
from ..algorithms.select import ALGORITHMS
from ..progress import Algorithm, Channel, GroupInfo, Transport, Waiting
from . import metadata
from .convert import same
from .result_pool import MIN_BYTES

NO_DATA = np.empty(0, np.uint8)  # a call without an array (barrier), or none in flight
NO_SCRATCH: List[np.ndarray] = []  # (never appended to)
Carrier = Union[lb.RecursiveDoublingBuffers, lb.HeaderBuffers]


@lru_cache(maxsize=256)
def segments(shape: tuple, p: int, r: int) -> tuple:
    """Item offsets of the p reduce-scatter segments of an array of ``shape`` (near-equal
    axis-0 chunks), and the rows of rank r's."""
    row = math.prod(shape[1:])
    rows = chunk_bounds(shape[0], p)
    return tuple(k * row for k in rows), rows[r + 1] - rows[r]


class Carried(NamedTuple):
    """An algorithm carrying the check in its messages: the buffers the header rides in, where
    the input goes in and the result comes out, and its steps (on a channel and the buffers)."""

    bufs: Carrier
    source: np.ndarray
    result: np.ndarray
    steps: Callable[[Channel, Any], Algorithm]


class CallState:
    """One kind of call (collective, algorithm, shape, dtype, op, root): what stays the same
    from call to call (description, hash, buffers, channels), and the arrays of one in flight."""

    __slots__ = ("spec", "method", "algo", "op", "root", "shape", "pooled", "scratch", "desc",
                 "hash", "check", "source", "result", "steps", "ch", "ctl", "waiting", "items",
                 "hosts", "home", "finish", "x", "res", "restore")
    x: np.ndarray
    res: np.ndarray
    items: int
    steps: Callable[[Channel, Any], Algorithm]

    def __init__(self, group: GroupInfo, t: Transport, spec: "Spec", key: tuple, algo: str,
                 root: int, x: np.ndarray, chunk_bytes: int,
                 hosts: Callable[[], List[Hashable]]) -> None:
        op = self.op = key[4]
        self.spec, self.method, self.algo, self.root = spec, spec.methods[algo], algo, root
        self.shape = spec.shape(x.shape, t.size, t.rank)
        self.pooled = math.prod(self.shape) * x.itemsize >= MIN_BYTES  # (result_pool.py)
        values = {"op": op, "root": root, "dtype": x.dtype, "shape": x.shape, "algorithm": algo}
        self.desc = (spec.name,) + sum(((f, values[f]) for f in spec.fields), ())
        self.hash = metadata.describe_hash(self.desc)
        self.items, self.hosts = max(1, chunk_bytes // max(1, x.itemsize)), hosts
        self.home: List[CallState] = []  # the cache's shelf it goes back to after a call
        self.finish = op == "avg" or spec.root_only  # more to do than ``restore(result)``
        self.x = self.res = x  # (for the scratch sizes)
        self.scratch = self.method.scratch(self)
        inside = self.method.buffers  # the check rides inside the data messages
        self.check: Carrier
        self.check, self.source, self.result, self.steps = (inside or _beside)(t, x, op or "sum")
        self.ch = Channel(t, 0, self.check.header if inside else 0)
        self.ctl = None if inside else Channel(t, 0)  # the check's own messages go here
        chans = [self.ch] if self.ctl is None else [self.ctl, self.ch]
        self.waiting = Waiting(group, spec.name, 0, chans)
        self.x = self.res = NO_DATA
        self.restore: Callable[[Any], Any] = same


Run = Callable[[CallState, Channel, List[np.ndarray]], Algorithm]


def _beside(t: Transport, x: np.ndarray, op: str) -> Carried:
    """The check's own 16-byte recursive doubling exchange, beside the data messages."""
    rd = lb.RecursiveDoublingBuffers(0, np.uint8, "min", t)
    return Carried(rd, NO_DATA, NO_DATA, lb.recursive_doubling_allreduce)


@dataclass(frozen=True)
class Method:
    """One algorithm: its generator, the scratch it borrows (bytes), and, when its messages
    carry the argument check, ``buffers(transport, x, op)`` (None: the check runs beside)."""

    run: Run = lambda st, ch, s: st.steps(ch, st.check)
    scratch: Callable[[CallState], Tuple[int, ...]] = lambda st: ()
    buffers: Optional[Callable[[Transport, np.ndarray, str], Carried]] = None


@dataclass(frozen=True)
class Spec:
    """One collective: its description's fields, algorithms, result shape and own-rank checks
    (``rooted``: a root; ``reduces``: an op; ``whole``: at least one axis; ``gather``: a 0-d
    input is one row, the output's bytes choose); ``root_only``: other ranks get None."""

    name: str
    fields: Tuple[str, ...]
    methods: Dict[str, Method]
    shape: Callable[[tuple, int, int], tuple] = lambda shape, p, r: shape
    rooted: bool = False
    reduces: bool = False
    whole: bool = False
    gather: bool = False
    root_only: bool = False

    def __post_init__(self) -> None:  # the engine glues, by name, the table's algorithms
        row = ALGORITHMS.get(self.name)
        if row is not None and set(self.methods) != set(row.steps):
            raise TypeError(f"{self.name}: {set(self.methods)} are not select's {set(row.steps)}")


def _workspace(st: CallState) -> Tuple[int, ...]:
    return (DEPTH * st.items * st.x.itemsize,)


def _workspace_and_acc(st: CallState) -> Tuple[int, ...]:
    return _workspace(st) + (st.x.nbytes,)


def _view(buf: np.ndarray, items: int, dtype: Any) -> np.ndarray:
    return buf[:items * np.dtype(dtype).itemsize].view(dtype)


def _ring_allreduce(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    x, res, items = st.x.reshape(-1), st.res.reshape(-1), st.items
    return ring_allreduce(ch, x, res, st.op, items, _view(s[0], DEPTH * items, x.dtype))


def _hierarchical(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    x, res, items = st.x.reshape(-1), st.res.reshape(-1), st.items
    return hierarchical_allreduce(ch, x, res, st.hosts(), st.op, items,
                                  _view(s[0], DEPTH * items, x.dtype), _view(s[1], x.size, x.dtype))


def _rd_allreduce(t: Transport, x: np.ndarray, op: str) -> Carried:
    rd = lb.RecursiveDoublingBuffers(x.nbytes, x.dtype, op, t)
    shaped = rd.data.reshape(x.shape)
    return Carried(rd, shaped, shaped, lb.recursive_doubling_allreduce)


def _rd_allgather(t: Transport, x: np.ndarray, op: str) -> Carried:
    n, p, r = x.nbytes, t.size, t.rank
    ag = lb.AllgatherBuffers(n, p, t)
    source = ag.work[r * n:(r + 1) * n].view(x.dtype).reshape(x.shape)
    result = ag.work[:p * n].view(x.dtype).reshape((p * x.shape[0],) + x.shape[1:])
    return Carried(ag, source, result, lb.recursive_doubling_allgather)


def _rh_reduce_scatter(t: Transport, x: np.ndarray, op: str) -> Carried:
    b, mine = segments(x.shape, t.size, t.rank)
    rs = lb.ReduceScatterBuffers(b, x.dtype, op, t)
    result = rs.data[b[t.rank]:b[t.rank + 1]].reshape((mine,) + x.shape[1:])
    return Carried(rs, rs.data.reshape(x.shape), result, lb.recursive_halving_reduce_scatter)


def _ring_reduce_scatter(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    # s[1]: the partial sums passing through (only p - 2 segments of them are ever used)
    x, b, items = st.x.reshape(-1), segments(st.x.shape, ch.size, ch.rank)[0], st.items
    return ring_reduce_scatter_full(ch, x, _view(s[1], x.size, x.dtype), b, st.op, items,
                                    _view(s[0], DEPTH * items, x.dtype), st.res.reshape(-1))


def _broadcast(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    if ch.rank == st.root and st.res is not st.x:
        st.res[...] = st.x
    return lb.binomial_broadcast(ch, st.res.reshape(-1), st.root, st.items)


def _reduce(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    x = st.x.reshape(-1)
    return lb.binomial_reduce(ch, x, st.res.reshape(-1), st.root, st.op, st.items,
                              _view(s[0], st.items, x.dtype))


def _alltoall(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    x, row = st.x, math.prod(st.x.shape[1:])
    return lb.pairwise_alltoall(ch, x.reshape(-1), st.res.reshape(-1), x.shape[0], row)


def _nothing(st: CallState, ch: Channel, s: List[np.ndarray]) -> Algorithm:
    return None
    yield  # a generator that finishes at once


def _exchanged(shape: tuple, p: int, r: int) -> tuple:
    b = chunk_bounds(shape[0], p)
    return (p * (b[r + 1] - b[r]),) + shape[1:]


_ARRAY = ("dtype", "shape", "algorithm")
ALLREDUCE = Spec("allreduce", ("op",) + _ARRAY, {
    "recursive_doubling": Method(buffers=_rd_allreduce),
    "ring": Method(_ring_allreduce, _workspace),
    "hierarchical": Method(_hierarchical, _workspace_and_acc)}, reduces=True)
ALLGATHER = Spec("allgather", _ARRAY, {
    "recursive_doubling": Method(buffers=_rd_allgather),
    "ring": Method(lambda st, ch, s: ring_allgather(ch, st.x.reshape(-1), st.res.reshape(-1),
                                                    st.items))},
    lambda s, p, r: (p * s[0],) + s[1:], gather=True)
REDUCE_SCATTER = Spec("reduce_scatter", ("op",) + _ARRAY, {
    "recursive_halving": Method(buffers=_rh_reduce_scatter),
    "ring": Method(_ring_reduce_scatter, _workspace_and_acc)},
    lambda s, p, r: (segments(s, p, r)[1],) + s[1:], reduces=True, whole=True)
BROADCAST = Spec("broadcast", ("root",) + _ARRAY, {"binomial": Method(_broadcast)}, rooted=True)
REDUCE = Spec("reduce", ("root", "op") + _ARRAY, {
    "binomial": Method(_reduce, lambda st: (st.items * st.x.itemsize,))},
    rooted=True, reduces=True, root_only=True)
ALLTOALL = Spec("alltoall", _ARRAY, {"pairwise": Method(_alltoall)}, _exchanged, whole=True)
BARRIER = Spec("barrier", (), {"check": Method(_nothing)})
