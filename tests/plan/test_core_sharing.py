"""needle.plan.core_sharing: the slowdown of synchronised work at p ranks against one."""
import pytest
from mpi_helpers import mpiexec

from needle.plan.core_sharing import sharing_factor, slowdown_curve
from needle.plan.measure.core_sharing import CHUNKS


def test_curve_takes_the_wait_alone_out_and_divides():
    """Seconds per iteration with n = 0 (the allreduce alone) first: 1 rank 0.1, 1.1, 4.1 ms;
    4 ranks 0.5, 2.5, 9.5 ms -> chunks of 1 and 4 ms, 2.0x and 2.25x slower."""
    curve = slowdown_curve([1e-4, 1.1e-3, 4.1e-3], [5e-4, 2.5e-3, 9.5e-3])
    assert [round(w * 1e3, 6) for w, _ in curve] == [1.0, 4.0]
    assert [round(f, 6) for _, f in curve] == [2.0, 2.25]


def test_factor_is_the_median_over_chunks():
    assert sharing_factor([(1e-3, 2.0), (2e-3, 3.0), (4e-3, 2.5)]) == 2.5
    assert sharing_factor([(1e-3, 1.0), (4e-3, 3.0)]) == 2.0


@pytest.mark.mpi
@pytest.mark.slow
def test_measured_at_two_ranks_gives_a_factor_per_chunk():
    """Launched with mpiexec at 1 and 2 ranks (bounded by measure_core_sharing's timeout):
    one (w, factor) per nonzero chunk, w growing with the chunk. No bound on the factor
    itself: it is a timing, and timings are the benchmark's (bench_plan.py)."""
    mpiexec()  # skips without mpiexec
    from needle.plan.cluster import measure_core_sharing
    curve = measure_core_sharing(2, timeout=120)
    assert len(curve) == len(CHUNKS) - 1
    ws = [w for w, _ in curve]
    assert all(w > 0 for w in ws) and ws == sorted(ws)
    assert all(f > 0 for _, f in curve)
