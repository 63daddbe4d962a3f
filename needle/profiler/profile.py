"""``profile``: record one step (or a schedule of steps) of training, on one rank or all.

    with ndl.profiler.profile(comm=comm) as prof:    # comm: optional, for one job-wide trace
        with ndl.profiler.record_function("step"):
            loss = loss_fn(model(x), y); loss.backward(); opt.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total"))
    prof.export_chrome_trace("trace.json")         # with comm: rank 0 writes every rank's

Profiling is off by default; while it is off the library's hooks cost one global test each.
"""
import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional

from .. import numbers
from . import distributed, hooks, summary, trace
from . import events as ev
from .events import Event, RankRecord
from .recorder import ThreadRecorder
from .schedule import ProfilerAction

if TYPE_CHECKING:  # the profiler is told its communicator; it never imports one to run
    from ..parallel.comm.protocol import Comm

_RECORDING = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
# thread ident -> the profile started on it and not yet stopped (one per thread: see start)
_STARTED: Dict[int, "profile"] = {}


class profile:
    """Context manager recording ops, modules, kernels, memory and messages on this thread.

    ``comm``: record the job on every rank of ``comm`` (enter it on every rank): clocks are
    aligned to rank 0's and ``export_chrome_trace`` writes one trace with a track per rank.
    ``schedule`` (``schedule(wait=, warmup=, active=)``) with ``prof.step()`` after each step
    records some steps only, calling ``on_trace_ready(prof)`` after each active cycle.
    ``record_shapes`` (ops' input shapes) and ``profile_memory`` (allocations and releases:
    bytes per event, memory counters, peaks) are on by default; each costs host time per op
    (``benchmarks/bench_profiler.py --parts`` measures them), turning them off saves it.
    """

    def __init__(self, *, comm: Optional["Comm"] = None,
                 schedule: Optional[Callable[[int], Any]] = None,
                 on_trace_ready: Optional[Callable[["profile"], Any]] = None,
                 record_shapes: bool = True, profile_memory: bool = True,
                 max_events: int = 2_000_000) -> None:
        if on_trace_ready is not None and schedule is None:
            raise ValueError("profile: on_trace_ready is called after each active cycle of a "
                             "schedule; pass schedule=schedule(wait=..., warmup=..., active=...)")
        self.comm, self.schedule, self.on_trace_ready = comm, schedule, on_trace_ready
        max_events = numbers.count_arg(max_events, "profile: max_events", lo=1)  # 0: all dropped
        self.record_shapes, self.max_events = record_shapes, max_events
        self.profile_memory = profile_memory
        self.step_num = 0
        self.record: Optional[RankRecord] = None   # this rank's last finished recording
        self.records: Optional[List[RankRecord]] = None  # every rank's, on rank 0, once exported
        self._rec: Optional[ThreadRecorder] = None
        self._action = ProfilerAction.NONE
        self._offset0 = 0
        self._thread: Optional[int] = None  # the thread it was started on, until stopped

    @property
    def rank(self) -> int:
        """This rank in ``comm`` (0 without one)."""
        return self.comm.rank if self.comm is not None else 0

    # ------------------------------------------------------------------ recording
    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.stop()
        else:  # no collective calls: the other ranks may never get here, and the error must show
            self._end_recorder()
            self._action = ProfilerAction.NONE
            self._release_thread()

    def start(self) -> None:
        """Start profiling (the step count starts at 0). Refused while a profile (this one or
        another) is started on this thread: a thread has one recorder, so the inner one would
        take the outer's events and leave it recording nothing after the inner block."""
        me = threading.get_ident()
        active = _STARTED.get(me)
        if active is self:
            raise RuntimeError("profile: already started on this thread (stop() it first)")
        if active is not None:
            raise RuntimeError("profile: this thread is already being profiled by an enclosing "
                               "profile(); nested profilers are refused (the inner one would "
                               "take the outer one's events). Mark a part of the outer "
                               "recording with profiler.record_function(name) instead")
        _STARTED[me] = self
        self._thread = me
        try:
            self._start()
        except BaseException:
            self._release_thread()
            raise

    def _start(self) -> None:
        self.step_num = 0
        self._offset0 = distributed.clock_offset(self.comm) if self.comm is not None else 0
        self._action = self.schedule(0) if self.schedule is not None else ProfilerAction.RECORD
        if self._action in _RECORDING:
            self._begin()

    def step(self) -> None:
        """Mark the end of a training step: the schedule decides what the next one does."""
        prev = self._action
        self.step_num += 1
        if self.schedule is None:
            self._step_range()
            return
        self._action = self.schedule(self.step_num)
        if prev == ProfilerAction.RECORD_AND_SAVE:
            self._finish(save=True)
        elif prev == ProfilerAction.WARMUP and self._action != ProfilerAction.WARMUP:
            self._end_recorder()  # warmup steps are thrown away
        if self._action in _RECORDING:
            if self._rec is None:
                self._begin()
            else:
                self._step_range()

    def stop(self) -> None:
        """Stop profiling; the recording so far becomes ``record``."""
        try:
            if self._rec is not None and self._action != ProfilerAction.WARMUP:
                self._finish(save=self.schedule is not None)
            else:
                self._end_recorder()
                if self.comm is not None:  # keep the collective calls matched on every rank
                    distributed.clock_offset(self.comm)
        finally:  # (on_trace_ready may raise: the thread is free again all the same)
            self._action = ProfilerAction.NONE
            self._release_thread()

    def _release_thread(self) -> None:
        if self._thread is not None and _STARTED.get(self._thread) is self:
            del _STARTED[self._thread]
        self._thread = None

    def _begin(self) -> None:
        self._rec = ThreadRecorder(self.record_shapes, self.max_events, self.profile_memory)
        hooks.install()
        self._rec.start()
        if self.schedule is not None:
            self._rec.open(f"ProfilerStep#{self.step_num}", ev.STEP)

    def _step_range(self) -> None:
        """Close the step range open now (if any) and open the next one."""
        if self._rec is None:
            return
        self._rec.close_through(f"ProfilerStep#{self.step_num - 1}", ev.STEP)
        self._rec.open(f"ProfilerStep#{self.step_num}", ev.STEP)

    def _end_recorder(self) -> Optional[ThreadRecorder]:
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.stop()
            hooks.uninstall()
        return rec

    def _finish(self, save: bool) -> None:
        """End the recording: align the clock again, keep the record, hand it over."""
        rec = self._end_recorder()
        offset1 = distributed.clock_offset(self.comm) if self.comm is not None else 0
        if rec is not None:
            self.record = rec.record(self.rank, (self._offset0 + offset1) // 2)
        self.records = None
        if save and self.on_trace_ready is not None:
            self.on_trace_ready(self)

    # ------------------------------------------------------------------ results
    def events(self) -> List[Event]:
        """This rank's recorded events, by start time (an enclosing range before its insides)."""
        return sorted(self._finished().events, key=lambda e: (e.ts, -e.dur))

    def _finished(self) -> RankRecord:
        if self.record is None:
            raise RuntimeError("profile: nothing recorded yet (results are ready after the "
                               "`with profile(...)` block, or after an active cycle)")
        return self.record

    def key_averages(self, group_by_input_shape: bool = False) -> summary.EventList:
        """This rank's events grouped by name (and input shapes): ``.table(sort_by=...)``."""
        return summary.key_averages(self._finished().events, group_by_input_shape)

    def summary(self, row_limit: int = 10) -> str:
        """Top ops by self time and memory, memory peaks, communication, overhead per op."""
        return summary.summary(self._finished(), row_limit)

    def gather(self) -> Optional[List[RankRecord]]:
        """Every rank's record on rank 0 (None on the others); collective with ``comm``."""
        mine = self._finished()
        if self.comm is None:
            self.records = [mine]
        elif self.records is None:
            self.records = distributed.gather_records(self.comm, mine)
        return self.records

    def export_chrome_trace(self, path: str) -> Optional[str]:
        """Write the trace (every rank's, with ``comm``: call it on every rank; rank 0
        writes); returns ``path`` where written, else None."""
        records = self.gather()
        return trace.write(records, path) if records is not None else None


@contextlib.contextmanager
def profile_to(directory: str, comm: Optional["Comm"] = None) -> Iterator[profile]:
    """Profile the block and write ``directory/trace.json`` (every rank's, by rank 0) and
    ``directory/summary.rank<r>.txt`` (each rank's); enter it on every rank of ``comm``."""
    os.makedirs(directory, exist_ok=True)
    with profile(comm=comm) as prof:
        yield prof
    written = prof.export_chrome_trace(os.path.join(directory, "trace.json"))
    with open(os.path.join(directory, f"summary.rank{prof.rank}.txt"), "w") as f:
        f.write(prof.summary() + "\n")
    if written is not None:
        print(f"profile: {written} (open in https://ui.perfetto.dev); summaries in {directory}",
              flush=True)
