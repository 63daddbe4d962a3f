"""A blocking collective's timeout names the call that timed out, not an earlier one.

The blocking path reuses one description object (and the small-allreduce path one per shape)
for its timeout message; each call must renumber it. Rank 0 makes ``done`` calls with rank 1,
then one more that rank 1 never joins: the message must name call ``done + 1`` and its op.
"""
import time

import numpy as np
import pytest

from needle.parallel import CommTimeoutError, RankFailedError, virtual

SMALL, LARGE = np.ones(8), np.ones(1 << 17)  # the fused small path and the general one

OPS = {
    "allreduce": lambda c, x: c.allreduce(x),
    "allgather": lambda c, x: c.allgather(x),
    "broadcast": lambda c, x: c.broadcast(x, root=0),
    "reduce_scatter": lambda c, x: c.reduce_scatter(x),
    "allreduce_async": lambda c, x: c.allreduce_async(x).wait(),
}


def _then_alone(comm, op, x, done, other):
    for k in range(done):  # an earlier call of another kind, then of this one
        (OPS[other] if k == 0 else OPS[op])(comm, x)
    if comm.rank == 0:
        OPS[op](comm, x)  # rank 1 does not join: this one times out
        return
    work = comm.irecv(0)  # busy, not blocked (no deadlock to report): rank 0's timeout fires
    for _ in range(100):  # up to 5 s: rank 0's failure ends this rank sooner
        if work.test():
            break
        time.sleep(0.05)


@pytest.mark.parametrize("op,x,done,other", [
    ("allreduce", SMALL, 3, "allgather"),
    ("allreduce", LARGE, 2, "allreduce"),
    ("allgather", SMALL, 4, "allreduce"),
    ("broadcast", LARGE, 2, "allreduce"),
    ("reduce_scatter", LARGE, 3, "broadcast"),
    ("allreduce_async", SMALL, 2, "allreduce"),
], ids=["allreduce-small", "allreduce-large", "allgather", "broadcast", "reduce_scatter",
        "allreduce-async"])
def test_timeout_names_the_call_that_timed_out(op, x, done, other):
    with pytest.raises(RankFailedError) as info:
        # 1 s: the earlier calls (a 1 MiB reduce-scatter among them) must finish within one
        # timeout even on a loaded machine, or the message names them instead
        virtual.run(2, _then_alone, op, x, done, other, timeout=1.0)
    err = info.value.errors[0]
    assert isinstance(err, CommTimeoutError), err
    name = op.replace("_async", "")
    assert f"{name} (call #{done + 1}) on rank 0 of 2 did not finish" in str(err), err
