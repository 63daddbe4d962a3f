"""Collective benchmark in the style of nccl-tests, with the communicator's targets.

Run ``mpiexec -n 2 python benchmarks/bench_collectives.py [--sizes 4K,1M,64M] [--batches 5]``;
``--engine`` (no mpiexec) times the communicator on the virtual cluster in process CPU time,
which a loaded machine disturbs less: the Python each call costs, both ranks' together;
``--crossovers`` instead
measures where the ring overtakes the latency-bound algorithm of allreduce, allgather and
reduce-scatter, the thresholds ``select.py`` uses (``NEEDLE_ALLREDUCE_SMALL``,
``NEEDLE_ALLGATHER_SMALL``, ``NEEDLE_REDUCE_SCATTER_SMALL``).

For each size it times, in the same run: MPI's point-to-point bandwidth (``Sendrecv`` around the
ring), our collectives (each algorithm), MPICH's native collectives and, when torch is installed,
``torch.distributed`` with the gloo backend (its ranks are these MPI processes; they meet through a
``FileStore`` in a temporary folder).  As in nccl-tests, *size* is the bytes of the full vector
(allreduce and broadcast: the buffer; allgather: the output; reduce-scatter: the input),
``algbw = size / time`` and ``busbw`` scales algbw by the fraction of the data that must cross a
link: allreduce ``2 (p - 1) / p``, allgather and reduce-scatter ``(p - 1) / p``, broadcast 1.
Outputs are preallocated (``out=``) like nccl-tests' buffers; two extra cases time the calls as
users often write them: ``allreduce(x)`` with no ``out=`` (at the largest size) and the 4 KiB
allreduce with the ledger disabled.  Time is the best batch of the slowest rank's mean per call,
all cases interleaved within each batch, so a change in the machine's load lands on all of them
alike; on a shared machine the slower batches measure other people's processes.

Then the alpha-beta model (``needle.parallel.comm.algorithms.cost_model``) is fitted to the
``Sendrecv`` times and predicts the ring allreduce from the message trace of the same call on
the virtual cluster; the collectives' targets are printed with PASS/FAIL.
"""
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import collective_floors as floors
import numpy as np

from needle import cli
from needle.parallel import virtual
from needle.parallel.comm.algorithms.cost_model import CostModel
from needle.parallel.comm.engine.communicator import Communicator, create

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
Results = Dict[int, Dict[Tuple[str, str], float]]


def timeit(comm: Communicator, cases: Dict[Tuple[str, str], Callable[[], object]], size: int,
           batches: int) -> Dict[Tuple[str, str], float]:
    """Best batch's mean seconds per call of every case, taking the slowest rank of each batch."""
    from mpi4py import MPI

    raw = comm.transport.comm
    iters = max(3, min(2000, int(4e8 // max(size, 1 << 14))))
    for fn in cases.values():
        fn()
    times: Dict[Tuple[str, str], List[float]] = {key: [] for key in cases}
    for _ in range(batches):
        for key, fn in cases.items():
            raw.Barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            elapsed = (time.perf_counter() - start) / iters
            times[key].append(raw.allreduce(elapsed, op=MPI.MAX))
    return {key: float(np.min(t)) for key, t in times.items()}


def gloo_cases(dist: object, size: int, p: int) -> Dict[Tuple[str, str], Callable[[], object]]:
    """torch.distributed (gloo) allreduce, allgather and reduce-scatter on ``size`` bytes."""
    import torch

    n = size // 4
    x, part = torch.ones(n), torch.ones(n // p)
    gathered, rs_in = torch.empty(n // p * p), torch.ones(n // p * p)
    scattered = torch.empty(n // p)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return {("allreduce", "gloo"): lambda: dist.all_reduce(x),
            ("allgather", "gloo"): lambda: dist.all_gather_into_tensor(gathered, part),
            ("reduce_scatter", "gloo"): lambda: rs(scattered, rs_in)}


def bench_size(comm: Communicator, quiet: Communicator, serial: Communicator, size: int,
               batches: int, dist: Optional[object], largest: bool
               ) -> Dict[Tuple[str, str], float]:
    """Seconds per call for every (collective, algorithm) at ``size`` bytes."""
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
        ("allgather", "ring"): lambda: comm.allgather(part, algorithm="ring", out=gathered),
        ("allgather", "auto"): lambda: comm.allgather(part, out=gathered),
        ("reduce_scatter", "MPI"): lambda: raw.Reduce_scatter_block(rs_in, scattered),
        ("reduce_scatter", "ring"):
            lambda: comm.reduce_scatter(rs_in, algorithm="ring", out=scattered),
        ("reduce_scatter", "auto"): lambda: comm.reduce_scatter(rs_in, out=scattered),
        ("broadcast", "MPI"): lambda: raw.Bcast(x, root=0),
        ("broadcast", "binomial"): lambda: comm.broadcast(x, root=0, out=x),
    }
    if p & (p - 1) == 0 and p > 1:  # the algorithms that carry the check in their messages
        cases[("allgather", "recursive_doubling")] = lambda: comm.allgather(
            part, algorithm="recursive_doubling", out=gathered)
        cases[("reduce_scatter", "recursive_halving")] = lambda: comm.reduce_scatter(
            rs_in, algorithm="recursive_halving", out=scattered)
    if size <= 1 << 20:  # what running the argument check beside the first messages saves
        cases[("allgather", "check first")] = lambda: serial.allgather(
            part, algorithm="ring", out=gathered)
        cases[("broadcast", "check first")] = lambda: serial.broadcast(x, root=0, out=x)
    if size == 4 << 10:
        cases[("allreduce", "auto ledger off")] = lambda: quiet.allreduce(x, out=out)
    if largest:
        cases[("allreduce", "auto no out=")] = lambda: comm.allreduce(x)
    if dist is not None and p > 1:
        cases.update(gloo_cases(dist, size, p))
    if p > 1:
        cases.update(floor_cases(raw, x, out, part, gathered, rs_in, scattered))
    if p == 1:
        cases = {k: v for k, v in cases.items() if k[0] != "sendrecv"}
    return timeit(comm, cases, size, batches)


def floor_cases(raw: object, x: np.ndarray, out: np.ndarray, part: np.ndarray,
                gathered: np.ndarray, rs_in: np.ndarray, scattered: np.ndarray
                ) -> Dict[Tuple[str, str], Callable[[], object]]:
    """The same messages as our algorithms on bare mpi4py (``collective_floors.py``)."""
    from mpi4py import MPI

    every = {"allreduce": floors.allreduce_floors(raw, MPI, x, out),
             "allgather": floors.allgather_floors(raw, MPI, part, gathered),
             "reduce_scatter": floors.reduce_scatter_floors(raw, MPI, rs_in, scattered),
             "broadcast": floors.broadcast_floor(raw, MPI, x)}
    return {(coll, name): fn for coll, fns in every.items() for name, fn in fns.items()}


def floor_lines(results: Results) -> List[str]:
    """Per collective and size >= 64 KiB: ours, the best floor, MPICH (us), and what our own
    Python costs on top of the floor."""
    lines = ["floors: the same messages on bare mpi4py (collective_floors.py), us"]
    for size, res in ((s, r) for s, r in results.items() if s >= 64 << 10):
        for coll, algo in OURS.items():
            fl = [t for (c, a), t in res.items() if c == coll and a.endswith("floor")]
            if fl:
                ours, floor, native = res[(coll, algo)], min(fl), res[(coll, "MPI")]
                lines.append(f"{human(size):>9} {coll:<15} ours {ours * 1e6:8.1f}  floor "
                             f"{floor * 1e6:8.1f}  MPICH {native * 1e6:8.1f}  ours - floor "
                             f"{(ours - floor) * 1e6:7.1f}  MPICH / floor {native / floor:5.2f}")
    return lines


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests' bus bandwidth factor."""
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in ("allgather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0


def report(results: Results, p: int) -> List[str]:
    """The table rows: time, algbw, busbw, busbw / p2p, and MPI's time / ours."""
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
    return rows


OURS = {"allreduce": "auto", "allgather": "auto", "reduce_scatter": "auto",
        "broadcast": "binomial"}


def targets(results: Results, p: int) -> List[str]:
    """The collectives' target table, each row with its numbers and PASS/FAIL."""
    lines = [f"targets ({p} ranks):"]

    def row(name: str, value: float, ok: bool, need: str) -> None:
        lines.append(_target_line(name, value, ok, need))
    big = [s for s in results if s >= 64 << 10]
    for coll, algo in OURS.items():
        if big:
            ratio, at = min((results[s][(coll, "MPI")] / results[s][(coll, algo)], s)
                            for s in big)
            row(f"busbw {coll} / MPICH, worst size >= 64K ({human(at)})", ratio, ratio >= 0.9,
                ">= 0.9")
    for coll in ("allreduce", "allgather", "reduce_scatter"):
        if big and (coll, "gloo") in results[big[0]]:
            ratio, at = min((results[s][(coll, "gloo")] / results[s][(coll, OURS[coll])], s)
                            for s in big)
            row(f"busbw {coll} / gloo, worst size >= 64K ({human(at)})", ratio, ratio >= 1.0,
                ">= 1.0")
    if 4 << 10 in results:
        r4 = results[4 << 10]
        ratio = r4[("allreduce", "auto")] / r4[("allreduce", "MPI")]
        row("4K allreduce time / MPICH's (timeout and argument check kept)", ratio,
            ratio <= 1.5, "<= 1.5")
        off = r4[("allreduce", "auto ledger off")] / r4[("allreduce", "auto")]
        lines.append(f"info  4K allreduce time, ledger off / on: {off:.3f}")
    lines += _ring_rows(results, p)
    res = results[max(results)]
    if ("allreduce", "auto no out=") in res:
        ratio = res[("allreduce", "auto no out=")] / res[("allreduce", "auto")]
        lines.append(f"info  allreduce at {human(max(results))}: time without out= / with out=: "
                     f"{ratio:.2f}")
    return lines


def _target_line(name: str, value: float, ok: bool, need: str) -> str:
    """One row of the target table: PASS or FAIL, the figure and what it needs."""
    return f"{'PASS' if ok else 'FAIL'}  {name}: {value:.2f} (need {need})"


def _ring_rows(results: Results, p: int) -> List[str]:
    """The ring allreduce's busbw over ``Sendrecv``'s at 16 and 64 MiB, and its floor's."""
    lines = []
    for at in [s for s in (16 << 20, 64 << 20) if s in results] or [max(results)]:
        res = results[at]
        if ("sendrecv", "p2p") in res:
            ratio = _vs_p2p(res, "ring", p)
            lines.append(_target_line(f"ring allreduce busbw / p2p at {human(at)}", ratio,
                                      ratio >= 0.7, ">= 0.7"))
            if ("allreduce", "ring floor") in res:
                lines.append(f"info  the ring's floor (the same messages unchunked on bare "
                             f"mpi4py, the same reductions) busbw / p2p at {human(at)}: "
                             f"{_vs_p2p(res, 'ring floor', p):.2f}")
    return lines


def _vs_p2p(res: Dict[Tuple[str, str], float], algo: str, p: int) -> float:
    """Allreduce busbw with ``algo`` over the ``Sendrecv`` bandwidth."""
    return busbw_factor("allreduce", p) * res[("sendrecv", "p2p")] / res[("allreduce", algo)]


def cost_model_lines(results: Results, comm: Communicator) -> List[str]:
    """Fit alpha-beta to the Sendrecv times; predict the ring allreduce from its trace."""
    p = comm.size
    sizes = sorted(s for s in results if ("sendrecv", "p2p") in results[s])
    if not sizes:
        return []
    model = CostModel.fit(sizes, [results[s][("sendrecv", "p2p")] for s in sizes])
    # a fit on noisy timings (a loaded machine, two sizes) can give beta = 0
    bandwidth = f"{1e-9 / model.beta:.1f} GB/s" if model.beta > 0 else "fit failed: beta = 0"
    lines = [f"alpha-beta model fitted to Sendrecv: alpha = {model.alpha * 1e6:.2f} us, "
             f"beta = {model.beta * 1e12:.1f} ps/byte ({bandwidth})",
             f"{'size':>9} {'ring predicted_us':>18} {'measured_us':>12} {'measured/pred':>14}"]
    for size in (s for s in sizes if s >= 1 << 20):
        cluster = virtual.Cluster(p, trace=True)
        cluster.run(_ring_once, size, comm.chunk_bytes)
        pred = model.predict(cluster.trace)
        meas = results[size][("allreduce", "ring")]
        lines.append(f"{human(size):>9} {pred * 1e6:18.1f} {meas * 1e6:12.1f} {meas / pred:14.2f}")
    return lines


def _ring_once(comm: Communicator, size: int, chunk: int) -> None:
    c = Communicator(comm.transport, chunk_bytes=chunk)
    c.allreduce(np.ones(size // 4, np.float32), algorithm="ring")


def stats_line(comm: Communicator, size: int) -> str:
    """Bytes one rank sends in a ring allreduce of ``size`` bytes, against 2 (p-1)/p N."""
    comm.reset_stats()
    comm.allreduce(np.ones(size // 4, np.float32), algorithm="ring")
    sent, p = comm.stats["allreduce"]["bytes_sent"], comm.size
    return (f"comm.stats: ring allreduce of N={size} bytes, rank {comm.rank} sent {sent} bytes; "
            f"2(p-1)/p*N = {2 * (p - 1) * size // p}")


CROSSOVERS = {  # collective: (latency-bound algorithm, select.py's threshold)
    "allreduce": ("recursive_doubling", "NEEDLE_ALLREDUCE_SMALL"),
    "allgather": ("recursive_doubling", "NEEDLE_ALLGATHER_SMALL"),
    "reduce_scatter": ("recursive_halving", "NEEDLE_REDUCE_SCATTER_SMALL"),
}


def crossovers(comm: Communicator, batches: int) -> List[str]:
    """Each collective's latency-bound algorithm against the ring, 4 KiB to 16 MiB (the full
    vector), interleaved: the largest size up to which the latency-bound one stays faster is
    ``select.py``'s threshold for this machine and rank count."""
    p = comm.size
    lines = [f"crossovers ({p} ranks): time_us, latency-bound algorithm vs ring"]
    for coll, (fast, env) in CROSSOVERS.items():
        if coll != "allreduce" and (p & (p - 1) or p == 1):
            lines.append(f"{coll}: {fast} needs a power-of-two number of ranks")
            continue
        small, fast_wins = 0, True
        for size in [4 << (10 + 2 * k) for k in range(7)]:
            t = timeit(comm, _pair(comm, coll, size, fast), size, batches)
            a, b = t[(coll, fast)], t[(coll, "ring")]
            fast_wins = fast_wins and a <= b
            small = size if fast_wins else small
            lines.append(f"{coll:>15} {human(size):>6} {a * 1e6:10.1f} {b * 1e6:10.1f}  "
                         f"{fast if a <= b else 'ring'}")
        lines.append(f"{env}={small}  (select.py: {fast} up to this size)")
    return lines


def _pair(comm: Communicator, coll: str, size: int, fast: str
          ) -> Dict[Tuple[str, str], Callable[[], object]]:
    """``coll`` of ``size`` bytes (the full vector) with ``fast`` and with the ring."""
    n, p = size // 4, comm.size
    x, res = np.ones(n, np.float32), np.empty(n, np.float32)
    part, scattered = np.ones(n // p, np.float32), np.empty(n // p, np.float32)
    x = x[:n // p * p]
    calls = {"allreduce": lambda a: comm.allreduce(x, algorithm=a, out=res),
             "allgather": lambda a: comm.allgather(part, algorithm=a, out=res[:n // p * p]),
             "reduce_scatter": lambda a: comm.reduce_scatter(x, algorithm=a, out=scattered)}
    call = calls[coll]
    return {(coll, a): (lambda a=a: call(a)) for a in (fast, "ring")}


def _engine_rank(comm: Communicator, size: int, iters: int, reps: int) -> Dict[str, float]:
    """Best CPU seconds per call of each collective (the best of ``reps`` rounds)."""
    p, n = comm.size, size // 4
    x, out, part = np.ones(n, np.float32), np.empty(n, np.float32), np.ones(n // p, np.float32)
    gathered, scattered = np.empty(n // p * p, np.float32), np.empty(n // p, np.float32)
    c = Communicator(comm.transport)
    calls = {"allreduce": lambda: c.allreduce(x, out=out),
             "allgather": lambda: c.allgather(part, out=gathered),
             "reduce_scatter": lambda: c.reduce_scatter(x[:n // p * p], out=scattered),
             "broadcast": lambda: c.broadcast(x, root=0, out=x),
             "reduce": lambda: c.reduce(x, root=0), "alltoall": lambda: c.alltoall(x)}
    best: Dict[str, float] = {}
    for _ in range(reps):
        for name, fn in calls.items():
            t0 = time.process_time()
            for _ in range(iters):
                fn()
            dt = (time.process_time() - t0) / iters
            best[name] = min(best.get(name, dt), dt)
    return best


def engine_lines() -> List[str]:
    """``_engine_rank`` on virtual clusters of 1 and 2 ranks at 4 KiB and 64 KiB (us)."""
    lines = ["engine: CPU us per call on the virtual cluster (all ranks)"]
    for p in (1, 2):
        for size in (4 << 10, 64 << 10):
            best = virtual.run(p, _engine_rank, size, 300, 7)[0]
            cells = [f"{k} {t * 1e6:.1f}" for k, t in best.items()]
            lines.append(f"p={p} {human(size):>4}  " + "  ".join(cells))
    return lines


def human(nbytes: int) -> str:
    """4096 -> '4K'."""
    for unit, shift in (("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def start_gloo(comm: Communicator) -> Optional[object]:
    """torch.distributed with gloo on these ranks (None without torch)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    raw = comm.transport.comm
    folder = raw.bcast(tempfile.mkdtemp(prefix="needle-gloo-") if comm.rank == 0 else None)
    store = dist.FileStore(os.path.join(folder, "store"), comm.size)
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
    return dist


def main() -> None:
    """Parse the options, run, print the table on rank 0."""
    parser = cli.Parser(description="nccl-tests style collective benchmark")
    parser.add_argument("--sizes", default=",".join(human(s) for s in SIZES),
                        help="comma-separated sizes, e.g. 4K,1M,64M")
    parser.add_argument("--batches", type=cli.count_type(lo=1), default=5)
    parser.add_argument("--no-gloo", action="store_true", help="skip torch.distributed")
    parser.add_argument("--engine", action="store_true",
                        help="only the engine's CPU time per call (no mpiexec)")
    parser.add_argument("--crossovers", action="store_true",
                        help="only measure the allreduce algorithm crossover (select.py)")
    args = parser.parse_args()
    if args.engine:
        print("\n".join(engine_lines()), flush=True)
        return
    if args.crossovers:
        comm = create()
        lines = crossovers(comm, args.batches)
        if comm.rank == 0:
            print("\n".join(lines), flush=True)
        return
    sizes = [int(s[:-1]) << {"K": 10, "M": 20}[s[-1]] if s[-1] in "KM" else int(s)
             for s in args.sizes.split(",")]
    comm = create()
    floors.OVERSUBSCRIBED = comm.transport.spin == 0  # the transport's own finding
    quiet = Communicator(comm.transport)
    quiet.ledger.disable()
    serial = Communicator(comm.transport)
    serial.overlap_check = False
    dist = None if args.no_gloo or comm.size == 1 else start_gloo(comm)
    results = {size: bench_size(comm, quiet, serial, size, args.batches, dist, size == max(sizes))
               for size in sizes}
    stats = stats_line(comm, max(sizes))
    model = cost_model_lines(results, comm) if comm.rank == 0 else []
    if comm.rank == 0:
        print(f"# bench_collectives: {comm.size} ranks, float32, sizes in bytes, time in us, "
              f"bandwidth in GB/s{'' if dist else ' (gloo: torch not installed)'}")
        print("\n".join(report(results, comm.size)))
        print(stats)
        print("\n".join(model))
        print("\n".join(floor_lines(results)))
        print("\n".join(targets(results, comm.size)))
    if dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
