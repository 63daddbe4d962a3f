"""Choosing an algorithm per call from the message size and the rank count.

Like MPICH (R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, Section 4) and Open MPI's "tuned" component, the choice is a
simple table: latency-bound algorithms (few message rounds) for small messages, the ring for
large ones.  For allreduce, recursive doubling costs ``log2(p) * (alpha + N beta)`` and the ring
``2 (p - 1) (alpha + N beta / p)``, so the crossover grows with the per-message latency
``alpha`` and shrinks with p.  Recursive doubling allgather and recursive halving
reduce-scatter (p a power of two) move as many bytes as the ring in ``log2 p`` rounds and carry
the argument check inside their messages, but copy the data in and out of their own buffers,
so the ring (which works in place) wins once copying costs more than the rounds it saves.

Each threshold is measured on the machine at hand by ``mpiexec -n P python
benchmarks/bench_collectives.py --crossovers`` (figures behind the defaults:
``benchmarks/README.md``).

``ALGORITHMS`` names each algorithm's ``*_steps``, what it sends, declared beside its
generator: the communicator asks ``choose``; the cost models and the planner ``steps``.
"""
from typing import Callable, Dict, Hashable, Optional, Sequence

from ..engine.args import env_bytes
from ..ledger import Steps
from . import latency_bound as lb
from .hierarchical import hierarchical_allreduce_steps, worthwhile
from .ring import ring_allgather_steps, ring_allreduce_steps, ring_reduce_scatter_steps

# Each collective's algorithms and what each sends, f(nbytes, p or hosts, unit, piece).
ALGORITHMS: Dict[str, Dict[str, Callable[..., Steps]]] = {
    "allreduce": {"ring": ring_allreduce_steps,
                  "recursive_doubling": lb.recursive_doubling_allreduce_steps,
                  "hierarchical": hierarchical_allreduce_steps},
    "allgather": {"ring": ring_allgather_steps,
                  "recursive_doubling": lb.recursive_doubling_allgather_steps},
    "reduce_scatter": {"ring": ring_reduce_scatter_steps,
                       "recursive_halving": lb.recursive_halving_reduce_scatter_steps},
    "broadcast": {"binomial": lb.binomial_broadcast_steps},
    "reduce": {"binomial": lb.binomial_reduce_steps},
    "alltoall": {"pairwise": lb.pairwise_alltoall_steps},
}

# Allreduce messages up to this many bytes use recursive doubling (override for experiments).
ALLREDUCE_SMALL = env_bytes("NEEDLE_ALLREDUCE_SMALL", 64 * 1024)
# Allgathers with an output up to this many bytes use recursive doubling when p is a power of
# two (its messages carry the argument check; the ring's copies are fewer for large outputs).
ALLGATHER_SMALL = env_bytes("NEEDLE_ALLGATHER_SMALL", 64 * 1024)
# Reduce-scatters with an input up to this many bytes use recursive halving (p a power of two).
REDUCE_SCATTER_SMALL = env_bytes("NEEDLE_REDUCE_SCATTER_SMALL", 64 * 1024)
# The algorithms that need a power-of-two number of ranks.
POWER_OF_TWO = {("allgather", "recursive_doubling"), ("reduce_scatter", "recursive_halving")}

def choose(collective: str, nbytes: int, size: int, algorithm: str = "auto",
           hosts: Optional[Callable[[], Sequence[Hashable]]] = None) -> str:
    """The algorithm to run: ``algorithm`` itself when given, else the size-based choice;
    a large allreduce over ranks that share hosts (``hosts()``: each rank's host) is
    hierarchical (``hierarchical.py``)."""
    options = tuple(ALGORITHMS[collective])
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


def steps(collective: str, algorithm: str, nbytes: int, p: int, unit: int = 1, piece: int = 0,
          nodes: Optional[Sequence[Hashable]] = None) -> Steps:
    """What one call by ``algorithm`` (``"auto"``: ``choose``'s) sends (``unit``: where segments
    are cut, an item or a row; ``piece``: ``chunk_bytes`` in whole items, 0: unsplit)."""
    algorithm = choose(collective, nbytes, p, algorithm, (lambda: nodes) if nodes else None)
    ranks = (nodes or [0] * p) if algorithm == "hierarchical" else p  # hierarchical: the hosts
    return ALGORITHMS[collective][algorithm](nbytes, ranks, unit, piece)
