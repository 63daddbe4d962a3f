"""Large results reuse the memory of results the caller dropped, never of ones it holds."""
import numpy as np

from needle.parallel import virtual
from needle.parallel.comm.engine.result_pool import ResultPool


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_dropped_results_are_reused_held_ones_never() -> None:
    pool = ResultPool(keep=2)
    a = pool.empty((1 << 18,), np.float32)
    first = _addr(a)
    del a
    b = pool.empty((1 << 18,), np.float32)
    assert _addr(b) == first  # reused
    view = b[10:20]
    del b
    c = pool.empty((1 << 18,), np.float32)
    assert _addr(c) != first  # a view of the old result is alive
    del view
    small = pool.empty((10,), np.float64)
    assert small.base is None  # small results are plain np.empty


def _allreduce_twice(comm):
    x = np.full(1 << 19, comm.rank + 1.0, dtype=np.float32)
    held = comm.allreduce(x, algorithm="ring")
    again = comm.allreduce(x * 2, algorithm="ring")
    return float(held[0]), float(again[0]), _addr(held) != _addr(again)


def test_collective_results_the_caller_holds_stay_intact() -> None:
    for held, again, distinct in virtual.run(2, _allreduce_twice):
        assert held == 3.0 and again == 6.0 and distinct
