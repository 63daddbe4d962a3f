"""Choosing an algorithm per call from the message size and the rank count.

Like MPICH (R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, Section 4) and Open MPI's "tuned" component, the choice is a
simple table: latency-bound algorithms (few message rounds, more bytes) for small messages,
bandwidth-optimal ones (more rounds, fewest bytes) for large ones.  For allreduce, recursive
doubling costs ``log2(p) * (alpha + N beta)`` and the ring ``2 (p - 1) (alpha + N beta / p)``,
so the crossover grows with the per-message latency ``alpha`` and shrinks with p.  The threshold
below was measured over shared memory with 2 ranks (the figures are in benchmarks/README.md,
"Figures behind constants and docstrings"); re-measure it with
``mpiexec -n P python benchmarks/bench_collectives.py --crossovers``, which prints both
algorithms per size and the value to put here (or in ``NEEDLE_ALLREDUCE_SMALL``).
"""
import os
from typing import Callable, Hashable, Optional, Sequence

from .hierarchical import worthwhile

ALGORITHMS = {
    "allreduce": ("ring", "recursive_doubling", "hierarchical"),
    "allgather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("binomial",),
    "reduce": ("binomial",),
    "alltoall": ("pairwise",),
}

# Allreduce messages up to this many bytes use recursive doubling (override for experiments).
ALLREDUCE_SMALL = int(os.environ.get("NEEDLE_ALLREDUCE_SMALL", 64 * 1024))


def choose(collective: str, nbytes: int, size: int, algorithm: str = "auto",
           hosts: Optional[Callable[[], Sequence[Hashable]]] = None) -> str:
    """The algorithm to run: ``algorithm`` itself when given, else the size-based choice;
    a large allreduce over ranks that share hosts (``hosts()``: each rank's host) is
    hierarchical (``hierarchical.py``)."""
    options = ALGORITHMS[collective]
    if algorithm != "auto":
        if algorithm not in options:
            raise ValueError(f"{collective}: unknown algorithm {algorithm!r}; "
                             f"choose from {options}")
        return algorithm
    if collective == "allreduce":
        if nbytes <= ALLREDUCE_SMALL or size == 1:
            return "recursive_doubling"
        return "hierarchical" if hosts is not None and worthwhile(hosts()) else "ring"
    return options[0]
