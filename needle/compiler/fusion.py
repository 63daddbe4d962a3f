"""The fusion pass: group maximal chains of elementwise steps (and one feeding a reduction).

A value is a (buffer, version) pair: each write of a buffer makes a new version. An
elementwise step's value is *inlined* into the step that reads it, instead of being written
to memory and read back, when all of these hold:

* that step is its only reader, and reads it whole, element i for element i (a flat read);
* the buffer is not visible outside the traced function (not an input, output or gradient);
* both iterate over the same number of elements, in at most one strided shape;
* every input of the inlined chain still holds the version it had (no write in between).

Greedy in program order this yields maximal chains (trees, in fact: a step may inline
several producers). A reduction (``reduce_sum``/``reduce_max``) whose input is such a chain
takes the chain as its map expression. Each group is written as short SSA statements,
``t0 = x0 * x1; t1 = exp(t0); out = t1 + x2``, over inputs ``x0..xk`` (strided array views or
scalars): the expression string of the ``fused_elementwise`` device primitive
(``backend_ndarray/kernel_expr.py``); each step's expression is the one ``primitives.py``
declares for it.
"""
import math
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from ..backend_ndarray import NDArray, primitives
from ..backend_ndarray.kernel_expr import Stmt, join, rename
from ..backend_ndarray.primitives import Primitive
from .capture import Step, Trace, View

_FLOATS = (np.dtype("float32"), np.dtype("float64"))
_REDUCTIONS = ("reduce_sum", "reduce_max")
MAX_INPUTS = 24  # keep kernels' argument lists short
Value = Tuple[int, int]  # (buffer, version)


class Group:
    """A fused kernel: SSA statements over leaf inputs, run at the position of its root step."""

    def __init__(self, root: int, size: int, dtype: np.dtype) -> None:
        self.root = root                        # index of the step whose output it writes
        self.members: List[int] = [root]        # every step folded in (root last once built)
        self.size = size                        # elements iterated over
        self.shape: Optional[Tuple[int, ...]] = None  # the one strided shape, if any
        self.dtype = dtype                      # the float type computed in
        self.leaves: List[Tuple[int, int, View]] = []  # (buffer, version, view)
        self.scalars: List[Any] = []            # scalar inputs (typed numpy scalars)
        self.stmts: List[Stmt] = []             # (name, expression)
        self.result = ""                        # name holding the group's value
        self.reduce: Optional[Tuple[str, int, int]] = None  # (op, reduce_size, inner_size)
        self.out = -1                           # buffer written

    @property
    def iter_shape(self) -> Tuple[int, ...]:
        """The shape iterated over: the strided inputs' shape, else the flat size."""
        return self.shape if self.shape is not None else (self.size,)

    def leaf(self, buf: int, version: int, view: View) -> str:
        """The input name of value (buf, version) read through ``view``."""
        key = (buf, version, view)
        if key not in self.leaves:
            self.leaves.append(key)
        return f"x{self.leaves.index(key)}"

    def scalar(self, value: Any) -> str:
        """The input name of a scalar, as the compute dtype (equal values share one)."""
        value = self.dtype.type(value)
        for j, s in enumerate(self.scalars):
            if s == value and not (value != value):
                return f"c{j}"
        self.scalars.append(value)
        return f"c{len(self.scalars) - 1}"

    def tmp(self, expr: str) -> str:
        """A new statement ``t<k> = expr``; returns ``t<k>``."""
        name = f"t{len(self.stmts)}"
        self.stmts.append((name, expr))
        return name

    def absorb(self, other: "Group") -> str:
        """Copy ``other``'s statements in (renaming its names); return its result's new name."""
        names: Dict[str, str] = {}
        for j, (buf, ver, view) in enumerate(other.leaves):
            names[f"x{j}"] = self.leaf(buf, ver, view)
        for j, s in enumerate(other.scalars):
            names[f"c{j}"] = self.scalar(s)
        for lhs, rhs in other.stmts:
            names[lhs] = self.tmp(rename(rhs, names))
        self.members = other.members + self.members
        if other.shape is not None:
            self.shape = other.shape
        return names[other.result]

    def expression(self) -> str:
        """The kernel's source: SSA statements, the last one assigning ``out``."""
        return join(self.stmts[:-1] + [("out", self.stmts[-1][1])])

    def inputs_text(self) -> str:
        """The inputs, for a dump: ``x0=%3[shape=... strides=...], c0=1.0``."""
        return ", ".join([f"x{j}=%{b}" + ("" if v is None else f"[{_view_text(v)}]")
                          for j, (b, _, v) in enumerate(self.leaves)]
                         + [f"c{j}={s!r}" for j, s in enumerate(self.scalars)])


def _view_text(v: View) -> str:
    shape, strides, offset = v
    return f"shape={shape} strides={strides}" + (f" +{offset}" if offset else "")


def _is_flat(view: View, size: int) -> bool:
    """True when ``view`` reads a buffer of ``size`` elements in order (no re-indexing)."""
    if view is None:
        return True
    shape, strides, offset = view
    return (offset == 0 and math.prod(shape) == size
            and all(st == c for st, c, n in zip(strides, NDArray.compact_strides(shape), shape)
                    if n != 1))


# ---------------------------------------------------------------------- which steps fuse
def _declared(s: Step) -> Optional[Primitive]:
    """The declaration whose expression computes step ``s`` (``ewise_strided``: its op's)."""
    if s.name == "ewise_strided":
        return primitives.lookup("ewise_" + s.args[0])
    p = primitives.lookup(s.name)
    return p if p is not None and p.elementwise and p.expr is not None else None


def _compute_dtype(trace: Trace, s: Step) -> Optional[np.dtype]:
    """The one float type step ``s`` computes in (bools allowed beside it), else None."""
    dts = [trace.dtype(b) for b, _ in s.reads] + [trace.dtype(s.write)]
    floats = {d for d in dts if d in _FLOATS}
    if len(floats) != 1 or any(d not in _FLOATS and d != np.bool_ for d in dts):
        return None
    return floats.pop()


def _weak(val: Any, dt: np.dtype) -> bool:
    """True when a scalar operand keeps the array's dtype (a Python number, or of ``dt``)."""
    return isinstance(val, (bool, int, float)) or (
        isinstance(val, np.generic) and np.dtype(type(val)) == dt)


def _dtypes_fit(p: Primitive, s: Step, trace: Trace, dt: np.dtype) -> bool:
    """True when step ``s`` (declared ``p``) computes in ``dt`` as its unfused kernel does."""
    first, out_dt = trace.dtype(s.reads[0][0]) if s.reads else dt, trace.dtype(s.write)
    if p.name == "ewise_astype":
        return first == np.bool_ and out_dt == dt
    if p.family == "unary":
        return first == dt == out_dt
    if p.family in ("binary", "compare") and p.scalar >= 0:
        return _weak(s.args[p.scalar], dt) and first == dt
    return p.family != "binary" or out_dt == dt


def _elementwise(trace: Trace, i: int) -> Optional[Tuple[Primitive, np.dtype, int]]:
    """(declaration, float dtype, size) when step ``i`` can join a fused group, else None."""
    s = trace.steps[i]
    if s.write < 0 or s.partial or trace.size(s.write) == 0:
        return None
    p = _declared(s)
    dt = _compute_dtype(trace, s) if p is not None else None
    if p is None or dt is None or not _dtypes_fit(p, s, trace, dt):
        return None
    return p, dt, trace.size(s.write)


def _apply(g: Group, p: Primitive, s: Step, ops: List[str]) -> str:
    """The statement computing step ``s`` from operand names ``ops``; returns its name."""
    if p.scalar >= 0:
        ops = ops + [g.scalar(s.args[p.scalar])]
    if p.expr == "{0}" and p.scalar < 0:  # compact: a copy, the value itself
        return ops[0]
    consts = {"one": g.scalar(1), "zero": g.scalar(0)} if "{one}" in p.expr else {}
    return g.tmp(p.expr.format(*ops, **consts))


# ---------------------------------------------------------------------- the four steps
def number_versions(trace: Trace) -> Tuple[List[List[int]], Dict[Value, int]]:
    """The version of each buffer each step reads, and the number of readers of each value."""
    version: Dict[int, int] = {}
    readers: Dict[Value, int] = {}
    read_ver: List[List[int]] = []
    for s in trace.steps:
        vs = []
        for b, _ in s.reads:
            key = (b, version.get(b, 0))
            readers[key] = readers.get(key, 0) + 1
            vs.append(key[1])
        read_ver.append(vs)
        if s.write >= 0:
            version[s.write] = version.get(s.write, 0) + 1
    return read_ver, readers


class _Fuser:
    """Builds the groups in program order, inlining a producer into its one reader."""

    def __init__(self, trace: Trace, protected: Set[int]) -> None:
        self.trace, self.protected = trace, protected
        self.read_ver, self.readers = number_versions(trace)
        self.version: Dict[int, int] = {}        # current version of each buffer
        self.producer: Dict[Value, Group] = {}   # values a live group computes
        self.groups: List[Optional[Group]] = [None] * len(trace.steps)
        self.folded: Set[int] = set()

    def run(self) -> Tuple[List[Optional[Group]], Set[int]]:
        """(groups by step, steps folded into a later group)."""
        for i, s in enumerate(self.trace.steps):
            info = _elementwise(self.trace, i)
            if info is not None:
                self.groups[i] = self.elementwise_group(i, s, *info)
            elif s.name in _REDUCTIONS and self.trace.dtype(s.write) in _FLOATS:
                self.groups[i] = self.reduction_group(i, s)
            if s.write >= 0:
                ver = self.version[s.write] = self.version.get(s.write, 0) + 1
                g = self.groups[i]
                if g is not None and not g.reduce:
                    self.producer[(s.write, ver)] = g
        for i in self.folded:
            self.groups[i] = None
        return self.groups, self.folded

    def inlinable(self, b: int, ver: int, view: View, g: Group) -> Optional[Group]:
        """The group computing value (b, ver) when ``g`` may inline it, else None."""
        p = self.producer.get((b, ver))
        if p is None or self.readers.get((b, ver)) != 1 or b in self.protected or p.reduce:
            return None
        if p.size != g.size or not _is_flat(view, p.size) or p.dtype != g.dtype:
            return None
        if p.shape is not None and g.shape is not None and p.shape != g.shape:
            return None
        if len(p.leaves) + len(g.leaves) > MAX_INPUTS:
            return None
        if any(self.version.get(lb, 0) != lv for lb, lv, _ in p.leaves):
            return None  # an input of the chain was overwritten since: it must run in place
        return p

    def take(self, b: int, ver: int, p: Group, g: Group) -> str:
        """Inline producer ``p`` of (b, ver) into ``g``; the name of its value there."""
        self.folded.update(p.members)
        self.producer.pop((b, ver))
        return g.absorb(p)

    def elementwise_group(self, i: int, s: Step, p: Primitive, dt: np.dtype, size: int
                          ) -> Optional[Group]:
        """The group of elementwise step ``i``, with its inlinable producers folded in."""
        g = Group(i, size, dt)
        for b, view in s.reads:
            if view is not None and not _is_flat(view, self.trace.size(b)):
                if g.shape is not None and g.shape != view[0]:
                    return None  # two strided shapes: not one iteration space
                g.shape = view[0]
        ops = []
        for (b, view), ver in zip(s.reads, self.read_ver[i]):
            q = self.inlinable(b, ver, view, g)
            ops.append(self.take(b, ver, q, g) if q is not None else g.leaf(b, ver, view))
        g.result = _apply(g, p, s, ops)
        if not g.stmts or g.stmts[-1][0] != g.result:
            g.result = g.tmp(g.result)  # a bare copy: the kernel still writes its output
        g.out = s.write
        return g

    def reduction_group(self, i: int, s: Step) -> Optional[Group]:
        """A reduction whose input is an inlinable chain, as that chain's group, else None."""
        b, ver = s.reads[0][0], self.read_ver[i][0]
        reduce_size, inner = s.args[2], (s.args[3] if len(s.args) > 3 else 1)
        probe = Group(i, self.trace.size(b), self.trace.dtype(b))
        p = self.inlinable(b, ver, None, probe) if reduce_size > 0 else None
        if p is None:
            return None
        g = Group(i, p.size, p.dtype)
        g.result = self.take(b, ver, p, g)
        g.members = p.members + [i]
        g.reduce = (s.name[7:], reduce_size, inner)
        g.out = s.write
        return g


def check_in_place(groups: List[Optional[Group]]) -> None:
    """A group whose output buffer it also reads through a re-indexing view is unsafe."""
    for g in groups:
        if g is not None and any(b == g.out and v is not None and not _is_flat(v, g.size)
                                 for b, _, v in g.leaves):
            raise AssertionError("fusion: in-place kernel reads its output re-indexed")


def dead_buffers(trace: Trace, groups: List[Optional[Group]], folded: Set[int]
                 ) -> Dict[int, int]:
    """Buffers that only folded steps wrote (inlined intermediates), mapped to their sizes."""
    steps = trace.steps
    written = {g.out for g in groups if g is not None}
    written |= {s.write for i, s in enumerate(steps) if groups[i] is None and i not in folded}
    return {s.write: trace.size(s.write) for i, s in enumerate(steps)
            if i in folded and s.write not in written and s.write >= 0}


def fuse(trace: Trace, protected: Set[int]
         ) -> Tuple[List[Optional[Group]], Dict[int, int], Set[int]]:
    """(groups, dead, folded): the Group run at each step (or None), the sizes of the inlined
    buffers never written, and the steps folded into a later group."""
    groups, folded = _Fuser(trace, protected).run()
    check_in_place(groups)
    return groups, dead_buffers(trace, groups, folded), folded
