"""What the CUDA backend asks of CuPy, counted at the emulator's CuPy surface: kernel launches,
CuPy library calls (cuBLAS, ufuncs, reductions, gathers), device allocations, host-device copies,
host synchronisations and CUDA graph launches (``graph.py``: the work inside a graph is not
counted again), each by name. These counts depend on a program's structure, not on
its sizes or the card, so a GPU step's counts are read on a laptop.

``with counting() as c:`` collects them; ``set_execute(False)`` skips the kernels' bodies (the
launch is still checked and counted), so that a step's host time is the host's alone.
"""
import contextlib
from collections import Counter
from typing import Dict, Iterator, Optional

KINDS = ("launch", "library", "alloc", "h2d", "d2h", "sync", "graph")
_ACTIVE: Optional["Counts"] = None
_EXECUTE = [True]
_QUIET = [0]  # > 0 inside the emulator's own use of what it counts


class Counts:
    """Per kind, a Counter of names (a kernel's name, a CuPy function's, ...)."""

    def __init__(self) -> None:
        self.by_kind: Dict[str, Counter] = {k: Counter() for k in KINDS}

    def total(self, kind: str) -> int:
        """How many events of ``kind`` were counted."""
        return sum(self.by_kind[kind].values())

    def totals(self) -> Dict[str, int]:
        """kind -> count."""
        return {k: self.total(k) for k in KINDS}


def record(kind: str, name: str) -> None:
    """Count one ``kind`` event named ``name`` (a no-op unless ``counting()`` is open)."""
    if _ACTIVE is not None and not _QUIET[0]:
        _ACTIVE.by_kind[kind][name] += 1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Count nothing inside: the emulator's own work behind one counted call."""
    _QUIET[0] += 1
    try:
        yield
    finally:
        _QUIET[0] -= 1


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count every CuPy event inside the block (blocks do not nest)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("counting() blocks do not nest: one is already open")
    _ACTIVE = Counts()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = None


def set_execute(on: bool) -> None:
    """Run kernel bodies (True, the default) or skip them (False: results are garbage)."""
    _EXECUTE[0] = bool(on)


def executing() -> bool:
    """Whether kernel bodies run."""
    return _EXECUTE[0]
