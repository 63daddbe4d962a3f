"""ProcessMesh groups and coordinates, bad mesh shapes, and one 3D (dp x pp x tp) training step
equal to the serial model's."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel.mesh import ProcessMesh
from needle.parallel.pipeline import PipelineParallel
from needle.parallel.tensor_parallel import ParallelTransformerBlock


def backends():
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def virtual_only():
    return [b for b in backends() if b == "virtual"] or backends()


def mesh_groups(comm, dp, pp, tp):
    mesh = ProcessMesh(comm, dp=dp, pp=pp, tp=tp)
    me = np.array([comm.rank])
    return ((mesh.dp_rank, mesh.pp_rank, mesh.tp_rank),
            [int(r) for r in mesh.tp.allgather(me)], [int(r) for r in mesh.pp.allgather(me)],
            [int(r) for r in mesh.dp.allgather(me)])


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("shape", [(2, 1, 2), (1, 2, 2), (2, 2, 1)])
def test_groups_and_coordinates(backend, shape):
    dp, pp, tp = shape
    for r, (coords, tpg, ppg, dpg) in enumerate(run_ranks(backend, 4, mesh_groups, *shape)):
        d, p, t = r // (pp * tp), (r // tp) % pp, r % tp              # tp fastest
        assert coords == (d, p, t)
        assert tpg == [(d * pp + p) * tp + i for i in range(tp)]
        assert ppg == [(d * pp + i) * tp + t for i in range(pp)]
        assert dpg == [(i * pp + p) * tp + t for i in range(dp)]


def bad_mesh(comm):
    try:
        ProcessMesh(comm, dp=2, pp=2, tp=2)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("backend", backends())
def test_bad_mesh_is_an_error_on_every_rank(backend):
    for msg in run_ranks(backend, 4, bad_mesh):
        assert msg is not None and "2 * 2 * 2 = 8" in msg and "world size 4" in msg


B, T, D, NH, DH, H, LAYERS = 4, 4, 8, 2, 4, 16, 4


def mse(out, y):
    """Mean squared error over all entries."""
    n = 1
    for s in out.shape:
        n *= s
    return ((out - y) ** 2).sum() / n


def data():
    rng = np.random.RandomState(1)
    return rng.randn(B, T, D), rng.randn(B, T, D)


def serial_3d_reference():
    np.random.seed(0)
    layers = [nn.TransformerLayer(D, NH, DH, H, dtype="float64") for _ in range(LAYERS)]
    x, y = data()
    h = ndl.Tensor(x, dtype="float64")
    for layer in layers:
        h = layer(h)
    loss = mse(h, ndl.Tensor(y, dtype="float64"))
    loss.backward()
    grads = {f"{i}.{n}": q.grad.numpy() for i, layer in enumerate(layers)
             for n, q in layer.named_parameters()}
    return float(loss.numpy()), grads


def three_d_step(comm, dp, pp, tp, schedule):
    mesh = ProcessMesh(comm, dp=dp, pp=pp, tp=tp)
    np.random.seed(0)   # every rank draws every layer in the serial order, keeps its stage's
    blocks = [ParallelTransformerBlock(D, NH, DH, H, mesh.tp, dtype="float64")
              for _ in range(LAYERS)]
    per = LAYERS // pp
    mine = list(range(mesh.pp_rank * per, (mesh.pp_rank + 1) * per))
    stage = nn.Sequential(*[blocks[i] for i in mine])
    pipe = PipelineParallel(stage, mesh.pp, num_microbatches=2, schedule=schedule, loss_fn=mse)
    x, y = data()
    rows = slice(mesh.dp_rank * B // dp, (mesh.dp_rank + 1) * B // dp)
    loss = pipe.train_step(x[rows], y[rows])
    for q in pipe.parameters():           # the naive data-parallel step: average gradients
        q.grad = ndl.Tensor(mesh.dp.allreduce(q.grad.numpy(), op="avg"), dtype="float64")
    loss = float(mesh.dp.allreduce(np.array([loss]), op="avg")[0])
    names = {id(q): f"{i}.{n}" for i in mine for n, q in blocks[i].named_parameters()}
    return loss, mesh.tp_rank, {names[id(q)]: q.grad.numpy() for q in pipe.parameters()}


SHARD = {"attn.q_projection.weight": 1, "attn.k_projection.weight": 1,
         "attn.v_projection.weight": 1, "attn.out_projection.weight": 0,
         "mlp.linear1.weight": 1, "mlp.linear1.bias": 1, "mlp.linear2.weight": 0}


@pytest.mark.parametrize("backend,schedule", [
    *[(b, s) for b in virtual_only() for s in ("1f1b", "gpipe")],
    pytest.param("mpi", "1f1b", marks=pytest.mark.mpi)])   # 8 ranks oversubscribed: ~5 s
def test_3d_step_equals_serial(backend, schedule):
    dp, pp, tp = 2, 2, 2
    loss_ref, grads_ref = serial_3d_reference()
    seen = set()
    for loss, t, grads in run_ranks(backend, 8, three_d_step, dp, pp, tp, schedule,
                                    timeout=300):
        assert abs(loss - loss_ref) < 1e-10
        for name, g in grads.items():
            layer, pname = name.split(".", 1)
            ref_name = f"{layer}.{pname.replace('mlp.', '')}"
            want = grads_ref[ref_name]
            if pname in SHARD:
                want = np.split(want, tp, axis=SHARD[pname])[t]
            np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-11, err_msg=name)
            seen.add(ref_name)
    assert seen == set(grads_ref)
