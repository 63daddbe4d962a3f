"""No import circles in ``needle/`` but the two the course's API needs: every import (lazy ones
inside functions too: ``test_layers_imports.arrows``) is an arrow between modules, and the
strongly connected components of that graph are single modules, except

- ``autograd`` and ``ops``: Tensor's operators build ops, ops build Tensors (the course's
  autograd.py imports ops last, once Tensor exists);
- the NDArray core: ``ndarray``, ``device``, ``functions`` and ``dlpack`` (an NDArray names its
  device, a device makes NDArrays, functions and DLPack take and give both).
"""
import sys
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_layers_imports as layers  # noqa: E402

ALLOWED = [
    {"needle.autograd", "needle.ops", *(f"needle.ops.{m}" for m in (
        "ops_conv", "ops_dropout", "ops_indexing", "ops_logarithmic", "ops_mathematic",
        "ops_norm", "ops_reduce", "ops_tuple"))},
    {f"needle.backend_ndarray.{m}" for m in ("ndarray", "device", "functions", "dlpack")},
]


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT / "needle") -> Dict[str, Set[str]]:
    """module -> the modules of ``root`` it imports (a package's import of itself aside)."""
    files = sorted(root.rglob("*.py"))
    names = {_name(p, root.parent) for p in files}
    graph: Dict[str, Set[str]] = {}
    for path in files:
        me, targets = _name(path, root.parent), set()
        for arrow in layers.arrows(path.read_text(), path):
            t = arrow.target
            while t and t not in names:  # `from pkg import name`: the module or its package
                t = t.rpartition(".")[0]
            if t and t != me and not me.startswith(t + "."):
                targets.add(t)
        graph[me] = targets
    return graph


def reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """Every module an import chain from ``start`` reaches."""
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """The circles: sets of more than one module that each reach all the others."""
    reach = {v: reachable(graph, v) for v in graph}
    out: List[Set[str]] = []
    for v in sorted(graph):
        comp = {w for w in reach[v] if v in reach.get(w, ())} | {v}
        if len(comp) > 1 and comp not in out:
            out.append(comp)
    return out


def test_needle_has_no_import_circle_but_the_courses_two():
    found = cycles(import_graph())
    extra = [sorted(c) for c in found if c not in ALLOWED]
    assert not extra, f"import circles: {extra}"
    assert all(any(c == a for c in found) for a in ALLOWED), \
        "an allowed circle is gone: shrink ALLOWED"


def test_the_scan_finds_a_planted_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "needle"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import g\n")  # lazy: still an arrow
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("from needle.sub.a import f\n")
    (pkg / "sub" / "d.py").write_text("from .a import f\n")
    monkeypatch.setattr(layers, "ROOT", tmp_path)  # where arrows() reads dotted names from
    found = cycles(import_graph(pkg))
    assert found == [{"needle.sub.a", "needle.sub.b", "needle.sub.c"}]
