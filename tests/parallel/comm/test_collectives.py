"""Every collective against the pure references, on MPI and on the virtual cluster, 1 to 8 ranks.

The same function (``collective_cases.check_all``) runs on both backends; under MPI the digest of
every result must equal the virtual cluster's, bit for bit.
"""
import subprocess
import sys

import collective_cases
import pytest
from mpi_helpers import BACKENDS, ROOT, mpiexec, run_ranks, worker_env


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives_match_references(backend: str, ranks: int) -> None:
    res = run_ranks(backend, ranks, collective_cases.check_all, timeout=240)
    assert len(res) == ranks and min(checks for checks, _ in res) > 1000
    if backend == "mpi":  # the virtual cluster gives the same bits
        virtual = run_ranks("virtual", ranks, collective_cases.check_all)
        assert [d for _, d in res] == [d for _, d in virtual]


@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives_eight_ranks(backend: str) -> None:
    res = run_ranks(backend, 8, collective_cases.check_all, True, timeout=240)
    assert len(res) == 8 and all(checks > 100 for checks, _ in res)


@pytest.mark.mpi
def test_bench_smoke() -> None:
    cmd = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "benchmarks" / "bench_collectives.py"),
           "--sizes", "4K,1M", "--batches", "1", "--no-gloo"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=worker_env(), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "allreduce       ring" in out and "busbw" in out
    assert "rank 0 sent 1048576 bytes; 2(p-1)/p*N = 1048576" in out
    for row in ("busbw allreduce / MPICH", "busbw broadcast / MPICH", "4K allreduce time / MPICH",
                "ring allreduce busbw / p2p at 1M", "without out= / with out=",
                "ledger off / on", "alpha-beta model fitted", "ring predicted_us"):
        assert row in out, out
