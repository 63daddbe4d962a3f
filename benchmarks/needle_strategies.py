"""The collectives needle's own data-parallel strategies issue per step, from their bucket rules.

``comm.layout_collectives`` is the textbook count (Psi elements per collective). needle's
``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` pack gradients into buckets
(``assign_buckets``: 25 MiB, DDP's first 1 MiB), append one usage flag per parameter to each
bucket, and pad ZeRO's shards to a multiple of the world size; this module applies the same
rules to a list of parameter sizes, so the bytes it predicts are the ledger's to the byte
(tests/plan/test_comm.py runs the real strategies on the virtual cluster and compares).
"""
from typing import Any, List, NamedTuple, Sequence, Tuple

from needle.autograd import find_topo_sort
from needle.parallel.comm.algorithms.latency_bound import binomial_broadcast_steps
from needle.parallel.data_parallel.buckets import assign_buckets
from needle.plan.comm_time import Collective, pp_sends, step_bytes

__all__ = ["needle_collectives", "needle_tp_collectives", "needle_pp_collectives",
           "needle_buffer_bytes", "STRATEGIES", "UnitSpan", "fsdp_unit_spans",
           "fsdp_buffer_bytes", "needle_fsdp_collectives"]

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


def needle_fsdp_collectives(units: Sequence[Tuple[int, int]], itemsize: int, p: int
                            ) -> List[Collective]:
    """One step of needle's FullyShardedDataParallel, for units of (elements, parameters).

    Per unit (``parallel/zero/flat_param.py``): an allgather of its ceil(numel / p)-element
    shards in forward and again in backward, and a reduce-scatter of p rows of that many
    columns plus one usage flag per parameter. The textbook's 3 (N-1)/N Psi plus the padding
    and the flags, and 3 calls per unit where the textbook counts 3.
    """
    out: List[Collective] = []
    for numel, nparams in units:
        cols = -(-int(numel) // p)
        out.append(Collective("allgather", "dp", p, cols, itemsize, 2))
        out.append(Collective("reduce_scatter", "dp", p, cols + int(nparams), itemsize, 1))
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
    """One step of needle's PipelineParallel on its busiest stage: activation / gradient sends
    of (b, s, h) per microbatch (``pp_sends``), and its part of the float64 loss broadcast
    from the last stage (a binomial tree: the root sends to ceil(log2 p) stages, a stage that
    forwards it to its children in the tree)."""
    sbh = s * b * h
    if v > 1:  # interleaved: every stage sends both ways; the root's broadcast counted
        return [Collective("send", "pp", p, sbh, itemsize, pp_sends(p, m, v)),
                Collective("broadcast", "pp", p, 1, 8, 1)]
    relays = binomial_broadcast_steps(8, p).msgs.sum(axis=0)  # children, rooted at stage 0
    per_stage = []
    for r in range(p):
        cs = [Collective("send", "pp", p, sbh, itemsize, m * ((r < p - 1) + (r > 0)))]
        if r == p - 1:
            cs.append(Collective("broadcast", "pp", p, 1, 8, 1))
        elif relays[r + 1 - p]:  # relays the loss (from stage p - 1): plain sends
            cs.append(Collective("send", "pp", p, 1, 8, int(relays[r + 1 - p])))
        per_stage.append(cs)
    return max(per_stage, key=step_bytes)


class UnitSpan(NamedTuple):
    """An FSDP unit in one backward: its elements and parameters, and the positions (in the
    order backward visits nodes) where it is gathered and gets its first and last gradient."""

    numel: int
    nparams: int
    gather: int
    first_grad: int
    last_grad: int


def fsdp_unit_spans(loss: Any, units: Sequence[Tuple[Any, Sequence[Any]]]) -> List[UnitSpan]:
    """Each (unit output, unit parameters)'s span in ``loss``'s backward, from the graph.

    Backward visits the reversed topological order (``compute_gradient_of_variables``); FSDP
    gathers a unit when the adjoint reaches the unit's output (a hook there), and a parameter's
    gradient arrives when its leaf is visited, which for a leaf the DFS met early (e.g. a
    LayerNorm weight) is long after the rest of its unit's.
    """
    order = {id(n): i for i, n in enumerate(reversed(find_topo_sort([loss])))}
    spans = []
    for out, params in units:
        pos = [order[id(q)] for q in params if id(q) in order]
        if not pos:
            raise ValueError("fsdp_unit_spans: a unit's parameters are not in the loss's graph")
        numel = sum(int(q.size) for q in params)
        spans.append(UnitSpan(numel, len(params), order[id(out)], min(pos), max(pos)))
    return spans


def fsdp_buffer_bytes(spans: Sequence[UnitSpan], p: int, itemsize: int = 4) -> float:
    """Peak bytes of needle's FSDP buffers over one backward (``parallel/zero/fsdp.py``);
    ``spans`` in the units' forward order.

    Per unit, N = p ranks, cols = ceil(numel / N): the gathered flat parameters (N cols) from
    its gather until its last gradient (then ``free``); the reduce-scatter bucket of N rows of
    cols + one usage flag per parameter from its first gradient to the end of backward; the
    received row (cols + flags) from its launch (buckets launch in backward order, each after
    the ones before it) to the end, while last step's row (the gradient shard) is still held.
    """
    events: List[Tuple[float, float]] = []
    launched = -1.0
    for u in reversed(spans):  # the reducer's buckets: units in reverse forward order
        cols = -(-u.numel // p)
        launched = max(launched, u.last_grad)
        events += [(u.gather, p * cols), (u.last_grad + 0.5, -p * cols),
                   (u.first_grad, p * (cols + u.nparams)), (launched + 0.5, cols + u.nparams)]
    live = peak = 0.0
    for _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak * itemsize
