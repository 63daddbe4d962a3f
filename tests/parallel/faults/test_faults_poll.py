"""Fault injection, hangs: a rank polling ``Work.test()`` in a loop for a peer that will never
answer raises ``CommTimeoutError`` within the timeout (virtual cluster and MPI), while a long
poll (``Work.poll()``, the parameter server's) is bounded by its caller, not by the timeout."""
import os
import sys
import time

import numpy as np
import pytest
from mpi_helpers import BACKENDS, PARALLEL_TESTS, ROOT, mpiexec, run_bounded, run_ranks, worker_env
from ps_cases import tiny_asp_job

from needle.parallel import CommTimeoutError, RankFailedError, virtual
from needle.parallel.param_server.worker import train_worker

pytestmark = pytest.mark.faults
TIMEOUT = 3
WORKER = str(PARALLEL_TESTS / "faults" / "worker_poll_after_exit.py")


def _both_poll(comm):
    work = comm.irecv(1 - comm.rank, tag=4)  # neither rank ever sends
    while not work.test():
        pass


def test_virtual_ranks_polling_test_for_each_other_raise_within_the_timeout():
    """Before the fix both ranks polled forever: neither is blocked (no deadlock) nor alone."""
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        virtual.run(2, _both_poll, timeout=0.5)
    assert time.monotonic() - start < 5
    assert sorted(info.value.errors) == [0, 1]
    for r, err in info.value.errors.items():
        assert isinstance(err, CommTimeoutError), err
        assert f"recv(source={1 - r}, tag=4) (call #1) on rank {r} of 2 did not finish " \
               "within 0.5 s" in str(err), err


def _compute_then_test(comm):
    if comm.rank == 0:
        work = comm.irecv(1, tag=6)
        time.sleep(0.8)  # computing longer than the timeout (rank 1 cannot run meanwhile)
        work.test()  # nothing yet: rank 1 has not had a chance to send
        return float(work.wait()[0])
    comm.send(np.full(1, 7.0), 0, tag=6)
    return 0.0


def test_a_test_after_a_long_computation_is_not_a_timeout():
    """Counting the computation as polling would raise in that first test()."""
    assert virtual.run(2, _compute_then_test, timeout=0.5) == [7.0, 0.0]


def compute(comm, seconds):
    """Stand-in for ``seconds`` of computation.  On the virtual cluster the other ranks run
    meanwhile (as other processes would): an unbounded poll of a receive nobody sends."""
    if hasattr(comm.transport, "comm"):  # MPI: the server polls in its own process
        time.sleep(seconds)
        return
    never = comm.irecv(0, tag=99)
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)
        never.poll()


def _slow_worker_long_poll(comm):
    """One server, one worker that computes (holding the baton) for longer than the
    communicator's timeout between steps: the server's long poll must not time out."""
    comm.timeout = 0.3  # this job's communicator timeout (MPI: after a create() with the default)
    # compute for 0.6 s before each batch: > the 0.3 s communicator timeout
    ps, model, batches, loss = tiny_asp_job(comm, 30.0, pause=lambda: compute(comm, 0.6))
    if ps.is_server:
        return len(ps.serve())
    return len(train_worker(ps, model, loss, batches, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_parameter_servers_long_poll_outlasts_the_timeout(backend):
    """With the server polling ``test()`` (bounded), it raised CommTimeoutError here."""
    server_events, steps = run_ranks(backend, 2, _slow_worker_long_poll, timeout=60)
    assert steps == 2 and server_events > 0


@pytest.mark.mpi
def test_mpi_rank_polling_test_after_its_peer_exited_cleanly_raises():
    """Rank 1 returns (MPI finalises at exit); rank 0 polls an irecv from it: within
    the timeout it raises naming the call and the peer, and the job ends nonzero."""
    start = time.monotonic()
    res = run_bounded([mpiexec(), "-n", "2", sys.executable, WORKER], 5 * TIMEOUT + 10,
                      cwd=ROOT, env=worker_env(NEEDLE_COMM_TIMEOUT=str(TIMEOUT)),
                      stdin=open(os.devnull))
    took = time.monotonic() - start
    assert res.returncode != 0, res.stdout + res.stderr
    assert "CommTimeoutError: needle.parallel: recv(source=1, tag=5) (call #1) on rank 0 of 2 " \
           f"did not finish within {TIMEOUT} s" in res.stderr, res.stderr
    assert "waiting for ranks [1]" in res.stderr
    assert took < 4 * TIMEOUT, took
