"""Allreduce across hosts: measured against the two-link-class alpha-beta model, and the
hierarchical allreduce against the flat ring.

    python benchmarks/bench_multihost.py [--rate 1gbit] [--sizes 4K,64K,1M,16M,64M] [--reps 3]

Makes a test cluster (``tools/testcluster``: 2 hosts x 2 ranks, network namespaces
with each host link shaped to ``--rate`` by ``tc tbf``; needs root), runs itself on its 4 ranks
with mpiexec over TCP, and removes the cluster.  The ranks first fit each link class
(``fit_links``: the sustained rate of 16 MiB exchanges, alpha 0; ranks 0-1 share host 0, ranks 0-2
cross the host link), then time each allreduce algorithm at each size, all algorithms
interleaved within each repetition; time is the best repetition of the slowest rank.
``busbw = 2 (p - 1) / p * size / time`` (nccl-tests).  ``tree`` is needle's binomial reduce to
rank 0 followed by its binomial broadcast.  The prediction prices the steps each algorithm
declares (``select.steps``; a send's pieces are pipelined, one latency) with the fitted
``TwoLevelModel`` (the ranks of a host share its link).  Last lines: the range of measured /
predicted from 1 MiB up (target: within 25%), and hierarchical / flat ring at the largest size
(target >= 1.3x at 2 x 2 with a 1 Gbit/s link; the link-bound limit is 1.5x).
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from needle import cli

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the checkout's needle and tools/
    sys.path.insert(0, str(ROOT))
ALGORITHMS = ["ring", "recursive_doubling", "tree", "hierarchical"]
NODES = [0, 0, 1, 1]


def parse_size(s: str) -> int:
    """``4K`` -> 4096, ``64M`` -> 67108864."""
    s = s.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s[:-1] if s[-1] in "KMG" else s) * scale


def exchange(raw, peer: int, nbytes: int, iters: int) -> float:
    """Seconds per exchange of ``nbytes`` each way between rank 0 and ``peer`` (others idle),
    back to back: both directions busy at once, as in a collective's round."""
    buf, got = np.zeros(max(nbytes, 1), np.uint8), np.empty(max(nbytes, 1), np.uint8)
    raw.Barrier()
    t0 = time.perf_counter()
    if raw.rank in (0, peer):
        other = peer if raw.rank == 0 else 0
        for _ in range(iters):
            raw.Sendrecv(buf, other, recvbuf=got, source=other)
    return raw.bcast((time.perf_counter() - t0) / iters, root=0)


def fit_links(raw):
    """(intra-host, inter-host) ``CostModel``: the sustained rate of back-to-back 16 MiB
    exchanges (tbf's burst, 1 ms of the rate, is 1% of the first), alpha 0: from 1 MiB up a
    message's latency hides behind the transfer here, and an alpha fitted over 1-16 MiB is
    noise (0-2 ms across runs on this shared 2-core machine, whose small messages measure its
    scheduler), as is the rate at 1 MiB (10% slower, run to run)."""
    from needle.parallel.comm.algorithms.cost_model import CostModel
    n = 16 << 20
    return [CostModel(0.0, min(exchange(raw, peer, n, 4) for _ in range(2)) / n)
            for peer in (1, 2)]


def cases(comm, n: int) -> Dict[str, Callable[[], object]]:
    """One allreduce of ``n`` float32 per algorithm."""
    x = np.full(n, comm.rank + 1.0, np.float32)
    out = np.empty_like(x)

    def tree() -> object:
        res = comm.reduce(x, root=0)
        return comm.broadcast(res if comm.rank == 0 else out, root=0, out=out)
    run = {a: (lambda a=a: comm.allreduce(x, algorithm=a, out=out))
           for a in ("ring", "recursive_doubling", "hierarchical")}
    run["tree"] = tree
    return {a: run[a] for a in ALGORITHMS}


def measure(comm, sizes: List[int], reps: int) -> Dict[int, Dict[str, List[float]]]:
    """Seconds per call of the slowest rank, per size, algorithm and repetition."""
    from mpi4py import MPI
    raw = comm.transport.comm
    comm.nodes = NODES  # the layout the hostfile makes (checked by the tests)
    out: Dict[int, Dict[str, List[float]]] = {}
    for size in sizes:
        run = cases(comm, size // 4)
        iters = max(1, min(20, (4 << 20) // size))
        for fn in run.values():
            fn()
        out[size] = {a: [] for a in run}
        for _ in range(reps):
            for a, fn in run.items():
                raw.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                t = (time.perf_counter() - t0) / iters
                out[size][a].append(raw.allreduce(t, op=MPI.MAX))
    return out


def predicted_steps(algorithm: str, size: int, piece: int = 0):
    """The steps an allreduce of ``size`` bytes of float32 sends on ``NODES`` (``piece=0``: one
    latency per send, its pieces pipelined behind each other)."""
    from needle.parallel.comm.algorithms import select
    p = len(NODES)
    if algorithm == "tree":
        return select.steps("reduce", "binomial", size, p, 4, piece).then(
            select.steps("broadcast", "binomial", size, p, 4, piece))
    return select.steps("allreduce", algorithm, size, p, 4, piece, NODES)


def worker(args: argparse.Namespace) -> None:
    """On each rank: fit, measure, and (rank 0) print the table."""
    from two_level_model import TwoLevelModel

    from needle.parallel.comm.engine.communicator import create
    comm = create()
    raw = comm.transport.comm
    intra, inter = fit_links(raw)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    times = measure(comm, sizes, args.reps)
    if comm.rank != 0:
        return
    model = TwoLevelModel(intra, inter)
    p = comm.size
    print(f"fitted: intra alpha {intra.alpha * 1e6:.1f} us, {1e-9 / intra.beta:.2f} GB/s; "
          f"inter alpha {inter.alpha * 1e6:.1f} us, {1e-9 / max(inter.beta, 1e-30):.3f} GB/s")
    print(f"| size | algorithm | measured ms | busbw GB/s | predicted ms | predicted busbw "
          f"| measured / predicted |\n|{' --- |' * 7}")
    big_ratios: List[float] = []
    for size in sizes:
        for a in ALGORITHMS:
            t = min(times[size][a])
            pred = model.seconds(predicted_steps(a, size), NODES)
            bus = 2 * (p - 1) / p * size
            print(f"| {size >> 10} KiB | {a} | {t * 1e3:.3f} | {bus / t / 1e9:.4f} | "
                  f"{pred * 1e3:.3f} | {bus / pred / 1e9:.4f} | {t / pred:.2f} |")
            big_ratios += [t / pred] if size >= 1 << 20 else []
    if big_ratios:
        lo, hi = min(big_ratios), max(big_ratios)
        print(f"measured / predicted from 1 MiB up: {lo:.2f}-{hi:.2f} (target 0.75-1.25: "
              f"{'PASS' if 0.75 <= lo and hi <= 1.25 else 'FAIL'})")
    big = sizes[-1]
    ratios = [r / h for r, h in zip(times[big]["ring"], times[big]["hierarchical"])]
    print(f"hierarchical / flat ring speed at {big >> 20} MiB: best-of-reps "
          f"{min(times[big]['ring']) / min(times[big]['hierarchical']):.2f}x; per rep "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (target >= 1.3x, link-bound limit 1.5x)")


def main() -> int:
    """Make the cluster, run the workers across it, remove it."""
    p = cli.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--reps", type=cli.count_type(lo=1), default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    from needle.parallel import mpiexec
    from tools.testcluster import NamespaceHosts, available
    from tools.testcluster.mpirun import mpiexec_command
    reason = available()
    if reason:
        print(f"bench_multihost: no test cluster here: {reason}", file=sys.stderr)
        return 2
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    print(f"2 hosts x 2 ranks, host links {args.rate} (tc tbf); CPU {cpu}; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    env = mpiexec.pythonpath_env(ROOT)
    with NamespaceHosts(2, 2, args.rate) as cluster:
        cmd = mpiexec_command(mpiexec.find(), str(cluster.hostfile), 4) + [
            sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes", args.sizes,
            "--reps", str(args.reps)]
        before = [cluster.link_bytes(i) for i in range(2)]
        code = subprocess.call(cmd, env=env, timeout=900)
        after = [cluster.link_bytes(i) for i in range(2)]
    print(f"bytes sent on the host links: {[a[0] - b[0] for a, b in zip(after, before)]}; "
          f"load average {os.getloadavg()[0]:.1f} at end")
    return code


if __name__ == "__main__":
    sys.exit(main())
