"""A checkpoint saved at tp=2 loads at tp=1 and back at tp=2 and tp=4 (per-shard with an
index, and gathered), giving the same model."""
import numpy as np
from mpi_helpers import run_ranks

import needle as ndl
from needle import nn
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    VocabParallelEmbedding,
)
from needle.parallel.tensor_parallel.tp_checkpoint import (
    gather_state_dict,
    load_full_state_dict,
    load_sharded,
    save_sharded,
)

B, T, D, NH, DH, H, V = 2, 4, 8, 4, 2, 16, 8


def build(comm, seed):
    np.random.seed(seed)
    m = nn.Module()
    m.emb = VocabParallelEmbedding(V, D, comm, dtype="float64")
    m.block = ParallelTransformerBlock(D, NH, DH, H, comm, dtype="float64")
    m.head = ColumnParallelLinear(D, V, comm, bias=True, gather_output=True, dtype="float64")
    return m


def forward(m):
    idx = np.random.RandomState(3).randint(0, V, size=(B, T))
    return m.head(m.block(m.emb(idx))).numpy()


def save_fn(comm, directory, seed):
    m = build(comm, seed)
    save_sharded(m, comm, directory)
    full = gather_state_dict(m, comm)
    if comm.rank == 0:
        ndl.save(full, directory + "/gathered.ndl")
    comm.barrier()
    return forward(m), full


def load_fn(comm, directory, gathered):
    m = build(comm, seed=123)                      # different weights until loaded
    before = forward(m)
    if gathered:
        load_full_state_dict(m, comm, ndl.load(directory + "/gathered.ndl"))
    else:
        load_sharded(m, comm, directory)
    return before, forward(m), gather_state_dict(m, comm)


def test_tp2_to_tp1_and_back(tmp_path):
    a, b = str(tmp_path / "tp2"), str(tmp_path / "tp1")
    out2, full2 = run_ranks("virtual", 2, save_fn, a, 0)[0]
    for gathered in (False, True):
        before, out1, full1 = run_ranks("virtual", 1, load_fn, a, gathered)[0]
        assert not np.allclose(before, out2)
        np.testing.assert_allclose(out1, out2, rtol=1e-12, atol=1e-12)
        assert set(full1) == set(full2)
        for k in full2:
            np.testing.assert_array_equal(full1[k], full2[k])
    # save again at tp=1 (a model now holding the tp=2 weights), load at tp=2 and tp=4
    run_ranks("virtual", 1, resave_fn, a, b)
    for tp in (2, 4):
        for _before, out, full in run_ranks("virtual", tp, load_fn, b, False):
            np.testing.assert_allclose(out, out2, rtol=1e-12, atol=1e-12)
            for k in full2:
                np.testing.assert_array_equal(full[k], full2[k])


def resave_fn(comm, src, dst):
    m = build(comm, seed=7)
    load_sharded(m, comm, src)
    save_sharded(m, comm, dst)


def _load_uneven(comm):
    layer = ColumnParallelLinear(4, 6, comm, bias=False, dtype="float64")
    try:
        load_full_state_dict(layer, comm, {"weight": np.zeros((4, 5))})
    except ValueError as err:
        return str(err)
    return "loaded"


def test_a_full_weight_that_does_not_split_is_refused_naming_it():
    """A serial weight of 5 columns cannot be cut into 2 equal column shards."""
    for msg in run_ranks("virtual", 2, _load_uneven):
        assert "a weight of shape (4, 5) does not split into 2 equal parts along axis 1" in msg
