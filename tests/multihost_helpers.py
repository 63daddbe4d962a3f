"""Running test functions on ranks spread over the test cluster's hosts (network namespaces).

``cluster`` (a pytest fixture of the module that imports it) makes 2 hosts x 2 slots once per
module and removes them after, also when a test fails; every test using it skips, with the
reason, where namespaces cannot be made.  ``run_on_hosts(cluster, k, fn, *args)`` is
``mpi_helpers.run_ranks("mpi", k, fn, *args)`` with mpiexec started across the hosts.
"""
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

from tools.testcluster import NamespaceHosts, available, sweep
from tools.testcluster.mpirun import mpiexec_command
from tools.testcluster.netns import leftovers


def make_cluster(hosts: int = 2, slots: int = 2,
                 rate: Optional[str] = None) -> Iterator[NamespaceHosts]:
    """A cluster for the duration of a fixture (skips with the reason where none can be made)."""
    reason = available()
    if reason is not None:
        pytest.skip(f"no test cluster here: {reason}")
    sweep()  # clusters left by test runs that were killed (their process is gone)
    cluster = NamespaceHosts(hosts, slots, rate)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        mine = [ns for ns in leftovers() if ns.startswith(cluster.name + "-")]
        assert not mine, f"namespaces left behind: {mine}"


def run_on_hosts(cluster: NamespaceHosts, k: int, fn: Callable, *args: Any, timeout: float = 120,
                 env: Optional[dict] = None) -> List[Any]:
    """``fn(comm, *args)`` on ``k`` ranks placed by the cluster's hostfile; the results."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "call.pkl"
        source = Path(sys.modules[fn.__module__].__file__).resolve()
        spec.write_bytes(pickle.dumps((str(source), fn.__name__, args)))
        cmd = mpiexec_command(mpiexec(), str(cluster.hostfile), k) + [
            sys.executable, str(ROOT / "tests" / "rank_main.py"), str(spec)]
        env = worker_env(PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
                         **(env or {}))
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                             env=env, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"mpiexec across {cluster.hosts} hosts, {k} ranks, "
                               f"{fn.__name__} exited {res.returncode}:\n"
                               f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
        return [pickle.loads((Path(tmp) / f"rank{r}.pkl").read_bytes()) for r in range(k)]
