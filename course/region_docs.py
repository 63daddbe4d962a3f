"""What the code says about each exercise: the functions holding its solution regions, and
their docstrings (the spec lives beside the hole; notebooks read it from there).

A region in a class body (a switch the release keeps off) asks nothing of the student, and a
copy of an answer (a fused path's fallback, a tuned step) says so in its docstring with
``COPY_MARK``: the student writes the original, the release stubs the copy.
"""
import ast
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

from .make_student import CUDA_SUFFIXES, ROOT, Region, all_regions

COPY_MARK = "stubbed in the"  # "...: stubbed in the (student) release"


class Asked(NamedTuple):
    """One function a question asks for: its file, qualified name, and docstring (for a
    method, its class's docstring too; for a CUDA kernel, the comment above it)."""

    path: str
    qualname: str
    doc: str
    class_doc: str = ""


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _node(path: Path, qualname: str) -> Optional[ast.AST]:
    node: Optional[ast.AST] = _tree(path)
    for part in qualname.split("."):
        node = next((n for n in ast.iter_child_nodes(node)  # type: ignore[arg-type]
                     if getattr(n, "name", None) == part), None)
    return node


def _python_doc(path: Path, qualname: str) -> Optional[str]:
    """The docstring of def ``qualname`` ('' when it has none); None for a class body."""
    node = _node(path, qualname)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return ast.get_docstring(node) or ""


def _class_doc(path: Path, qualname: str) -> str:
    """The docstring of the class holding method ``qualname`` ('' for a plain function)."""
    owner = qualname.rpartition(".")[0]
    node = _node(path, owner) if owner else None
    return (ast.get_docstring(node) or "") if isinstance(node, ast.ClassDef) else ""


def _cuda_doc(path: Path, begin: int) -> str:
    """The ``//`` comment lines right above the CUDA function whose body holds line ``begin``."""
    lines = path.read_text().splitlines()
    i = begin - 2  # 0-based index of the line above the region
    while i >= 0 and "__global__" not in lines[i] and "__device__" not in lines[i]:
        i -= 1
    i -= 1
    while i >= 0 and lines[i].startswith("template"):
        i -= 1
    comment: List[str] = []
    while i >= 0 and lines[i].startswith("//"):
        comment.insert(0, lines[i][2:].strip())
        i -= 1
    return "\n".join(comment)


def _asked(region: Region, root: Path) -> Optional[Asked]:
    path = root / region.path
    if path.suffix in CUDA_SUFFIXES:
        return Asked(region.path, region.qualname, _cuda_doc(path, region.begin))
    doc = _python_doc(path, region.qualname)
    if doc is None or COPY_MARK in doc:
        return None
    return Asked(region.path, region.qualname, doc, _class_doc(path, region.qualname))


def asked_functions(root: Path = ROOT) -> Dict[str, List[Asked]]:
    """Per exercise, the functions its question asks for, in file and line order."""
    out: Dict[str, List[Asked]] = {}
    for region in all_regions(root):
        asked = _asked(region, root)
        if asked is not None and asked not in out.setdefault(region.exercise, []):
            out[region.exercise].append(asked)
    return out
