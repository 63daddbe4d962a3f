"""The CPU backend's ``fused_elementwise`` primitive: one expression, one pass over memory.

``expr`` is SSA statements over ``x0..xk`` (views) and ``c0..cm`` (scalars), the last assigning
``out`` (``kernel_expr.py``). Engines, chosen once per process (``NEEDLE_FUSED_ENGINE``):

* ``numba`` (default when installed): a loop LLVM compiles and vectorizes, each element loaded
  and stored once. numba's libm calls are scalar and its pow differs in the last bit, so
  groups with a transcendental, sqrt or ``**`` run on the NumPy engine; one core only
  (threads spin against OpenBLAS's). Measurements: benchmarks/README.md, "Figures behind
  constants and docstrings" (numexpr's interpreter, 10x slower than numba there, is not used).
* ``numpy`` (always available): one ufunc pass per statement over cache-sized blocks
  (``BLOCK``); bit for bit the unfused values.

Reductions map a block of whole rows into a small scratch and reduce it with NumPy as the
``reduce_*`` primitives do, so results match the unfused steps bit for bit.
"""
import ast
import hashlib
import importlib.util
import math
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, cast

import numpy as np

from .primitives import FUNCTIONS

_FUNCS = {f: getattr(np, f) for f in FUNCTIONS}  # exp -> np.exp, where -> np.where, ...
# the table's functions numba computes with scalar libm calls (see the module docstring)
_TRANSCENDENTAL = tuple(f + "(" for f in FUNCTIONS if f not in ("where", "abs")) + ("**",)


ENGINES = ("numba", "numpy")


def _engine_from_env() -> str:
    """NEEDLE_FUSED_ENGINE, checked; unset: numba where installed, else numpy."""
    name = os.environ.get("NEEDLE_FUSED_ENGINE") or (
        "numba" if importlib.util.find_spec("numba") is not None else "numpy")
    if name not in ENGINES:
        raise ValueError(f"NEEDLE_FUSED_ENGINE={name!r}: expected one of {ENGINES}")
    return name


ENGINE = _engine_from_env()
_CACHE: Dict[Tuple, Callable] = {}


def _views(inputs: Sequence[Any]) -> list:
    """NumPy views of the (Array, shape, strides, offset) inputs, then the scalars: the
    kernels' parameter order."""
    arrays, scalars = [], []
    for x in inputs:
        if isinstance(x, tuple):
            arr, vshape, strides, offset = x
            base = arr.array
            item = base.itemsize
            arrays.append(np.ndarray(vshape, base.dtype, buffer=base, offset=offset * item,
                                     strides=tuple(s * item for s in strides)))
        else:
            scalars.append(x)
    return arrays + scalars


BLOCK = 16384  # elements per block of the NumPy engine: its temporaries stay in cache


def _blocks(shape: Tuple[int, ...]) -> list:
    """Index tuples cutting ``shape`` into C-order blocks of about BLOCK elements."""
    k, inner = len(shape) - 1, 1
    while k > 0 and inner * shape[k] <= BLOCK:  # the last axes fit in a block: keep them whole
        inner *= shape[k]
        k -= 1
    if k == 0 and inner * shape[0] <= BLOCK:
        return [()]
    step = max(1, BLOCK // inner)
    return [idx + (slice(s, s + step),) for idx in np.ndindex(*shape[:k])
            for s in range(0, shape[k], step)]


def _numpy_kernel(expr: str) -> Callable:
    """The statements as NumPy array expressions, one ufunc pass each, block by block (the
    temporaries stay in cache; values equal eager ones bit for bit)."""
    code = compile(expr.replace("; ", "\n"), "<fused>", "exec")

    def run(args: list, out: np.ndarray) -> None:
        arrays = [(f"x{j}", a) for j, a in enumerate(args) if isinstance(a, np.ndarray)]
        # the scalars follow the arrays (the kernels' parameter order)
        env = dict(_FUNCS, **{f"c{k}": c for k, c in enumerate(args[len(arrays):])})
        for idx in _blocks(out.shape):
            for name, a in arrays:
                env[name] = a[idx]
            exec(code, env)
            np.copyto(out[idx], env["out"], casting="unsafe")
    return run


class _ToElement(ast.NodeTransformer):
    """Rewrite an array expression for one element: ``x0`` -> ``x0[i]``, where -> if-else."""

    def __init__(self, arrays: Sequence[str], index: str) -> None:
        self.arrays, self.index = set(arrays), index

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.arrays:
            return ast.parse(f"{node.id}[{self.index}]", mode="eval").body
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = cast(ast.Name, node.func).id  # the parser only makes calls of names
        if name == "where":
            return ast.IfExp(test=node.args[0], body=node.args[1], orelse=node.args[2])
        if name != "abs":
            node.func = ast.Attribute(value=ast.Name("np", ast.Load()), attr=name,
                                      ctx=ast.Load())
        return node


# error_model="numpy": x / 0 gives inf as in NumPy (numba's default raises, and its zero
# checks keep divisions from vectorizing)
_HEADER = ("import numpy as np\nimport numba\n\n\n"
           "@numba.njit(cache=True, nogil=True, error_model=\"numpy\")\n")


def numba_source(expr: str, n_arrays: int, n_scalars: int, ndim: int) -> str:
    """The Python source of the numba loop kernel for ``expr`` over ``ndim``-D views."""
    arrays = [f"x{j}" for j in range(n_arrays)]
    index = ", ".join(f"i{d}" for d in range(ndim))
    body = []
    for stmt in ast.parse(expr.replace("; ", "\n")).body:
        stmt = ast.fix_missing_locations(_ToElement(arrays, index).visit(stmt))
        line = ast.unparse(stmt)
        if line.startswith("out = "):
            line = f"out[{index}] = " + line[6:]
        body.append(line)
    params = ", ".join(arrays + [f"c{j}" for j in range(n_scalars)] + ["out"])
    lines = [f"def kernel({params}):"]
    for d in range(ndim):
        lines.append("    " * (d + 1) + f"for i{d} in range(out.shape[{d}]):")
    lines += ["    " * (ndim + 1) + b for b in body]
    return _HEADER + "\n".join(lines) + "\n"


def _numba_kernel(expr: str, n_arrays: int, n_scalars: int, ndim: int) -> Callable:
    """Compile (or load from the on-disk cache) the loop kernel for ``expr``."""
    src = numba_source(expr, n_arrays, n_scalars, ndim)
    cache_dir = os.environ.get("NEEDLE_KERNEL_CACHE",
                               os.path.join(os.path.expanduser("~"), ".cache", "needle"))
    os.makedirs(cache_dir, exist_ok=True)
    name = "k_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, name + ".py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(src)
        os.replace(tmp, path)  # atomic: concurrent processes see a whole file
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None  # a .py path always has both
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # numba's on-disk cache finds the function's module by name
        spec.loader.exec_module(mod)
    kernel = mod.kernel
    return lambda args, out: kernel(*args, out)


def _collapse(views: list, out: np.ndarray) -> Tuple[list, np.ndarray]:
    """1-D views when every array is C-contiguous (the common case): one flat loop."""
    if all(not isinstance(v, np.ndarray) or v.flags.c_contiguous for v in views):
        return [v.reshape(-1) if isinstance(v, np.ndarray) else v for v in views], \
            out.reshape(-1)
    return views, out


def kernel_for(expr: str, views: list, out: np.ndarray, engine: Optional[str] = None
               ) -> Callable:
    """The cached callable ``run(views, out)`` evaluating ``expr``."""
    engine = engine or ENGINE
    if engine == "numba" and any(f in expr for f in _TRANSCENDENTAL):
        engine = "numpy"  # numba calls scalar libm here; NumPy's SIMD versions win
    n_arr = sum(isinstance(v, np.ndarray) for v in views)
    key = (engine, expr, n_arr, len(views) - n_arr, out.ndim)
    fn = _CACHE.get(key)
    if fn is None:
        if engine == "numba":
            fn = _numba_kernel(expr, n_arr, len(views) - n_arr, out.ndim)
        else:
            fn = _numpy_kernel(expr)
        _CACHE[key] = fn
    return fn


def fused_elementwise(expr: str, inputs: Sequence[Any], out: Any, shape: Tuple[int, ...],
                      reduce: Optional[Tuple[str, int, int]] = None) -> None:
    """out = expr(inputs) over ``shape``; with ``reduce``, out = reduce(expr) (see module doc).

    ``inputs``: (Array, shape, strides, offset) views of the iteration shape, or scalars
    (NumPy scalars of the compute dtype). ``out``: a compact Array of prod(shape) elements,
    or of prod(shape) / reduce_size with ``reduce``.
    """
    views = _views(inputs)
    if reduce is None:
        target = out.array[: math.prod(shape)].reshape(shape)
        views, target = _collapse(views, target)
        kernel_for(expr, views, target)(views, target)
        return
    op, reduce_size, inner = reduce
    if _blocked_reduce(expr, views, out, shape, op, reduce_size, inner):
        return
    scratch = np.empty(shape, out.array.dtype)
    views, flat = _collapse(views, scratch)
    kernel_for(expr, views, flat)(views, flat)
    _reduce_rows(op, scratch.reshape(-1, reduce_size, inner), out.array.reshape(-1, inner))


def _reduce_rows(op: str, rows: np.ndarray, out: np.ndarray) -> None:
    """``out`` (outer, inner) = ``op`` of ``rows`` (outer, reduce_size, inner) over its middle
    axis, with the NumPy call the ``reduce_*`` primitives make (2-D for inner 1: bit for bit)."""
    ufunc = np.add if op == "sum" else np.maximum
    if rows.shape[2] == 1:
        ufunc.reduce(rows[:, :, 0], axis=1, out=out[:, 0])
    else:
        ufunc.reduce(rows, axis=1, out=out)


def _as_rows(views: list, outer: int, rest: Tuple[int, ...]) -> Optional[list]:
    """The views seen as (outer, *rest) without a copy, or None where that needs one."""
    out = []
    for v in views:
        if isinstance(v, np.ndarray):
            w = v.view()
            try:
                w.shape = (outer,) + rest  # raises instead of copying
            except AttributeError:
                return None
            v = w
        out.append(v)
    return out


def _blocked_reduce(expr: str, views: list, out: Any, shape: Tuple[int, ...], op: str,
                    reduce_size: int, inner: int) -> bool:
    """Map a block of whole rows into a cached scratch and reduce it with NumPy (the same call
    as unfused, so bit for bit; NumPy's SIMD reductions beat a numba loop here). False when a
    view cannot be seen as (outer, reduce_size, inner) without a copy."""
    outer = math.prod(shape) // (reduce_size * inner)
    rows = _as_rows(views, outer, (reduce_size, inner))
    if rows is None:
        return False
    step = max(1, 4 * BLOCK // (reduce_size * inner))  # a 256 KiB float32 scratch: in L2
    scratch = np.empty((min(step, outer), reduce_size, inner), out.array.dtype)
    target = out.array[:outer * inner].reshape(outer, inner)
    kernel = None
    for s in range(0, outer, step):
        n = min(step, outer - s)
        part = scratch[:n]
        block, flat = _collapse([v[s:s + n] if isinstance(v, np.ndarray) else v
                                 for v in rows], part)
        kernel = kernel or kernel_for(expr, block, flat)
        kernel(block, flat)
        _reduce_rows(op, part, target[s:s + n])
    return True
