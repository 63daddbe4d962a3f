"""apps/train_parallel.py: every data-parallel strategy trains through the launcher (2-3 ranks)."""
import json
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def launch(tmp_path, ranks, *args):
    mpiexec()  # skips when there is none
    out = tmp_path / "figures.json"
    cmd = [sys.executable, "-m", "needle.parallel.launch", "-n", str(ranks), "-m",
           "apps.train_parallel", *args, "--no-progress", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT,
                         env=worker_env(**ONE_THREAD), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(out.read_text()), res.stdout


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["naive", "ddp", "zero1", "zero2", "fsdp"])
def test_data_parallel_strategy_matches_one_process(tmp_path, strategy):
    figs, stdout = launch(tmp_path, 2, "--strategy", strategy, "--steps", "4", "--batch", "16",
                          "--dtype", "float64", "--check", "--plot", str(tmp_path / "p.png"))
    assert figs["max_param_diff_vs_single_process"] < 1e-9
    assert figs["last_loss"] < figs["first_loss"]
    assert len(figs["peak_bytes"]) == len(figs["bytes_sent_per_step"]) == 2
    assert min(figs["bytes_sent_per_step"]) > 0 and (tmp_path / "p.png").stat().st_size > 0
    assert "max_param_diff_vs_single_process" in stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_parameter_server_and_charlm(tmp_path):
    figs, _ = launch(tmp_path, 3, "--strategy", "ps", "--consistency", "ssp", "--steps", "5",
                     "--batch", "16")
    assert figs["strategy"] == "ps-ssp" and figs["max_staleness_read"] <= 2
    figs, _ = launch(tmp_path, 2, "--strategy", "ddp", "--task", "charlm", "--steps", "2",
                     "--batch", "4")
    assert figs["ranks"] == 2
