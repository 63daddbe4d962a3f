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
    for _ in range(LAYERS):
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


def timeline_step(comm, schedule):
    model = build()
    pipe = PipelineParallel(partition(model, comm.size)[comm.rank], comm, 4, schedule=schedule,
                            loss_fn=mse)
    pipe.train_step(*data())
    return pipe.gather_timeline(), pipe.peak_activation_bytes


@pytest.mark.parametrize("backend", backends())
def test_measured_timeline_is_causal_and_exported(backend, tmp_path):
    import json

    from needle.parallel.pipeline import one_f_one_b, simulate
    from needle.parallel.pipeline.timeline import plot_gantt, write_chrome_trace
    p = 2
    results = run_ranks(backend, p, timeline_step, "1f1b", timeout=120)
    events = results[0][0]
    assert all(r[0] == events for r in results)              # every rank sees every stage
    for s in range(p):
        assert [a[:2] for a, _, _ in events[s]] == one_f_one_b(p, 4)[s]
        ends = [e for _, _, e in events[s]]
        starts = [b for _, b, _ in events[s]]
        assert all(b >= e for b, e in zip(starts[1:], ends[:-1]))   # one action at a time
    end = {(a[0], a[1], s): (b, e) for s in range(p) for a, b, e in events[s]}
    for mb in range(4):                                      # data dependencies held in reality
        assert end[("F", mb, 1)][0] >= end[("F", mb, 0)][1]
        assert end[("B", mb, 0)][0] >= end[("B", mb, 1)][1]
    trace = tmp_path / "t.json"
    write_chrome_trace(str(trace), simulate(one_f_one_b(p, 4)).events, events)
    assert len(json.loads(trace.read_text())["traceEvents"]) > 4 * p * 2
    png = tmp_path / "g.png"
    plot_gantt(str(png), simulate(one_f_one_b(p, 4)).events, events)
    assert png.stat().st_size > 1000


def peak_memory(comm, schedule, m):
    model = build()
    pipe = PipelineParallel(partition(model, comm.size)[comm.rank], comm, m, schedule=schedule,
                            loss_fn=mse)
    pipe.train_step(*data())
    return pipe.peak_activation_bytes


def test_1f1b_keeps_fewer_activations_than_gpipe():
    g = run_ranks("virtual", 2, peak_memory, "gpipe", 8)
    o = run_ranks("virtual", 2, peak_memory, "1f1b", 8)
    assert o[0] <= 2 / 8 * g[0] * 1.01 and o[1] <= 1 / 8 * g[1] * 1.01   # p - s of m in flight


def bad_pipeline(comm):
    errors = []
    try:
        partition(build(), 17)
    except ValueError as err:
        errors.append(str(err))
    pipe = PipelineParallel(partition(build(), comm.size)[comm.rank], comm, 3, loss_fn=mse)
    try:
        pipe.train_step(*data())
    except ValueError as err:
        errors.append(str(err))
    return errors


@pytest.mark.parametrize("backend", backends())
def test_bad_input_on_every_rank(backend):
    for errors in run_ranks(backend, 2, bad_pipeline, timeout=60):
        assert "16 layers into 17 pipeline stages" in errors[0]
        assert "3 microbatches do not divide the batch of 8" in errors[1]
