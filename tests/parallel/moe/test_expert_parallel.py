"""Expert-parallel MoE == nn.MoE on each rank's tokens; expert gradients == the sum over ranks."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel.moe import ExpertParallelMoE

D, FF, E = 4, 6, 4


def backends():
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def tokens(rank, idle_expert):
    """Rank r has 3 + 2r tokens (uneven); positive ones for the idle-expert case."""
    x = np.random.RandomState(10 + rank).randn(3 + 2 * rank, D)
    return np.abs(x) + 0.1 if idle_expert else x


def router_override(moe, idle_expert):
    if idle_expert:
        w = moe.router.weight.numpy().copy()
        w[:, E - 1] = -5.0          # with positive tokens: the lowest logit, never chosen
        moe.router.weight.cached_data = ndl.NDArray(w, dtype="float64")


def _loss(out, aux, rank):
    w = np.random.RandomState(100 + rank).randn(*out.shape)
    return (out * ndl.Tensor(w, dtype="float64")).sum() + aux


def ep_step(comm, top_k, idle_expert):
    np.random.seed(0)
    moe = ExpertParallelMoE(D, FF, E, comm, top_k=top_k, capacity_factor=1.0, dtype="float64")
    router_override(moe, idle_expert)
    x = ndl.Tensor(tokens(comm.rank, idle_expert), dtype="float64")
    comm.ledger.reset()
    with comm.region("forward"):
        out = moe(x)
    with comm.region("backward"):
        _loss(out, moe.aux_loss, comm.rank).backward()
    fwd = [(r.name, r.label) for r in comm.ledger.records]
    grads = {n: (q.grad.numpy() if q.grad is not None else None)
             for n, q in moe.named_parameters()}
    return out.numpy(), grads, x.grad.numpy(), fwd, moe.first_expert


def serial(rank, top_k, idle_expert):
    np.random.seed(0)
    moe = nn.MoE(D, FF, E, top_k=top_k, capacity_factor=1.0, dtype="float64")
    router_override(moe, idle_expert)
    x = ndl.Tensor(tokens(rank, idle_expert), dtype="float64")
    out = moe(x)
    _loss(out, moe.aux_loss, rank).backward()
    grads = {n: (q.grad.numpy() if q.grad is not None else np.zeros(q.shape))
             for n, q in moe.named_parameters()}
    return out.numpy(), grads, x.grad.numpy(), moe


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("p,top_k,idle", [(2, 1, False), (2, 2, True), (4, 2, False),
                                          (4, 1, True)])
def test_expert_parallel_equals_serial(backend, p, top_k, idle):
    refs = [serial(r, top_k, idle) for r in range(p)]
    if idle:
        assert all(ref[3].tokens_per_expert[E - 1] == 0 for ref in refs)
    expert_sum = {n: sum(ref[1][n] for ref in refs) for n in refs[0][1] if n.startswith("exp")}
    per = E // p
    for r, (out, grads, xgrad, fwd, first) in enumerate(run_ranks(backend, p, ep_step, top_k,
                                                                  idle, timeout=120)):
        ref_out, ref_grads, ref_xgrad, _ = refs[r]
        np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(xgrad, ref_xgrad, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(grads["router.weight"], ref_grads["router.weight"],
                                   rtol=1e-10, atol=1e-12)
        assert first == r * per
        for name, g in grads.items():
            if not name.startswith("experts"):
                continue
            i, rest = name.split(".", 2)[1], name.split(".", 2)[2]
            want = expert_sum[f"experts.{int(i) + first}.{rest}"]
            np.testing.assert_allclose(g if g is not None else np.zeros_like(want), want,
                                       rtol=1e-10, atol=1e-12, err_msg=f"{name} rank {r}")
        # sizes first, then dispatch and combine; backward: the two all-to-alls reversed
        assert fwd == [("allgather", "forward/moe.counts"), ("alltoall", "forward/moe.dispatch"),
                       ("alltoall", "forward/moe.combine"),
                       ("alltoall", "backward/moe.combine.backward"),
                       ("alltoall", "backward/moe.dispatch.backward")]


def mismatched(comm):
    d = D + comm.rank                                  # rank 1 disagrees on d_model
    try:  # refused at construction (comm/agree.py), before any token moves
        moe = ExpertParallelMoE(d, FF, E, comm, dtype="float64")
        moe(ndl.Tensor(np.ones((3, d)), dtype="float64"))
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("backend", backends())
def test_mismatch_is_an_error_on_every_rank(backend):
    for msg in run_ranks(backend, 2, mismatched, timeout=60):
        assert msg is not None and "disagree" in msg and "d_model" in msg
