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

``ALGORITHMS`` is the one table of the algorithms (``Row``): the communicator runs what
``choose`` names (its glue per name: ``engine/collectives.py``); the cost models and the
planner price what ``steps`` says.
"""
from typing import Callable, Dict, FrozenSet, Hashable, NamedTuple, Optional, Sequence

from ..engine.args import env_bytes
from . import latency_bound as lb
from .hierarchical import hierarchical_allreduce_steps, worthwhile
from .ring import ring_allgather_steps, ring_allreduce_steps, ring_reduce_scatter_steps
from .steps import Steps

# Allreduce messages up to this many bytes use recursive doubling (override for experiments).
ALLREDUCE_SMALL = env_bytes("NEEDLE_ALLREDUCE_SMALL", 64 * 1024)
# Allgathers with an output up to this many bytes use recursive doubling when p is a power of
# two (its messages carry the argument check; the ring's copies are fewer for large outputs).
ALLGATHER_SMALL = env_bytes("NEEDLE_ALLGATHER_SMALL", 64 * 1024)
# Reduce-scatters with an input up to this many bytes use recursive halving (p a power of two).
REDUCE_SCATTER_SMALL = env_bytes("NEEDLE_REDUCE_SCATTER_SMALL", 64 * 1024)


class Row(NamedTuple):
    """One collective's algorithms: ``steps`` by name (what each sends, f(nbytes, p or hosts,
    unit, piece)); ``choose`` takes ``small`` up to ``limit`` bytes (or on one rank), else
    ``hosts`` over ranks that share hosts, else ``default``; ``power_of_two``: needs 2^k ranks."""

    steps: Dict[str, Callable[..., Steps]]
    default: str
    small: str = ""
    limit: int = 0
    power_of_two: FrozenSet[str] = frozenset()
    hosts: str = ""


RD, RH = "recursive_doubling", "recursive_halving"
ALGORITHMS: Dict[str, Row] = {
    "allreduce": Row({"ring": ring_allreduce_steps, RD: lb.recursive_doubling_allreduce_steps,
                      "hierarchical": hierarchical_allreduce_steps},
                     "ring", RD, ALLREDUCE_SMALL, hosts="hierarchical"),
    "allgather": Row({"ring": ring_allgather_steps, RD: lb.recursive_doubling_allgather_steps},
                     "ring", RD, ALLGATHER_SMALL, frozenset({RD})),
    "reduce_scatter": Row({"ring": ring_reduce_scatter_steps,
                           RH: lb.recursive_halving_reduce_scatter_steps},
                          "ring", RH, REDUCE_SCATTER_SMALL, frozenset({RH})),
    "broadcast": Row({"binomial": lb.binomial_broadcast_steps}, "binomial"),
    "reduce": Row({"binomial": lb.binomial_reduce_steps}, "binomial"),
    "alltoall": Row({"pairwise": lb.pairwise_alltoall_steps}, "pairwise"),
}


def choose(collective: str, nbytes: int, size: int, algorithm: str = "auto",
           hosts: Optional[Callable[[], Sequence[Hashable]]] = None) -> str:
    """The algorithm to run: ``algorithm`` itself when given, else the size-based choice;
    a large allreduce over ranks that share hosts (``hosts()``: each rank's host) is
    hierarchical (``hierarchical.py``)."""
    row = ALGORITHMS[collective]
    if algorithm != "auto":
        if algorithm not in row.steps:
            raise ValueError(f"{collective}: unknown algorithm {algorithm!r}; "
                             f"choose from {tuple(row.steps)}")
        if algorithm in row.power_of_two and size & (size - 1):
            raise ValueError(f"{collective}: {algorithm} needs a power-of-two number of "
                             f"ranks, not {size}")
        return algorithm
    fits = row.small not in row.power_of_two or (size > 1 and size & (size - 1) == 0)
    if row.small and fits and (nbytes <= row.limit or size == 1):
        return row.small  # latency-bound: few rounds, its check in its messages
    if row.hosts and hosts is not None and worthwhile(hosts()):
        return row.hosts
    return row.default


def steps(collective: str, algorithm: str, nbytes: int, p: int, unit: int = 1, piece: int = 0,
          nodes: Optional[Sequence[Hashable]] = None) -> Steps:
    """What one call by ``algorithm`` (``"auto"``: ``choose``'s) sends (``unit``: where segments
    are cut, an item or a row; ``piece``: ``chunk_bytes`` in whole items, 0: unsplit)."""
    algorithm = choose(collective, nbytes, p, algorithm, (lambda: nodes) if nodes else None)
    ranks = (nodes or [0] * p) if algorithm == "hierarchical" else p  # hierarchical: the hosts
    return ALGORITHMS[collective].steps[algorithm](nbytes, ranks, unit, piece)
