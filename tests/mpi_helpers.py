"""Launching multi-rank workers under mpiexec from ordinary pytest tests (``run_mpi``)."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARALLEL_TESTS = ROOT / "tests" / "parallel"


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    return found


def worker_env(**extra: str) -> dict:
    """The environment for workers: needle importable from this checkout."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(ROOT)])
    env.update(extra)
    return env


def make_run_mpi() -> Callable[..., Tuple[subprocess.CompletedProcess, float]]:
    """``run_mpi(k, "comm/worker.py", *args, timeout=..., env={...})`` -> (result, seconds);
    the worker path is relative to tests/parallel/, and ``timeout`` bounds the whole job."""
    def run(k: int, worker: str, *args: str, timeout: float = 120,
            env: dict = None) -> Tuple[subprocess.CompletedProcess, float]:
        cmd = [mpiexec(), "-n", str(k), sys.executable, str(PARALLEL_TESTS / worker), *args]
        start = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                             env=worker_env(**(env or {})), stdin=subprocess.DEVNULL)
        return res, time.monotonic() - start
    return run
