"""Data-parallel benchmark: DDP buckets and overlap, torch DDP, scaling, ZeRO/FSDP memory and
traffic, and the parameter server with a straggler.

    python -m needle.parallel.launch -n 2 --no-prefix benchmarks/bench_data_parallel.py
    python -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_data_parallel.py --zero
    python -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_data_parallel.py --ps \\
        --plot benchmarks/param_server.png
    env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u MKL_NUM_THREADS -u OPENBLAS_CORETYPE \\
        -u OPENBLAS_L2_SIZE mpiexec -n 2 python benchmarks/bench_data_parallel.py --default-threads

``--default-threads`` leaves the BLAS threads to ``create()`` (the library's default placement,
``needle/parallel/threads.py``) and compares needle DDP with torch DDP. Otherwise one BLAS
thread per rank (``threadpoolctl``: the launcher's rank process has loaded NumPy before this
script runs, so environment variables would come too late). Timed cases run in interleaved
blocks (each block: a barrier, then a few steps of every case in turn), and a case's time is the
median over blocks of the slowest rank's median step, so the machine's load changes land on all
cases alike and every ratio comes from one run. Memory is measured per rank with
``MemoryTracker`` (live bytes after a step, inputs excluded), bytes with the communicator's
counters.
"""
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

import needle as ndl
from needle import cli, nn
from needle.memory import MemoryTracker, estimate_module
from needle.parallel import (
    DataParallelNaive,
    DistributedDataParallel,
    FullyShardedDataParallel,
    ParameterServer,
    ZeroRedundancyOptimizer,
    create,
)
from needle.parallel.param_server import train_worker

Step = Callable[[], None]
PS_BATCH = 256


def one_blas_thread() -> None:
    """Limit NumPy's BLAS (and torch) to one thread in this rank."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # then OMP_NUM_THREADS=1 must be set by whoever starts the ranks
        return
    threadpool_limits(1)
    os.environ.update({v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")})


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- models and a training step ----------------------------------------------------------------
def many_small(seed: int) -> nn.Module:
    """~1000 small parameters: 500 Linear(8, 8)-Tanh layers (weight + bias)."""
    np.random.seed(seed)
    return nn.Sequential(*[m for _ in range(500) for m in (nn.Linear(8, 8), nn.Tanh())])


def mlp(seed: int, width: int = 1024) -> nn.Module:
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


class CharTransformer(nn.Module):
    """Embedding -> 2 Transformer layers -> Linear over a 96-token vocabulary: (T, B) ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(96, 128, gather=True)
        self.seq_model = nn.Transformer(128, 256, 2, sequence_len=32, num_head=4, dim_head=32)
        self.linear = nn.Linear(128, 96)

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        T, B = x.shape
        out, _ = self.seq_model(self.embedding(x))                        # (T, B, 128)
        return self.linear(out.reshape((T * B, 128)))


def transformer(seed: int) -> nn.Module:
    np.random.seed(seed)
    return CharTransformer()


def data_for(name: str, batch: int, rank: int) -> Tuple[ndl.Tensor, ndl.Tensor, Callable]:
    rng = np.random.default_rng(rank)
    if name == "transformer":
        x = ndl.Tensor(rng.integers(0, 96, (32, batch)), dtype="float32", requires_grad=False)
        y = ndl.Tensor(rng.integers(0, 96, 32 * batch), dtype="int64", requires_grad=False)
        return x, y, lambda net, x, y: nn.SoftmaxLoss()(net(x), y)
    dim = 8 if name == "many_small" else 256
    x = ndl.Tensor(rng.standard_normal((batch, dim)), dtype="float32", requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 8 if name == "many_small" else 10, batch), dtype="int64",
                   requires_grad=False)
    return x, y, lambda net, x, y: nn.SoftmaxLoss()(net(x), y)


MODELS = {"many_small": many_small, "mlp": mlp, "transformer": transformer}


def train_step(net: Any, opt: Any, x: ndl.Tensor, y: ndl.Tensor, loss_fn: Callable) -> Step:
    def step() -> None:
        loss = loss_fn(net, x, y)
        opt.reset_grad()
        loss.backward(create_graph=False)
        opt.step()
    return step


def timed(comm: Any, cases: Dict[str, Step], blocks: int, steps: int) -> Dict[str, float]:
    """Seconds per step of every case: interleaved blocks, slowest rank, median of blocks."""
    raw = comm.transport.comm
    for fn in cases.values():
        fn()
    per: Dict[str, List[float]] = {k: [] for k in cases}
    for _ in range(blocks):
        for name, fn in cases.items():
            raw.Barrier()
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            per[name].append(float(np.max(comm.allgather(np.array([np.median(ts)])))))
    return {k: float(np.median(v)) for k, v in per.items()}


# -- DDP ---------------------------------------------------------------------------------------
def bench_ddp(comm: Any, args: Any) -> List[str]:
    out = []
    cases: Dict[str, Step] = {}
    # Bucketed vs one allreduce per tensor (~1000 parameters of 64 or 8 floats).
    for name, wrap in (("per_tensor", lambda m: DataParallelNaive(m, comm)),
                       ("bucketed", lambda m: DistributedDataParallel(m, comm))):
        net = wrap(many_small(comm.rank))
        x, y, loss_fn = data_for("many_small", 8, comm.rank)
        cases[name] = train_step(net, ndl.optim.SGD(net.parameters(), lr=0.01), x, y, loss_fn)
    # Overlapped vs allreduce after backward, MLP and transformer, 1 MiB buckets.
    for model in ("mlp", "transformer"):
        for overlap in (True, False):
            net = DistributedDataParallel(MODELS[model](comm.rank), comm, bucket_cap_mb=1.0,
                                          overlap=overlap)
            x, y, loss_fn = data_for(model, 32, comm.rank)
            cases[f"{model}_{'overlap' if overlap else 'after'}"] = train_step(
                net, ndl.optim.Adam(net.parameters(), lr=1e-3), x, y, loss_fn)
    gloo = start_gloo(comm) if not args.no_torch else None
    if gloo is not None:
        cases["torch_ddp"] = torch_ddp_step(comm, gloo, batch=64)
        net = DistributedDataParallel(mlp(comm.rank), comm)
        x, y, loss_fn = data_for("mlp", 64, comm.rank)
        cases["needle_ddp"] = train_step(net, ndl.optim.SGD(net.parameters(), lr=0.01), x, y,
                                         loss_fn)
    # Scaling: the same per-rank batch on 1 rank (rank 0 alone, its own communicator) and 2.
    solo = comm.split(0 if comm.rank == 0 else 1)
    x, y, loss_fn = data_for("mlp", 64, comm.rank)
    net2 = DistributedDataParallel(mlp(comm.rank), comm)
    cases["scale_n"] = train_step(net2, ndl.optim.SGD(net2.parameters(), lr=0.01), x, y,
                                  loss_fn)
    net1 = DistributedDataParallel(mlp(comm.rank), solo)
    one = train_step(net1, ndl.optim.SGD(net1.parameters(), lr=0.01), x, y, loss_fn)
    cases["scale_1"] = one if comm.rank == 0 else (lambda: None)
    t = timed(comm, cases, args.blocks, args.steps)
    p = comm.size
    r = t["per_tensor"] / t["bucketed"]
    out.append(f"bucketed vs per-tensor allreduce, 1000 params: {1e3 * t['per_tensor']:.1f} vs "
               f"{1e3 * t['bucketed']:.1f} ms/step = {r:.2f}x (target >= 1.8x) {verdict(r >= 1.8)}")
    for model in ("mlp", "transformer"):
        a, b = t[f"{model}_after"], t[f"{model}_overlap"]
        out.append(f"overlap vs allreduce-after-backward, {model}: {1e3 * a:.1f} -> "
                   f"{1e3 * b:.1f} ms/step, gain {100 * (a / b - 1):+.1f}% "
                   f"(target not slower) {verdict(b <= a * 1.02)}")
    if "torch_ddp" in t:
        r = t["needle_ddp"] / t["torch_ddp"]
        out.append(f"needle DDP vs torch DDP (gloo), MLP 256-1024x3-10, batch 64/rank: "
                   f"{1e3 * t['needle_ddp']:.1f} vs {1e3 * t['torch_ddp']:.1f} ms/step = "
                   f"{r:.2f}x (target <= 1.3x) {verdict(r <= 1.3)}")
    eff = t["scale_1"] / t["scale_n"]
    out.append(f"scaling efficiency {p} ranks vs 1 (MLP, batch 64/rank): step "
               f"{1e3 * t['scale_1']:.1f} -> {1e3 * t['scale_n']:.1f} ms, efficiency "
               f"{eff:.2f} (target >= 0.8) {verdict(eff >= 0.8)}")
    return out


def start_gloo(comm: Any) -> Any:
    """torch.distributed (gloo) on these MPI ranks, meeting through a FileStore; None without
    torch."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    torch.set_num_threads(1)
    raw = comm.transport.comm
    folder = raw.bcast(tempfile.mkdtemp(prefix="needle-gloo-") if comm.rank == 0 else None)
    store = dist.FileStore(os.path.join(folder, "store"), comm.size)
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
    return dist


def torch_ddp_step(comm: Any, dist: Any, batch: int,
                   sizes: Tuple[int, ...] = (256, 1024, 1024, 1024, 10),
                   adam: bool = False) -> Step:
    """A torch DDP training step of an MLP with layer ``sizes`` (SGD, or Adam)."""
    import torch
    torch.manual_seed(comm.rank)
    layers: List[Any] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3) if adam else \
        torch.optim.SGD(ddp.parameters(), lr=0.01)
    rng = np.random.default_rng(comm.rank)
    x = torch.tensor(rng.standard_normal((batch, sizes[0])), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, sizes[-1], batch))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


# -- plain mpiexec: needle's default thread placement vs torch DDP ------------------------------
DDP_MLP = (784, 1024, 1024, 10)  # the compared case: 128 samples per rank, Adam


def blas_report() -> str:
    """Each BLAS library threadpoolctl sees: its name, kernel (architecture) and threads."""
    from threadpoolctl import threadpool_info
    return "; ".join(f"{p['internal_api']} {p.get('architecture', '?')} "
                     f"{p['num_threads']} thread(s) ({os.path.basename(p['filepath'])})"
                     for p in threadpool_info() if p["user_api"] == "blas") or "none found"


def bench_default_threads(comm: Any, args: Any) -> List[str]:
    """needle DDP with the threads ``create()`` chose vs torch DDP at one thread per rank
    (what torchrun sets): MLP 784-1024-1024-10, 128 samples per rank, Adam."""
    dist = start_gloo(comm)
    if dist is None:
        return ["torch not installed: no comparison"]
    np.random.seed(comm.rank)
    layers: List[Any] = []
    for a, b in zip(DDP_MLP[:-1], DDP_MLP[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = DistributedDataParallel(nn.Sequential(*layers[:-1]), comm)
    rng = np.random.default_rng(comm.rank)
    x = ndl.Tensor(rng.standard_normal((128, DDP_MLP[0])), dtype="float32", requires_grad=False)
    y = ndl.Tensor(rng.integers(0, DDP_MLP[-1], 128), dtype="int64", requires_grad=False)
    cases = {"needle_ddp": train_step(net, ndl.optim.Adam(net.parameters(), lr=1e-3), x, y,
                                      lambda m, x, y: nn.SoftmaxLoss()(m(x), y)),
             "torch_ddp": torch_ddp_step(comm, dist, 128, DDP_MLP, adam=True)}
    t = timed(comm, cases, args.blocks, args.steps)
    r = t["needle_ddp"] / t["torch_ddp"]
    return [f"needle BLAS: {blas_report()}",
            f"needle DDP (default threads) vs torch DDP (gloo, 1 thread/rank), MLP "
            f"784-1024-1024-10, 128/rank, Adam: {1e3 * t['needle_ddp']:.1f} vs "
            f"{1e3 * t['torch_ddp']:.1f} ms/step = {r:.2f}x (target <= 1.0x) {verdict(r <= 1.0)}"]


# -- ZeRO and FSDP -----------------------------------------------------------------------------
def zero_model(seed: int) -> nn.Module:
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 512))


def build_zero(stage: int, model: nn.Module, comm: Any) -> Tuple[Any, Any]:
    if stage == 0:
        net = DistributedDataParallel(model, comm)
        return net, ndl.optim.Adam(net.parameters(), lr=1e-3)
    if stage == 3:
        net = FullyShardedDataParallel(model, comm)
        return net, ndl.optim.Adam(net.parameters(), lr=1e-3)
    net = DistributedDataParallel(model, comm) if stage == 1 else model
    return net, ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=stage,
                                        lr=1e-3)


def zero_memory(comm: Any, stage: int) -> Tuple[int, int, int]:
    """(live bytes after a step, bytes sent in that step, Psi) on this rank."""
    with MemoryTracker() as tracker:
        model = zero_model(comm.rank)
        psi = model.num_parameters()
        net, opt = build_zero(stage, model, comm)
        x = ndl.Tensor(np.random.default_rng(0).standard_normal((4, 512)), requires_grad=False)
        y = ndl.Tensor(np.arange(4), dtype="int64", requires_grad=False)
        comm.reset_stats()
        loss = nn.SoftmaxLoss()(net(x), y)
        opt.reset_grad()
        loss.backward(create_graph=False)
        opt.step()
        sent = sum(s["bytes_sent"] for s in comm.stats.values())
        del loss
        inputs = x.realize_cached_data().nbytes + y.realize_cached_data().nbytes
        live = tracker.current_bytes - inputs
    return live, sent, psi


def bench_zero(comm: Any, args: Any) -> List[str]:
    p, out = comm.size, []
    formula = {0: (16, "16 Psi"), 1: (8 + 8 / p, "8 Psi + 8 Psi/N"),
               2: (4 + 12 / p, "4 Psi + 12 Psi/N"), 3: (16 / p, "16 Psi/N")}
    measured = {}
    for stage in (0, 1, 2, 3):
        live, sent, psi = zero_memory(comm, stage)
        live = int(np.max(comm.allgather(np.array([live]))))
        measured[stage] = (live, sent, psi)
        k, text = formula[stage]
        est = estimate_module(zero_model(0), [ndl.Tensor(np.zeros((1, 512)), requires_grad=False)],
                              optimizer="adam", zero_stage=stage, dp=p).model_states
        err, err_est = live / (k * psi) - 1, live / est - 1
        out.append(f"ZeRO-{stage} model states/rank, N={p}, Psi={psi:,}: {live / 2**20:.2f} MiB "
                   f"vs {text} = {k * psi / 2**20:.2f} MiB ({100 * err:+.1f}%) "
                   f"{verdict(abs(err) <= 0.05)}; estimator {est / 2**20:.2f} MiB "
                   f"({100 * err_est:+.1f}%) {verdict(abs(err_est) <= 0.05)}")
    r = measured[3][1] / measured[0][1]
    out.append(f"bytes sent per rank per step, FSDP vs DDP: {measured[3][1]:,} / {measured[0][1]:,}"
               f" = {r:.3f}x (target 1.5x +-5%) {verdict(abs(r / 1.5 - 1) <= 0.05)}")
    cases = {}
    for stage in (0, 3):
        model = zero_model(comm.rank)
        net, opt = build_zero(stage, model, comm)
        x = ndl.Tensor(np.random.default_rng(comm.rank).standard_normal((32, 512)),
                       dtype="float32", requires_grad=False)
        y = ndl.Tensor(np.arange(32) % 512, dtype="int64", requires_grad=False)
        cases["fsdp" if stage else "ddp"] = train_step(
            net, opt, x, y, lambda n, x, y: nn.SoftmaxLoss()(n(x), y))
    t = timed(comm, cases, args.blocks, args.steps)
    r = t["fsdp"] / t["ddp"]
    out.append(f"FSDP vs DDP step time, N={p}: {1e3 * t['fsdp']:.1f} vs {1e3 * t['ddp']:.1f} ms "
               f"= {r:.2f}x (target <= 2x) {verdict(r <= 2)}")
    return out


# -- parameter server --------------------------------------------------------------------------
def bench_ps(comm: Any, args: Any) -> List[str]:
    """1 server + workers: the last worker ``--slow`` x slower every iteration (persistent), then
    every worker ``--slow`` x slower on a random third of its iterations (random)."""
    train, _ = ndl.data.digits_datasets(test_fraction=0.2, seed=0)
    slow_rank = comm.size - 1
    runs, out = {}, []
    for mode, prob in (("persistent", 1.0), ("random", 1 / 3)):
        for name, s in (("BSP", None), ("SSP(2)", 2), ("ASP", None)):
            np.random.seed(comm.rank)
            model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                  nn.Linear(512, 10))
            consistency = name[:3].lower()
            ps = ParameterServer(comm, model, ndl.optim.SGD, consistency=consistency,
                                 staleness=s, timeout=60.0, lr=0.05, momentum=0.9)
            comm.transport.comm.Barrier()
            start = time.perf_counter()
            if ps.is_server:
                log = ps.serve()
                hist: List[Tuple[float, float]] = []
            else:
                log = []
                hist = train_worker(ps, model, digits_loss, digits_batches(
                                        train, comm.rank - 1, ps.num_workers),
                                    args.ps_steps,
                                    args.slow if comm.rank == slow_rank or mode == "random"
                                    else 1.0,
                                    delay_probability=prob, seed=comm.rank)
            wall = time.perf_counter() - start
            every = comm.transport.comm.gather((hist, wall, log), root=0)
            if comm.rank == 0:
                runs[(mode, name)] = every
    if comm.rank != 0:
        return out
    for mode in ("persistent", "random"):
        tput = {}
        for name in ("BSP", "SSP(2)", "ASP"):
            every = runs[(mode, name)]
            tput[name] = throughput(every)
            reads = [e for e in every[0][2] if e.event == "read"]
            lead = max((e.clock - e.min_clock for e in reads), default=0)
            wall = max(w for _, w, _ in every)
            out.append(f"PS {mode} {args.slow:g}x slowdown, {name}: {tput[name]:,.0f} samples/s,"
                       f" last worker done after {wall:.2f} s, largest read lead {lead}")
        for name in ("SSP(2)", "ASP"):
            r = tput[name] / tput["BSP"]
            out.append(f"PS {mode} slowdown: {name} / BSP throughput = {r:.2f}x "
                       f"(target >= 1.5x) {verdict(r >= 1.5)}")
    if args.plot:
        plot_ps(runs, args)
        out.append(f"plot: {args.plot}")
    return out


def throughput(every: List[Tuple[list, float, list]]) -> float:
    """Samples per second of the job while it runs: each worker's samples over its own time,
    summed (a fast worker that finishes early stops adding, as in a fixed time window)."""
    return sum(len(h) * PS_BATCH / h[-1][0] for h, _, _ in every if h)


def digits_batches(train: Any, rank: int, world: int) -> Any:
    """Batches of PS_BATCH digits from this worker's share of every epoch."""
    sampler = ndl.data.DistributedSampler(train, world, rank, drop_last=True)
    loader = ndl.data.DataLoader(train, PS_BATCH, sampler=sampler, drop_last=True)
    for epoch in range(10 ** 6):
        sampler.set_epoch(epoch)
        for x, y in loader:
            yield x.reshape((x.shape[0], 64)), y


def digits_loss(model: Any, x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
    return nn.SoftmaxLoss()(model(x), y)


def plot_ps(runs: Dict[Tuple[str, str], Any], args: Any) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, mode in enumerate(("persistent", "random")):
        for name, color in (("BSP", "C0"), ("SSP(2)", "C1"), ("ASP", "C2")):
            for w, (hist, _, _) in enumerate(runs[(mode, name)][1:]):
                if hist:
                    t, loss = zip(*hist)
                    axes[i].plot(t, loss, color=color, alpha=0.8, lw=1,
                                 label=name if w == 0 else None)
        who = "one worker" if mode == "persistent" else "each worker on 1/3 of steps"
        axes[i].set(xlabel="wall clock (s)", ylabel="worker loss",
                    title=f"{args.slow:g}x slower: {who}")
        axes[i].legend()
    names = ["BSP", "SSP(2)", "ASP"]
    for k, mode in enumerate(("persistent", "random")):
        vals = [throughput(runs[(mode, name)]) for name in names]
        axes[2].bar(np.arange(3) + 0.4 * k, vals, width=0.4, label=mode)
    axes[2].set_xticks(np.arange(3) + 0.2, names)
    axes[2].set(ylabel="samples / s", title="throughput")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)


def main() -> None:
    ap = cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--zero", action="store_true", help="only ZeRO/FSDP memory, bytes, time")
    ap.add_argument("--ps", action="store_true", help="only the parameter server experiment")
    ap.add_argument("--blocks", type=cli.count_type(lo=1), default=7)
    ap.add_argument("--steps", type=cli.count_type(lo=1), default=5)
    ap.add_argument("--ps-steps", type=cli.count_type(lo=1), default=30)
    ap.add_argument("--slow", type=cli.real_type(lo=1), default=3.0)
    ap.add_argument("--plot", default="")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--default-threads", action="store_true",
                    help="only needle DDP vs torch DDP, with the BLAS threads create() "
                         "chooses (run under plain mpiexec, no thread variables set)")
    args = ap.parse_args()
    if args.default_threads:
        comm = create()
        lines = bench_default_threads(comm, args)
        if comm.rank == 0:
            print(f"bench_data_parallel --default-threads, {comm.size} ranks, load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            print("\n".join(lines), flush=True)
        return
    one_blas_thread()
    comm = create()
    lines = []
    if args.ps:
        lines += bench_ps(comm, args)
    else:
        if not args.zero:
            lines += bench_ddp(comm, args)
        lines += bench_zero(comm, args)
    if comm.rank == 0:
        print(f"bench_data_parallel, {comm.size} ranks, one BLAS thread each, "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
