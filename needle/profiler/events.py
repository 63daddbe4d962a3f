"""What the profiler records: timed events, memory samples and peaks, one rank's whole record.

Times are integer nanoseconds of ``time.perf_counter_ns()`` on the rank that recorded them;
the trace export shifts each rank by its measured clock offset (``distributed.py``). Events
are plain named tuples so that a rank's record pickles cheaply to rank 0.
"""
from typing import Any, Dict, List, NamedTuple

# The category of each kind of event, the way the trace and the summary group them.
OP, BACKWARD, MODULE, USER = "op", "backward", "module", "user_annotation"
DATALOADER, OPTIMIZER, STEP = "dataloader", "optimizer", "profiler_step"
KERNEL, PROGRAM, PROGRAM_STEP = "kernel", "compiled_program", "program_step"
COMM, BUCKET = "comm", "bucket"

# The track (Chrome trace thread) each category is drawn on: host work nests on "main";
# kernels and compiled-program steps on "kernels" (a GPU stream's place in torch's trace);
# messages on "comm", where overlapping calls (nonblocking buckets) get lanes of their own.
MAIN, KERNELS, COMMS = "main", "kernels", "comm"
TRACK = {KERNEL: KERNELS, PROGRAM_STEP: KERNELS, COMM: COMMS}


# entries per record in a recorder's flat logs (recorder.py appends them, build.py reads them)
OP_FIELDS, GRAD_FIELDS, MODULE_FIELDS, MEMORY_FIELDS = 8, 5, 4, 3

class Event(NamedTuple):
    """One timed interval (or an instant, ``dur == -1``) on one rank."""

    name: str
    cat: str
    ts: int       # start, ns (perf_counter_ns of the recording rank)
    dur: int      # ns; -1 for an instant
    args: Dict[str, Any]

    @property
    def track(self) -> str:
        """The trace track this event is drawn on."""
        return TRACK.get(self.cat, MAIN)

    @property
    def end(self) -> int:
        """End time, ns."""
        return self.ts + max(self.dur, 0)


class MemorySample(NamedTuple):
    """Bytes allocated on ``device`` since profiling began, and still alive, at ``ts``."""

    ts: int
    device: str
    allocated: int


class Peak(NamedTuple):
    """The most bytes allocated at once on ``device``, when, and inside which op or range."""

    device: str
    allocated: int
    ts: int
    at: str


class RankRecord(NamedTuple):
    """Everything one rank recorded: what the trace export and the summaries read."""

    rank: int
    events: List[Event]
    samples: List[MemorySample]
    peaks: Dict[str, Peak]
    offset_ns: int                 # this rank's clock minus rank 0's
    overhead_ns_per_op: float      # the profiler's own time per recorded op
    ops: int                       # ops recorded
    dropped: int                   # events not kept (past the recorder's limit)
