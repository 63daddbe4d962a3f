"""``with needle.lazy():``: queue the device's primitives, run them fused when data is read."""
import contextlib
from typing import Any, Iterator, List, Optional

from ..backend_ndarray import cpu
from .capture import Recorder, Trace, alive_elsewhere
from .replay import Program


class LazyBlock:
    """The state of one ``lazy()`` block: the queue of primitives and the programs it ran."""

    def __init__(self, device: Any, fusion: bool) -> None:
        self.device = device
        self.fusion = fusion
        self.programs: List[Program] = []
        self.recorder = Recorder(device, execute=False, on_read=self.flush)

    def flush(self) -> None:
        """Run the queued primitives, fused, in place."""
        trace = self.recorder.trace
        if not trace.steps:
            return
        self.recorder.trace = Trace()
        keep = alive_elsewhere(trace, [])
        program = Program(trace, self.device, [], keep, fusion=self.fusion, in_place=True,
                          lookup=self.recorder.original)
        program.run([])
        self.programs.append(program)

    def explain(self, limit: Optional[int] = None) -> str:
        """Every flushed program's dump."""
        return "\n".join(p.explain(limit=limit) for p in self.programs) or "nothing ran"


@contextlib.contextmanager
def lazy(device: Any = None, fusion: bool = True) -> Iterator[LazyBlock]:
    """Defer the device's primitives in this block; run them fused on a read or at the end."""
    state = LazyBlock(device if device is not None else cpu(), fusion)
    with state.recorder:
        try:
            yield state
        finally:
            state.flush()
