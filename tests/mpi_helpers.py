"""Launching multi-rank workers under mpiexec from ordinary pytest tests (``run_mpi``)."""
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pytest

from needle.parallel import mpiexec as mpiexec_tool

ROOT = Path(__file__).resolve().parent.parent
PARALLEL_TESTS = ROOT / "tests" / "parallel"


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the one on PATH."""
    try:
        return mpiexec_tool.find()
    except FileNotFoundError:
        pytest.skip("mpiexec not found (pip install mpich)")


def _session_members(sid: int) -> List[int]:
    """Every live process whose session is ``sid`` (read from /proc; [] where it is absent)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after "pid (comm)": state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


def run_bounded(cmd: List[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)`` in a session of its
    own; past ``timeout`` every process of that session (mpiexec, its proxies, every rank and
    the children they forked) is killed before TimeoutExpired is raised, so a job that outlives
    its bound leaves nothing running (plain ``subprocess.run`` kills only ``cmd`` itself)."""
    with subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in _session_members(proc.pid) or [proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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
        cmd = mpiexec_tool.command(k, exe=mpiexec()) + [
            sys.executable, str(PARALLEL_TESTS / worker), *args]
        start = time.monotonic()
        res = run_bounded(cmd, timeout, cwd=ROOT, env=worker_env(**(env or {})),
                          stdin=subprocess.DEVNULL)
        return res, time.monotonic() - start
    return run


def run_ranks(backend: str, k: int, fn: Callable, *args: Any, timeout: float = 120,
              env: Optional[dict] = None) -> List[Any]:
    """Run ``fn(comm, *args)`` on ``k`` ranks and return the list of per-rank results.

    ``backend="mpi"``: ``mpiexec -n k`` runs ``tests/rank_main.py``, which imports ``fn`` from
    its module's file, calls it with a real communicator and pickles its result; a rank that
    fails makes this raise with the job's output.  ``backend="virtual"``: the same function on
    the in-process virtual cluster (``needle.parallel.virtual.run``).  ``fn`` must be a
    module-level function and ``args`` picklable.  Tests parametrize over ``BACKENDS``.
    """
    if backend == "virtual":
        from needle.parallel import virtual
        return virtual.run(k, fn, *args)
    if backend != "mpi":
        raise ValueError(f"backend must be 'mpi' or 'virtual', not {backend!r}")
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "call.pkl"
        source = Path(sys.modules[fn.__module__].__file__).resolve()
        spec.write_bytes(pickle.dumps((str(source), fn.__name__, args)))
        cmd = mpiexec_tool.command(k, exe=mpiexec()) + [
            sys.executable, str(ROOT / "tests" / "rank_main.py"), str(spec)]
        env = worker_env(PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
                         **(env or {}))
        res = run_bounded(cmd, timeout, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"mpiexec -n {k} {fn.__name__} exited {res.returncode}:\n"
                               f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
        return [pickle.loads((Path(tmp) / f"rank{r}.pkl").read_bytes()) for r in range(k)]


BACKENDS = ["virtual", pytest.param("mpi", marks=pytest.mark.mpi)]
