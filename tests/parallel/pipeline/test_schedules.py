"""Pipeline schedules: exact small cases written by hand, invariants up to 8 stages, and the
simulator's bubble against the papers' formulas."""
import pytest

from needle.parallel.pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b
from needle.parallel.pipeline.simulator import ScheduleDeadlockError, simulate, virtual_stage


def test_gpipe_exact():
    assert gpipe(2, 3) == [[("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]] * 2


def test_1f1b_exact():
    assert one_f_one_b(3, 4) == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)],
    ]
    # fewer microbatches than stages: warm-up is cut to m
    assert one_f_one_b(4, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_interleaved_exact():
    # p=2, m=2, v=2: stage 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards, i.e. all of them
    s = interleaved_1f1b(2, 2, 2)
    assert s[0] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
                    ("B", 0, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0)]
    assert s[1] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1),
                    ("F", 1, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0)]


def _all(p, m):
    yield "gpipe", gpipe(p, m), 1
    yield "1f1b", one_f_one_b(p, m), 1
    for v in (2, 3):
        if m % p == 0:
            yield f"interleaved{v}", interleaved_1f1b(p, m, v), v


def _check_stage(name, acts, s, p, m, v):
    """Every (microbatch, chunk) once forward and once backward, F before B; peak in flight."""
    keys = [(a[1], a[2] if len(a) > 2 else 0) for a in acts]
    fs = [k for a, k in zip(acts, keys) if a[0] == "F"]
    bs = [k for a, k in zip(acts, keys) if a[0] == "B"]
    want = {(i, c) for i in range(m) for c in range(v)}
    assert len(fs) == len(bs) == m * v and set(fs) == set(bs) == want, name
    for k in want:
        assert keys.index(k) < len(keys) - 1 - keys[::-1].index(k) or m * v == 0
        assert acts[keys.index(k)][0] == "F", (name, s, k)
    # in flight (forwarded, not yet backwarded) microbatches
    live, peak = 0, 0
    for a in acts:
        live += 1 if a[0] == "F" else -1
        peak = max(peak, live)
    if name == "1f1b":
        assert peak <= min(p - s, m), (s, peak)
    if name == "gpipe":
        assert peak == m


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
def test_invariants(p, m):
    for name, sched, v in _all(p, m):
        assert len(sched) == p
        for s, acts in enumerate(sched):
            _check_stage(name, acts, s, p, m, v)
        # stage s's F(m) after stage s-1's F(m), B(m) after stage s+1's B(m): the simulator
        # raises on any violation it cannot wait out, and checks each start after its inputs
        t = simulate(sched)
        ends = {}
        for s, ev in enumerate(t.events):
            for a, b, e in ev:
                ends[(a[0], a[1], virtual_stage(s, a, p))] = (b, e)
        for (kind, mb, k), (b, _) in ends.items():
            if kind == "F" and k > 0:
                assert b >= ends[("F", mb, k - 1)][1]
            if kind == "B" and k < p * v - 1:
                assert b >= ends[("B", mb, k + 1)][1]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2), (8, 3), (3, 1)])
def test_bubble_equals_formula(p, m):
    for sched in (gpipe(p, m), one_f_one_b(p, m)):
        assert simulate(sched).bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 3)])
def test_interleaved_bubble_equals_formula(p, m, v):
    t = simulate(interleaved_1f1b(p, m, v), cost=lambda s, a: (1.0 if a[0] == "F" else 2.0) / v)
    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))


def test_deadlock_detected():
    # stage 1 wants B(0) before it has run F(0): nothing can ever run it
    with pytest.raises(ScheduleDeadlockError):
        simulate([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]])


def test_bad_input():
    with pytest.raises(ValueError, match="multiple of the number of stages"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="num_microbatches=0"):
        one_f_one_b(2, 0)
