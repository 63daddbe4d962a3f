"""A p-stage pipeline's loss and gradients equal the serial model's (float64), every schedule."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel.pipeline import PipelineParallel, partition

N, DIM, LAYERS = 8, 6, 8


def backends():
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def mse(out, y):
    """Mean squared error over all entries."""
    return ((out - y) ** 2).sum() / (out.shape[0] * out.shape[1])


def build():
    np.random.seed(0)
    layers = []
    for i in range(LAYERS):
        layers.append(nn.Linear(DIM, DIM, dtype="float64"))
        layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def data():
    rng = np.random.RandomState(1)
    return rng.randn(N, DIM), rng.randn(N, DIM)


def serial():
    model = build()
    x, y = data()
    loss = mse(model(ndl.Tensor(x, dtype="float64")), ndl.Tensor(y, dtype="float64"))
    loss.backward()
    return float(loss.numpy()), {n: q.grad.numpy() for n, q in model.named_parameters()}


def pipeline_step(comm, schedule, m, v):
    model = build()
    names = {id(q): n for n, q in model.named_parameters()}
    p = comm.size
    pieces = partition(model, p * v)
    chunks = [pieces[c * p + comm.rank] for c in range(v)]
    pipe = PipelineParallel(chunks if v > 1 else chunks[0], comm, m, schedule=schedule,
                            loss_fn=mse)
    x, y = data()
    loss = pipe.train_step(x, y)
    return loss, {names[id(q)]: q.grad.numpy() for q in pipe.parameters()}


CASES = [("gpipe", 2, 4, 1), ("1f1b", 2, 4, 1), ("interleaved", 2, 4, 2),
         ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 4, 2),
         ("1f1b", 4, 2, 1), ("gpipe", 4, 1, 1)]   # fewer microbatches than stages too


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_pipeline_equals_serial(backend, schedule, p, m, v):
    loss_ref, grads_ref = serial()
    results = run_ranks(backend, p, pipeline_step, schedule, m, v, timeout=120)
    seen = set()
    for loss, grads in results:
        assert abs(loss - loss_ref) < 1e-6 * max(1, abs(loss_ref))   # loss on every rank
        for name, g in grads.items():
            np.testing.assert_allclose(g, grads_ref[name], rtol=1e-6, atol=1e-6, err_msg=name)
            seen.add(name)
    assert seen == set(grads_ref)                  # every parameter lives on exactly one stage
