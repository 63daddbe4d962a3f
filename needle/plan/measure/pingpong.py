"""Under mpiexec: ping-pong between ranks 0 and 1 (alpha, beta fitted by ``CostModel.fit``), then
every rank's GEMM FLOP/s measured at once; rank 0 writes them as JSON."""
import json
import sys
import time

import numpy as np

from needle.parallel import communicator
from needle.parallel.comm.algorithms.cost_model import CostModel
from needle.plan.cluster import measure_gemm_flops

SIZES = (8, 1024, 65536, 1 << 20, 4 << 20)


def main(path: str) -> None:
    """Time one-way messages of each size (half a round trip, best of a few) and fit."""
    comm = communicator.create()
    if comm.size < 2:  # run by hand: say how to run it, not a send to a rank that is not there
        sys.exit("python -m needle.plan.measure.pingpong: run under mpiexec -n 2 or more (it "
                 f"times messages between ranks 0 and 1); this is {comm.size} rank")
    times = []
    for n in SIZES:
        buf = np.zeros(n, np.uint8)
        best = np.inf
        for _ in range(20):  # best of 20: robust to the other jobs on a shared machine
            comm.barrier()
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.send(buf, 1)
                comm.recv(1)
            elif comm.rank == 1:
                comm.recv(0)
                comm.send(buf, 0)
            best = min(best, (time.perf_counter() - t0) / 2)
        times.append(best)
    comm.barrier()
    gemm = comm.allgather(np.array([measure_gemm_flops()]))  # all ranks share the cores now
    if comm.rank == 0:
        fit = CostModel.fit(SIZES, times)
        with open(path, "w") as f:
            json.dump({"alpha": fit.alpha, "beta": fit.beta,
                       "gemm_flops": float(np.median(gemm))}, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: mpiexec -n 2 python -m needle.plan.measure.pingpong OUT.json")
    main(sys.argv[1])
