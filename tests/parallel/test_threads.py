"""BLAS/OpenMP thread placement when a communicator is created (``parallel/threads.py``).

Under ``mpiexec -n 2`` each rank's BLAS must run cores/2 threads (at least 1) by default,
the environment's count when the user set one, and the caller's when ``create`` is given
one; the virtual cluster (threads in this process) must leave the process's pools alone.
"""
import os

import pytest
from mpi_helpers import run_ranks

from needle.parallel import threads

CLEAN = {v: "" for v in threads.ENV_VARS}  # no user setting


def _blas_threads():
    from threadpoolctl import threadpool_info
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def _seen(comm):
    """The BLAS thread counts this rank's pools report after ``create()`` (rank_main)."""
    return _blas_threads()


def _seen_explicit(comm):
    from needle.parallel.comm.engine import communicator
    communicator.create(blas_threads=1)
    return _blas_threads()


@pytest.mark.parametrize("cores,ranks,want", [(2, 2, 1), (16, 4, 4), (2, 4, 1), (8, 1, 8),
                                              (7, 2, 3)])
def test_threads_per_rank_divides_the_cores(cores, ranks, want):
    assert threads.threads_per_rank(cores, ranks) == want


def test_user_setting_reads_the_first_variable_set(monkeypatch):
    for v in threads.ENV_VARS:
        monkeypatch.delenv(v, raising=False)
    assert threads.user_setting() is None
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    assert threads.user_setting() == ("MKL_NUM_THREADS", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.user_setting() == ("OMP_NUM_THREADS", "2")


def test_bad_blas_threads_is_refused_before_any_collective():
    with pytest.raises(ValueError, match="blas_threads must be a positive int, got 0"):
        threads.place(None, blas_threads=0)


@pytest.mark.mpi
def test_two_ranks_share_the_cores_by_default():
    cores = len(os.sched_getaffinity(0))
    got = run_ranks("mpi", 2, _seen, timeout=120, env=CLEAN)
    for counts in got:
        assert counts and set(counts) == {max(1, cores // 2)}, (cores, got)


@pytest.mark.mpi
def test_the_environment_wins_over_the_default():
    got = run_ranks("mpi", 2, _seen, timeout=120, env=dict(CLEAN, OPENBLAS_NUM_THREADS="2"))
    assert all(counts and set(counts) == {2} for counts in got), got


@pytest.mark.mpi
def test_an_explicit_setting_wins_over_the_environment():
    got = run_ranks("mpi", 2, _seen_explicit, timeout=120,
                    env=dict(CLEAN, OPENBLAS_NUM_THREADS="2"))
    assert all(counts and set(counts) == {1} for counts in got), got


def test_the_virtual_cluster_leaves_the_pools_alone():
    before = _blas_threads()
    got = run_ranks("virtual", 2, _seen)
    assert before and got == [before, before] and _blas_threads() == before
