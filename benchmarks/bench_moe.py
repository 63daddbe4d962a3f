"""Expert-parallel MoE: step time against one process, all-to-all bytes, load balance.

    python -m needle.parallel.launch -n 2 --no-prefix benchmarks/bench_moe.py
    python -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_moe.py

Every rank holds ``--tokens`` tokens and E/p of the ``--experts`` experts of one
``ExpertParallelMoE`` layer (``needle/parallel/moe/``); one step is its forward and backward
(loss: the output's sum plus the Switch load-balancing loss). The reference is the same layer on
one process: an ``nn.MoE`` built from the same seed (so the same router and experts) run on each
rank's tokens in turn, one backward over the sum; it does the same arithmetic and routes the same
tokens to the same experts, so the ratio is the speedup of sharding the experts. Rounds
alternate the two (in one round: a few expert-parallel steps on every rank, a few one-process
steps on rank 0 while the other ranks sleep, the order flipped every round) because the
machine's speed drifts; a time is the median over steps of the slowest rank. One BLAS thread
per process.

All-to-all bytes. GShard (Lepikhin et al., arXiv:2006.16668, sec. 2.2 and Algorithm 2) and Switch
Transformers (Fedus et al., arXiv:2101.03961, sec. 2.2, Fig. 3) dispatch a fixed buffer of
E x C token rows per device, C = ceil(capacity_factor * tokens * k / E), and send the (p-1)/p of
it that lives on other devices; combine sends it back, and the backward pass repeats both: 4
all-to-alls of (p-1)/p * E * C * d * itemsize bytes per step. needle's all-to-all pads each
(source, destination) block to the largest block any rank sends instead (``ep_comms.py``), so
each rank sends exactly 4 * (p-1) * max_block * d * itemsize bytes per step, where max_block is
the largest number of tokens one rank routes to another rank's experts (after capacity). The
script computes max_block from the one-process layer's routing and compares it with the
communicator's ledger; it also prints the balanced, unpadded volume 4 (p-1)/p * tokens * k * d *
itemsize and the count exchange, an allgather of (p-1) * (E + 2) int64 per rank.

Load balance: tokens per expert after capacity (over all ranks), tokens dropped at the
capacity factor (and, from the same router probabilities, at other factors), and the Switch
loss E * sum_i f_i P_i (1.0 when balanced). The router is untrained: it balances only as well
as random weights do.
"""
import argparse
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

import needle as ndl
from needle import cli, nn, ops
from needle.nn.nn_moe import route
from needle.parallel import create
from needle.parallel.moe import ExpertParallelMoE

Step = Callable[[], Any]


def parse() -> argparse.Namespace:
    ap = cli.Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=cli.count_type(lo=1), default=1024, help="tokens per rank")
    ap.add_argument("--d-model", type=cli.count_type(lo=1), default=256)
    ap.add_argument("--d-ff", type=cli.count_type(lo=1), default=1024)
    ap.add_argument("--experts", type=cli.count_type(lo=1), default=8)
    ap.add_argument("--top-k", type=cli.count_type(lo=1), default=1)
    ap.add_argument("--capacity-factor", type=cli.positive_type(), default=1.25)
    ap.add_argument("--rounds", type=cli.count_type(lo=1), default=5)
    ap.add_argument("--steps", type=cli.count_type(lo=1), default=3,
                    help="steps of each side per round")
    ap.add_argument("--seed", type=cli.count_type(lo=0, hi=2**32 - 1), default=0)
    return ap.parse_args()


def tokens(rank: int, args: argparse.Namespace) -> np.ndarray:
    """Rank ``rank``'s tokens (N, d), the same on every process."""
    return np.random.RandomState(100 + rank).randn(args.tokens, args.d_model).astype(np.float32)


def layer_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The layer's arguments besides its sizes, the same for both sides."""
    return dict(top_k=args.top_k, capacity_factor=args.capacity_factor, dtype="float32")


def ep_step(moe: ExpertParallelMoE, x: ndl.Tensor) -> ndl.Tensor:
    """This rank's tokens forward and backward through the expert-parallel layer."""
    out = moe(x)
    (out.sum() + moe.aux_loss).backward()
    return out


def serial_step(moe: nn.MoE, xs: List[ndl.Tensor], log: List[Any]) -> List[ndl.Tensor]:
    """Every rank's tokens through one process's layer; routing of each kept in ``log``."""
    outs, losses = [], []
    log.clear()
    for x in xs:
        out = moe(x)
        aux = moe.aux_loss
        assert aux is not None                                # set by every forward
        log.append((moe.tokens_per_expert.copy(), moe.dropped, float(aux.numpy())))
        losses.append(out.sum() + aux)
        outs.append(out)
    sum(losses[1:], losses[0]).backward()
    return outs


def sleep_until_all(world: Any) -> None:
    """Wait at a barrier without spinning, so that the timed rank has a core to itself."""
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(0.001)


def timed(comm: Any, step: Step) -> Tuple[float, float]:
    """(wall seconds of one step, the slowest rank's; CPU seconds, all ranks together),
    exchanged outside the ledger."""
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    with comm.ledger.paused():
        wall = comm.allreduce(np.array([dt]), op="max")[0]
        cpu = comm.allreduce(np.array([dc]), op="sum")[0]
    return float(wall), float(cpu)


def measure(comm: Any, ep: Step, serial: Step, args: argparse.Namespace) -> Dict[str, list]:
    """Interleaved rounds; per side the list of step seconds (serial: rank 0's)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    got: Dict[str, list] = {"ep": [], "serial": [], "a2a_s": [], "ep_cpu": [], "serial_cpu": []}

    def ep_block() -> None:
        for _ in range(args.steps):
            comm.ledger.reset()
            wall, cpu = timed(comm, ep)
            got["ep"].append(wall)
            got["ep_cpu"].append(cpu)
            got["a2a_s"].append(comm.ledger.total("alltoall", field="seconds"))

    def serial_block() -> None:
        if comm.rank == 0:
            for _ in range(args.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                serial()
                got["serial"].append(time.perf_counter() - t0)
                got["serial_cpu"].append(time.process_time() - c0)
        sleep_until_all(world)

    ep()                                                      # warm-up, not timed
    serial_block()
    for r in range(args.rounds):
        blocks = (ep_block, serial_block) if r % 2 == 0 else (serial_block, ep_block)
        for block in blocks:
            comm.barrier()
            block()
    return got


def formula_bytes(table: np.ndarray, p: int, args: argparse.Namespace) -> Tuple[int, int]:
    """(max_block, all-to-all bytes per rank per step) from the (p, E) tokens-per-expert table."""
    per_pair = table.reshape(p, p, args.experts // p).sum(axis=2)  # [source, destination]
    max_block = int(per_pair.max())
    return max_block, 4 * (p - 1) * max_block * args.d_model * 4


def drops_at(moe: nn.MoE, xs: List[ndl.Tensor], factors: List[float]) -> List[int]:
    """Tokens dropped over all ranks' groups at each capacity factor (same router)."""
    probs = [ops.softmax(moe.router(x), axis=-1).numpy() for x in xs]
    out = []
    for cf in factors:
        cap = int(np.ceil(cf * xs[0].shape[0] * moe.top_k / moe.num_experts))
        out.append(sum(route(pr, moe.top_k, cap).dropped for pr in probs))
    return out


def machine() -> str:
    """CPU model, BLAS kernel and the load average, for the figures' 'machine' column."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{i['internal_api']} {i.get('architecture', '')} {i['version']} "
                         f"({i['num_threads']} thread)" for i in threadpool_info())
    except ImportError:
        blas = "threadpoolctl absent"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores; BLAS {blas}; load average {load}"


def report(comm: Any, got: Dict[str, list], log: List[Any],
           ep_bytes: np.ndarray, args: argparse.Namespace, extra: Dict[str, Any]) -> None:
    """Rank 0 prints every figure and its comparison."""
    p, e, n, k, d = comm.size, args.experts, args.tokens, args.top_k, args.d_model
    t_ep, t_1 = statistics.median(got["ep"]), statistics.median(got["serial"])
    print(f"== Expert-parallel MoE: {p} ranks x {n} tokens, d_model {d}, d_ff {args.d_ff}, "
          f"{e} experts, top-{k}, capacity factor {args.capacity_factor}, float32 ==")
    print(f"machine: {machine()}")
    print(f"step (forward + backward), median of {args.rounds} rounds x {args.steps} steps: "
          f"expert parallel {t_ep * 1e3:.1f} ms, one process {t_1 * 1e3:.1f} ms, speedup "
          f"{t_1 / t_ep:.2f}x (ideal min(p, cores) = {min(p, os.cpu_count() or 1)}); "
          f"all-to-all share of the step {statistics.median(got['a2a_s']) / t_ep:.0%}")
    c_ep, c_1 = statistics.median(got["ep_cpu"]), statistics.median(got["serial_cpu"])
    print(f"CPU seconds per step, all ranks together: expert parallel {c_ep * 1e3:.1f} ms, one "
          f"process {c_1 * 1e3:.1f} ms ({c_ep / c_1:.2f}x); share of a core per process: "
          f"expert parallel {c_ep / (p * t_ep):.2f}, one process {c_1 / t_1:.2f} (below 1: "
          f"waiting, or other jobs on the machine)")
    print(f"rank 0 output vs one process on its tokens: max |diff| {extra['diff']:.2e}")
    table = np.array([t for t, _, _ in log])                  # (p, E) after capacity
    for r in range(p):
        print(f"tokens per expert from rank {r}: {table[r].tolist()}")
    max_block, want = formula_bytes(table, p, args)
    a2a = int(ep_bytes[:, 0].max())
    print(f"all-to-all bytes sent per rank per step: ledger {ep_bytes[:, 0].tolist()}, "
          f"formula 4 x (p-1) x max_block x d x 4 = 4 x {p - 1} x {max_block} x {d} x 4 = {want}: "
          f"{'exact' if (ep_bytes[:, 0] == want).all() else 'DIFFERENT'}")
    gshard = 4 * (p - 1) / p * e * int(np.ceil(args.capacity_factor * n * k / e)) * d * 4
    even = 4 * (p - 1) / p * n * k * d * 4
    print(f"  vs GShard's capacity buffer 4 (p-1)/p E C d 4 = {gshard:.0f}: {a2a / gshard:.2f}x; "
          f"vs balanced unpadded 4 (p-1)/p N k d 4 = {even:.0f}: {a2a / even:.2f}x")
    want_counts = (p - 1) * (e + 2) * 8
    print(f"count allgather bytes per rank per step: ledger {ep_bytes[:, 1].tolist()}, "
          f"(p-1)(E+2) x 8 = {want_counts}: "
          f"{'exact' if (ep_bytes[:, 1] == want_counts).all() else 'DIFFERENT'}")
    load = table.sum(axis=0)
    dropped = sum(dr for _, dr, _ in log)
    print(f"tokens per expert, all ranks: {load.tolist()} (max / mean "
          f"{load.max() / load.mean():.2f}); dropped at capacity factor {args.capacity_factor}: "
          f"{dropped} of {p * n * k} ({dropped / (p * n * k):.1%})")
    print("dropped at capacity factor " + ", ".join(
        f"{cf}: {dr}" for cf, dr in zip(extra["factors"], extra["drops"])))
    print(f"Switch load-balancing loss (1.0 = balanced), mean over ranks: "
          f"{np.mean([a for _, _, a in log]):.3f}")


def main() -> None:
    args = parse()
    comm = create(blas_threads=1)
    p = comm.size
    if p < 2:
        raise SystemExit("bench_moe.py compares expert parallelism with one process: run it on "
                         "2 or more ranks (python -m needle.parallel.launch -n 2 --no-prefix "
                         "benchmarks/bench_moe.py)")
    xs = [ndl.Tensor(tokens(r, args), requires_grad=True) for r in range(p)]
    np.random.seed(args.seed)
    ep = ExpertParallelMoE(args.d_model, args.d_ff, args.experts, comm, **layer_kwargs(args))
    np.random.seed(args.seed)
    one = nn.MoE(args.d_model, args.d_ff, args.experts, **layer_kwargs(args))
    log: List[Any] = []
    mine = xs[comm.rank]
    got = measure(comm, lambda: ep_step(ep, mine), lambda: serial_step(one, xs, log), args)
    comm.ledger.reset()
    out = ep_step(ep, mine)
    mine_bytes = np.array([comm.ledger.total("alltoall"), comm.ledger.total("allgather")])
    with comm.ledger.paused():
        ep_bytes = comm.allgather(mine_bytes.astype(np.int64).reshape(1, 2))  # (p, 2)
    if comm.rank == 0:
        ref = serial_step(one, xs, log)[0]
        factors = [1.0, 1.25, 1.5, 2.0]
        extra = {"diff": float(np.abs(out.numpy() - ref.numpy()).max()), "factors": factors,
                 "drops": drops_at(one, xs, factors)}
        report(comm, got, log, ep_bytes, args, extra)
    comm.barrier()


if __name__ == "__main__":
    main()
