"""A compiled program: the fused tape replayed on fresh inputs, and its readable dump. Outputs are
fresh each call (a kept result is never overwritten); intermediates are allocated once."""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend_ndarray import NDArray
from ..process_state import switches
from .capture import Buf, Trace
from .fusion import fuse


class Program:
    """Steps and fused kernels to replay; ``run(inputs)`` returns the output buffers."""

    def __init__(self, trace: Trace, device: Any, inputs: Sequence[int], outputs: Sequence[int],
                 fusion: bool = True, in_place: bool = False, lookup: Any = None) -> None:
        self.trace = trace
        self.device = device
        self.in_place = in_place  # run on the recorded arrays themselves (``needle.lazy``)
        self.lookup = lookup or (lambda name: getattr(device, name))
        self.inputs = list(inputs)    # buffer indices bound per call, in the caller's order
        self.outputs = list(outputs)  # buffer indices returned per call
        protected = set(self.inputs) | set(self.outputs)
        protected |= {i for i, internal in enumerate(trace.internal) if not internal}
        if fusion:
            self.groups, self.dead, self.folded = fuse(trace, protected)
        else:
            self.groups, self.dead, self.folded = [None] * len(trace.steps), {}, set()
        for i, g in enumerate(self.groups):  # a lone step runs as its own primitive
            # (a lone strided copy too: NumPy's copy was measured faster than a numba loop)
            if g is not None and len(g.members) == 1:
                self.groups[i] = None
        self._build()

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        trace, dev = self.trace, self.device
        dynamic = set() if self.in_place else set(self.inputs) | set(self.outputs)
        n = len(trace.arrays)
        self.static: List[Any] = [None] * n
        for b in range(n):
            if b in dynamic or b in self.dead:
                continue
            if trace.internal[b] and not self.in_place:
                self.static[b] = dev.Array(trace.size(b), dtype=trace.dtype(b))
            else:
                self.static[b] = trace.arrays[b]  # a constant the function closed over
        self.fresh = [] if self.in_place else [
            (b, trace.size(b), trace.dtype(b)) for b in dict.fromkeys(self.outputs)
            if b not in set(self.inputs) and trace.internal[b]]  # (a result may be saved too)
        fused_prim = self.lookup("fused_elementwise") if hasattr(
            dev.mod, "fused_elementwise") else None
        per_call = set() if self.in_place else set(self.inputs) | {b for b, _, _ in self.fresh}
        self.bound: List[Tuple[Any, list, list]] = []  # (fn, arguments, holes) per call
        self.checked: List[Tuple[int, str, int]] = []  # (index buffer, step, rows) checked
        self.unchecked: Dict[int, Any] = {}  # call index -> the step without its check
        for i, s in enumerate(trace.steps):
            if i in self.folded:
                continue
            g = self.groups[i]
            if g is not None and fused_prim is not None:
                shape = g.iter_shape
                args: list = []
                for b, _, v in g.leaves:
                    v = v if v is not None else ((trace.size(b),), (1,), 0)
                    if v[0] != shape and math.prod(v[0]) == math.prod(shape):
                        # a flat read seen in group shape
                        v = (shape, NDArray.compact_strides(shape), v[2])
                    args.append((Buf(b), *v))
                args += g.scalars
                self.bound.append(self._bind(fused_prim, (g.expression(), args, Buf(g.out),
                                                          shape, g.reduce), per_call))
                continue
            self.groups[i] = None
            fn = self.lookup(s.name)
            if s.name in ("take_rows", "scatter_add_rows"):
                a, idx, out, row = s.args[:4]
                rows = trace.size(a if s.name == "take_rows" else out) // max(row, 1)
                self.checked.append((_index_source(trace, int(idx), self.inputs), s.name,
                                     rows))
                self.unchecked[len(self.bound)] = fn
                fn = _bounds_checked(fn, s.name, self.lookup("to_numpy"))
            self.bound.append(self._bind(fn, s.args, per_call))

    def _bind(self, fn: Any, args: tuple, per_call: set) -> Tuple[Any, list, list]:
        """(fn, arguments, holes): every argument that does not change between calls
        resolved, a hole (position, buffer, list index) for each that does."""
        holes: List[Tuple[int, int, Optional[int]]] = []
        flat = list(args)
        for k, a in enumerate(flat):
            if isinstance(a, Buf):
                if a in per_call:
                    holes.append((k, int(a), None))
                else:
                    flat[k] = self.static[a]
            elif isinstance(a, list):  # fused inputs: (Buf, shape, strides, offset)
                lst = list(a)
                for j, x in enumerate(lst):
                    if isinstance(x, tuple) and isinstance(x[0], Buf):
                        if x[0] in per_call:
                            holes.append((k, int(x[0]), j))
                        else:
                            lst[j] = (self.static[x[0]],) + x[1:]
                flat[k] = lst
        return fn, flat, holes

    # ------------------------------------------------------------------ running
    def run(self, inputs: Sequence[Any]) -> List[Any]:
        """Replay on the input Arrays (in ``self.inputs`` order); return the output Arrays."""
        if switches.profiler is not None:  # needle.profiler: each step timed
            return switches.profiler.program(self, inputs, Program._run)
        return self._run(inputs)

    def _run(self, inputs: Sequence[Any], outputs: Optional[Dict[int, Any]] = None,
             checked: bool = True) -> List[Any]:
        """Replay; ``outputs`` (buffer -> Array) replaces the fresh outputs (CUDA graph mode's
        static ones), and ``checked=False`` drops the host-side index checks (the caller's)."""
        slot: Dict[int, Any] = dict(zip(self.inputs, inputs))
        if outputs is not None:
            slot.update(outputs)
        else:
            Array = self.device.Array
            for b, size, dtype in self.fresh:
                slot[b] = Array(size, dtype=dtype)
        bound = self.bound if checked else [
            (self.unchecked.get(k, fn), flat, holes)
            for k, (fn, flat, holes) in enumerate(self.bound)]
        for fn, flat, holes in bound:
            if not holes:
                fn(*flat)
                continue
            args = list(flat)
            for k, b, j in holes:
                if j is None:
                    args[k] = slot[b]
                else:
                    lst = args[k] = list(args[k])
                    lst[j] = (slot[b],) + lst[j][1:]
            fn(*args)
        return [slot[b] if b in slot else self.static[b] for b in self.outputs]

    # ------------------------------------------------------------------ reporting
    def stats(self) -> Dict[str, Any]:
        """Kernel launches and bytes moved before and after fusion."""
        tr = self.trace
        before = sum(_traffic(tr, s) for s in tr.steps)
        after = 0
        for i, s in enumerate(tr.steps):
            if i in self.folded:
                continue
            g = self.groups[i]
            if g is None:
                after += _traffic(tr, s)
            else:
                item = g.dtype.itemsize
                after += sum(tr.size(b) * tr.dtype(b).itemsize for b, _, _ in g.leaves)
                after += tr.size(g.out) * tr.dtype(g.out).itemsize
                if g.reduce:
                    after += 2 * g.size * item  # the map result goes through a scratch
        kernels = len(tr.steps) - len(self.folded)
        return {"steps": len(tr.steps), "kernels": kernels,
                "fused_groups": sum(g is not None for g in self.groups),
                "bytes_before": before, "bytes_after": after,
                "dead_bytes": sum(n * tr.dtype(b).itemsize for b, n in self.dead.items())}

    def explain(self, before: bool = True, after: bool = True, limit: Optional[int] = None
                ) -> str:
        """The tape before fusion and the kernels after, one line each, with totals."""
        tr, st = self.trace, self.stats()
        lines = []
        if before:
            lines.append(f"== before fusion: {st['steps']} primitive calls, "
                         f"{st['bytes_before'] / 2**20:.1f} MiB moved ==")
            for i, s in enumerate(tr.steps[:limit]):
                lines.append(f"{i:4d}  {_step_text(tr, s)}")
        if after:
            lines.append(f"== after fusion: {st['kernels']} kernels ({st['fused_groups']} "
                         f"fused), {st['bytes_after'] / 2**20:.1f} MiB moved, "
                         f"{st['dead_bytes'] / 2**20:.1f} MiB of intermediates never "
                         f"written ==")
            shown = 0
            for i, s in enumerate(tr.steps):
                if i in self.folded:
                    continue
                if limit is not None and shown >= limit:
                    break
                shown += 1
                g = self.groups[i]
                if g is None:
                    lines.append(f"{i:4d}  {_step_text(tr, s)}")
                else:
                    names = "+".join(tr.steps[m].name.replace("ewise_", "")
                                     .replace("scalar_", "s_") for m in g.members)
                    red = f" then {g.reduce[0]}" if g.reduce else ""
                    lines.append(f"{i:4d}  %{g.out} = fused[{names}]{red} "
                                 f"{g.iter_shape} {g.dtype}: {g.expression()}")
                    lines.append(f"{'':6}    inputs {g.inputs_text()}")
        return "\n".join(lines)


def _index_source(trace: Trace, buf: int, inputs: Sequence[int]) -> int:
    """The input an index buffer was copied from (through ``compact`` steps: each element of
    a copy is one of its source's, so the source's range bounds it), else ``buf`` itself."""
    writer = {st.write: st for st in trace.steps if st.write >= 0}
    b = buf
    while b not in inputs:
        st = writer.get(b)
        if st is None or st.name != "compact" or st.partial or len(st.reads) != 1:
            return buf
        b = st.reads[0][0]
    return b


def check_index_ranges(checks: Sequence[Tuple[Any, int, str]], to_numpy: Any) -> None:
    """Eager mode's index checks, (index buffer, rows, take_rows / scatter_add_rows) each, on
    the host: the range an uploaded index buffer carries (no device read), else a download's."""
    for idx, rows, name in checks:
        rng = getattr(idx, "known_range", None)
        if rng is None:
            host = to_numpy(idx, (idx.size,), (1,), 0)
            rng = (host.min(), host.max()) if host.size else None
        if rng is not None and (rng[0] < 0 or rng[1] >= rows):
            raise ValueError(f"{name}: indices must lie in [0, {rows}), got values in "
                             f"[{rng[0]}, {rng[1]}]")


def _bounds_checked(fn: Any, name: str, to_numpy: Any) -> Any:
    """``fn`` (take_rows / scatter_add_rows) after the index check eager mode makes."""
    def run(a: Any, idx: Any, out: Any, row_size: int) -> None:
        rows = (a.size if name == "take_rows" else out.size) // max(row_size, 1)
        check_index_ranges(((idx, rows, name),), to_numpy)
        fn(a, idx, out, row_size)
    return run


def _traffic(tr: Trace, s: Any) -> int:
    """Bytes a step moves: each read and each write counted at the size of its buffer."""
    total = sum(tr.size(b) * tr.dtype(b).itemsize for b, _ in s.reads)
    if s.write >= 0:
        total += tr.size(s.write) * tr.dtype(s.write).itemsize
    return total


def _step_text(tr: Trace, s: Any) -> str:
    args = []
    for a in s.args:
        if isinstance(a, Buf):
            args.append(f"%{int(a)}")
        elif isinstance(a, np.ndarray):
            args.append(f"<host {a.shape} {a.dtype}>")
        else:
            args.append(repr(a))
    out = f"%{s.write} = " if s.write >= 0 else ""
    info = f"  ({tr.size(s.write)},) {tr.dtype(s.write)}" if s.write >= 0 else ""
    return f"{out}{s.name}({', '.join(args)}){info}"
