"""Run under mpiexec by test_faults_hang.py: rank 1 ends in MODE at a given point of the job.

``python worker_early_death.py MODE WHEN``: MODE is raise, exit0, exit3, kill or
``kill-late-seen`` (SIGKILL after starting a process that keeps this rank's stderr open for a
while, so its supervisor sees the end of its output long after its death); WHEN is
``before`` (before ``communicator.create()``, MPI not started), ``after`` (mid-job) or
``split`` (while the others split the communicator) or ``end`` (after the last call, while
the others finish). Rank 0 (and any others) create the
communicator and call collectives.
"""
import os
import signal
import subprocess
import sys

import numpy as np

import needle.parallel  # noqa: F401  (installs the exit guard, as any needle program does)


def die(mode: str) -> None:
    """End this rank the way ``mode`` says."""
    if mode == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    if mode == "exit0":
        os._exit(0)
    if mode == "exit3":
        sys.exit(3)
    if mode == "kill-starved":  # under the launcher: the parent is this rank's supervisor
        later = float(os.environ["NEEDLE_COMM_TIMEOUT"]) + 1
        subprocess.Popen(["sh", "-c", f"sleep {later}; kill -CONT {os.getppid()}"],
                         start_new_session=True)
        os.kill(os.getppid(), signal.SIGSTOP)
    if mode == "kill-late-seen":  # the sleeper inherits stderr: its pipe stays open 10 s
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    mode, when = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("PMI_RANK", "0"))
    if rank == 1 and when == "before":
        die(mode)
    from needle.parallel import communicator
    comm = communicator.create()
    comm.allreduce(np.ones(4))
    if comm.rank == 1 and when in ("after", "split"):
        die(mode)
    if when == "split":
        comm = comm.split(0)
    comm.allreduce(np.ones(4))
    comm.barrier()
    if comm.rank == 1 and when == "end":
        die(mode)


if __name__ == "__main__":
    main()
