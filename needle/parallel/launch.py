"""Start a script on several ranks: ``python -m needle.parallel.launch -n 4 script.py [args]``.

A thin wrapper over ``mpiexec`` (``mpiexec -n 4 python script.py`` works just as well): it finds
the mpiexec of the ``mpich`` wheel beside this Python, prefixes every output line with its rank,
runs the script under ``python -m mpi4py`` so that an uncaught exception on any rank aborts the
whole job, and exits with the job's status.  ``-m module`` runs a module instead of a file, and
``-f hostfile`` is passed to mpiexec for multi-host runs (MPI's own host file format).
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional

SHIM = "--rank-shim"  # internal: how each rank starts, so it can prefix its own output lines


def find_mpiexec() -> str:
    """The mpiexec installed beside this Python (the mpich wheel), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec not found: pip install mpich (or install an MPI)")
    return found


def build_command(argv: Optional[List[str]] = None) -> List[str]:
    """The mpiexec command line for the launcher's arguments."""
    parser = argparse.ArgumentParser(prog="python -m needle.parallel.launch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    parser.add_argument("-f", "--hostfile", help="MPI host file for multi-host runs")
    parser.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    parser.add_argument("-m", dest="module", help="run a module instead of a script")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="script and its arguments")
    args = parser.parse_args(argv)
    if args.module is None and not args.rest:
        parser.error("give a script (or -m module) to run")
    cmd = [find_mpiexec(), "-n", str(args.nproc)]
    if args.hostfile:
        cmd += ["-f", args.hostfile]
    shim = ["-m", "needle.parallel.launch", SHIM] if not args.no_prefix else ["-m", "mpi4py"]
    target = ["-m", args.module] if args.module else []
    return cmd + [sys.executable] + shim + target + args.rest


class _Prefixed:
    """A text stream wrapper writing ``prefix`` at the start of every line."""

    def __init__(self, stream: Any, prefix: str) -> None:
        self._stream, self._prefix, self._partial = stream, prefix, ""

    def write(self, text: str) -> int:
        # Whole lines only, in one write each, so lines of different ranks never interleave.
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            self._stream.write("".join(self._prefix + line + "\n" for line in lines))
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._stream.write(self._prefix + self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_as_rank(rest: List[str]) -> None:
    """Inside one rank: prefix its output with the rank, then ``python -m mpi4py rest...``."""
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    sys.stdout = _Prefixed(sys.stdout, f"[{rank}] ")
    sys.stderr = _Prefixed(sys.stderr, f"[{rank}] ")
    from mpi4py.run import main as mpi4py_main

    sys.argv = ["mpi4py"] + rest
    mpi4py_main()


def main(argv: Optional[List[str]] = None) -> int:
    """Run the job and return its exit status."""
    return subprocess.call(build_command(argv))


if __name__ == "__main__":
    if sys.argv[1:2] == [SHIM]:
        run_as_rank(sys.argv[2:])
    else:
        sys.exit(main())
