"""Collective benchmark in the style of nccl-tests.

Run ``mpiexec -n 2 python benchmarks/bench_collectives.py [--sizes 4K,1M,64M] [--batches 5]``.

For each size it times, in the same run: MPI's point-to-point bandwidth (``Sendrecv`` around the
ring), our collectives (each algorithm) and MPI's native collectives.  As in nccl-tests, *size*
is the bytes of the full vector (allreduce and broadcast: the buffer; allgather: the output;
reduce-scatter: the input), ``algbw = size / time`` and ``busbw`` scales algbw by the fraction
of the data that must cross a link, so it is comparable with the link bandwidth:
allreduce ``2 (p - 1) / p``, allgather and reduce-scatter ``(p - 1) / p``, broadcast 1.
Outputs are preallocated (``out=``) like nccl-tests' buffers; time is the fastest of several
batches of the slowest rank's mean per call, with all cases interleaved within each batch.  The
*best* batch is reported: on a shared machine the slower batches measure other people's
processes, not the algorithm.  The targets are checked at the end.
"""
import argparse
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

from needle.parallel.comm.communicator import Communicator, create

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def timeit(comm: Communicator, cases: Dict[Tuple[str, str], Callable[[], object]], size: int,
           batches: int) -> Dict[Tuple[str, str], float]:
    """Best batch's mean seconds per call of every case, taking the slowest rank of each batch.

    The cases are *interleaved*: each batch times every case once, in turn, so that a change in
    the machine's speed during the run (other processes, memory contention) lands on all of
    them alike instead of on whichever case happened to run at that moment.
    """
    from mpi4py import MPI

    iters = max(3, min(2000, int(4e8 // max(size, 1 << 14))))
    for fn in cases.values():
        fn()
    times: Dict[Tuple[str, str], List[float]] = {key: [] for key in cases}
    for _ in range(batches):
        for key, fn in cases.items():
            comm.transport.comm.Barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            elapsed = (time.perf_counter() - start) / iters
            times[key].append(comm.transport.comm.allreduce(elapsed, op=MPI.MAX))
    return {key: float(np.min(t)) for key, t in times.items()}


def bench_size(comm: Communicator, size: int, batches: int) -> Dict[Tuple[str, str], float]:
    """Seconds per call for every (collective, algorithm) at ``size`` bytes."""
    from mpi4py import MPI

    p, r, raw = comm.size, comm.rank, comm.transport.comm
    n = size // 4
    x, out = np.ones(n, np.float32), np.empty(n, np.float32)
    part, gathered = np.ones(n // p, np.float32), np.empty(n // p * p, np.float32)
    scattered = np.empty(n // p, np.float32)
    rs_in = np.ones(n // p * p, np.float32)
    right, left = (r + 1) % p, (r - 1) % p
    cases: Dict[Tuple[str, str], Callable[[], object]] = {
        ("sendrecv", "p2p"): lambda: raw.Sendrecv(x, right, 7, out, left, 7),
        ("allreduce", "MPI"): lambda: raw.Allreduce(x, out),
        ("allreduce", "ring"): lambda: comm.allreduce(x, algorithm="ring", out=out),
        ("allreduce", "recursive_doubling"):
            lambda: comm.allreduce(x, algorithm="recursive_doubling", out=out),
        ("allreduce", "auto"): lambda: comm.allreduce(x, out=out),
        ("allgather", "MPI"): lambda: raw.Allgather(part, gathered),
        ("allgather", "ring"): lambda: comm.allgather(part, out=gathered),
        ("reduce_scatter", "MPI"): lambda: raw.Reduce_scatter_block(rs_in, scattered),
        ("reduce_scatter", "ring"): lambda: comm.reduce_scatter(rs_in, out=scattered),
        ("broadcast", "MPI"): lambda: raw.Bcast(x, root=0),
        ("broadcast", "binomial"): lambda: comm.broadcast(x, root=0, out=x),
    }
    if p == 1:
        cases = {k: v for k, v in cases.items() if k[0] != "sendrecv"}
    del MPI
    return timeit(comm, cases, size, batches)


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests' bus bandwidth factor."""
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in ("allgather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0


def report(results: Dict[int, Dict[Tuple[str, str], float]], p: int) -> List[str]:
    """The table rows and the PASS/FAIL lines of the targets."""
    rows = [f"{'size':>9} {'collective':<15} {'algorithm':<19} {'time_us':>10} {'algbw':>7} "
            f"{'busbw':>7} {'vs_p2p':>7} {'vs_MPI':>7}"]
    for size, res in results.items():
        p2p = size / res[("sendrecv", "p2p")] / 1e9 if ("sendrecv", "p2p") in res else None
        for (coll, algo), sec in res.items():
            algbw = size / sec / 1e9
            bus = algbw * (busbw_factor(coll, p) if coll != "sendrecv" else 1.0)
            native = res.get((coll, "MPI"))
            vs_p2p = f"{bus / p2p:7.2f}" if p2p else f"{'-':>7}"
            vs_mpi = f"{native / sec:7.2f}" if native and algo != "MPI" else f"{'-':>7}"
            rows.append(f"{human(size):>9} {coll:<15} {algo:<19} {sec * 1e6:10.1f} "
                        f"{algbw:7.2f} {bus:7.2f} {vs_p2p} {vs_mpi}")
    return rows + targets(results, p)


def targets(results: Dict[int, Dict[Tuple[str, str], float]], p: int) -> List[str]:
    """Issue 4's performance targets, each with its numbers and PASS/FAIL."""
    lines = []

    def check(name: str, ratio: float, need: float) -> None:
        lines.append(f"{'PASS' if ratio >= need else 'FAIL'}  {name}: {ratio:.2f} (need >= {need})")
    big = max(results)
    res = results[big]
    if ("sendrecv", "p2p") in res:
        p2p_t = res[("sendrecv", "p2p")]
        f_ar, f_ag = busbw_factor("allreduce", p), busbw_factor("allgather", p)
        check(f"ring allreduce busbw / p2p bw at {human(big)}",
              f_ar * p2p_t / res[("allreduce", "ring")], 0.8)
        check(f"allgather busbw / p2p bw at {human(big)}",
              f_ag * p2p_t / res[("allgather", "ring")], 0.6)
        check(f"reduce_scatter busbw / p2p bw at {human(big)}",
              f_ag * p2p_t / res[("reduce_scatter", "ring")], 0.6)
    worst = min((r[("allreduce", "MPI")] / r[("allreduce", "ring")], s)
                for s, r in results.items() if s >= 1 << 20) if big >= 1 << 20 else None
    if worst:
        check(f"ring allreduce busbw / MPI_Allreduce busbw, worst size >= 1M "
              f"({human(worst[1])})", worst[0], 1.0)
    if 4 << 10 in results:
        r4 = results[4 << 10]
        check("MPI_Allreduce time / auto allreduce time at 4K (auto <= 1.5x MPI)",
              1.5 * r4[("allreduce", "MPI")] / r4[("allreduce", "auto")], 1.0)
    return lines


def stats_line(comm: Communicator, size: int) -> str:
    """Bytes one rank sends in a ring allreduce of ``size`` bytes, against 2 (p-1)/p N."""
    comm.reset_stats()
    comm.allreduce(np.ones(size // 4, np.float32), algorithm="ring")
    sent, p = comm.stats["allreduce"]["bytes_sent"], comm.size
    return (f"comm.stats: ring allreduce of N={size} bytes, rank {comm.rank} sent {sent} bytes; "
            f"2(p-1)/p*N = {2 * (p - 1) * size // p}")


def human(nbytes: int) -> str:
    """4096 -> '4K'."""
    for unit, shift in (("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def main() -> None:
    """Parse the options, run, print the table on rank 0."""
    parser = argparse.ArgumentParser(description="nccl-tests style collective benchmark")
    parser.add_argument("--sizes", default=",".join(human(s) for s in SIZES),
                        help="comma-separated sizes, e.g. 4K,1M,64M")
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s[:-1]) << {"K": 10, "M": 20}[s[-1]] if s[-1] in "KM" else int(s)
             for s in args.sizes.split(",")]
    comm = create()
    results = {size: bench_size(comm, size, args.batches) for size in sizes}
    stats = stats_line(comm, max(sizes))
    if comm.rank == 0:
        print(f"# bench_collectives: {comm.size} ranks, float32, sizes in bytes, time in us, "
              f"bandwidth in GB/s")
        print("\n".join(report(results, comm.size)))
        print(stats)


if __name__ == "__main__":
    main()
