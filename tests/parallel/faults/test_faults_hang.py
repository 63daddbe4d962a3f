"""Fault injection, hangs: a rank that dies at any point (before MPI starts, before its
communicator exists, mid-job) ends every rank within the timeout, under plain mpiexec, the
launcher and the virtual cluster; the launcher names the rank and how it ended."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi_helpers import PARALLEL_TESTS, ROOT, run_bounded, worker_env

from needle.parallel import CommTimeoutError, RankFailedError, virtual
from needle.parallel.launch import first_failure

pytestmark = pytest.mark.faults
TIMEOUT = 3  # NEEDLE_COMM_TIMEOUT of these jobs: every one must end well within 5 x this
WORKER = str(PARALLEL_TESTS / "faults" / "worker_early_death.py")
MODES = ["raise", "exit0", "exit3", "kill"]


def _job(cmd, limit=5 * TIMEOUT + 10):
    start = time.monotonic()
    res = run_bounded(cmd, limit, cwd=ROOT, env=worker_env(NEEDLE_COMM_TIMEOUT=str(TIMEOUT)),
                      stdin=subprocess.DEVNULL)
    return res, time.monotonic() - start


@pytest.mark.mpi
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("mode", MODES)
def test_plain_mpiexec_ends_when_a_rank_dies(mode, when):
    """Before the fix, rank 1 raising before create() left rank 0 in MPI start-up forever."""
    from mpi_helpers import mpiexec
    res, took = _job([mpiexec(), "-n", "2", sys.executable, WORKER, mode, when])
    assert res.returncode != 0, res.stdout + res.stderr
    assert took < 4 * TIMEOUT, took
    if mode == "raise":
        assert "rank 1 fails on purpose" in res.stderr


@pytest.mark.mpi
def test_plain_mpiexec_names_a_rank_that_calls_os_exit_0_mid_job():
    """Rank 1's guardian says it left, rank 0 raises within the timeout naming its call and rank
    1, and the job ends nonzero (left to hydra, rank 0 is killed and the job exits 0)."""
    from mpi_helpers import mpiexec
    res, took = _job([mpiexec(), "-n", "2", sys.executable, WORKER, "exit0", "after"])
    assert res.returncode != 0 and took < 4 * TIMEOUT, (took, res.stdout + res.stderr)
    assert "needle.parallel: rank 1 (pid" in res.stderr, res.stderr
    assert "exited with code 0 mid-job" in res.stderr
    assert "CommTimeoutError: needle.parallel: allreduce (call #2) on rank 0 of 2 did not " \
           f"finish within {TIMEOUT} s (NEEDLE_COMM_TIMEOUT); waiting for ranks [1]" in res.stderr


@pytest.mark.mpi
def test_plain_mpiexec_fails_a_job_whose_rank_left_with_os_exit_0_after_its_last_call():
    """No rank waits for it: its guardian aborts the job after 2 * timeout + 5 s (hydra said 0)."""
    from mpi_helpers import mpiexec
    res, took = _job([mpiexec(), "-n", "2", sys.executable, WORKER, "exit0", "end"])
    assert res.returncode != 0, res.stdout + res.stderr
    assert "rank 1 left mid-job: aborting the job" in res.stderr, res.stderr
    assert 2 * TIMEOUT + 5 <= took < 2 * TIMEOUT + 5 + 2 * TIMEOUT, took


@pytest.mark.mpi
def test_split_under_mpi_cannot_wait_forever_for_a_rank_that_left():
    """MPI_Comm_split blocks with no deadline; the ranks now meet (with one) before it."""
    from mpi_helpers import mpiexec
    res, took = _job([mpiexec(), "-n", "2", sys.executable, WORKER, "exit3", "split"])
    assert res.returncode != 0 and took < 4 * TIMEOUT, (took, res.stderr)
    assert "split (call #1) on rank 0 of 2 did not finish within 3 s" in res.stderr, res.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("mode,how", [
    ("kill", "rank 1 ended first: it was killed by signal 9 (SIGKILL)."),
    ("exit0", "rank 1 ended first: it exited with code 0 mid-job"),
    ("exit3", "rank 1 ended first: it exited with code 3."),
    ("raise", "rank 1 ended first: it raised RuntimeError: rank 1 fails on purpose."),
])
@pytest.mark.parametrize("when", ["before", "after"])
def test_launcher_names_the_rank_and_how_without_its_own_traceback(mode, how, when):
    res, took = _job([sys.executable, "-m", "needle.parallel.launch", "-n", "2", WORKER,
                      mode, when])
    assert res.returncode != 0 and took < 4 * TIMEOUT, (took, res.stderr)
    assert how in res.stderr, res.stderr
    own = [line for line in res.stderr.splitlines() if not line.lstrip().startswith("[")]
    assert not any("Traceback" in line or "Error" in line for line in own
                   if not line.startswith("needle.parallel.launch:")), res.stderr


@pytest.mark.mpi
def test_launcher_names_the_rank_that_died_not_the_one_that_timed_out_first():
    """Rank 1 is killed while a process it started holds its stderr open 10 s, past rank 0's
    timeout: the launcher names rank 1, not rank 0, which timed out first."""
    res, took = _job([sys.executable, "-m", "needle.parallel.launch", "-n", "2", WORKER,
                      "kill-late-seen", "after"])
    assert res.returncode != 0 and took < 4 * TIMEOUT, (took, res.stderr)
    assert "rank 1 ended first: it was killed by signal 9 (SIGKILL)." in res.stderr, res.stderr


@pytest.mark.mpi
def test_launcher_names_the_rank_whose_supervisor_was_starved():
    """Rank 1's supervisor is stopped when rank 1 dies and resumes after rank 0's timeout: the
    launcher names rank 1, though rank 0 timed out and aborted before that supervisor recorded."""
    res, took = _job([sys.executable, "-m", "needle.parallel.launch", "-n", "2", WORKER,
                      "kill-starved", "after"])
    assert res.returncode != 0 and took < 5 * TIMEOUT, (took, res.stderr)
    assert "rank 1 ended first: it was killed by signal 9 (SIGKILL)." in res.stderr, res.stderr


def _status(folder, rank, **status):
    (folder / f"rank{rank}.status").write_text(json.dumps(status))


def test_a_timeout_is_not_named_before_the_failure_it_waited_for(tmp_path):
    """By the clock rank 0's timeout came first (rank 1's death seen late); rank 1 caused it."""
    _status(tmp_path, 0, exception="CommTimeoutError: needle.parallel: allreduce (call #2) on "
            "rank 0 of 3 did not finish within 3 s; waiting for ranks [1]", time=100.0)
    _status(tmp_path, 1, returncode=-9, time=104.0)
    _status(tmp_path, 2, exception="DeadlockError: ...", time=100.5)
    report = first_failure(tmp_path)
    assert "rank 1 ended first: it was killed by signal 9 (SIGKILL)." in report, report
    _status(tmp_path, 1, exception="RuntimeError: bad batch", time=99.0)  # the clock agrees
    assert "rank 1 ended first: it raised RuntimeError: bad batch." in first_failure(tmp_path)


def test_a_timeout_alone_is_named(tmp_path):
    _status(tmp_path, 0, exception="CommTimeoutError: waiting for ranks [1]", time=100.0)
    report = first_failure(tmp_path)
    assert "rank 0 ended first: it raised CommTimeoutError" in report
    assert "no rank it waited for recorded how it ended (stuck without communicating" in report


def _poll_while_peer_times_out(comm):
    if comm.rank == 0:
        work = comm.allreduce_async(np.ones(3))
        while not work.test():
            pass
    else:
        comm.recv(source=0, tag=9)  # never sent: times out


def test_virtual_run_returns_when_a_rank_polls_test_forever():
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        virtual.run(2, _poll_while_peer_times_out, timeout=0.5)
    assert time.monotonic() - start < 5
    assert all(isinstance(e, CommTimeoutError) for e in info.value.errors.values())


@pytest.mark.mpi
def test_a_stuck_parameter_server_worker_cannot_keep_the_job_alive():
    """ASP goes on without the silent worker, then the job ends, nonzero, naming it."""
    from mpi_helpers import mpiexec
    res, took = _job([mpiexec(), "-n", "3", sys.executable,
                      str(PARALLEL_TESTS / "faults" / "worker_ps_stuck.py")])
    assert "server done; presumed dead: [2]" in res.stdout, res.stdout + res.stderr
    assert "worker 1 trained 6 steps" in res.stdout
    assert res.returncode != 0 and "worker ranks [2] were presumed dead" in res.stderr
    assert took < 4 * TIMEOUT + 2, took


@pytest.mark.mpi
def test_the_exit_guard_leaves_a_ranks_child_processes_alone(tmp_path):
    """A child inherits mpiexec's environment (PMI); the exit guard does not make it join MPI
    start-up at exit, and the job ends 0."""
    from mpi_helpers import mpiexec
    res, _ = _job([mpiexec(), "-n", "2", sys.executable,
                   str(PARALLEL_TESTS / "faults" / "worker_spawns_child.py"), str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    outcomes = [(tmp_path / f"child{rank}").read_text() for rank in range(2)]
    assert outcomes == ["0 ", "0 "], outcomes


@pytest.mark.mpi
def test_the_exit_guard_does_not_end_a_job_that_never_uses_mpi():
    """Rank 1 exits at once, rank 0 works for longer than the timeout without MPI: no kill."""
    from mpi_helpers import mpiexec
    script = ("import os, time\nimport needle.parallel\n"
              f"time.sleep({TIMEOUT + 2} if os.environ['PMI_RANK'] == '0' else 0)\n"
              "print('rank', os.environ['PMI_RANK'], 'done', flush=True)\n")
    res, _ = _job([mpiexec(), "-n", "2", sys.executable, "-c", script])
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n"))[-2:] == ["rank 0 done", "rank 1 done"], res.stdout
