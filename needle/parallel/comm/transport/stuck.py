"""A rank stuck inside one MPI call, where the transport's deadline cannot see it.

``MPITransport.wait`` keeps its deadline in Python, between calls of ``MPI_Testall``. A single
call can block too: when a peer's host is gone, MPICH's network module (libfabric's tcp
provider) may retry an ``MPI_Isend`` to it for ever inside the call (seen on the test cluster,
``tests/parallel/test_testcluster_faults.py``: the ranks of one host killed, a survivor's
``Isend`` never returned). mpi4py releases the GIL during MPI calls, so a daemon thread can
look at the main thread: ``watch`` starts one that samples the main thread's innermost Python
frame four times per timeout. Once that frame has sat in the same one of the ``calls`` the
communicator names (each posts a message or makes a communicator: one MPI call) for longer
than the timeout, the thread names the rank, the collective and its peers, and ends the job
with ``MPI_Abort`` ``GRACE`` seconds later (MPI runs with ``MPI_THREAD_MULTIPLE``). The calls
themselves pay nothing.
"""
import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Iterable, Optional, Set

# Seconds between saying so and ``MPI_Abort``: the ranks waiting for this one began about when
# it stuck, so their deadlines are about as near; they raise and name it first.
GRACE = 2.0

_watching = False


def watch(timeout: float, rank: int, abort: Callable[[int], None],
          calls: Iterable[Callable]) -> None:
    """Start the watchdog thread (once per process; from the main thread only). ``calls``: the
    functions whose one MPI call should return at once (a frame parked in one of them for a
    whole timeout is stuck inside MPI)."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    _watching = True
    main, codes = threading.main_thread(), {f.__code__ for f in calls}
    threading.Thread(target=_run, args=(main, timeout, rank, abort, codes), daemon=True,
                     name="needle-stuck-in-mpi").start()


def _run(main: threading.Thread, timeout: float, rank: int, abort: Callable[[int], None],
         codes: Set[CodeType]) -> None:
    parked: Optional[tuple] = None
    since = time.monotonic()
    while main.is_alive():
        time.sleep(timeout / 4)
        frame = sys._current_frames().get(main.ident or 0)
        now = time.monotonic()
        here = (id(frame), frame.f_lasti) if frame and frame.f_code in codes else None
        if here is None or here != parked:
            parked, since = here, now
        elif frame is not None and now - since > timeout:
            _end(frame, now - since, rank, abort)
            return


def _end(frame: FrameType, seconds: float, rank: int, abort: Callable[[int], None]) -> None:
    """Say which call is stuck where, record it for the launcher, and end the job."""
    from ...faults import write_status  # (faults imports the communicator's parts: lazily)

    message = (f"{_call(frame, rank)}: stuck {seconds:.0f} s inside one MPI call (in "
               f"{frame.f_code.co_name}), which never returned (its peer's host gone?); ending "
               "the job")
    write_status({"exception": f"CommTimeoutError: {message}", "time": time.time()})
    os.write(2, f"{message}\n".encode())
    time.sleep(GRACE)
    abort(1)


def _call(frame: Optional[FrameType], rank: int) -> str:
    """The timeout message of the call ``frame`` runs in (its ``describe``), else the rank."""
    while frame is not None:
        names = frame.f_locals
        describe: Any = names.get("describe") or getattr(names.get("self"), "_describe", None)
        if callable(describe):
            return str(describe())
        frame = frame.f_back
    return f"needle.parallel: rank {rank}"
