"""Hierarchical (topology-aware) allreduce: reduce-scatter within a host, allreduce across hosts,
allgather within a host.

When ranks share hosts, the link between hosts is the slow one.  The flat ring on p = H x L
ranks (H hosts, L ranks each, placed host by host) sends ``2 (p - 1) / p * N`` bytes over each
host link in each direction; the hierarchical scheme sends ``2 (H - 1) / H * N``: first the L
ranks of a host reduce-scatter the array among themselves (local rank l holds the host's sum of
segment l, N / L bytes), then the L ranks with local index l, one per host, allreduce their
segment over the host links (all L of those rings run at once, each on N / L bytes), then each
host allgathers its segments.  At 2 hosts x 2 ranks that is N against 1.5 N on the link: the
link-bound limit of the speedup is 1.5x.  This is the scheme of NCCL's and Horovod's
hierarchical allreduce (A. Sergeev and M. Del Balso, "Horovod: fast and easy distributed deep
learning in TensorFlow", arXiv:1802.05799, 2018; also P. Goyal et al., "Accurate, large
minibatch SGD", arXiv:1706.02677, 2017, Section 4 and its appendix).

Naive version first: ``hierarchical_allreduce_reference`` is the pure function over a list of
per-rank arrays built from ``reference.py``'s pieces; ``hierarchical_allreduce`` is the same
schedule over point-to-point messages built from ``ring.py``'s generators, and is tested against
the pure one bit for bit.  ``nodes[r]`` names rank r's host (any hashable value); every host
must hold the same number of ranks.
"""
from typing import Any, Hashable, List, Optional, Sequence, Tuple, cast

import numpy as np

from ..progress import Algorithm, Channel
from . import ring
from .reference import chunk_bounds, finish_avg, reduce_scatter_segments, ring_allreduce
from .steps import Steps, segment_bytes


def host_groups(nodes: Sequence[Hashable]) -> List[List[int]]:
    """The ranks of each host, hosts in order of their first rank; equal-sized groups only."""
    groups: dict = {}
    for r, n in enumerate(nodes):
        groups.setdefault(n, []).append(r)
    out = list(groups.values())
    if len({len(g) for g in out}) > 1:
        raise ValueError(f"hierarchical allreduce needs the same number of ranks on every "
                         f"host, got {[len(g) for g in out]} (nodes={list(nodes)})")
    return out


def worthwhile(nodes: Optional[Sequence[Hashable]]) -> bool:
    """True when the ranks span several hosts with several (equally many) ranks on each."""
    try:
        groups = host_groups(nodes or [])
    except ValueError:  # unequal hosts
        return False
    return len(groups) > 1 and len(groups[0]) > 1


def hierarchical_allreduce_reference(xs: List[np.ndarray], nodes: Sequence[Hashable],
                                     op: str = "sum") -> List[np.ndarray]:
    """The pure function: every rank's result of the hierarchical allreduce of ``xs``."""
    p, shape = len(xs), np.shape(xs[0])
    red = "sum" if op == "avg" else op
    flat = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    groups = host_groups(nodes)
    b = chunk_bounds(flat[0].size, len(groups[0]))
    seg: List[Any] = [None] * p
    for g in groups:  # 1. ring reduce-scatter within each host: local rank l gets segment l
        for r, part in zip(g, reduce_scatter_segments([flat[r] for r in g], b, red, 0)):
            seg[r] = part
    for cross in zip(*groups):  # 2. ring allreduce of segment l across the hosts
        for r, part in zip(cross, ring_allreduce([seg[r] for r in cross], red)):
            seg[r] = part
    out: List[Any] = [None] * p
    for g in groups:  # 3. allgather within each host (the data moves, it never changes)
        full = np.concatenate([seg[r] for r in g]).reshape(shape)
        for r in g:
            out[r] = finish_avg(full.copy(), p) if op == "avg" else full.copy()
    return out


class GroupChannel:
    """A channel seen by a subgroup: ranks 0..len(group)-1 stand for the ranks in ``group``
    (messages and byte counts go through the parent channel)."""

    __slots__ = ("_ch", "_group", "rank", "size")

    def __init__(self, ch: Channel, group: List[int]) -> None:
        self._ch, self._group = ch, group
        self.rank, self.size = group.index(ch.rank), len(group)

    def isend(self, buf: Any, dest: int) -> Any:
        """Send to the group's rank ``dest``."""
        return self._ch.isend(buf, self._group[dest])

    def irecv(self, buf: Any, source: int) -> Any:
        """Receive from the group's rank ``source``."""
        return self._ch.irecv(buf, self._group[source])


def hierarchical_allreduce(ch: Channel, x: np.ndarray, out: np.ndarray,
                           nodes: Sequence[Hashable], op: str, chunk: int,
                           workspace: np.ndarray, acc: np.ndarray) -> Algorithm:
    """Hierarchical allreduce of flat ``x`` into flat ``out`` (``acc``: scratch of x's size,
    ``workspace``: ``DEPTH * chunk`` items), over point-to-point messages."""
    groups = host_groups(nodes)
    local = next(g for g in groups if ch.rank in g)  # the ranks on our host
    cross = [g[local.index(ch.rank)] for g in groups]  # the ranks with our local index
    # a GroupChannel has the Channel interface the ring algorithms use (rank, size, isend,
    # irecv, counts), over the parent channel
    near = cast(Channel, GroupChannel(ch, local))
    far = cast(Channel, GroupChannel(ch, cross))
    b = chunk_bounds(x.size, near.size)
    lo, hi = b[near.rank], b[near.rank + 1]
    # 1. Within the host; segment l of ``acc`` is never a partial sum, so it holds the result.
    yield from ring.ring_reduce_scatter_full(near, x, acc, b, op, chunk, workspace, acc[lo:hi])
    # 2. Across the hosts, straight into our segment of the result.
    yield from ring.ring_allreduce(far, acc[lo:hi], out[lo:hi], op, chunk, workspace)
    # 3. Within the host again.
    if near.size > 1:
        yield from ring.ring_gather(near, out, b, near.rank, chunk, [], own_sent=False)
    return out


def hierarchical_allreduce_steps(nbytes: int, nodes: Sequence[Hashable], unit: int = 1,
                                 piece: int = 0) -> Steps:
    """What ``hierarchical_allreduce`` sends: three phases of rings, all hosts at once."""
    groups = host_groups(nodes)
    seg, loc = segment_bytes(nbytes, len(groups[0]), unit), len(groups[0])
    near = [(ring.ring_reduce_scatter_steps(nbytes, loc, unit, piece), g) for g in groups]
    far = [(ring.ring_allreduce_steps(int(n), len(groups), unit, piece), list(c))
           for n, c in zip(seg, zip(*groups))]
    back = [(ring.ring_gather_steps(nbytes, loc, unit, piece), g) for g in groups]
    return _together(near).then(_together(far)).then(_together(back))


def _together(parts: List[Tuple[Steps, List[int]]]) -> Steps:
    """Groups' steps (as many rounds each) run at once, as steps of all ranks."""
    shape = (len(parts[0][0].dst), sum(len(g) for _, g in parts))
    dst, n, m = np.full(shape, -1), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    for s, g in parts:
        dst[:, g] = np.where(s.dst >= 0, np.asarray(g)[s.dst], -1)
        n[:, g], m[:, g] = s.nbytes, s.msgs
    return Steps(dst, n, m)
