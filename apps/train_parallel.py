"""Train on several ranks with any strategy and report loss, memory, bytes sent and step time.

    mpiexec -n 4 python -m apps.train_parallel --strategy ddp            # or naive, zero1,
    python -m needle.parallel.launch -n 4 -m apps.train_parallel --strategy fsdp   # zero2, ps
    python -m needle.parallel.launch -n 4 -m apps.train_parallel --strategy ps \\
        --consistency ssp --staleness 2 --straggler 3:3
    python -m needle.parallel.launch -n 2 -m apps.train_parallel --strategy ddp --check
    ... --task charlm            # the character transformer instead of the digits MLPResNet
    ... --device cuda            # rank r on ndl.cuda(local_rank % gpus)

``STRATEGIES`` maps a name to ``fn(comm, args) -> dict of figures``; the data-parallel ones come
from ``data_parallel_strategies.py``, the model-parallel ones (tp, pp, 3d, moe) from
``model_parallel_strategies.py``. Rank 0 prints one line per figure and, with ``--plot``, writes
a PNG of what the strategy measured: the loss curve (per worker for ``ps``), and per-rank peak
memory and bytes sent where measured.

Each option is registered once; the two families' own defaults (``--steps`` is 60 for the
data-parallel strategies, 20 for the model-parallel ones) are filled in after parsing, and an
option given to a strategy that does not use it (``OPTION_USERS``) is refused, as is input that
cannot work (zero steps, a batch larger than the data).
"""
import argparse
import contextlib
import json
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import numpy as np

from needle import numbers
from needle.cli import Parser, check_output_dir, check_output_path, fail
from needle.parallel import Comm

if __package__:
    from . import data_parallel_strategies as dp
    from . import model_parallel_strategies as mp
else:
    import data_parallel_strategies as dp
    import model_parallel_strategies as mp

STRATEGIES: Dict[str, Callable[[Comm, argparse.Namespace], Dict[str, Any]]] = {**dp.STRATEGIES,
                                                                 **mp.STRATEGIES}


DP, MP = sorted(dp.STRATEGIES), sorted(mp.STRATEGIES)
# option (dest) -> the strategies that use it; options not listed work for every strategy
OPTION_USERS: Dict[str, List[str]] = {
    "task": DP, "dtype": DP, "seed": DP, "check": [s for s in DP if s != "ps"],
    "bucket_mb": ["ddp", "zero1", "zero2"], "mixed_precision": ["fsdp"],
    "consistency": ["ps"], "staleness": ["ps"], "straggler": ["ps"], "ps_lr": ["ps"],
    "seq_len": MP, "d_model": MP, "heads": MP, "layers": MP, "chars": MP,
    "schedule": ["pp", "3d"], "microbatches": ["pp", "3d"], "chunks": ["pp", "3d"],
    "timeline": ["pp", "3d"], "dp": ["3d"], "pp": ["3d"], "tp": ["3d"],
    "experts": ["moe"], "top_k": ["moe"],
    "sequence_parallel": [],  # the app's transformer does not scatter the sequence: refused
}


class _Family:
    """Takes a strategies module's ``add_argument`` calls: the real parser gets each option
    once with default None (so that what the user gave is known); defaults are kept here."""

    def __init__(self, parser: argparse.ArgumentParser, defaults: Dict[str, Any]) -> None:
        self.parser, self.defaults = parser, defaults

    def add_argument(self, *flags: str, **kw: Any) -> None:
        dest = kw.get("dest") or flags[0].lstrip("-").replace("-", "_")
        store_true = kw.get("action") == "store_true"
        self.defaults[dest] = kw.get("default", False if store_true else None)
        if dest not in {a.dest for a in self.parser._actions}:
            self.parser.add_argument(*flags, **dict(kw, default=None))


DEFAULTS: Dict[str, Dict[str, Any]] = {"dp": {}, "mp": {}}


def parser(strategies: Optional[List[str]] = None,
           prog: str = "python -m apps.train_parallel") -> argparse.ArgumentParser:
    """Every strategy's options, each once (``finish_args`` fills in the family's defaults);
    ``--strategy`` one of ``strategies`` (all of them by default)."""
    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--strategy", choices=strategies or sorted(STRATEGIES), required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--plot", default="", help="write the figures to this PNG (rank 0)")
    p.add_argument("--json", default="", help="write the figures to this JSON file (rank 0)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--profile", default="", metavar="DIR",
                   help="write a Chrome trace of the run (every rank) and summaries to DIR")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="BLAS threads per rank (default: the node's cores shared among its "
                        "ranks, or OMP_NUM_THREADS when set; see needle/parallel/threads.py)")
    # a _Family takes the add_argument calls a parser would
    mp.add_arguments(cast(argparse.ArgumentParser, _Family(p, DEFAULTS["mp"])))
    dp.add_arguments(cast(argparse.ArgumentParser, _Family(p, DEFAULTS["dp"])))
    return p


def finish_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse options the strategy does not use and input that cannot work; fill defaults."""
    _refuse_unused(p, args)
    for dest, value in DEFAULTS["dp" if args.strategy in DP else "mp"].items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
    _refuse_input(p, args)
    return args


def _refuse_unused(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options given to a strategy that does not use them: an error naming both."""
    s = args.strategy
    for dest, users in OPTION_USERS.items():
        if getattr(args, dest, None) is not None and s not in users:
            flag = "--" + dest.replace("_", "-")
            where = f"it is for {', '.join(users)}" if users else "no strategy supports it yet"
            p.error(f"{flag} does not apply to --strategy {s} ({where})")
    if args.chunks is not None and (args.schedule or "1f1b") != "interleaved":
        p.error(f"--chunks applies to --schedule interleaved, not {args.schedule or '1f1b'}")
    if s == "ps" and args.staleness is not None and args.consistency != "ssp":
        p.error(f"--staleness applies to --consistency ssp, not {args.consistency or 'bsp'}")


def _refuse_input(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Input that cannot work (no steps, an empty batch, microbatches that do not divide)."""
    s = args.strategy
    for dest in ("steps", "batch"):
        if getattr(args, dest) < 1:
            p.error(f"--{dest} must be at least 1, not {getattr(args, dest)}")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, not {args.lr}")
    _refuse_counts(p, args)
    if s in ("pp", "3d"):  # each data-parallel replica cuts its rows into microbatches
        rows = args.batch // (args.dp if s == "3d" else 1)
        if args.microbatches < 1 or rows % args.microbatches:
            p.error(f"--microbatches {args.microbatches} does not divide the {rows} rows of "
                    f"--batch {args.batch}" + (f" / --dp {args.dp}" if s == "3d" else ""))
    _refuse_model(p, args)
    _refuse_ps(p, args)
    for flag in ("plot", "json", "timeline"):  # before training, not after it
        problem = check_output_path(getattr(args, flag, None) or "", "--" + flag)
        if problem:
            p.error(problem)
    problem = check_output_dir(args.profile, "--profile")  # not after MPI started
    if problem:
        p.error(problem)


def _refuse_counts(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Counts below 1 and rates or sizes that are not positive."""
    for dest in _POSITIVE:
        if getattr(args, dest, None) is not None and getattr(args, dest) < 1:
            p.error(f"--{dest.replace('_', '-')} must be at least 1, not {getattr(args, dest)}")
    for dest in ("bucket_mb", "ps_lr"):
        if getattr(args, dest) is not None and not getattr(args, dest) > 0:
            p.error(f"--{dest.replace('_', '-')} must be > 0, not {getattr(args, dest)}")
    if args.seed is not None and not 0 <= args.seed < 2 ** 32:  # NumPy's seeds
        p.error(f"--seed must be from 0 to {2 ** 32 - 1}, not {args.seed}")


# options that count something: at least 1 when given (checked after the defaults are in)
_POSITIVE = ("blas_threads", "seq_len", "d_model", "heads", "layers", "chars", "chunks",
             "dp", "pp", "tp", "experts", "top_k")


def _refuse_model(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The model-parallel transformer's shape: heads that split d_model, enough text."""
    s = args.strategy
    if s not in MP:
        return
    if args.d_model % args.heads:
        p.error(f"--heads {args.heads} does not divide --d-model {args.d_model}")
    if s == "moe" and not 1 <= args.top_k <= min(2, args.experts):
        p.error(f"--top-k must be 1 or 2 and at most --experts {args.experts}, not {args.top_k}")
    train_chars = int(args.chars * 0.9)  # CharCorpus keeps 10% for testing
    if train_chars < args.seq_len + 2:
        p.error(f"--chars {args.chars} leaves {train_chars} training characters, fewer than "
                f"one window of --seq-len {args.seq_len} + 2")


def _refuse_ps(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The parameter server's staleness bound and --straggler RANK:FACTOR."""
    if args.strategy != "ps":
        return
    if args.staleness is not None and args.staleness < 0:
        p.error(f"--staleness must be >= 0, not {args.staleness}")
    if args.straggler:  # a factor of inf slept for ever; a rank of '٣' read as 3
        rank, _, factor = args.straggler.partition(":")
        try:
            ok = numbers.count(rank, "rank") >= 0 and numbers.real(factor, "factor", lo=1) >= 1
        except numbers.NumberError:
            ok = False
        if not ok:
            p.error(f"--straggler must be RANK:FACTOR (a rank >= 0, a slowdown >= 1), not "
                    f"{args.straggler!r}")


def world_problem(args: argparse.Namespace, size: int) -> Optional[str]:
    """Why the job's ``size`` ranks cannot run these options (None when they can)."""
    s = args.strategy
    if s == "3d" and args.dp * args.pp * args.tp != size:
        return (f"--dp {args.dp} x --pp {args.pp} x --tp {args.tp} = "
                f"{args.dp * args.pp * args.tp} ranks, but the job has {size}")
    tp = {"tp": size, "3d": args.tp}.get(s, 1)
    if args.strategy in MP and (args.heads % tp or args.d_model % tp):
        return (f"the tensor-parallel size {tp} does not divide --heads {args.heads} and "
                f"--d-model {args.d_model}")
    stages = {"pp": size, "3d": args.pp}.get(s, 1) * (
        args.chunks if s in ("pp", "3d") and args.schedule == "interleaved" else 1)
    if s in ("pp", "3d") and args.layers + 2 < stages:  # embedding, blocks, head
        return f"--layers {args.layers} (+ embedding and head) cannot fill {stages} stages"
    if s == "moe" and args.experts % size:
        return f"--experts {args.experts} do not split evenly over {size} ranks"
    if s == "ps" and size < 2:
        return "--strategy ps needs at least 2 ranks (a server and a worker)"
    if s in DP and args.task == "digits":  # the task's own check, before any model is built
        try:  # ps: one rank serves, the others share the data
            dp.TASKS["digits"](args, None).batches(0, size - (s == "ps"))
        except ValueError as err:
            return str(err)
    if s == "ps" and args.straggler and int(args.straggler.partition(":")[0]) >= size:
        return f"--straggler {args.straggler} names a rank the job of {size} ranks lacks"
    return None


def pick_device(kind: str, comm: Comm) -> Any:
    """The CPU, or GPU ``local_rank % gpus`` (ranks share GPUs when there are fewer GPUs);
    the local rank from the launcher's environment or MPI's shared-memory split."""
    from needle.parallel import devices
    mpi_comm = None
    if kind == "cuda" and devices.local_rank_from_env() is None:
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD
    return devices.device_for(kind, devices.local_rank(mpi_comm), comm.rank)


def report(out: Dict[str, Any]) -> List[str]:
    """The figures as lines of text."""
    lines = []
    for k, v in out.items():
        if k in ("losses", "history", "worker_histories"):
            continue
        if isinstance(v, float):
            v = f"{v:.6g}"
        elif isinstance(v, list) and v and isinstance(v[0], float):
            v = "[" + ", ".join(f"{x:.4g}" for x in v) + "]"
        lines.append(f"{k:>34}: {v}")
    return lines


def plot(out: Dict[str, Any], path: str) -> bool:
    """Draw what the strategy measured (loss; peak memory and bytes sent per rank where
    measured) to ``path``; False (and no file) if it measured none of them."""
    panels = [k for k in ("peak_bytes", "bytes_sent_per_step", "bytes_sent") if out.get(k)]
    curves = _loss_curves(out)
    if not curves and not panels:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = int(bool(curves)) + len(panels)
    fig, grid = plt.subplots(1, n, figsize=(4.3 * n, 3.6), squeeze=False)
    axes = list(grid[0])
    title = f"{out.get('strategy')} on {out.get('ranks')} ranks"
    if curves:
        ax = axes.pop(0)
        for label, (xs, ys, _) in curves.items():
            ax.plot(xs, ys, label=label)
        xlabel = next(iter(curves.values()))[2]  # one x axis: every curve is in steps or seconds
        ax.set(xlabel=xlabel, ylabel="loss", title=title)
        if len(curves) > 1:
            ax.legend(fontsize=7)
    labels = {"peak_bytes": "peak MiB", "bytes_sent_per_step": "MiB sent / step",
              "bytes_sent": "MiB sent"}
    for ax, key in zip(axes, panels):
        vals = np.asarray(out[key], dtype=float) / 2 ** 20
        ax.bar(range(len(vals)), vals)
        ax.set(xlabel="rank", ylabel=labels[key], title=title if not curves else "")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _loss_curves(out: Dict[str, Any]) -> Dict[str, Tuple[list, list, str]]:
    """label -> (x, loss, x label): the mean loss per step, or each ps worker's over time."""
    if out.get("losses"):
        return {"loss": (list(range(len(out["losses"]))), out["losses"], "step")}
    return {f"worker rank {r}": ([t for t, _ in h], [v for _, v in h], "seconds")
            for r, h in sorted(out.get("worker_histories", {}).items()) if h}


def main(argv: Optional[List[str]] = None, strategies: Optional[List[str]] = None,
         prog: str = "python -m apps.train_parallel") -> Dict[str, Any]:
    """Run one strategy (of ``strategies``) on this rank; rank 0 prints (and plots) the figures."""
    p = parser(strategies, prog)
    args = finish_args(p, p.parse_args(argv))
    from needle.parallel import communicator
    comm = communicator.create(blas_threads=args.blas_threads)
    problem = world_problem(args, comm.size)
    if problem:  # every rank finds it; rank 0 says it
        fail(p.prog, problem)
    args.device = pick_device(args.device, comm)
    from needle import profiler
    with profiler.profile_to(args.profile, comm) if args.profile else contextlib.nullcontext():
        out = STRATEGIES[args.strategy](comm, args)
    out.setdefault("strategy", args.strategy)
    out.setdefault("ranks", comm.size)
    if comm.rank != 0:
        wait_quietly(comm)  # rank 0 may still time a single-process run: leave it the cores
        return out
    print(f"{args.strategy} on {comm.size} ranks ({args.device}):", flush=True)
    print("\n".join(report(out)), flush=True)
    if args.plot:
        drawn = plot(out, args.plot)
        print(f"{'plot':>34}: {args.plot if drawn else 'nothing measured to draw, none written'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v for k, v in out.items()}, f, default=float)
    for r in range(1, comm.size):
        comm.send(np.zeros(1), r, DONE_TAG)
    return out


DONE_TAG = 77


def wait_quietly(comm: Comm) -> None:
    """Wait for rank 0's word, sleeping between polls instead of spinning on a core.  A long
    poll (rank 0 may time a single-process run for longer than the timeout); a rank 0 that
    fails aborts the job, so this cannot wait forever."""
    work = comm.irecv(0, DONE_TAG)
    while not work.poll():
        time.sleep(0.01)


if __name__ == "__main__":
    main()
