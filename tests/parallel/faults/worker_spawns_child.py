"""Run under mpiexec by test_faults_hang.py: each rank starts a Python child that imports
needle.parallel (inheriting mpiexec's environment) and exits; the exit guard must leave it be.

Each rank writes its child's outcome to ``OUT_DIR/child<rank>`` (two ranks printing to one
mpiexec stdout can interleave mid-line)."""
import pathlib
import subprocess
import sys

import needle.parallel  # noqa: F401  (installs the exit guard in the rank)
from needle.parallel import communicator

if __name__ == "__main__":
    out_dir = pathlib.Path(sys.argv[1])
    child = subprocess.run([sys.executable, "-c", "import needle.parallel"],
                           capture_output=True, text=True, timeout=60)
    comm = communicator.create()
    (out_dir / f"child{comm.rank}").write_text(
        f"{child.returncode} {child.stderr.strip()[-300:]}")
    comm.barrier()
