"""Choosing an algorithm per call from the message size and the rank count.

Like MPICH (R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, Section 4) and Open MPI's "tuned" component, the choice is a
simple table: latency-bound algorithms (few message rounds, more bytes) for small messages,
bandwidth-optimal ones (more rounds, fewest bytes) for large ones.  For allreduce, recursive
doubling costs ``log2(p) * (alpha + N beta)`` and the ring ``2 (p - 1) (alpha + N beta / p)``,
so the crossover grows with the per-message latency ``alpha`` and shrinks with p.  The threshold
below comes from shared memory, 2 ranks, on the 2-core development machine (recursive doubling
21 us against the ring's 49 us at 64 KiB at low load; under heavy load in issue 25 the two tied
at 256 KiB and the ring won from 1 MiB, so 64 KiB is kept until a quiet re-measurement);
re-measure it with ``mpiexec -n P python benchmarks/bench_collectives.py --crossovers``, which
prints both algorithms per size and the value to put here (or in ``NEEDLE_ALLREDUCE_SMALL``).
"""
import os
from typing import Callable, Hashable, Optional, Sequence

from .hierarchical import worthwhile

ALGORITHMS = {
    "allreduce": ("ring", "recursive_doubling", "hierarchical"),
    "allgather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring", "recursive_halving"),
    "broadcast": ("binomial",),
    "reduce": ("binomial",),
    "alltoall": ("pairwise",),
}

# Allreduce messages up to this many bytes use recursive doubling (override for experiments).
ALLREDUCE_SMALL = int(os.environ.get("NEEDLE_ALLREDUCE_SMALL", 64 * 1024))
# Allgathers with an output up to this many bytes use recursive doubling when p is a power of
# two (its messages carry the argument check; the ring's copies are fewer for large outputs).
ALLGATHER_SMALL = int(os.environ.get("NEEDLE_ALLGATHER_SMALL", 1 << 20))
# Reduce-scatters with an input up to this many bytes use recursive halving (p a power of two).
REDUCE_SCATTER_SMALL = int(os.environ.get("NEEDLE_REDUCE_SCATTER_SMALL", 1 << 20))
# The algorithms that need a power-of-two number of ranks.
POWER_OF_TWO = {("allgather", "recursive_doubling"), ("reduce_scatter", "recursive_halving")}


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
        if (collective, algorithm) in POWER_OF_TWO and size & (size - 1):
            raise ValueError(f"{collective}: {algorithm} needs a power-of-two number of "
                             f"ranks, not {size}")
        return algorithm
    if collective == "allreduce":
        if nbytes <= ALLREDUCE_SMALL or size == 1:
            return "recursive_doubling"
        return "hierarchical" if hosts is not None and worthwhile(hosts()) else "ring"
    if collective in ("allgather", "reduce_scatter") and size > 1 and size & (size - 1) == 0:
        limit = ALLGATHER_SMALL if collective == "allgather" else REDUCE_SCATTER_SMALL
        if nbytes <= limit:  # the latency-bound algorithm, its check in its messages
            return options[1]
    return options[0]
