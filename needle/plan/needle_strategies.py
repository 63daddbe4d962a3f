"""The collectives needle's own data-parallel strategies issue per step, from their bucket rules.

``comm.layout_collectives`` is the textbook count (Psi elements per collective). needle's
``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` pack gradients into buckets
(``assign_buckets``: 25 MiB, DDP's first 1 MiB), append one usage flag per parameter to each
bucket, and pad ZeRO's shards to a multiple of the world size; this module applies the same
rules to a list of parameter sizes, so the bytes it predicts are the ledger's to the byte
(tests/plan/test_comm.py runs the real strategies on the virtual cluster and compares).
"""
from typing import List, Sequence

from ..parallel.data_parallel.buckets import assign_buckets
from .comm import Collective

__all__ = ["needle_collectives", "STRATEGIES"]

STRATEGIES = ("ddp", "zero1", "zero2")
MB = 1024 * 1024


def needle_collectives(sizes: Sequence[int], itemsize: int, strategy: str, p: int,
                       bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0
                       ) -> List[Collective]:
    """One step's collectives of ``strategy`` for parameters of ``sizes`` elements each."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    nbytes = [int(n) * itemsize for n in sizes]
    dtypes = ["x"] * len(sizes)
    out: List[Collective] = []
    if strategy in ("ddp", "zero1"):
        for idx in assign_buckets(nbytes, dtypes, bucket_cap_mb * MB, first_bucket_mb * MB):
            numel = sum(int(sizes[i]) for i in idx)
            out.append(Collective("allreduce", "dp", p, numel + len(idx), itemsize, 1))
    zero_layout = assign_buckets(nbytes, dtypes, bucket_cap_mb * MB, bucket_cap_mb * MB)
    for idx in zero_layout if strategy != "ddp" else []:
        numel = sum(int(sizes[i]) for i in idx)
        cols = -(-numel // p)
        if strategy == "zero2":  # rows = p of (cols + flags): each rank gets one row
            out.append(Collective("reduce_scatter", "dp", p, cols + len(idx), itemsize, 1))
        out.append(Collective("allgather", "dp", p, cols, itemsize, 1))
    return out
