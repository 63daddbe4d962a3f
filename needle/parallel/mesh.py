"""A process mesh: the world's ranks as a (dp, pp, tp) grid, tp fastest (neighbours share the
chattiest traffic); every 3D-parallel group is split from it (Narayanan et al., SC 2021)."""
from typing import Tuple

from .comm.agree import agree
from .comm.protocol import Comm

__all__ = ["ProcessMesh"]


class ProcessMesh:
    """Sub-communicators ``.dp``, ``.pp``, ``.tp`` of ``comm`` arranged as a (dp, pp, tp) grid."""

    def __init__(self, comm: Comm, dp: int = 1, pp: int = 1, tp: int = 1) -> None:
        for name, n in (("dp", dp), ("pp", pp), ("tp", tp)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"ProcessMesh: {name} must be a positive int, got {n!r}")
        if dp * pp * tp != comm.size:
            raise ValueError(f"ProcessMesh: dp * pp * tp = {dp} * {pp} * {tp} = {dp * pp * tp} "
                             f"does not equal the world size {comm.size}")
        # Ranks that view the world as different grids would split it into groups that do not
        # match (collectives between strangers, or silently wrong sums): agree on it first.
        agree(comm, "ProcessMesh", {"dp": dp, "pp": pp, "tp": tp})
        self.world = comm
        self.shape: Tuple[int, int, int] = (dp, pp, tp)
        self.dp_rank, self.pp_rank, self.tp_rank = self.coords(comm.rank)
        d, p, t = self.dp_rank, self.pp_rank, self.tp_rank
        # Three collective splits, in the same order on every rank.
        self.tp = comm.split(color=d * pp + p, key=t)   # same (dp, pp): varies tp
        self.pp = comm.split(color=d * tp + t, key=p)   # same (dp, tp): varies pp
        self.dp = comm.split(color=p * tp + t, key=d)   # same (pp, tp): varies dp

    def coords(self, rank: int) -> Tuple[int, int, int]:
        """(dp, pp, tp) coordinates of a world rank."""
        dp, pp, tp = self.shape
        return rank // (pp * tp), (rank // tp) % pp, rank % tp

    def __repr__(self) -> str:
        dp, pp, tp = self.shape
        return (f"ProcessMesh(dp={dp}, pp={pp}, tp={tp}; rank {self.world.rank} at "
                f"{self.coords(self.world.rank)})")
