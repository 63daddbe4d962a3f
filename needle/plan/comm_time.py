"""Per-step communication of a layout: each collective's bytes and messages, and its time.

Messages and bytes are the busiest rank's of the algorithm ``select.choose`` runs, in closed
form (``collective_sends.busiest``: O(1) in the group's size; equal to what ``select.steps``
declares, which is checked against the ledger; 1 MiB pieces not counted; no hosts: never
hierarchical).  Times: alpha-beta (``CostModel.seconds``) on the link the group runs on,
NVLink inside a node, InfiniBand across nodes.

A layout's collectives per step (Megatron-LM, Narayanan et al. SC'21 sec. 3; ZeRO sec. 7):
  dp  : DDP allreduce of the gradients once per step (accumulating locally); ZeRO-1 as
        needle's ZeroRedundancyOptimizer does it, allreduce + allgather of the parameters
        (3 (d-1)/d Psi, 1.5x DDP); ZeRO-2 reduce-scatter + allgather (2 (d-1)/d Psi), the
        reduce-scatter after each of the m microbatches (the full gradient is never kept);
        ZeRO-3 / FSDP 2 allgathers + 1 reduce-scatter (3 (d-1)/d Psi) per microbatch;
  tp  : per layer and microbatch 2 allreduces of s b h in forward and 2 in backward (+2 when
        the forward is recomputed); with SP each is an allgather + reduce-scatter pair, the
        same bytes;
  pp  : per microbatch one activation send forward and one gradient send backward between
        neighbouring stages (v times as many with interleaving; ``pp_sends``), s b h / t
        with SP.
"""
from typing import List, NamedTuple

import numpy as np

from ..parallel.comm.algorithms.cost_model import CostModel
from .cluster import ClusterSpec
from .collective_sends import busiest
from .layout import Layout, Setup
from .model import ModelSpec

__all__ = ["Collective", "collective_bytes", "layout_collectives", "comm_seconds", "step_bytes",
           "pp_sends"]


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


def collective_bytes(name: str, items: int, itemsize: int, p: int) -> int:
    """Payload bytes the busiest rank sends in one call (what its ledger records)."""
    return int(np.max(busiest(name, items, itemsize, p).nbytes, initial=0))


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
    return c.calls * _link(cluster, lay, c.group).seconds(
        busiest(c.name, c.items, c.itemsize, c.p))


def step_bytes(cs: List[Collective]) -> float:
    """Bytes one GPU sends per step."""
    return float(np.sum([c.calls * collective_bytes(c.name, c.items, c.itemsize, c.p)
                         for c in cs]))
