"""Every MPI collective against the pure references and MPI's own collectives, 1 to 8 ranks."""
import re

import pytest


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_collectives_match_references(run_mpi, ranks: int) -> None:
    res, _ = run_mpi(ranks, "worker_collectives.py", timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    oks = re.findall(r"OK (\d+)", res.stdout)  # one per rank (lines may interleave)
    assert len(oks) == ranks and min(int(n) for n in oks) > 1000, res.stdout


def test_collectives_eight_ranks_oversubscribed(run_mpi) -> None:
    res, _ = run_mpi(8, "worker_collectives.py", "--quick", timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert res.stdout.count("OK ") == 8
