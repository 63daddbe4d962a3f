"""A ZeRO optimizer's state belongs to one rank of one job size: another rank's state, even one
with the same piece layout (equal shards), is refused, naming both ranks."""
import numpy as np
import pytest

import needle as ndl
from needle.parallel import ZeroRedundancyOptimizer, virtual


def _zero(comm):
    """8 elements over 2 ranks: both ranks own one piece of 4, the same layout."""
    w = ndl.nn.Parameter(np.arange(8.0), dtype="float64")
    opt = ZeroRedundancyOptimizer([w], ndl.optim.Adam, comm, stage=1, lr=0.1)
    w.grad = ndl.Tensor(np.full(8, 1.0 + comm.rank), dtype="float64", requires_grad=False)
    opt.step()
    return opt


def _save(comm):
    return _zero(comm).state_dict()


def _load(comm, states, source):
    opt = _zero(comm)
    try:
        opt.load_state_dict(states[source(comm.rank)])
    except ValueError as err:
        return str(err)
    return "loaded"


def test_another_ranks_state_with_the_same_layout_is_refused():
    states = virtual.run(2, _save)
    assert states[0]["pieces"] == states[1]["pieces"]  # only the rank tells them apart
    swapped = virtual.run(2, _load, states, lambda r: 1 - r)
    for rank, msg in enumerate(swapped):
        assert f"state saved by rank {1 - rank} of 2, this is rank {rank} of 2" in msg, msg
    assert virtual.run(2, _load, states, lambda r: r) == ["loaded", "loaded"]


@pytest.mark.parametrize("key,value,text", [("world_size", 4, "saved by rank 0 of 4"),
                                            ("rank", None, "saved by rank None of 2")])
def test_state_from_another_job_size_or_without_its_rank_is_refused(key, value, text):
    state = dict(virtual.run(2, _save)[0])
    state[key] = value
    msg = virtual.run(2, _load, [state, state], lambda r: 0)[0]
    assert text in msg and "this is rank 0 of 2" in msg, msg
