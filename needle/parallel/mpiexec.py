"""Finding ``mpiexec`` and building its command line: the one place needle starts ranks (the
launcher, the planner, benchmarks and tests); host files are checked before mpiexec sees them."""
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

from . import hostfile

__all__ = ["find", "command", "python_command", "pythonpath_env"]


def find() -> str:
    """The mpiexec installed beside this Python (the mpich wheel), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec not found: pip install mpich (or install an MPI)")
    return found


def command(nproc: int, hostfile_path: Optional[str] = None,
            exe: Optional[str] = None) -> List[str]:
    """``mpiexec -n nproc [-f hostfile]``; a bad host file raises naming its line."""
    if nproc < 1:  # mpiexec -n 0 (or -3) quietly runs one rank
        raise ValueError(f"mpiexec needs at least 1 rank, not {nproc}")
    if hostfile_path is not None:
        hostfile.parse(hostfile_path)
    cmd = [exe or find(), "-n", str(nproc)]
    return cmd + (["-f", str(hostfile_path)] if hostfile_path is not None else [])


def python_command(nproc: int, *args: str, hostfile_path: Optional[str] = None) -> List[str]:
    """``mpiexec -n nproc [-f hostfile] python args...`` with this Python."""
    return command(nproc, hostfile_path) + [sys.executable, *args]


def pythonpath_env(first: Path, env: Optional[Dict[str, str]] = None,
                   **extra: str) -> Dict[str, str]:
    """``env`` (default: this process's) with ``first`` ahead on PYTHONPATH, then ``extra``:
    the ranks import needle (and the workers it runs) from ``first``."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join([str(first)] + rest)
    out.update(extra)
    return out
