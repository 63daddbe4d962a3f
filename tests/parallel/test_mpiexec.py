"""needle.parallel.mpiexec: the one place that finds mpiexec and builds its command line."""
import os
import sys
from pathlib import Path

import pytest

from needle.parallel import hostfile, mpiexec


def test_command_is_n_ranks_then_the_host_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:2\nnode2:2\n")
    assert mpiexec.command(4, exe="mpx") == ["mpx", "-n", "4"]
    assert mpiexec.command(4, str(hosts), exe="mpx") == ["mpx", "-n", "4", "-f", str(hosts)]


def test_python_command_runs_this_python(monkeypatch):
    monkeypatch.setattr(mpiexec, "find", lambda: "mpx")
    assert mpiexec.python_command(3, "-m", "needle.plan.measure.pingpong", "out.json") == \
        ["mpx", "-n", "3", sys.executable, "-m", "needle.plan.measure.pingpong", "out.json"]


def test_a_bad_host_file_is_refused_before_mpiexec_is_looked_for(tmp_path, monkeypatch):
    looked = []
    monkeypatch.setattr(mpiexec, "find", lambda: looked.append(1) or "mpx")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:-2\n")  # hydra would spin at 100% CPU for ever
    with pytest.raises(hostfile.HostfileError, match="line 1"):
        mpiexec.command(2, str(hosts))
    assert not looked


@pytest.mark.parametrize("n", [0, -3])
def test_fewer_than_one_rank_is_refused(n):
    with pytest.raises(ValueError, match=f"not {n}"):
        mpiexec.command(n, exe="mpx")


def test_pythonpath_puts_the_checkout_first():
    env = mpiexec.pythonpath_env(Path("/ckout"), {"PYTHONPATH": f"/a{os.pathsep}/b", "X": "1"},
                                 OMP_NUM_THREADS="1")
    assert env == {"PYTHONPATH": os.pathsep.join(["/ckout", "/a", "/b"]), "X": "1",
                   "OMP_NUM_THREADS": "1"}
    assert mpiexec.pythonpath_env(Path("/ckout"), {})["PYTHONPATH"] == "/ckout"


def test_missing_mpiexec_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install mpich"):
        mpiexec.find()
