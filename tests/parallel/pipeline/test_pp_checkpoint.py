"""A pipeline checkpoint saved at pp=2 loads at pp=1 and at pp=4 (other stage boundaries)."""
import numpy as np
from mpi_helpers import run_ranks

from needle import nn
from needle.parallel.pipeline import partition
from needle.parallel.pipeline.stage_state import load_stage, save_stage


def build(seed):
    np.random.seed(seed)
    return nn.Sequential(*[nn.Linear(4, 4, dtype="float64") for _ in range(8)])


def save_fn(comm, directory):
    model = build(0)
    stages = partition(model, comm.size)
    first = sum(len(s) for s in stages[:comm.rank])
    save_stage(stages[comm.rank], first, comm, directory)


def load_fn(comm, directory):
    model = build(5)
    stages = partition(model, comm.size)
    first = sum(len(s) for s in stages[:comm.rank])
    load_stage(stages[comm.rank], first, directory)
    return stages[comm.rank].state_dict(), first


def test_pp2_to_pp1_and_pp4(tmp_path):
    run_ranks("virtual", 2, save_fn, str(tmp_path))
    want = build(0).state_dict()
    for pp in (1, 4):
        got = {}
        for state, first in run_ranks("virtual", pp, load_fn, str(tmp_path)):
            for k, v in state.items():
                head, i, rest = k.split(".", 2)
                got[f"{head}.{int(i) + first}.{rest}"] = v
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
