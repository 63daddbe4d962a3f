"""Run under mpiexec by test_faults.py: mismatched arguments, crashing ranks, timeouts.

``caught_mismatch`` runs the mismatch cases on either backend through ``run_ranks``.

``python worker_faults.py MODE``; in the mismatch modes every rank prints
"rank R ValueError: ..." to stderr and the job exits with status 3.
"""
import os
import signal
import sys
import time

import numpy as np

from needle.parallel import CommTimeoutError, communicator


def mismatch(comm: communicator.Communicator, mode: str) -> None:
    """Call a collective with arguments that differ on the last rank."""
    r, last = comm.rank, comm.rank == comm.size - 1
    x = np.ones(8, dtype=np.float32)
    if mode == "size_small":
        comm.allreduce(np.ones(9 if last else 8, dtype=np.float32))
    elif mode == "size_large":  # ring on the others, recursive doubling on the last rank
        comm.allreduce(np.ones(16 if last else 1 << 20, dtype=np.float32))
    elif mode == "dtype":
        comm.allreduce(x.astype(np.int32) if last else x)
    elif mode == "op":
        comm.allreduce(x, op="max" if last else "sum")
    elif mode == "collective":
        comm.allgather(x) if last else comm.allreduce(x)
    elif mode == "allgather_shape":
        comm.allgather(np.ones((3, 2) if last else (2, 3)))
    elif mode == "reduce_scatter_size":  # mid-size: the ring runs beside the check
        comm.reduce_scatter(np.ones((1 << 15) if last else (1 << 14), dtype=np.float32))
    elif mode == "broadcast_root":
        comm.broadcast(x, root=1 if last else 0)
    print(f"rank {r} finished without error", flush=True)


def caught_mismatch(comm: communicator.Communicator, mode: str) -> str:
    """``mismatch`` on any backend (``run_ranks``): the ValueError's message, or a failure."""
    comm.allreduce(np.ones(3))  # a healthy collective first
    try:
        mismatch(comm, mode)
    except ValueError as err:
        return str(err)
    return "finished without error"


def caught_mismatch_check_first(comm: communicator.Communicator, mode: str) -> str:
    """``caught_mismatch`` with the argument check finished before the first message."""
    comm.overlap_check = False
    return caught_mismatch(comm, mode)


def _die(comm: communicator.Communicator, mode: str) -> None:
    """Rank 1 raises, exits or is killed; the others call the next collective."""
    if comm.rank == 1:
        if mode == "raise":
            raise RuntimeError("rank 1 failed on purpose")
        if mode == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.allreduce(np.ones(1 << 16 if mode == "kill" else 3))


def _time_out(comm: communicator.Communicator, mode: str) -> None:
    """The last rank skips a collective; the others time out (and, when caught, abort)."""
    last = comm.rank == comm.size - 1
    if mode == "timeout":
        if last:
            time.sleep(60)
        comm.allreduce(np.ones(3))
        return
    if not last:
        try:
            comm.allreduce(np.ones(3))
        except CommTimeoutError as err:
            print(f"rank {comm.rank} CommTimeoutError: {err}", file=sys.stderr, flush=True)
            comm.abort(4)
    time.sleep(60)


def _stuck(comm: communicator.Communicator) -> None:
    """Rank 0's broadcast posts its first message by a call that never returns (``Ssend`` on a
    communicator rank 1 never receives on: what MPICH's network module can do to an ``Isend``
    whose peer's host is gone); rank 1 sleeps. The watchdog (``transport/stuck.py``) must end
    the job naming the call."""
    never = comm.transport.comm.Dup()  # (collective)
    if comm.rank == 0:
        comm.transport.isend = never.Ssend  # (buf, dest, tag), as Isend; read by new channels
        comm.broadcast(np.ones(4), root=0)
    time.sleep(60)


def main() -> None:
    mode = sys.argv[1]
    comm = communicator.create(timeout=float(os.environ.get("WORKER_TIMEOUT", 20)))
    comm.allreduce(np.ones(3))  # a healthy collective first
    if mode in ("raise", "exit", "kill"):
        _die(comm, mode)
    elif mode in ("timeout", "timeout_caught"):
        _time_out(comm, mode)
    elif mode == "stuck":
        _stuck(comm)
    else:
        try:
            mismatch(comm, mode)
        except ValueError as err:
            print(f"rank {comm.rank} ValueError: {err}", file=sys.stderr, flush=True)
            comm.barrier()  # every rank reports before anyone exits
            sys.exit(3)


if __name__ == "__main__":
    main()
