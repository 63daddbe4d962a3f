"""Bad arguments give a clear error on every rank; failures end the whole job quickly."""
import re

import pytest
import worker_faults
from mpi_helpers import BACKENDS, run_ranks

MISMATCH = ["size_small", "size_large", "dtype", "op", "collective", "allgather_shape",
            "broadcast_root", "reduce_scatter_size"]


BOTH_CALLS = {
    "size_small": ("shape=(8,)", "shape=(9,)"), "size_large": ("shape=(1048576,)", "shape=(16,)"),
    "dtype": ("dtype=float32", "dtype=int32"), "op": ("op=sum", "op=max"),
    "collective": ("allreduce op=sum", "allgather dtype"),
    "allgather_shape": ("shape=(2, 3)", "shape=(3, 2)"), "broadcast_root": ("root=0", "root=1"),
    "reduce_scatter_size": ("shape=(16384,)", "shape=(32768,)"),
}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("mode", MISMATCH)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatch_raises_on_every_rank_naming_both_calls(backend: str, mode: str,
                                                          ranks: int) -> None:
    messages = run_ranks(backend, ranks, worker_faults.caught_mismatch, mode, timeout=60,
                         env={"NEEDLE_COMM_TIMEOUT": "20"})
    for r, msg in enumerate(messages):
        assert msg.startswith("needle.parallel: ranks called a collective with different "
                              f"arguments (seen from rank {r})"), msg
        first, last = BOTH_CALLS[mode]
        assert f"ranks [{ranks - 1}]: " in msg and "ranks [0" in msg, msg
        assert first in msg and last in msg, msg


@pytest.mark.parametrize("mode", ["collective", "reduce_scatter_size"])
def test_mismatch_raises_with_the_check_run_first(mode: str) -> None:
    messages = run_ranks("virtual", 3, worker_faults.caught_mismatch_check_first, mode,
                         timeout=60)
    first, last = BOTH_CALLS[mode]
    for msg in messages:
        assert "different arguments" in msg and first in msg and last in msg, msg


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("mode", MISMATCH)
def test_mismatched_arguments_raise_on_every_rank(run_mpi, mode: str, ranks: int) -> None:
    res, seconds = run_mpi(ranks, "comm/worker_faults.py", mode, timeout=60)
    assert res.returncode != 0 and "finished without error" not in res.stdout
    reported = sorted(int(r) for r in re.findall(r"rank (\d+) ValueError: needle.parallel: ranks "
                                                 r"called a collective with different", res.stderr))
    assert reported == list(range(ranks)), res.stderr[-3000:]
    # The message names the ranks and both versions of the arguments.
    assert f"ranks [{ranks - 1}]:" in res.stderr and "ranks [0" in res.stderr, res.stderr[-2000:]
    assert seconds < 30


@pytest.mark.mpi
def test_mismatch_message_names_the_values(run_mpi) -> None:
    res, _ = run_mpi(2, "comm/worker_faults.py", "op", timeout=60)
    assert "op=sum" in res.stderr and "op=max" in res.stderr, res.stderr[-2000:]
    res, _ = run_mpi(2, "comm/worker_faults.py", "dtype", timeout=60)
    assert "dtype=float32" in res.stderr and "dtype=int32" in res.stderr, res.stderr[-2000:]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["raise", "exit", "kill"])
def test_a_failing_rank_ends_the_job(run_mpi, mode: str) -> None:
    res, seconds = run_mpi(3, "comm/worker_faults.py", mode, timeout=60,
                           env={"WORKER_TIMEOUT": "50"})
    assert res.returncode != 0
    assert seconds < 30, seconds
    if mode == "raise":
        assert "rank 1 failed on purpose" in res.stderr


@pytest.mark.mpi
def test_timeout_raises_and_aborts(run_mpi) -> None:
    res, seconds = run_mpi(3, "comm/worker_faults.py", "timeout", timeout=60,
                           env={"WORKER_TIMEOUT": "2"})
    assert res.returncode != 0 and seconds < 30
    assert "CommTimeoutError" in res.stderr and "did not finish within 2 s" in res.stderr


@pytest.mark.mpi
def test_timeout_is_raised_on_every_waiting_rank(run_mpi) -> None:
    res, seconds = run_mpi(3, "comm/worker_faults.py", "timeout_caught", timeout=60,
                           env={"WORKER_TIMEOUT": "2"})
    assert res.returncode != 0 and seconds < 30
    # Either waiting rank may abort the job first; at least one reports with its peers named.
    assert re.search(r"rank [01] CommTimeoutError: .*allreduce .*waiting for ranks \[", res.stderr)


@pytest.mark.mpi
def test_a_call_stuck_inside_mpi_ends_the_job_naming_it(run_mpi) -> None:
    """A rank stuck inside one MPI call (where the transport's deadline cannot see it) is
    found by the watchdog within about a timeout, which names the call and ends the job."""
    res, seconds = run_mpi(2, "comm/worker_faults.py", "stuck", timeout=60,
                           env={"WORKER_TIMEOUT": "2"})
    assert res.returncode == 1 and seconds < 30, (seconds, res.stderr[-2000:])
    assert re.search(r"needle\.parallel: broadcast \(call #\d+\) on rank 0 of 2 did not finish "
                     r"within 2 s \(NEEDLE_COMM_TIMEOUT\); waiting for ranks \[1\]: stuck [23] s "
                     r"inside one MPI call \(in isend\), which never returned", res.stderr), \
        res.stderr[-2000:]
