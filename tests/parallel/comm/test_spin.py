"""How long a waiting rank spins before yielding its core (no MPI launch needed)."""
import os

import pytest

from needle.parallel.comm.transport.mpi import _spin_polls


class _FakeComm:
    """Just enough of an mpi4py communicator: ``Split_type`` reports ``ranks`` on this node."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks

    def Split_type(self, _kind):  # noqa: N802 (mpi4py's name)
        return self

    def Get_size(self) -> int:  # noqa: N802
        return self.ranks

    def Free(self) -> None:  # noqa: N802
        pass


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_oversubscribed_node_yields_at_once(monkeypatch):
    monkeypatch.delenv("NEEDLE_POLLS_BEFORE_YIELD", raising=False)
    assert _spin_polls(_FakeComm(_cores() + 1)) == 0


def test_node_with_a_core_per_rank_spins_first(monkeypatch):
    monkeypatch.delenv("NEEDLE_POLLS_BEFORE_YIELD", raising=False)
    assert _spin_polls(_FakeComm(1)) == 256
    assert _spin_polls(_FakeComm(_cores())) == 256


@pytest.mark.parametrize("value", ["0", "1000"])
def test_environment_overrides(monkeypatch, value):
    monkeypatch.setenv("NEEDLE_POLLS_BEFORE_YIELD", value)
    assert _spin_polls(_FakeComm(_cores() + 5)) == int(value)
