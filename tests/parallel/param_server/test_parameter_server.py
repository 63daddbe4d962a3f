"""Parameter server: BSP equals synchronous single-process SGD step for step; SSP's staleness
bound holds in the server's log; stragglers, crashed workers and bad pushes."""
import math
import time

import numpy as np
import pytest
from dp_helpers import BATCH, SEED, build, fast_backend, local_slice, loss_of, reference
from mpi_helpers import run_ranks

import needle as ndl
from needle.parallel.param_server import (
    ClockTable,
    ParameterServer,
    ParameterServerError,
    staleness_of,
    train_worker,
)


def test_clock_table_rule():
    table = ClockTable([1, 2, 3], staleness=2)
    table.tick(1, 3)
    assert table.min_clock() == 0 and not table.can_read(3) and table.can_read(2)
    assert table.laggards(3) == [2, 3]
    table.remove(2, dead=True)
    table.remove(3)
    assert table.can_read(3) and table.dead == [2]
    assert staleness_of("bsp") == 0 and staleness_of("asp") == math.inf
    assert staleness_of("ssp", 2) == 2
    with pytest.raises(ValueError, match="staleness bound"):
        staleness_of("ssp")
    with pytest.raises(ValueError, match="consistency must be one of"):
        staleness_of("hogwild")


def sgd_lockstep(comm, num_servers, steps):
    """Workers pull every key, compute their slice's gradient, push, clock (the lecture loop);
    returns the parameters each worker pulled at every step."""
    model = build("mlp", SEED + comm.rank)
    ps = ParameterServer(comm, model, ndl.optim.SGD, num_servers=num_servers,
                         consistency="bsp", lr=0.1, momentum=0.9, weight_decay=0.01)
    if ps.is_server:
        return ps.serve()
    w = comm.rank - num_servers
    named = list(model.named_parameters())
    pulled = []
    for step in range(steps + 1):
        values = [ps.pull(name) for name, _ in named]
        pulled.append(values)
        if step == steps:
            break
        for (_, p), v in zip(named, values):
            p.data = ndl.Tensor(v, dtype="float64", requires_grad=False)
        loss = loss_of(model, *local_slice(w, ps.num_workers, step))
        loss.backward()
        for name, p in named:
            ps.push(name, p.grad)
        ps.clock()
    ps.finish()
    return pulled


@pytest.mark.parametrize("ranks, num_servers", [(4, 1), (4, 2), (3, 1)])
def test_bsp_sgd_equals_single_process_step_for_step(ranks, num_servers):
    if BATCH % (ranks - num_servers):
        pytest.skip("the batch must split evenly")
    want = reference("mlp", "sgd", steps=4)
    results = run_ranks(fast_backend(), ranks, sgd_lockstep, num_servers, 4)
    start = build("mlp", SEED).state_dict()  # rank 0's model: the broadcast start
    for pulled in results[num_servers:]:
        np.testing.assert_allclose(pulled[0][0], list(start.values())[0], atol=0)
        for step in range(4):
            for got, ref in zip(pulled[step + 1], want[step]):
                np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=f"step {step}")


@pytest.mark.mpi
def test_bsp_under_mpiexec():
    want = reference("mlp", "sgd", steps=3)
    for pulled in run_ranks("mpi", 4, sgd_lockstep, 1, 3)[1:]:
        for step in range(3):
            for got, ref in zip(pulled[step + 1], want[step]):
                np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def run_job(comm, consistency, staleness, steps, delays, stop=None, timeout=10.0):
    """1 server + workers; returns the server's log or the worker's (seconds, loss) history
    (or the error message a rank raised)."""
    np.random.seed(0)
    model = build("mlp", SEED)
    ps = ParameterServer(comm, model, ndl.optim.SGD, consistency=consistency,
                         staleness=staleness, timeout=timeout, lr=0.05)
    try:
        if ps.is_server:
            return ps.serve()
        w = comm.rank - 1

        def batches():
            step = 0
            while True:
                yield local_slice(w, ps.num_workers, step % 3)
                step += 1
        return train_worker(ps, model, loss_of, batches(), steps,
                            delay_factor=delays.get(comm.rank, 1.0),
                            stop_after=(stop or {}).get(comm.rank))
    except ParameterServerError as err:
        return str(err)


@pytest.mark.mpi  # real time: the straggler sleeps, which the virtual cluster cannot model
@pytest.mark.slow
def test_ssp_never_lets_a_worker_run_more_than_s_ahead():
    s = 2
    log, *workers = run_ranks("mpi", 4, run_job, "ssp", s, 12, {3: 6.0}, timeout=180)
    reads = [e for e in log if e.event == "read"]
    assert reads and all(e.clock - e.min_clock <= s for e in reads)
    assert max(e.clock - e.min_clock for e in reads) == s  # the bound was reached
    assert all(len(h) == 12 for h in workers)


def test_asp_and_ssp_go_on_without_a_crashed_worker():
    for consistency, s in (("asp", None), ("ssp", 1)):
        log, *workers = run_ranks(fast_backend(), 4, run_job, consistency, s, 6, {}, {3: 2},
                                  1.0)
        assert [e.worker for e in log if e.event == "dead"] == [3]
        assert [len(h) for h in workers] == [6, 6, 2]


def test_bsp_fails_within_the_timeout_naming_the_missing_worker():
    start = time.monotonic()
    results = run_ranks(fast_backend(), 4, run_job, "bsp", None, 6, {}, {3: 2}, 1.0)
    assert time.monotonic() - start < 30
    server, w1, w2, w3 = results
    assert isinstance(server, str) and "worker rank 3 sent nothing" in server
    for msg in (w1, w2):
        assert isinstance(msg, str) and "BSP cannot go on: worker rank 3" in msg
    assert len(w3) == 2  # the crashed worker's own two steps


def bad_push(comm):
    model = build("mlp", SEED)
    ps = ParameterServer(comm, model, ndl.optim.SGD, timeout=5.0, lr=0.1)
    try:
        if ps.is_server:
            ps.serve()
            return None
        name = "modules.0.weight"
        ps.pull(name)
        shape = (5, 8) if comm.rank != 2 else (8, 5)
        ps.push(name, np.zeros(shape))
        ps.clock()
        ps.pull(name)
        ps.finish()
    except ParameterServerError as err:
        return str(err)


def test_wrong_shape_push_is_an_error_on_every_rank():
    msgs = run_ranks(fast_backend(), 3, bad_push)
    for msg in msgs:
        assert msg is not None
        assert "worker rank 2 pushed a gradient of shape (8, 5) for parameter " \
               "'modules.0.weight', whose shape is (5, 8)" in msg


def test_bad_arguments():
    assert "num_servers must be in 1..1" in run_ranks(fast_backend(), 2, _make, 2)[0]


def _make(comm, num_servers):
    try:
        ParameterServer(comm, build("mlp", 0), ndl.optim.SGD, num_servers=num_servers)
    except ValueError as err:
        return str(err)
