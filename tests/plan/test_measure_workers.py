"""``--cluster here`` runs its measuring workers from needle's own package, so it works from an
installed needle, with no repository checkout beside it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_helpers import mpiexec, run_bounded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.mpi
def test_cluster_here_from_a_non_editable_install(tmp_path):
    """needle (only the package and setup.py, copied) installed with pip --target, nothing
    downloaded; ``python -m needle.plan --cluster here --gpus 2`` run from another folder
    imports that copy, and its mpiexec ping-pong runs the installed worker."""
    mpiexec()  # skips without mpiexec
    src, target, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    shutil.copytree(ROOT / "needle", src / "needle",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.py", src)
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--no-build-isolation", "--quiet", "--target", str(target), str(src)],
                   check=True, capture_output=True, timeout=180)
    assert not (target / "tools").exists()
    env = dict(os.environ, PYTHONPATH=str(target))  # ahead of the editable install's path
    where = subprocess.run([sys.executable, "-c", "import needle.plan.measure.pingpong as m; "
                            "print(m.__file__)"], env=env, cwd=elsewhere, capture_output=True,
                           text=True, timeout=60, check=True).stdout.strip()
    assert Path(where).is_relative_to(target), where
    run = run_bounded([sys.executable, "-m", "needle.plan", "--model", "gpt2-small",
                       "--batch", "8", "--cluster", "here", "--gpus", "2", "--top", "1"],
                      timeout=120, env=env, cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    assert "cluster here (x2): 1 x 2 GPUs" in run.stdout and "  1. " in run.stdout
