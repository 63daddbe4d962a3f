"""Making a failure on one rank end the whole job instead of hanging the others: the exit
guard, the abort hook, the start-up watchdog and the guardian (docs/reliability.md, "Dead
ranks", with the times measured for each fault).
"""
import atexit
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

from .comm.engine.args import check_timeout

REPORT_DIR_ENV = "NEEDLE_LAUNCH_DIR"
GUARD_ENV = "NEEDLE_EXIT_GUARD_PID"  # the rank that installed the exit guard


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
        time.sleep(_grace(kind))
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        if world.Get_size() > 1:
            world.Abort(1)
    hook.needle_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# Under the launcher, a rank that timed out waiting for others waits this long before aborting
# the job, so that the (perhaps starved) supervisors of those ranks record how they ended first.
CONSEQUENCE_GRACE = 2.0

# What a rank raises when another rank failed (it waited for it in vain), by class name.
CONSEQUENCES = ("CommTimeoutError", "DeadlockError")


def _grace(kind: Any) -> float:
    """Seconds to wait before ``MPI_Abort`` after an uncaught exception of type ``kind``."""
    waited = any(k.__name__ in CONSEQUENCES for k in kind.__mro__)
    return CONSEQUENCE_GRACE if waited and os.environ.get(REPORT_DIR_ENV) else ABORT_GRACE


def under_mpi_launcher() -> bool:
    """Whether this process is one of several ranks started by mpiexec (MPICH or Open MPI)."""
    size = os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    return size.isdigit() and int(size) > 1


def _mpi_started() -> bool:
    return "mpi4py.MPI" in sys.modules  # importing mpi4py.MPI initialises MPI


def start_mpi(why: str) -> Any:
    """Initialise MPI (``mpi4py.MPI``); under an MPI launcher, SIGKILL this rank if start-up has
    not finished within ``NEEDLE_COMM_TIMEOUT`` seconds. The watchdog is a forked process
    (``MPI_Init`` holds the GIL: no thread could run); under plain ``mpiexec`` it stays as the
    rank's guardian (``_guard``)."""
    if _mpi_started() or not under_mpi_launcher() or not hasattr(os, "fork"):
        from mpi4py import MPI
        return MPI
    timeout = check_timeout(os.environ.get("NEEDLE_COMM_TIMEOUT", "60"))
    guard = not os.environ.get(REPORT_DIR_ENV)
    me, (rd, wr) = os.getpid(), os.pipe()
    watchdog = os.fork()
    if watchdog == 0:  # the child: watch the rank start MPI, then (plain mpiexec) guard it
        try:
            os.close(wr)
            _watch(me, rd, timeout, why, guard)
        finally:
            os._exit(0)
    os.close(rd)
    try:
        from mpi4py import MPI
    except BaseException:
        _stop(watchdog, wr)
        raise
    if not guard:
        _stop(watchdog, wr)
        return MPI
    os.write(wr, STARTED)
    atexit.register(_tell_clean_exit, wr, me)  # os._exit and signals skip it: how the guard tells
    return MPI


def _stop(watchdog: int, wr: int) -> None:
    os.kill(watchdog, signal.SIGKILL)
    os.waitpid(watchdog, 0)
    os.close(wr)


def _tell_clean_exit(wr: int, rank_pid: int) -> None:
    if os.getpid() == rank_pid:  # not in a child the rank forked (it inherits the handler)
        os.write(wr, CLEAN_EXIT)


STARTED, CLEAN_EXIT = b"S", b"E"  # what a rank tells its watchdog through the pipe


def _watch(rank_pid: int, rd: int, timeout: float, why: str, guard: bool) -> None:
    """In the watchdog: SIGKILL the rank if MPI start-up takes longer than ``timeout``; with
    ``guard``, then watch it until it ends (``_guard``)."""
    told, deadline = b"", time.monotonic() + timeout
    while STARTED not in told:
        left = deadline - time.monotonic()
        if left <= 0:
            os.write(2, (f"needle.parallel: rank {rank_from_env()} {why}; not every rank reached "
                         f"MPI start-up within {timeout:g} s (NEEDLE_COMM_TIMEOUT: one ended or "
                         "is stuck before starting MPI): killing this rank to end the job\n"
                         ).encode())
            write_status({"returncode": -signal.SIGKILL, "consequence": True,
                          "time": time.time()})  # the launcher names the rank that never came
            os.kill(rank_pid, signal.SIGKILL)
            return
        chunk = _read(rd, min(left, 1.0), rank_pid)
        if chunk == b"":
            return  # the rank ended during start-up: mpiexec sees that itself
        told += chunk or b""
    if guard:
        _guard(rank_pid, rd, told, timeout)


def _read(rd: int, seconds: float, rank_pid: int) -> Optional[bytes]:
    """What the rank wrote within ``seconds`` (None: nothing yet), b"" once it has ended (the
    pipe's end closed, or this process re-parented: a child the rank forked may hold the pipe)."""
    ready, _, _ = select.select([rd], [], [], seconds)
    if ready:
        return os.read(rd, 16)
    return b"" if os.getppid() != rank_pid else None


def _guard(rank_pid: int, rd: int, told: bytes, timeout: float) -> None:
    """Outlive the rank (holding its output and PMI connection): plain ``mpiexec`` would end the
    job with status 0 at a rank's ``os._exit(0)`` mid-job. Say so, and let the ranks waiting
    for it time out naming it, or abort the job after ``2 * timeout + 5`` s; a rank that ends
    with a nonzero code or a signal without Python's exit has the job aborted with that code."""
    while CLEAN_EXIT not in told:
        chunk = _read(rd, 1.0, rank_pid)
        if chunk == b"":
            break
        told += chunk or b""
    # A dying rank closes its files before its children are re-parented: wait for that. A rank
    # alive a second after the pipe closed closed it itself: it can no longer tell (blind).
    blind, since = False, time.monotonic()
    while CLEAN_EXIT not in told and os.getppid() == rank_pid:
        blind = time.monotonic() - since > 1.0
        time.sleep(0.05)
    status = None if CLEAN_EXIT in told else _exit_status(rank_pid)
    if CLEAN_EXIT in told or status or blind:  # a clean end, or a signal / nonzero code
        if status:  # hydra, seeing the end only now (this process held the rank's output),
            _pmi_abort(status >> 8 or 128 + (status & 0x7F))  # ends the job only if told
        return
    rank = rank_from_env()
    os.write(2, (f"needle.parallel: rank {rank} (pid {rank_pid}) exited with code 0 mid-job "
                 "without Python's exit (os._exit?) and without finalising MPI; the ranks "
                 f"waiting for it raise when their NEEDLE_COMM_TIMEOUT ({timeout:g} s) "
                 "passes\n").encode())
    time.sleep(2 * timeout + 5)
    os.write(2, f"needle.parallel: rank {rank} left mid-job: aborting the job\n".encode())
    _pmi_abort(1)


def _pmi_abort(code: int) -> None:
    """End the job with ``code``, as ``MPI_Abort`` does: MPICH's PMI-1 ``abort`` command on the
    rank's PMI connection (which this process shares)."""
    fd = os.environ.get("PMI_FD", "")
    if fd.isdigit():
        os.write(int(fd), f"cmd=abort exitcode={code}\n".encode())
        time.sleep(ABORT_GRACE)


def _exit_status(pid: int) -> Optional[int]:
    """The wait status of an ended (not yet reaped) process, from ``/proc`` (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def install_exit_guard() -> None:
    """Under an MPI launcher: a rank that ends before MPI starts still ends the job (above)."""
    if not under_mpi_launcher() or getattr(sys.excepthook, "needle_guard", False):
        return
    # A process a rank started inherits the launcher's environment but is no rank itself.
    if os.environ.get(GUARD_ENV, str(os.getpid())) != str(os.getpid()):
        return
    os.environ[GUARD_ENV] = str(os.getpid())
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if _mpi_started():  # started, perhaps with no communicator (and no abort hook) yet
            previous(kind, value, tb)
            _abort_if_running(kind)
            return
        write_status({"exception": f"{kind.__name__}: {value}", "time": time.time()})
        sys.stderr.write("".join(traceback.format_exception(kind, value, tb)))
        sys.stderr.flush()
        sys.stdout.flush()
        MPI = start_mpi(f"raised {kind.__name__} before starting MPI")
        time.sleep(ABORT_GRACE)
        MPI.COMM_WORLD.Abort(1)
    hook.needle_guard, hook.previous = True, previous  # type: ignore[attr-defined]
    sys.excepthook = hook
    atexit.register(_finalize_if_never_started)


def _abort_if_running(kind: Any) -> None:
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(_grace(kind))
    MPI = sys.modules["mpi4py.MPI"]
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(1)


def _finalize_if_never_started() -> None:
    """At exit, a rank that never started MPI joins start-up and finalises, so that the ranks
    waiting in start-up go on (and time out waiting for this one, naming it); no watchdog."""
    if _mpi_started():
        return
    from mpi4py import MPI
    if not MPI.Is_finalized():
        MPI.Finalize()


def remove_exit_guard() -> None:
    """Undo ``install_exit_guard`` (the launcher's supervisor is no rank: it never starts MPI)."""
    hook = sys.excepthook
    if getattr(hook, "needle_guard", False):
        sys.excepthook = hook.previous  # type: ignore[attr-defined]
    atexit.unregister(_finalize_if_never_started)
    os.environ.pop(GUARD_ENV, None)
