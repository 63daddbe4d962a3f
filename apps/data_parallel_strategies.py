"""Data-parallel strategies for ``apps/train_parallel.py``: naive, ddp, zero1, zero2, fsdp, ps.

Each strategy is ``fn(comm, args) -> dict`` of figures (the interface of
``model_parallel_strategies.py``), listed in ``STRATEGIES``. Two tasks: ``digits`` (the course's
MLPResNet on scikit-learn's 8x8 digits, LayerNorm and no dropout, so that every rank computes
exactly what one process would) and ``charlm`` (the character transformer of ``make demo``).
Every rank trains on its own slice of each global batch (``DistributedSampler`` for digits),
starts from a differently seeded model (the strategy's broadcast makes them equal), and
measures its step time, peak memory (``MemoryTracker``) and bytes sent.
"""
import argparse
import itertools
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np

import needle as ndl
from needle import nn
from needle.memory import MemoryTracker
from needle.parallel import (
    Comm,
    DataParallelNaive,
    DistributedDataParallel,
    FullyShardedDataParallel,
    ParameterServer,
    ZeroRedundancyOptimizer,
)
from needle.parallel.param_server import train_worker

if __package__:
    from .mlp_resnet import MLPResNet
    from .models import LanguageModel
    from .progress import Progress
else:
    from mlp_resnet import MLPResNet
    from models import LanguageModel
    from progress import Progress

__all__ = ["STRATEGIES", "TASKS", "add_arguments"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the data-parallel strategies."""
    p.add_argument("--task", choices=["digits", "charlm"], default="digits")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32, help="examples (sequences) per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--mixed-precision", choices=["bf16", "fp16"], default=None)
    p.add_argument("--consistency", choices=["bsp", "ssp", "asp"], default="bsp")
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--straggler", default="", help="RANK:FACTOR, e.g. 3:3 slows rank 3 3x")
    p.add_argument("--ps-lr", type=float, default=0.1, help="the parameter server's SGD rate")
    p.add_argument("--check", action="store_true",
                   help="rank 0 also trains one process on the whole batch and compares")


# -- tasks ------------------------------------------------------------------------------------
class Digits:
    """MLPResNet on the built-in digits; each rank's batches from a DistributedSampler."""

    def __init__(self, args: argparse.Namespace, device: Any) -> None:
        self.args, self.device = args, device
        self.train, self.test = ndl.data.digits_datasets(test_fraction=0.2, seed=0)

    def model(self, seed: int) -> nn.Module:
        np.random.seed(seed)
        m = MLPResNet(64, hidden_dim=128, num_blocks=2, num_classes=10, norm=nn.LayerNorm1d,
                      drop_prob=0.0)
        return m.to(self.device, self.args.dtype)

    def batches(self, rank: int, world: int) -> Iterator[Tuple[ndl.Tensor, ndl.Tensor]]:
        """This rank's batches, epoch after epoch (the same epoch shuffle on every rank)."""
        each = len(self.train) // world
        if self.args.batch > each:  # drop_last: every epoch would be empty, forever
            raise ValueError(f"--batch {self.args.batch} is more than the {each} training "
                             f"examples each of the {world} ranks gets ({len(self.train)} in "
                             "all): use a smaller --batch")
        return self._batches(rank, world)

    def _batches(self, rank: int, world: int) -> Iterator[Tuple[ndl.Tensor, ndl.Tensor]]:
        sampler = ndl.data.DistributedSampler(self.train, world, rank, seed=self.args.seed,
                                              drop_last=True)
        loader = ndl.data.DataLoader(self.train, self.args.batch, sampler=sampler,
                                     drop_last=True, device=self.device, dtype=self.args.dtype)
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            for x, y in loader:
                yield x.reshape((x.shape[0], 64)), y

    def loss(self, model: Any, x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
        return nn.SoftmaxLoss()(model(x), y)

    def evaluate(self, model: nn.Module) -> Dict[str, float]:
        model.eval()
        X, y = self.test[np.arange(len(self.test))]
        with ndl.no_grad():
            logits = model(ndl.Tensor(X.reshape(len(X), 64), device=self.device,
                                      dtype=self.args.dtype, requires_grad=False))
        return {"test_accuracy": float((logits.numpy().argmax(1) == y).mean())}


class CharLM:
    """The character transformer; each global batch of random windows split by columns."""

    seq_len = 32

    def __init__(self, args: argparse.Namespace, device: Any) -> None:
        self.args, self.device = args, device
        corpus = ndl.data.CharCorpus(n_chars=200_000, test_fraction=0.05)
        self.data = np.array(corpus.train, dtype=np.int64)
        self.vocab = len(corpus.dictionary)

    def model(self, seed: int) -> nn.Module:
        np.random.seed(seed)
        return LanguageModel(64, self.vocab, 128, num_layers=2, seq_model="transformer",
                             seq_len=self.seq_len, num_head=4, dim_head=16,
                             device=self.device, dtype=self.args.dtype)

    def batches(self, rank: int, world: int) -> Iterator[Tuple[ndl.Tensor, ndl.Tensor]]:
        b, T = self.args.batch, self.seq_len
        for step in itertools.count():
            rng = np.random.default_rng(1000 * self.args.seed + step)  # same on every rank
            starts = rng.integers(0, len(self.data) - T - 1, size=b * world)[rank * b:][:b]
            x = np.stack([self.data[s:s + T] for s in starts], axis=1)          # (T, b)
            y = np.stack([self.data[s + 1:s + T + 1] for s in starts], axis=1)  # (T, b)
            yield (ndl.Tensor(x, device=self.device, dtype=self.args.dtype, requires_grad=False),
                   ndl.Tensor(y.reshape(-1), device=self.device, dtype="int64",
                              requires_grad=False))

    def loss(self, model: Any, x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
        return nn.SoftmaxLoss()(model(x)[0], y)

    def evaluate(self, model: nn.Module) -> Dict[str, float]:
        return {}


TASKS: Dict[str, Any] = {"digits": Digits, "charlm": CharLM}  # name -> task class


# -- wrappers: (model, comm, args) -> (what forward runs on, optimizer) --------------------------
def _adam(params: List[Any], args: argparse.Namespace) -> Any:
    return ndl.optim.Adam(params, lr=args.lr)


def _naive(model: nn.Module, comm: Comm, args: argparse.Namespace) -> Tuple[Any, Any]:
    net = DataParallelNaive(model, comm)
    return net, _adam(net.parameters(), args)


def _ddp(model: nn.Module, comm: Comm, args: argparse.Namespace) -> Tuple[Any, Any]:
    net = DistributedDataParallel(model, comm, bucket_cap_mb=args.bucket_mb)
    return net, _adam(net.parameters(), args)


def _zero1(model: nn.Module, comm: Comm, args: argparse.Namespace) -> Tuple[Any, Any]:
    net = DistributedDataParallel(model, comm, bucket_cap_mb=args.bucket_mb)
    return net, ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=1,
                                        bucket_cap_mb=args.bucket_mb, lr=args.lr)


def _zero2(model: nn.Module, comm: Comm, args: argparse.Namespace) -> Tuple[Any, Any]:
    return model, ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=2,
                                          bucket_cap_mb=args.bucket_mb, lr=args.lr)


def _fsdp(model: nn.Module, comm: Comm, args: argparse.Namespace) -> Tuple[Any, Any]:
    net = FullyShardedDataParallel(model, comm, mixed_precision=args.mixed_precision)
    return net, _adam(net.parameters(), args)


# name -> (model, comm, args) -> (what forward runs on, its optimizer)
WRAPPERS: Dict[str, Callable[[nn.Module, Comm, argparse.Namespace], Tuple[Any, Any]]] = {
    "naive": _naive, "ddp": _ddp, "zero1": _zero1, "zero2": _zero2, "fsdp": _fsdp}


def _plain_state(net: Any, model: nn.Module) -> Dict[str, np.ndarray]:
    return net.full_state_dict() if isinstance(net, FullyShardedDataParallel) \
        else model.state_dict()


def run_data_parallel(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Train with ``args.strategy``; figures for this rank (rank 0 adds the checks)."""
    task = TASKS[args.task](args, args.device)
    tracker = MemoryTracker(args.device)
    with tracker:
        model = task.model(args.seed + comm.rank)  # differs per rank: the broadcast fixes it
        net, opt = WRAPPERS[args.strategy](model, comm, args)
        batches = task.batches(comm.rank, comm.size)
        comm.reset_stats()
        losses: List[float] = []
        times: List[float] = []
        bar = Progress(range(args.steps), total=args.steps, desc=f"{args.strategy} x{comm.size}",
                       disable=True if comm.rank != 0 or args.no_progress else None)
        for _ in bar:
            x, y = next(batches)
            loss = _timed_step(task, net, opt, x, y, times)
            losses.append(float(loss.numpy()))
            bar.update(losses[-1], x.shape[0] if args.task == "digits" else x.shape[1])
        bar.close()
        sent = sum(s["bytes_sent"] for s in comm.stats.values())
    state = _plain_state(net, model)
    out = _figures(comm, args, losses, times, tracker.peak_bytes, sent / args.steps)
    if comm.rank == 0:
        plain = task.model(0)
        plain.load_state_dict(state)
        out.update(task.evaluate(plain))
        if args.check:
            out.update(_check_single_process(task, args, state, comm.size))
    return out


def _timed_step(task: Any, model: Any, opt: Any, x: Any, y: Any, times: List[float]) -> Any:
    """One training step (loss, backward, optimizer step); its seconds go to ``times``."""
    t0 = time.perf_counter()
    loss = task.loss(model, x, y)
    opt.reset_grad()
    loss.backward(create_graph=False)
    opt.step()
    times.append(time.perf_counter() - t0)
    return loss


def _figures(comm: Comm, args: argparse.Namespace, losses: List[float], times: List[float],
             peak: int, sent_per_step: float) -> Dict[str, Any]:
    """Losses averaged over ranks; per-rank memory, bytes and step time gathered to all."""
    mean_losses = comm.allreduce(np.array(losses), op="avg")
    per_rank = comm.allgather(np.array([[peak, sent_per_step, np.median(times[1:] or times)]]))
    per_step = float(np.max(per_rank[:, 2]))  # the step ends when the slowest rank is done
    return {"strategy": args.strategy, "ranks": comm.size, "losses": mean_losses.tolist(),
            "first_loss": float(mean_losses[0]), "last_loss": float(mean_losses[-1]),
            "step_ms": 1000 * per_step, "samples_per_s": args.batch * comm.size / per_step,
            "peak_bytes": per_rank[:, 0].astype(int).tolist(),
            "bytes_sent_per_step": per_rank[:, 1].astype(int).tolist(),
            "step_ms_per_rank": (1000 * per_rank[:, 2]).tolist()}


def _check_single_process(task: Any, args: argparse.Namespace, state: Dict[str, np.ndarray],
                          world: int) -> Dict[str, Any]:
    """One process, rank 0's start, the whole global batch: same parameters? how much slower?"""
    model = task.model(args.seed)  # rank 0's seed: what every rank started from
    opt = _adam(model.parameters(), args)
    streams = [task.batches(r, world) for r in range(world)]
    axis = 0 if args.task == "digits" else 1  # examples are rows (digits), columns (charlm)
    times: List[float] = []
    for _ in range(args.steps):
        parts = [next(s) for s in streams]
        x = np.concatenate([p[0].numpy() for p in parts], axis=axis)
        ys = [p[1].numpy().reshape(-1, p[0].shape[1]) if axis else p[1].numpy() for p in parts]
        x = ndl.Tensor(x, device=args.device, dtype=args.dtype, requires_grad=False)
        y = ndl.Tensor(np.concatenate(ys, axis=axis).reshape(-1), device=args.device,
                       dtype="int64", requires_grad=False)
        _timed_step(task, model, opt, x, y, times)
    diff = max(float(np.abs(model.state_dict()[k] - v).max()) for k, v in state.items())
    return {"max_param_diff_vs_single_process": diff,
            "single_process_step_ms": 1000 * float(np.median(times[1:] or times))}


def run_ps(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Rank 0 serves, the others train (``--consistency``, ``--straggler RANK:FACTOR``)."""
    task = TASKS[args.task](args, args.device)
    model = task.model(args.seed + comm.rank)
    ps = ParameterServer(comm, model, ndl.optim.SGD, consistency=args.consistency,
                         staleness=args.staleness if args.consistency == "ssp" else None,
                         timeout=60.0, lr=args.ps_lr, momentum=0.9)
    slow = {float(r): float(f) for r, f in (s.split(":") for s in args.straggler.split(",") if s)}
    comm.reset_stats()
    start = time.perf_counter()
    if ps.is_server:
        log = ps.serve()
        history: List[Tuple[float, float]] = []
    else:
        batches = task.batches(comm.rank - 1, ps.num_workers)
        history = train_worker(ps, model, task.loss, batches, args.steps,
                               delay_factor=slow.get(float(comm.rank), 1.0))
        log = []
    seconds = time.perf_counter() - start
    sent = sum(s["bytes_sent"] for s in comm.stats.values())
    everyone = comm.allgather(np.array([[seconds, len(history), sent]], dtype=np.float64))
    reads = [e for e in log if e.event == "read"]
    histories = _gather_histories(comm, history, everyone)
    return {"strategy": f"ps-{args.consistency}", "ranks": comm.size,
            "history": history, "worker_histories": histories,
            "first_loss": float(np.mean([h[0][1] for h in histories.values()])),
            "last_loss": float(np.mean([h[-1][1] for h in histories.values()])),
            "seconds": float(everyone[:, 0].max()),
            "samples_per_s": float(everyone[1:, 1].sum() * args.batch / everyone[:, 0].max()),
            "bytes_sent": everyone[:, 2].astype(int).tolist(),
            "max_staleness_read": max((e.clock - e.min_clock for e in reads), default=0)}


def _gather_histories(comm: Comm, history: List[Tuple[float, float]],
                      everyone: np.ndarray) -> Dict[int, List[Tuple[float, float]]]:
    """Every worker's (seconds, loss) history, on every rank (padded to the longest)."""
    longest = int(everyone[:, 1].max())
    mine = np.full((1, max(longest, 1), 2), np.nan)
    if history:
        mine[0, :len(history)] = history
    allh = comm.allgather(mine)
    return {r: [(float(t), float(v)) for t, v in allh[r, :int(everyone[r, 1])]]
            for r in range(comm.size) if everyone[r, 1] > 0}


STRATEGIES: Dict[str, Callable[[Comm, argparse.Namespace], Dict[str, Any]]] = {
    name: run_data_parallel for name in WRAPPERS}
STRATEGIES["ps"] = run_ps


if __name__ == "__main__":  # a library of strategies: `python -m` of it once ran nothing, exit 0
    raise SystemExit("apps.data_parallel_strategies holds the strategies and runs nothing: "
                     "python -m apps.train_parallel --strategy {naive,ddp,zero1,zero2,fsdp,ps}")
