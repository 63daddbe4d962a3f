"""The test helper that bounds multi-rank jobs leaves nothing running when a job times out."""
import os
import subprocess
import sys
import time

import pytest
from mpi_helpers import run_bounded

# The child forks a grandchild into a process group of its own (as mpiexec's ranks may end
# up) that lets go of the output pipes (so waiting for them cannot reap it), writes its pid,
# and both sleep far past the bound.
SCRIPT = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_job_past_its_bound_leaves_no_process_behind(tmp_path):
    out = tmp_path / "pid"
    cmd = [sys.executable, "-c", SCRIPT.replace("print(pid, flush=True)",
                                                f"open({str(out)!r}, 'w').write(str(pid))")]
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(cmd, 2.0)
    grandchild = int(out.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the grandchild outlived the job's bound"
