"""The pipeline time: the simulator's makespan, extended linearly past SIM_LIMIT microbatches."""
import pytest

from needle.plan.bubble import makespan, pipeline_seconds


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("b,comm", [(2.0, 0.0), (3.0, 0.3), (2.2, 1.7)])
def test_extrapolation_equals_the_full_simulation(schedule, v, p, b, comm):
    m = 24 * p
    full = makespan(schedule, p, m, v, 1.0, b, comm)
    assert pipeline_seconds(schedule, p, m, 1.0, b, comm, v, limit=1) == pytest.approx(full,
                                                                                      rel=1e-9)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (4, 100)])
def test_unit_costs_give_the_textbook_bubble(p, m):
    """F = 1, B = 2, no messages: (m + p - 1)(F + B) for GPipe and 1F1B, i.e. a bubble
    fraction (p - 1) / (m + p - 1) (Narayanan et al., arXiv:2104.04473, sec. 2.2)."""
    for sched in ("1f1b", "gpipe"):
        assert pipeline_seconds(sched, p, m, 1.0, 2.0) == pytest.approx(3 * (m + p - 1))
    if m % p == 0:  # interleaved, v = 2: (m + (p - 1) / v)(F + B)
        assert pipeline_seconds("interleaved", p, m, 1.0, 2.0, chunks=2) == \
            pytest.approx(3 * (m + (p - 1) / 2))


def test_no_pipeline_is_m_times_f_plus_b():
    assert pipeline_seconds("1f1b", 1, 7, 0.5, 1.25) == pytest.approx(7 * 1.75)
