"""Run under mpiexec by test_faults_hang.py: each rank starts a Python child that imports
needle.parallel (inheriting mpiexec's environment) and exits; the exit guard must leave it be."""
import subprocess
import sys

import needle.parallel  # noqa: F401  (installs the exit guard in the rank)
from needle.parallel import communicator

if __name__ == "__main__":
    child = subprocess.run([sys.executable, "-c", "import needle.parallel"],
                           capture_output=True, text=True, timeout=60)
    print("child", child.returncode, child.stderr.strip()[-300:], flush=True)
    comm = communicator.create()
    comm.barrier()
