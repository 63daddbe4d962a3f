"""Run across the test cluster by ``test_testcluster_faults.py``: allreduce in a loop (at most
60 s) until a fault ends it; the rank that raises records when and what before raising.

Each rank's standard error (file descriptor 2) goes to ``stderr{rank}`` in the folder: when a
peer's connection is reset, MPICH's network module may end a rank itself with a fatal error
that no error handler catches, and its message, forwarded by mpiexec, is at times lost."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from needle.parallel.comm.engine.communicator import create
from needle.parallel.comm.errors import CommTimeoutError


def main() -> None:
    folder = Path(sys.argv[1])
    comm = create()
    with open(folder / f"stderr{comm.rank}", "w") as f:
        os.dup2(f.fileno(), 2)
    x = np.ones(1 << 19)  # 4 MiB: a hierarchical allreduce over the host link
    comm.allreduce(x)
    (folder / f"started{comm.rank}").write_text(str(time.time()))
    end = time.monotonic() + 60
    try:
        while time.monotonic() < end:
            comm.allreduce(x)
    except CommTimeoutError as e:
        record = {"time": time.time(), "error": str(e)}
        (folder / f"error{comm.rank}.json").write_text(json.dumps(record))
        # The first rank to raise aborts the job; give the others time to record theirs too.
        # Any survivor's call began before this one failed, so its deadline is at most one
        # timeout away (a rank that was still finishing the call before, behind a stalled
        # host, started this one late: 1 s was not always enough).
        time.sleep(comm.timeout + 1.0)
        raise


if __name__ == "__main__":
    main()
