"""CuPy's surface as needle sees it: real CuPy's signatures, the stand-in's public names, and
the backend's direct CuPy calls (read from the source), for ``test_cupy_contract.py``.

CuPy's Cython objects have no ``inspect.signature``; their docstrings start with one
(``RawModule(str code=None, *, str path=None, ...)``), which ``signature_of`` parses with the
Cython types dropped.
"""
import ast
import importlib
import inspect
import re
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
# The files that call CuPy (through ``cp = cupy_module()`` and friends); the emulator is the
# stand-in itself and compile_check.py calls NVRTC without CuPy.
BACKEND_FILES = sorted(
    p for p in (ROOT / "needle" / "backend_cuda").glob("*.py") if p.name != "compile_check.py")
# The local names the backend binds CuPy's modules to -> the real module
ROOTS = {"cp": "cupy", "cupyx": "cupyx", "cublas": "cupy_backends.cuda.libs.cublas"}
# Stand-in names whose real home is not ``cupy.<same name>``
REAL_HOME = {"Device": "cupy.cuda.Device", "MemoryPool": "cupy.cuda.MemoryPool",
             "MemoryPointer": "cupy.cuda.MemoryPointer", "cupyx": "cupyx",
             "cublas": "cupy_backends.cuda.libs.cublas"}
# Dunder methods of stand-in classes that the backend relies on (the rest are NumPy's)
DUNDERS = ("__call__", "__enter__", "__exit__", "__add__")
_CYTHON_TYPE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:\s*\*)?\s+)+(?=\**[A-Za-z_]\w*\s*(?:=|$))")


class Use(NamedTuple):
    """One place the backend names CuPy: ``cp.take(a, i, axis=0, out=o)`` at file:line."""

    where: str
    name: str  # the real dotted name, e.g. "cupy.take"
    npos: Optional[int]  # positional arguments of a call (None: not a call, or *args)
    keywords: Tuple[str, ...]


def _split_params(text: str) -> List[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in parts + [cur] if p.strip()]


def _from_doc(obj: Any) -> Optional[inspect.Signature]:
    first = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"^[\w.]+\((.*)\)\s*(->.*)?$", first[0]) if first else None
    if m is None:
        return None
    text = m.group(1).replace("\\*", "*")  # reST-escaped stars in ufunc docstrings
    params = ", ".join(_CYTHON_TYPE.sub("", p) for p in _split_params(text))
    try:
        tree = ast.parse(f"def f({params}): pass")
    except SyntaxError:  # a docstring whose first line is not a signature
        return None
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = fn.args  # defaults become None: only their presence matters here
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    ns: Dict[str, Any] = {}
    exec(compile(ast.fix_missing_locations(tree), "<signature>", "exec"), ns)  # noqa: S102
    return inspect.signature(ns["f"])


def signature_of(obj: Any) -> Optional[inspect.Signature]:
    """``obj``'s signature without ``self`` (from its Cython docstring if need be), or None."""
    try:
        sig: Optional[inspect.Signature] = inspect.signature(obj)
    except (TypeError, ValueError):
        sig = _from_doc(obj)
    if sig is None:
        return None
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return sig.replace(parameters=params)


def resolve(dotted: str) -> Any:
    """The object at ``dotted`` ("cupy.cuda.Device"), importing its module; ImportError or
    AttributeError when it is not there."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module for {dotted}")


def real_name(stand_in_path: str) -> str:
    """The real dotted name of the stand-in's ``path`` ("ndarray.get" -> "cupy.ndarray.get")."""
    head, _, rest = stand_in_path.partition(".")
    home = REAL_HOME.get(head, "cupy." + head)
    return home + ("." + rest if rest else "")


def stand_in_surface(fake: types.ModuleType) -> Dict[str, Any]:
    """Every public name the stand-in offers: module functions and classes, their public
    methods and properties, and the names inside its namespaces (``cuda.runtime...``)."""
    package = fake.__name__.rsplit(".", 1)[0]
    own = {fake.__name__, package + ".elementwise", package + ".graph"}
    numpy_names = set(getattr(fake, "_NUMPY_FUNCTIONS", ()))
    out: Dict[str, Any] = {}

    def walk(prefix: str, items: Dict[str, Any], members: bool = False) -> None:
        for name, obj in items.items():
            if name.startswith("_") and name not in DUNDERS:
                continue
            path = prefix + name
            if isinstance(obj, types.SimpleNamespace):
                walk(path + ".", vars(obj))
            elif members or name in numpy_names or getattr(obj, "__module__", None) in own:
                out[path] = obj
                if inspect.isclass(obj):
                    walk(path + ".", vars(obj), members=True)
            elif prefix and callable(obj):  # a lambda inside a namespace
                out[path] = obj
    walk("", vars(fake))
    return out


_KIND = inspect.Parameter
_POSITIONAL = (_KIND.POSITIONAL_ONLY, _KIND.POSITIONAL_OR_KEYWORD)
_VAR = (_KIND.VAR_POSITIONAL, _KIND.VAR_KEYWORD)


def _positional_mismatches(fake: inspect.Signature, real: inspect.Signature,
                           matched: set) -> List[str]:
    """Positional parameters: same name at the same place, optional only where CuPy's is."""
    real_pos = [p for p in real.parameters.values() if p.kind in _POSITIONAL]
    fake_pos = [p for p in fake.parameters.values() if p.kind in _POSITIONAL]
    takes_star = any(p.kind == _KIND.VAR_POSITIONAL for p in real.parameters.values())
    why = []
    for i, p in enumerate(fake_pos):
        if i >= len(real_pos):
            if not takes_star:
                why.append(f"the stand-in takes {len(fake_pos)} positional arguments, CuPy "
                           f"{len(real_pos)}")
            break
        r = real_pos[i]
        matched.add(r.name)
        if r.name != p.name and p.kind == _KIND.POSITIONAL_OR_KEYWORD:
            why.append(f"argument {i} is {p.name!r} in the stand-in, {r.name!r} in CuPy")
        if p.default is not p.empty and r.default is r.empty:
            why.append(f"{p.name!r} is optional in the stand-in, required in CuPy")
    return why


def incompatibilities(fake: inspect.Signature, real: inspect.Signature) -> List[str]:
    """Why a call that the stand-in accepts could fail on CuPy (empty when none)."""
    matched: set = set()
    why = _positional_mismatches(fake, real, matched)
    real_kinds = {p.kind for p in real.parameters.values()}
    for p in fake.parameters.values():
        if p.kind == _KIND.KEYWORD_ONLY:
            matched.add(p.name)
            if p.name not in real.parameters and _KIND.VAR_KEYWORD not in real_kinds:
                why.append(f"keyword {p.name!r} of the stand-in is not a CuPy parameter")
        elif p.kind in _VAR and p.kind not in real_kinds:
            why.append(f"the stand-in takes {p}, CuPy does not")
    why += [f"CuPy requires {r.name!r}, which the stand-in lacks"
            for r in real.parameters.values()
            if r.default is r.empty and r.name not in matched and r.kind not in _VAR]
    return why


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in ROOTS and parts:
        return ".".join([ROOTS[node.id]] + parts[::-1])
    return None


def backend_uses() -> Iterator[Use]:
    """Every ``cp.X...`` / ``cupyx.X`` / ``cublas.X`` the backend names, with its call shape."""
    for path in BACKEND_FILES:
        tree = ast.parse(path.read_text())
        called = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func):
                called.add(id(node.func))
                star = any(isinstance(a, ast.Starred) for a in node.args) or any(
                    k.arg is None for k in node.keywords)
                yield Use(f"{path.relative_to(ROOT)}:{node.lineno}", str(_dotted(node.func)),
                          None if star else len(node.args),
                          tuple(str(k.arg) for k in node.keywords if k.arg))
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            name = _dotted(node) if isinstance(node, ast.Attribute) else None
            if name and id(node) not in called | inner and not isinstance(node.ctx, ast.Store):
                yield Use(f"{path.relative_to(ROOT)}:{node.lineno}", name, None, ())
