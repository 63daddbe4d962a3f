"""Every MPI collective against the pure references and MPI's own collectives, 1 to 8 ranks."""
import re
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_collectives_match_references(run_mpi, ranks: int) -> None:
    res, _ = run_mpi(ranks, "comm/worker_collectives.py", timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    oks = re.findall(r"OK (\d+)", res.stdout)  # one per rank (lines may interleave)
    assert len(oks) == ranks and min(int(n) for n in oks) > 1000, res.stdout


def test_collectives_eight_ranks_oversubscribed(run_mpi) -> None:
    res, _ = run_mpi(8, "comm/worker_collectives.py", "--quick", timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert res.stdout.count("OK ") == 8


def test_bench_smoke() -> None:
    cmd = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "benchmarks" / "bench_collectives.py"),
           "--sizes", "4K,1M", "--batches", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=worker_env(), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "allreduce       ring" in res.stdout and "busbw" in res.stdout
    assert "MPI_Allreduce time / auto allreduce time at 4K" in res.stdout
    assert "rank 0 sent 1048576 bytes; 2(p-1)/p*N = 1048576" in res.stdout
