"""Imports in needle run one way, down: a scan of every ``import`` in ``needle/``.

Layers, top to bottom: ``apps`` -> ``nn``, ``optim``, ``init``, ``data`` -> ``ops`` ->
``autograd`` -> ``backend_ndarray``; ``backend_cuda`` plugs into ``backend_ndarray`` from above
(it registers the ``"cuda"`` device kind), so the array layer never names it. Every import
counts, the lazy ones inside functions too: a lazy import is still an arrow.
"""
import ast
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, NamedTuple, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEEDLE = ROOT / "needle"

_ABOVE_ARRAYS = frozenset({"autograd", "ops", "nn", "optim", "init", "data", "parallel",
                           "memory", "compiler", "profiler", "plan", "amp", "quant"})
# layer (needle.<name>) -> the layers it must not import
FORBIDDEN: Dict[str, FrozenSet[str]] = {
    "backend_ndarray": _ABOVE_ARRAYS | {"backend_cuda"},  # arrays know no graph, no GPU backend
    "backend_numpy": _ABOVE_ARRAYS | {"backend_cuda"},  # the "np" arrays (NEEDLE_BACKEND=np)
    "backend_selection": _ABOVE_ARRAYS | {"backend_cuda"},
    "backend_cuda": _ABOVE_ARRAYS,  # a backend implements primitives; it knows no graph
    "autograd": frozenset({"ops", "nn", "optim", "data", "parallel"}),  # the engine: no layers
    "ops": frozenset({"nn", "optim", "data", "parallel"}),
    "nn": frozenset({"parallel"}),  # layers know no distribution
    # nn's siblings (the layers' building blocks) know neither the layers nor the tools above
    "optim": frozenset({"nn", "data", "parallel", "memory", "plan"}),
    "data": frozenset({"nn", "optim", "parallel", "memory", "plan"}),  # told its rank, not MPI
    "init": frozenset({"nn", "optim", "data", "parallel", "memory", "plan"}),
}
# Packages beside needle that the library never imports (the library knows no apps).
OUTSIDE = frozenset({"apps", "course", "tests", "tools", "benchmarks"})
# (file, imported layer) -> why the arrow stays. Each must still be found (stale ones fail).
KNOWN_EXCEPTIONS: Dict[Tuple[str, str], str] = {
    ("needle/autograd.py", "ops"): (
        "Tensor's operators (a + b, a @ b, a.sum()) and the backward pass (tuple_get_item, "
        "cast) build ops, as the course's autograd.py does; ops import autograd's Tensor, so "
        "autograd imports ops last, once Tensor exists"),
}


class Arrow(NamedTuple):
    """One import: the importing file and line, and the module it names."""

    where: str
    line: int
    target: str  # dotted, e.g. "needle.backend_cuda._runtime" or "apps.train"


def _module_parts(path: Path) -> Tuple[List[str], bool]:
    """A file's dotted name as parts, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _resolve(node: ast.ImportFrom, parts: List[str], is_pkg: bool) -> List[str]:
    """The dotted modules a ``from ... import ...`` names (relative ones made absolute)."""
    if not node.level:
        return [node.module or ""]
    package = parts if is_pkg else parts[:-1]
    base = package[:len(package) - (node.level - 1)]
    if node.module:  # from ..backend_cuda import x: the module is named
        return [".".join(base + node.module.split("."))]
    return [".".join(base + [alias.name]) for alias in node.names]  # from .. import ops


def arrows(source: str, path: Path) -> Iterator[Arrow]:
    """Every import in ``source`` (module level and inside functions) of the file ``path``."""
    parts, is_pkg = _module_parts(path)
    where = path.relative_to(ROOT).as_posix()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(node, parts, is_pkg)
        else:
            continue
        for target in targets:
            yield Arrow(where, node.lineno, target)


def layer_of(dotted: str) -> str:
    """``needle.ops.ops_mathematic`` -> ``ops``; ``needle.autograd`` -> ``autograd``;
    a module outside needle -> its top-level package."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "needle" and len(parts) > 1 else parts[0]


def violations(arrow: Arrow) -> List[str]:
    """Why ``arrow`` points up (empty when it does not)."""
    source = layer_of(".".join(_module_parts(ROOT / arrow.where)[0]))
    target = layer_of(arrow.target)
    if arrow.target.split(".")[0] in OUTSIDE:
        return [f"needle imports {target} (outside the library)"]
    if arrow.target.split(".")[0] == "needle" and target in FORBIDDEN.get(source, ()):
        return [f"{source} imports {target}"]
    return []


NEEDLE_FILES = sorted(NEEDLE.rglob("*.py"))
ALL_ARROWS = [a for path in NEEDLE_FILES for a in arrows(path.read_text(), path)]
FOUND = [(a, why) for a in ALL_ARROWS for why in violations(a)]  # every upward import


def test_no_import_points_up():
    unexpected = [f"{a.where}:{a.line}: {why} ({a.target})" for a, why in FOUND
                  if (a.where, layer_of(a.target)) not in KNOWN_EXCEPTIONS]
    assert not unexpected, "imports pointing up the layers:\n" + "\n".join(unexpected)


@pytest.mark.parametrize("key", sorted(KNOWN_EXCEPTIONS))
def test_each_known_exception_is_still_there(key):
    found = {(a.where, layer_of(a.target)) for a, _ in FOUND}
    assert key in found, f"{key} no longer imports upward: remove it from KNOWN_EXCEPTIONS"


def test_backend_ndarray_does_not_import_the_cuda_backend():
    """The arrow this file was written for, spelled out (also inside the general table)."""
    mine = [a for a in ALL_ARROWS if a.where.startswith("needle/backend_ndarray/")]
    assert mine, "the scan read no file of needle/backend_ndarray"
    cuda = [a for a in mine if layer_of(a.target) == "backend_cuda"]
    assert not cuda, cuda


def test_the_scan_sees_imports_down_the_layers():
    """The resolver finds the downward arrows everyone knows, so an empty scan means something."""
    seen = {(layer_of(".".join(_module_parts(ROOT / a.where)[0])), layer_of(a.target))
            for a in ALL_ARROWS}
    assert {("nn", "ops"), ("ops", "autograd"), ("autograd", "backend_ndarray"),
            ("backend_cuda", "backend_ndarray"), ("parallel", "nn")} <= seen


@pytest.mark.parametrize("where,source,why", [
    ("needle/backend_ndarray/x.py", "from ..backend_cuda import _runtime\n",
     "backend_ndarray imports backend_cuda"),
    ("needle/backend_ndarray/x.py", "def f():\n    import needle.backend_cuda.dlpack_cuda\n",
     "backend_ndarray imports backend_cuda"),
    ("needle/ops/x.py", "from .. import nn\n", "ops imports nn"),
    ("needle/nn/x.py", "from needle.parallel.comm import Comm\n", "nn imports parallel"),
    ("needle/autograd.py", "from .nn import Module\n", "autograd imports nn"),
    ("needle/optim/x.py", "from apps.train import main\n",
     "needle imports apps (outside the library)"),
    ("needle/data/x.py", "from needle.parallel import devices\n", "data imports parallel"),
])
def test_the_scan_catches_an_upward_import(where, source, why):
    found = [w for a in arrows(source, ROOT / where) for w in violations(a)]
    assert found == [why]


@pytest.mark.parametrize("where,source", [
    ("needle/nn/x.py", "from ..ops import relu\nfrom needle.autograd import Tensor\n"),
    ("needle/backend_cuda/x.py", "from ..backend_ndarray import primitives\n"),
    ("needle/backend_ndarray/x.py", "from . import device\nimport numpy\n"),
])
def test_the_scan_passes_a_downward_import(where, source):
    assert [w for a in arrows(source, ROOT / where) for w in violations(a)] == []
