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
scalars): the expression string of the ``fused_elementwise`` device primitive.
"""
import math
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from ..backend_ndarray import NDArray
from ..backend_ndarray.fused_elementwise_cpu import rename
from .capture import Trace, View

_BINOP = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "eq": "==",
          "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_CMP = ("eq", "ne", "lt", "le", "gt", "ge")
_UNARY = {"neg": "-{}", "log": "log({})", "exp": "exp({})", "tanh": "tanh({})",
          "sqrt": "sqrt({})", "abs": "abs({})", "sin": "sin({})", "cos": "cos({})"}
_FLOATS = (np.dtype("float32"), np.dtype("float64"))
MAX_INPUTS = 24  # keep kernels' argument lists short (numexpr allows at most 32 operands)


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
        self.stmts: List[str] = []
        self.result = ""                        # name holding the group's value
        self.reduce: Optional[Tuple[str, int, int]] = None  # (op, reduce_size, inner_size)
        self.out = -1                           # buffer written

    @property
    def iter_shape(self) -> Tuple[int, ...]:
        return self.shape if self.shape is not None else (self.size,)

    def leaf(self, buf: int, version: int, view: View) -> str:
        key = (buf, version, view)
        if key not in self.leaves:
            self.leaves.append(key)
        return f"x{self.leaves.index(key)}"

    def scalar(self, value: Any) -> str:
        value = self.dtype.type(value)
        for j, s in enumerate(self.scalars):
            if s == value and not (value != value):
                return f"c{j}"
        self.scalars.append(value)
        return f"c{len(self.scalars) - 1}"

    def tmp(self, expr: str) -> str:
        name = f"t{len(self.stmts)}"
        self.stmts.append(f"{name} = {expr}")
        return name

    def absorb(self, other: "Group") -> str:
        """Copy ``other``'s statements in (renaming its names); return its result's new name."""
        names: Dict[str, str] = {}
        for j, (buf, ver, view) in enumerate(other.leaves):
            names[f"x{j}"] = self.leaf(buf, ver, view)
        for j, s in enumerate(other.scalars):
            names[f"c{j}"] = self.scalar(s)
        for stmt in other.stmts:
            lhs, rhs = stmt.split(" = ", 1)
            names[lhs] = self.tmp(rename(rhs, names))
        self.members = other.members + self.members
        if other.shape is not None:
            self.shape = other.shape
        return names[other.result]

    def expression(self) -> str:
        """The kernel's source: SSA statements, the last one assigning ``out``."""
        body = self.stmts[:-1] + ["out = " + self.stmts[-1].split(" = ", 1)[1]]
        return "; ".join(body)

    def inputs_text(self) -> str:
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


def _elementwise(trace: Trace, i: int) -> Optional[Tuple[str, np.dtype, int]]:
    """(form, float dtype, size) when step ``i`` can join a fused group, else None."""
    s = trace.steps[i]
    name, a = s.name, s.args
    if s.write < 0 or s.partial:
        return None
    out_dt, size = trace.dtype(s.write), trace.size(s.write)
    if size == 0:
        return None
    in_dts = [trace.dtype(b) for b, _ in s.reads]
    floats = {d for d in in_dts + [out_dt] if d in _FLOATS}
    if len(floats) != 1 or any(d not in _FLOATS and d != np.bool_ for d in in_dts + [out_dt]):
        return None
    dt = floats.pop()
    if name == "fill" or name == "compact" or name == "ewise_where":
        return (name, dt, size)
    if name == "ewise_astype":
        return ("astype", dt, size) if in_dts[0] == np.bool_ and out_dt == dt else None
    if name.startswith("scalar_"):
        op, val = name[7:], a[1]
        weak = isinstance(val, (bool, int, float)) or (
            isinstance(val, np.generic) and np.dtype(type(val)) == dt)
        if op not in _BINOP and op != "maximum" or not weak or in_dts[0] != dt:
            return None
        return (name, dt, size)
    if name == "ewise_strided" or (name.startswith("ewise_") and
                                   (name[6:] in _BINOP or name[6:] == "maximum")):
        op = a[0] if name == "ewise_strided" else name[6:]
        if op not in _BINOP and op != "maximum":
            return None
        if op not in _CMP and out_dt != dt:
            return None
        return (name, dt, size)
    if name.startswith("ewise_") and name[6:] in _UNARY:
        return (name, dt, size) if in_dts[0] == dt == out_dt else None
    return None


def _apply(g: Group, name: str, args: tuple, ops: List[str]) -> str:
    """The statement computing step ``name`` from operand names ``ops``; returns its name."""
    if name == "fill":
        return g.tmp(g.scalar(args[1]))
    if name == "compact":
        return ops[0]
    if name == "ewise_where":
        return g.tmp(f"where({ops[0]}, {ops[1]}, {ops[2]})")
    if name == "ewise_astype":
        return g.tmp(f"where({ops[0]}, {g.scalar(1)}, {g.scalar(0)})")
    if name.startswith("scalar_"):
        op, b = name[7:], g.scalar(args[1])
        ops = [ops[0], b]
    else:
        op = args[0] if name == "ewise_strided" else name[6:]
    if op in _UNARY:
        return g.tmp(_UNARY[op].format(ops[0]))
    x, y = ops
    if op == "maximum":  # np.maximum: x if x > y or x is NaN, else y (so max(-0., 0.) is 0.)
        return g.tmp(f"where(({x} > {y}) | ({x} != {x}), {x}, {y})")
    return g.tmp(f"{x} {_BINOP[op]} {y}")


def fuse(trace: Trace, protected: Set[int]
         ) -> Tuple[List[Optional[Group]], Dict[int, int], Set[int]]:
    """Group the trace's steps. Returns (groups, dead, folded): ``groups[i]`` is the Group run
    at step i (None for a step run as recorded, or folded into a group), ``dead`` the
    buffers no longer written (inlined intermediates) mapped to their sizes, ``folded`` the
    indices of the steps folded into a later group."""
    steps = trace.steps
    version: Dict[int, int] = {}
    readers: Dict[Tuple[int, int], int] = {}
    read_ver: List[List[int]] = []
    for s in steps:  # number the versions and count each value's readers
        vs = []
        for b, _ in s.reads:
            key = (b, version.get(b, 0))
            readers[key] = readers.get(key, 0) + 1
            vs.append(key[1])
        read_ver.append(vs)
        if s.write >= 0:
            version[s.write] = version.get(s.write, 0) + 1
    version.clear()
    producer: Dict[Tuple[int, int], Group] = {}
    groups: List[Optional[Group]] = [None] * len(steps)
    folded: Set[int] = set()

    def inlinable(b: int, ver: int, view: View, g: Group) -> Optional[Group]:
        p = producer.get((b, ver))
        if p is None or readers.get((b, ver)) != 1 or b in protected or p.reduce:
            return None
        if p.size != g.size or not _is_flat(view, p.size) or p.dtype != g.dtype:
            return None
        if p.shape is not None and g.shape is not None and p.shape != g.shape:
            return None
        if len(p.leaves) + len(g.leaves) > MAX_INPUTS:
            return None
        if any(version.get(lb, 0) != lv for lb, lv, _ in p.leaves):
            return None  # an input of the chain was overwritten since: it must run in place
        return p

    for i, s in enumerate(steps):
        info = _elementwise(trace, i)
        red = s.name in ("reduce_sum", "reduce_max") and trace.dtype(s.write) in _FLOATS
        if info is not None:
            form, dt, size = info
            g = Group(i, size, dt)
            for (b, view), ver in zip(s.reads, read_ver[i]):
                if view is not None and not _is_flat(view, trace.size(b)):
                    if g.shape is not None and g.shape != view[0]:
                        g = None
                        break
                    g.shape = view[0]
            if g is not None:
                ops = []
                for (b, view), ver in zip(s.reads, read_ver[i]):
                    p = inlinable(b, ver, view, g)
                    if p is not None:
                        ops.append(g.absorb(p))
                        folded.update(p.members)
                        producer.pop((b, ver))
                    else:
                        ops.append(g.leaf(b, ver, view))
                g.result = _apply(g, s.name, s.args, ops)
                if not g.stmts or g.stmts[-1].split(" = ")[0] != g.result:
                    g.tmp(g.result)  # a bare copy: the kernel still writes its output
                    g.result = g.stmts[-1].split(" = ")[0]
                g.out = s.write
                groups[i] = g
        elif red:
            b, ver = s.reads[0][0], read_ver[i][0]
            reduce_size, inner = s.args[2], (s.args[3] if len(s.args) > 3 else 1)
            probe = Group(i, trace.size(b), trace.dtype(b))
            p = inlinable(b, ver, None, probe) if reduce_size > 0 else None
            if p is not None:
                g = Group(i, p.size, p.dtype)
                g.result = g.absorb(p)
                g.members = p.members + [i]
                g.reduce = (s.name[7:], reduce_size, inner)
                g.out = s.write
                folded.update(p.members)
                producer.pop((b, ver))
                groups[i] = g
        if s.write >= 0:
            version[s.write] = version.get(s.write, 0) + 1
            if groups[i] is not None and not groups[i].reduce:
                producer[(s.write, version[s.write])] = groups[i]
    for i in folded:
        groups[i] = None
    # a group whose output buffer is also read through a re-indexing view is unsafe in place
    for i, g in enumerate(groups):
        if g is not None and any(b == g.out and v is not None and not _is_flat(v, g.size)
                                 for b, _, v in g.leaves):
            raise AssertionError("fusion: in-place kernel reads its output re-indexed")
    written = {g.out for g in groups if g is not None}
    written |= {s.write for i, s in enumerate(steps) if groups[i] is None and i not in folded}
    dead = {s.write: trace.size(s.write) for i, s in enumerate(steps)
            if i in folded and s.write not in written and s.write >= 0}
    return [None if i in folded else g for i, g in enumerate(groups)], dead, folded
