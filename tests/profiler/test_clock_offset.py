"""needle/profiler/distributed.py's clock offset, exactly: scripted ping-pong rounds with known
legs give Cristian's estimate of the round with the shortest trip to the nanosecond, and a
profile's record holds the mean of the offsets measured when it starts and when it stops."""
import contextlib
import types

import numpy as np

from needle import profiler
from needle.profiler import distributed

SHIFT = 3 * 10**9  # rank 1's clock minus rank 0's, ns
# (rank 0 -> rank 1, rank 1 -> rank 0) time of each round, ns: trips 100, 40, 80, 16, 41
LEGS = [(50, 50), (30, 10), (20, 60), (7, 9), (40, 1)]


class _Rank0:
    """Rank 0's side of the ping-pong against a rank whose clock is SHIFT ahead: each send
    is answered after ``out`` ns with that rank's time, which arrives ``back`` ns later."""

    def __init__(self) -> None:
        self.now, self.legs, self.sent = 1_000_001, list(LEGS), 0
        self.ledger = types.SimpleNamespace(paused=contextlib.nullcontext)

    def clock(self) -> int:
        return self.now

    def send(self, arr, dest, tag) -> None:
        self.sent = int(arr[0])

    def recv(self, src, tag):
        out, back = self.legs.pop(0)
        t_r = self.now + out + SHIFT  # rank 1's clock when the ping arrived
        self.now += out + back
        return np.array([t_r], dtype=np.int64)


def test_the_offset_is_cristians_estimate_of_the_shortest_round(monkeypatch):
    comm = _Rank0()
    monkeypatch.setattr(distributed, "perf_ns", comm.clock)
    got = distributed._best_offset(comm, 1, len(LEGS))
    out, back = min(LEGS, key=sum)  # (7, 9): rank 1 read its clock 7 ns after t0, t1 = t0 + 16
    assert got == SHIFT + out - (out + back) // 2 == SHIFT - 1
    assert comm.legs == []


def test_the_other_rank_takes_the_offset_rank_0_sends(monkeypatch):
    got = []

    class Rank1:
        rank, size = 1, 2
        ledger = types.SimpleNamespace(paused=contextlib.nullcontext)

        def irecv(self, src, tag):
            return types.SimpleNamespace(poll=lambda: True)

        def send(self, arr, dest, tag):
            got.append(int(arr[0]))

        def recv(self, src, tag):
            return np.array([SHIFT + 5], dtype=np.int64)

    monkeypatch.setattr(distributed, "perf_ns", lambda: 7)
    assert distributed.clock_offset(Rank1(), rounds=3) == SHIFT + 5
    assert got == [7, 7, 7]  # one answer per round


def test_the_record_holds_the_mean_of_the_start_and_stop_offsets(monkeypatch):
    offsets = iter([1_000, 3_001])  # the clock drifted while profiling
    monkeypatch.setattr(distributed, "clock_offset", lambda comm: next(offsets))
    comm = types.SimpleNamespace(rank=1, size=2)
    with profiler.profile(comm=comm) as prof:
        pass
    assert prof.record.offset_ns == (1_000 + 3_001) // 2 == 2_000
