"""Pipeline parallelism: pure schedules, a simulator, partitioning, the executor, timelines."""
from .partition import balanced_cuts, partition
from .pipeline_parallel import PipelineParallel
from .schedules import SCHEDULES, gpipe, interleaved_1f1b, one_f_one_b
from .simulator import ScheduleDeadlockError, Timeline, simulate

__all__ = ["PipelineParallel", "gpipe", "one_f_one_b", "interleaved_1f1b", "SCHEDULES",
           "simulate", "Timeline", "ScheduleDeadlockError", "partition", "balanced_cuts"]
