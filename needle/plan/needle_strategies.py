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
from .comm import Collective, pp_sends

__all__ = ["needle_collectives", "needle_tp_collectives", "needle_pp_collectives",
           "needle_buffer_bytes", "STRATEGIES"]

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


def needle_buffer_bytes(sizes: Sequence[int], itemsize: int, strategy: str, p: int) -> float:
    """Bytes needle's strategy holds beyond the model states at its peak.

    ZeRO-1/2 allgather each bucket's updated parameters into a new buffer (``_allgather``:
    ``empty_host(world * cols)``) while the previous one, which the parameters still view, is
    alive: one more padded copy of the parameters.
    """
    if strategy not in ("zero1", "zero2"):
        return 0.0
    nbytes = [int(n) * itemsize for n in sizes]
    layout = assign_buckets(nbytes, ["x"] * len(sizes), 25.0 * MB, 25.0 * MB)
    return float(sum(p * -(-sum(int(sizes[i]) for i in idx) // p) for idx in layout)
                 * itemsize)


def needle_tp_collectives(layers: int, b: int, s: int, h: int, p: int, m: int = 1,
                          itemsize: int = 4) -> List[Collective]:
    """One step of needle's tensor-parallel char transformer (apps/model_parallel_strategies).

    Per layer and microbatch: forward allreduces after the attention and MLP row-parallel
    layers (2 x s b h); backward the ``copy_to_region`` of the stacked q, k, v inputs (the
    course's attention normalises q, k and v separately: one call of 3 s b h) and of the MLP
    input (s b h). Per microbatch: the vocab-parallel embedding's forward allreduce and the
    column-parallel head's backward one (s b h each), and the vocab-parallel cross entropy's
    three allreduces of s b floats (max, sum of exponentials, target logit).
    """
    sbh = s * b * h
    return [Collective("allreduce", "tp", p, sbh, itemsize, (3 * layers + 2) * m),
            Collective("allreduce", "tp", p, 3 * sbh, itemsize, layers * m),
            Collective("allreduce", "tp", p, s * b, itemsize, 3 * m)]


def needle_pp_collectives(b: int, s: int, h: int, p: int, m: int, v: int = 1,
                          itemsize: int = 4) -> List[Collective]:
    """One step of needle's PipelineParallel: activation / gradient sends of (b, s, h) per
    microbatch (``pp_sends``), then the float64 loss broadcast from the last stage."""
    return [Collective("send", "pp", p, s * b * h, itemsize, pp_sends(p, m, v)),
            Collective("broadcast", "pp", p, 1, 8, 1)]
