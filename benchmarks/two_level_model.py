"""The alpha-beta model with two link classes, for ranks on several hosts: one (alpha, beta)
between ranks of a host and one across hosts, the ranks of a host sharing its link. It prices
the steps each algorithm declares (``select.steps``) round by round; ``bench_multihost.py``
compares it with measured times on the namespace test cluster (``tools/testcluster``).
"""
from typing import Hashable, NamedTuple, Sequence

import numpy as np

from needle.parallel.comm.algorithms.cost_model import CostModel
from needle.parallel.comm.algorithms.steps import Steps


class TwoLevelModel(NamedTuple):
    """Alpha-beta with two link classes: ``intra`` between ranks of one host, ``inter`` across
    hosts, where every rank of a host shares the host's one link (``nodes[r]``: r's host).

    When k ranks of a host send across hosts in the same round (or k cross messages arrive at
    one host), each gets 1/k of the link: such a message costs ``alpha + k n beta``.  A round
    costs its slowest message; a call, the sum of its rounds (rounds are taken as synchronous:
    pipelining across them is not modelled)."""

    intra: CostModel
    inter: CostModel

    def seconds(self, steps: Steps, nodes: Sequence[Hashable]) -> float:
        """Seconds of a call that sends ``steps`` (``select.steps``), ranks placed on ``nodes``."""
        names = list(dict.fromkeys(nodes))
        host = np.array([names.index(n) for n in nodes])
        sent = steps.dst >= 0
        to = host[np.where(sent, steps.dst, 0)]
        cross = sent & (host != to)
        k = np.maximum(cross @ (host[:, None] == host).astype(int),  # from the sender's host
                       (cross[:, :, None] & (to[:, :, None] == to[:, None, :])).sum(1))  # into
        a, b = self.inter, self.intra
        t = np.where(cross, steps.msgs * a.alpha + steps.nbytes * k * a.beta,
                     steps.msgs * b.alpha + steps.nbytes * b.beta)
        return float(np.max(t * sent, axis=1, initial=0.0).sum())
