"""The library's process-wide switches (hooks and modes), and one way to save and restore them.

Every module reads and writes them here, as attributes of ``switches``: ``switches.grad_enabled``
(False inside ``no_grad()``), ``switches.autocast_dtype`` and ``switches.autocast_hook`` (set
inside ``needle.amp.autocast``: ``hook(op, args) -> args``, called on every TensorOp dispatch),
``switches.profiler`` (set while ``needle.profiler`` records: op dispatch, gradients, module
calls, data loading, optimizer steps, gradient buckets, compiled programs, kernel launches and
ledger records call it) and ``switches.alloc_cpu`` / ``alloc_cuda`` (set while a
``MemoryTracker`` or the profiler listens: each backend calls its own with every new Array; a
backend's ``ALLOC_SWITCH`` names it). The hooks are None while off, so each costs one
attribute test where it is checked.

``snapshot()`` returns the modes a separate process would have to itself: grad mode and
autocast, numpy's and ``random``'s global RNGs, and every piece another module added with
``register(getter, setter)``; ``restore(value)`` sets them back, and ``saved()`` does both
around a block. The virtual cluster gives each rank thread its own copy this way
(``parallel/virtual.py``). The hooks are not in a snapshot: they are on while any thread
listens (each thread has its own recorder), and their owners (the profiler's count of active
recorders, the memory tracker's list of listeners) set and clear them; a restore would undo
that bookkeeping.

The course's module globals stay where the course has them: ``autograd.LAZY_MODE`` (a test
assigns it, which nothing here could intercept) is registered by ``autograd`` as a getter and
setter, and ``autograd.TENSOR_COUNTER`` is a count of live tensors, not a mode to restore.

This module imports nothing of needle, so every layer may use it.
"""
import contextlib
import random
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np

__all__ = ["switches", "Switches", "snapshot", "restore", "saved", "register", "REGISTERED"]


class Switches:
    """The process-wide hooks and modes (one instance, ``switches``)."""

    __slots__ = ("grad_enabled", "autocast_dtype", "autocast_hook", "profiler", "alloc_cpu",
                 "alloc_cuda")
    MODES = ("grad_enabled", "autocast_dtype", "autocast_hook")  # the ones ``snapshot`` saves

    def __init__(self) -> None:
        self.grad_enabled = True
        self.autocast_dtype: Optional[str] = None
        self.autocast_hook: Optional[Callable[[Any, Tuple[Any, ...]], Tuple[Any, ...]]] = None
        self.profiler: Any = None
        self.alloc_cpu: Optional[Callable[[Any], None]] = None
        self.alloc_cuda: Optional[Callable[[Any], None]] = None


switches = Switches()

# (getter, setter) of each other piece of per-process state: the global RNGs, then what
# other modules add with ``register``.
REGISTERED: List[Tuple[Callable[[], Any], Callable[[Any], None]]] = [
    (np.random.get_state, np.random.set_state),
    (random.getstate, random.setstate),
]


def register(getter: Callable[[], Any], setter: Callable[[Any], None]) -> None:
    """Add a piece of per-process state to every ``snapshot`` and ``restore``."""
    REGISTERED.append((getter, setter))


def snapshot() -> Tuple[Any, ...]:
    """The current value of every mode and registered piece of state."""
    modes = tuple(getattr(switches, name) for name in Switches.MODES)
    return modes, tuple(get() for get, _ in REGISTERED)


def restore(value: Tuple[Any, ...]) -> None:
    """Set every mode and registered piece of state to ``value`` (from ``snapshot``)."""
    modes, others = value
    for name, v in zip(Switches.MODES, modes):
        setattr(switches, name, v)
    for (_, set_), v in zip(REGISTERED, others):
        set_(v)


@contextlib.contextmanager
def saved() -> Iterator[None]:
    """Restore, when the block ends, the state ``snapshot`` covers as it was when it began."""
    value = snapshot()
    try:
        yield
    finally:
        restore(value)
