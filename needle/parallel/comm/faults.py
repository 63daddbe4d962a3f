"""Making a failure on one rank end the whole job instead of hanging the others.

MPI jobs fail badly by default: if rank 1 raises, rank 0 waits forever in its next receive.
Two mechanisms prevent that: every wait has a deadline (``progress.wait`` raises
``CommTimeoutError`` after ``NEEDLE_COMM_TIMEOUT`` seconds), and an uncaught exception calls
``MPI_Abort`` on ``COMM_WORLD``, which makes ``mpiexec`` kill every rank and exit non-zero.
(``python -m mpi4py script.py`` installs the same behaviour; ``needle.parallel.launch`` uses it.)

Under ``needle.parallel.launch`` the hook first records the exception in the launcher's report
folder (``NEEDLE_LAUNCH_DIR``), so the launcher can say which rank failed first and why.
"""
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict

REPORT_DIR_ENV = "NEEDLE_LAUNCH_DIR"


def rank_from_env() -> str:
    """This process's rank as the MPI launcher told it (before MPI is initialised)."""
    return os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))


def write_status(status: Dict[str, Any]) -> None:
    """Record how this rank ended in the launcher's report folder (the first record wins)."""
    folder = os.environ.get(REPORT_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / f"rank{rank_from_env()}.status"
    if not path.exists():
        path.write_text(json.dumps(dict(status, host=socket.gethostname())))

# Seconds between printing the traceback and MPI_Abort: mpiexec forwards each rank's output
# asynchronously and drops what it has not forwarded when the abort tears the job down.
ABORT_GRACE = 0.3


def install_abort_hook() -> None:
    """Make an uncaught exception print its traceback and then ``MPI_Abort`` the job."""
    if getattr(sys.excepthook, "needle_abort", False):
        return
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        write_status({"exception": f"{kind.__name__}: {value}", "time": time.time()})
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
