"""needle.process_state: every mode and registered piece round-trips through snapshot/restore."""
import random

import numpy as np
import pytest

import needle as ndl
from needle import process_state
from needle.memory import MemoryTracker
from needle.process_state import Switches, switches


def _same(a, b) -> bool:
    """Equal values, looking inside tuples and arrays (an RNG state holds an array)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _hook(op, args):
    return args


def _change_everything(step: int) -> None:
    """A new value for every mode and every registered piece of state."""
    switches.grad_enabled = not switches.grad_enabled
    switches.autocast_dtype = ("float16", "bfloat16")[step % 2]
    switches.autocast_hook = _hook if switches.autocast_hook is None else None
    ndl.autograd.LAZY_MODE = not ndl.autograd.LAZY_MODE
    np.random.rand()
    random.random()


def _pieces():
    """The value of each piece ``snapshot`` covers, one by one."""
    return ([getattr(switches, name) for name in Switches.MODES]
            + [get() for get, _ in process_state.REGISTERED])


def test_snapshot_restore_round_trips_every_piece() -> None:
    with process_state.saved():
        _change_everything(0)  # away from the defaults
        kept, value = _pieces(), process_state.snapshot()
        _change_everything(1)
        changed = _pieces()
        # every piece changed (a piece registered here and not changed above fails this)
        assert [i for i, (a, b) in enumerate(zip(kept, changed)) if _same(a, b)] == []
        process_state.restore(value)
        assert all(_same(a, b) for a, b in zip(kept, _pieces()))
    assert ndl.autograd.LAZY_MODE is False and switches.grad_enabled is True
    assert switches.autocast_dtype is None and switches.autocast_hook is None


def test_course_globals_stay_in_autograd() -> None:
    """The course's tests assign ``autograd.LAZY_MODE``; the snapshot sees the assignment."""
    with process_state.saved():
        ndl.autograd.LAZY_MODE = True
        value = process_state.snapshot()
    assert ndl.autograd.LAZY_MODE is False
    process_state.restore(value)
    assert ndl.autograd.LAZY_MODE is True
    ndl.autograd.LAZY_MODE = False
    assert isinstance(ndl.autograd.TENSOR_COUNTER, int)


def test_saved_restores_after_an_error_and_grad_mode_reads_the_switch() -> None:
    with pytest.raises(KeyError):
        with process_state.saved():
            switches.grad_enabled = False
            assert not ndl.autograd.is_grad_enabled()
            raise KeyError
    assert ndl.autograd.is_grad_enabled()
    with ndl.no_grad():
        assert switches.grad_enabled is False
        with ndl.enable_grad():
            assert switches.grad_enabled is True
    assert switches.grad_enabled is True


@pytest.mark.parametrize("hook", ["profiler", "alloc_cpu", "alloc_cuda"])
def test_hooks_are_not_in_a_snapshot(hook) -> None:
    """Their owners (the profiler's count of recorders, the trackers' listeners) set them."""
    value = process_state.snapshot()
    setattr(switches, hook, _hook)
    try:
        process_state.restore(value)
        assert getattr(switches, hook) is _hook
    finally:
        setattr(switches, hook, None)


def test_a_memory_tracker_sets_its_backends_hook() -> None:
    with MemoryTracker() as tracker:
        assert switches.alloc_cpu is not None and switches.alloc_cuda is None
        ndl.cpu().empty((10,))
    assert switches.alloc_cpu is None and tracker.num_allocs == 1


def test_a_typo_is_an_error() -> None:
    with pytest.raises(AttributeError):
        switches.profilr = None  # type: ignore[attr-defined]
