"""What host code tells a CUDA graph being captured (``needle.backend_cuda.graphs``), without
importing the CUDA backend: a host value the captured work depends on (``watch``) and host
bookkeeping each replay must repeat and the capture itself must take back (``counted_step``: a
capture runs nothing on the device, so a step it counted on the host has not happened). No-ops
when nothing is captured."""
from typing import Any, Callable, List

CURRENT: List[Any] = [None]  # the CUDAGraph being captured (set by graphs.graph)


def watch(name: str, get: Callable[[], Any]) -> None:
    """During a capture: ``get()`` must return what it returns now at every replay."""
    g = CURRENT[0]
    if g is not None:
        g._checks.append((name, get, get()))


def counted_step(count: Callable[[int], None]) -> None:
    """During a capture: host bookkeeping ``count(+1)`` done by the captured call is taken back
    when the capture ends (``count(-1)``) and done again at each replay (``count(+1)``)."""
    g = CURRENT[0]
    if g is not None:
        g._on_end.append(lambda: count(-1))
        g._on_replay.append(lambda: count(1))
