"""Making a failure on one rank end the whole job instead of hanging the others.

MPI jobs fail badly by default: if rank 1 raises, rank 0 waits forever in its next receive.
Two mechanisms prevent that: every wait has a deadline (``progress.wait`` raises
``CommTimeoutError`` after ``NEEDLE_COMM_TIMEOUT`` seconds), and an uncaught exception calls
``MPI_Abort`` on ``COMM_WORLD``, which makes ``mpiexec`` kill every rank and exit non-zero.
(``python -m mpi4py script.py`` installs the same behaviour; ``needle.parallel.launch`` uses it.)
"""
import sys
import time
import traceback
from typing import Any

# Seconds between printing the traceback and MPI_Abort: mpiexec forwards each rank's output
# asynchronously and drops what it has not forwarded when the abort tears the job down.
ABORT_GRACE = 0.3


def install_abort_hook() -> None:
    """Make an uncaught exception print its traceback and then ``MPI_Abort`` the job."""
    if getattr(sys.excepthook, "needle_abort", False):
        return
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if previous is sys.__excepthook__:  # one write: no half-forwarded traceback
            sys.stderr.write("".join(traceback.format_exception(kind, value, tb)))
        else:
            previous(kind, value, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        time.sleep(ABORT_GRACE)
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        if world.Get_size() > 1:
            world.Abort(1)
    hook.needle_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook
