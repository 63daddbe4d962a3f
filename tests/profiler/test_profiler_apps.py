"""The apps write traces: ``apps.train_parallel --profile DIR`` (every rank, one trace) and
``profile_to`` (a trace and one summary per rank)."""
import subprocess
import sys

import numpy as np
import pytest
from mpi_helpers import ROOT, mpiexec, run_bounded, worker_env

import needle as ndl
from needle import profiler

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def test_profile_to_writes_a_trace_and_a_summary(tmp_path, capsys):
    with profiler.profile_to(str(tmp_path / "out")):
        ndl.Tensor(np.ones(3), requires_grad=False) * 2.0
    profiler.check_trace(str(tmp_path / "out" / "trace.json"))
    assert "MulScalar" in (tmp_path / "out" / "summary.rank0.txt").read_text()
    assert "perfetto" in capsys.readouterr().out


@pytest.mark.mpi
def test_train_parallel_profile_writes_one_trace_for_both_ranks(tmp_path):
    mpiexec()  # skips when there is none
    out = tmp_path / "prof"
    cmd = [sys.executable, "-m", "needle.parallel.launch", "-n", "2", "-m",
           "apps.train_parallel", "--strategy", "ddp", "--steps", "1", "--batch", "16",
           "--no-progress", "--profile", str(out)]
    res = run_bounded(cmd, 240, cwd=ROOT, env=worker_env(**ONE_THREAD),
                      stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trace = profiler.check_trace(str(out / "trace.json"))
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    assert {e.get("cat") for e in trace["traceEvents"]} >= {"op", "comm", "optimizer"}
    for r in (0, 1):
        assert "communication by kind" in (out / f"summary.rank{r}.txt").read_text()
