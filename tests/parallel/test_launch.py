"""The launcher forwards exit status and prefixes ranks."""
import subprocess
import sys
import time

import pytest
from mpi_helpers import ROOT, worker_env

pytestmark = pytest.mark.mpi


def launch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "needle.parallel.launch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=worker_env(), stdin=subprocess.DEVNULL)


def test_launch_prefixes_ranks_and_forwards_status(tmp_path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import sys\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
                      "print('hello', r)\nsys.exit(5 if r == 1 and 'fail' in sys.argv else 0)\n")
    res = launch("-n", "3", str(script))
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[0] hello 0", "[1] hello 1", "[2] hello 2"]
    assert launch("-n", "3", str(script), "fail").returncode == 5


def test_launch_aborts_the_job_on_an_exception(tmp_path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("import time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n"
                      "    raise ValueError('boom')\ntime.sleep(60)\n")
    res = launch("-n", "2", str(script))
    assert res.returncode != 0 and "[1] ValueError: boom" in res.stderr


DEATHS = {
    "exit": ("import os\nos._exit(3)\n", "it exited with code 3"),
    "kill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
             "it was killed by signal 9 (SIGKILL)"),
    "raise": ("raise ValueError('boom on purpose')\n", "it raised ValueError: boom on purpose"),
}


@pytest.mark.parametrize("death", sorted(DEATHS))
def test_launch_names_the_rank_that_ended_first(tmp_path, death: str) -> None:
    code, expect = DEATHS[death]
    script = tmp_path / "dies.py"
    body = "\n".join("    " + line for line in code.splitlines())
    script.write_text("import sys, time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
                      "print('rank', r, 'is about to go', file=sys.stderr, flush=True)\n"
                      f"if r == 1:\n{body}\n"
                      "MPI.COMM_WORLD.Barrier()\n")
    start = time.monotonic()
    res = launch("-n", "3", str(script), timeout=60)
    assert res.returncode != 0 and time.monotonic() - start < 30
    assert f"needle.parallel.launch: rank 1 ended first: {expect}." in res.stderr, res.stderr
    tail = res.stderr.split("lines of rank 1's stderr:")[-1]
    last = "ValueError: boom on purpose" if death == "raise" else "rank 1 is about to go"
    assert last in tail, res.stderr


@pytest.mark.parametrize("n", ["0", "-3"])
def test_launch_refuses_fewer_than_one_rank(n: str, capsys) -> None:
    """mpiexec -n 0 (or -3) quietly ran one rank."""
    from needle.parallel.launch import build_command
    with pytest.raises(SystemExit):
        build_command(["-n", n, "script.py"])
    assert f"-n must be at least 1, not {n}" in capsys.readouterr().err


def test_launch_refuses_a_missing_host_file(tmp_path, capsys) -> None:
    from needle.parallel.launch import build_command
    with pytest.raises(SystemExit):
        build_command(["-n", "2", "-f", str(tmp_path / "hosts"), "script.py"])
    assert f"-f {tmp_path / 'hosts'}: no such host file" in capsys.readouterr().err
