"""needle.profiler: one timeline of a training step's ops, kernels, memory and messages, per rank.

    from needle import profiler
    with profiler.profile(comm=comm) as prof:
        train_step()
    print(prof.summary())
    prof.export_chrome_trace("trace.json")   # open in https://ui.perfetto.dev

Names follow torch.profiler (``profile``, ``record_function``, ``schedule``, ``key_averages``,
``export_chrome_trace``). Files: ``events.py`` (what is recorded), ``recorder.py`` (per-thread
recording of raw tuples: the hot path), ``build.py`` (events from them, once recording ends),
``hooks.py`` (the library's hooks), ``schedule.py``, ``profile.py``,
``distributed.py`` (clock offsets, gathering to rank 0), ``trace.py`` (Chrome trace export),
``trace_check.py`` (the format's rules), ``summary.py`` (tables), ``plot.py`` (matplotlib).
"""
from .events import Event, MemorySample, Peak, RankRecord
from .profile import profile, profile_to
from .record_function import record_function
from .schedule import ProfilerAction, schedule
from .summary import exposed_comm_ns, key_averages
from .trace import chrome_trace
from .trace_check import TraceFormatError, check_trace

__all__ = ["Event", "MemorySample", "Peak", "ProfilerAction", "RankRecord", "TraceFormatError",
           "check_trace", "chrome_trace", "exposed_comm_ns", "key_averages", "profile",
           "profile_to", "record_function", "schedule"]
