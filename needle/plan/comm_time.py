"""Per-step communication of a layout: each collective's bytes and messages, and its time.

Bytes per rank are those ``needle.parallel.comm`` sends and its ledger records (checked against
the ledger in tests/plan/test_comm.py): a ring allreduce of n items cut into p near-equal
segments (``chunk_bounds``) sends every segment but two, ``2 (p - 1) / p N`` when p divides n;
recursive doubling (messages up to ``select.ALLREDUCE_SMALL`` bytes) sends N per round,
log2 p rounds plus one for ranks outside the largest power of two; ring allgather and
reduce-scatter send ``(p - 1)`` pieces. Times use the alpha-beta model (``CostModel``) with the
link the group runs on: NVLink inside a node, InfiniBand across nodes.

A layout's collectives per step (Megatron-LM, Narayanan et al. SC'21 sec. 3; ZeRO sec. 7):
  dp  : DDP allreduce of the gradients once per step (accumulating locally); ZeRO-1 as
        needle's ZeroRedundancyOptimizer does it, allreduce + allgather of the parameters
        (3 (d-1)/d Psi, 1.5x DDP); ZeRO-2
        reduce-scatter + allgather (2 (d-1)/d Psi), the reduce-scatter after each of the m
        microbatches (the full gradient is never kept); ZeRO-3 / FSDP 2 allgathers + 1
        reduce-scatter (3 (d-1)/d Psi) per microbatch;
  tp  : per layer and microbatch 2 allreduces of s b h in forward and 2 in backward (+2 when
        the forward is recomputed); with SP each is an allgather + reduce-scatter pair, the
        same bytes;
  pp  : per microbatch one activation send forward and one gradient send backward between
        neighbouring stages (v times as many with interleaving; ``pp_sends``), s b h / t
        with SP.
"""
from typing import List, NamedTuple

import numpy as np

from ..parallel.comm.cost_model import CostModel
from ..parallel.comm.reference import chunk_bounds
from ..parallel.comm.select import ALLREDUCE_SMALL
from .cluster import ClusterSpec
from .layout import Layout, Setup
from .model import ModelSpec

__all__ = ["Collective", "collective_bytes", "collective_messages", "layout_collectives",
           "comm_seconds", "step_bytes", "pp_sends"]


class Collective(NamedTuple):
    """``calls`` calls of collective ``name`` on group ``group`` (size ``p``) of ``items`` x
    ``itemsize`` bytes each; ``overlap`` names the compute it can hide behind, if any."""

    name: str
    group: str
    p: int
    items: int
    itemsize: int
    calls: float
    overlap: str = ""


def _rd_rounds(p: int) -> int:
    pof2 = 1 << (p.bit_length() - 1)
    return (pof2.bit_length() - 1) + (1 if p != pof2 else 0)


def collective_bytes(name: str, items: int, itemsize: int, p: int) -> int:
    """Payload bytes the busiest rank sends in one call (what its ledger records)."""
    if p == 1:
        return 0
    n = int(items)
    if name == "allreduce":
        if n * itemsize <= ALLREDUCE_SMALL:
            return _rd_rounds(p) * n * itemsize
        b = chunk_bounds(n, p)
        seg = [b[i + 1] - b[i] for i in range(p)]
        return max(2 * n - seg[(r + 1) % p] - seg[(r + 2) % p] for r in range(p)) * itemsize
    if name in ("allgather", "reduce_scatter"):   # n items per rank's piece
        return (p - 1) * n * itemsize
    if name == "send":
        return n * itemsize
    if name == "broadcast":   # binomial tree: the root sends to ceil(log2 p) children
        return (p - 1).bit_length() * n * itemsize
    raise ValueError(f"unknown collective {name!r}")


def collective_messages(name: str, items: int, itemsize: int, p: int) -> int:
    """Messages the busiest rank sends in one call (unchunked; large pieces may be split)."""
    if p == 1:
        return 0
    if name == "allreduce":
        return _rd_rounds(p) if items * itemsize <= ALLREDUCE_SMALL else 2 * (p - 1)
    if name == "broadcast":
        return (p - 1).bit_length()
    return 1 if name == "send" else p - 1


def layout_collectives(spec: ModelSpec, lay: Layout, setup: Setup) -> List[Collective]:
    """Every collective one GPU takes part in during one training step."""
    out: List[Collective] = []
    e = 2 if setup.precision == "mixed" else 4
    psi = int(round(spec.num_params / (lay.tp * lay.pp)))
    m = setup.batch // (lay.dp * lay.microbatch) if setup.batch % (lay.dp * lay.microbatch) \
        == 0 else 1
    if lay.dp > 1:
        shard = -(-psi // lay.dp)
        ov = "backward" if lay.pp == 1 else ""
        if lay.zero == 0:
            out.append(Collective("allreduce", "dp", lay.dp, psi, e, 1, ov))
        elif lay.zero == 1:
            out += [Collective("allreduce", "dp", lay.dp, psi, e, 1, ov),
                    Collective("allgather", "dp", lay.dp, shard, e, 1)]
        elif lay.zero == 2:   # gradients are sharded: reduced after every microbatch
            out += [Collective("reduce_scatter", "dp", lay.dp, shard, e, m, ov),
                    Collective("allgather", "dp", lay.dp, shard, e, 1)]
        else:                 # parameters are sharded: gathered for every microbatch
            out += [Collective("allgather", "dp", lay.dp, shard, e, m, "forward"),
                    Collective("allgather", "dp", lay.dp, shard, e, m, "backward"),
                    Collective("reduce_scatter", "dp", lay.dp, shard, e, m, "backward")]
    if not spec.is_transformer:
        return out
    sbh = spec.seq * lay.microbatch * spec.hidden
    if lay.tp > 1:
        per = (6 if lay.recompute == "full" else 4) * spec.layers // lay.pp * m
        if lay.sp:
            out += [Collective("allgather", "tp", lay.tp, sbh // lay.tp, e, per),
                    Collective("reduce_scatter", "tp", lay.tp, sbh // lay.tp, e, per)]
        else:
            out.append(Collective("allreduce", "tp", lay.tp, sbh, e, per))
    if lay.pp > 1:
        n = sbh // lay.tp if lay.sp else sbh
        out.append(Collective("send", "pp", lay.pp, n, e, pp_sends(lay.pp, m, lay.chunks),
                              "pipeline"))
    return out


def pp_sends(p: int, m: int, v: int = 1) -> int:
    """Sends of the busiest stage per step: a middle stage sends each of its v chunks' outputs
    forward and input gradients backward (2 m v); with 2 stages the ends send one way per
    chunk boundary (m (2 v - 1))."""
    return m * (2 * v - 1) if p == 2 else 2 * m * v


def _link(cluster: ClusterSpec, lay: Layout, group: str) -> CostModel:
    """Intra-node when the group's ranks share a node (ranks ordered tp fastest, then pp, dp)."""
    span = {"tp": lay.tp, "pp": lay.tp * lay.pp, "dp": lay.gpus}[group]
    if span <= cluster.gpus_per_node:
        return CostModel(cluster.intra_alpha, cluster.intra_beta)
    return CostModel(cluster.inter_alpha, cluster.inter_beta)


def comm_seconds(c: Collective, cluster: ClusterSpec, lay: Layout) -> float:
    """Alpha-beta seconds of all ``calls`` of ``c`` (the busiest rank's sends)."""
    link = _link(cluster, lay, c.group)
    msgs = collective_messages(c.name, c.items, c.itemsize, c.p)
    return c.calls * (msgs * link.alpha + collective_bytes(c.name, c.items, c.itemsize, c.p)
                      * link.beta)


def step_bytes(cs: List[Collective]) -> float:
    """Bytes one GPU sends per step."""
    return float(np.sum([c.calls * collective_bytes(c.name, c.items, c.itemsize, c.p)
                         for c in cs]))
