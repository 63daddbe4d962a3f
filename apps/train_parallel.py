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
a PNG: the loss curve, and per-rank peak memory and bytes sent per step.
"""
import argparse
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import needle as ndl

if __package__:
    from . import data_parallel_strategies as dp
    from . import model_parallel_strategies as mp
else:
    import data_parallel_strategies as dp
    import model_parallel_strategies as mp

STRATEGIES: Dict[str, Callable[[Any, Any], Dict[str, Any]]] = {**dp.STRATEGIES,
                                                                **mp.STRATEGIES}


def parser() -> argparse.ArgumentParser:
    """Every strategy's options (shared names keep the data-parallel meaning)."""
    p = argparse.ArgumentParser(prog="python -m apps.train_parallel",
                                description=__doc__.splitlines()[0],
                                conflict_handler="resolve")
    p.add_argument("--strategy", choices=sorted(STRATEGIES), required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--plot", default="", help="write the figures to this PNG (rank 0)")
    p.add_argument("--json", default="", help="write the figures to this JSON file (rank 0)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="BLAS threads per rank (default: the node's cores shared among its "
                        "ranks, or OMP_NUM_THREADS when set; see needle/parallel/comm/threads.py)")
    mp.add_arguments(p)
    dp.add_arguments(p)
    return p


def local_rank(comm: Any) -> int:
    """This rank's index on its node (MPICH / Open MPI environment), else its global rank."""
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return comm.rank


def pick_device(kind: str, comm: Any) -> Any:
    """The CPU, or GPU ``local_rank % gpus`` (ranks share GPUs when there are fewer GPUs)."""
    if kind == "cpu":
        return ndl.cpu()
    gpus = 0
    while gpus < 16 and ndl.cuda(gpus).enabled():
        gpus += 1
    if gpus == 0:
        raise RuntimeError(f"--device cuda: no GPU is enabled on rank {comm.rank}")
    return ndl.cuda(local_rank(comm) % gpus)


def report(out: Dict[str, Any]) -> List[str]:
    """The figures as lines of text."""
    lines = []
    for k, v in out.items():
        if k in ("losses", "history"):
            continue
        if isinstance(v, float):
            v = f"{v:.6g}"
        elif isinstance(v, list) and v and isinstance(v[0], float):
            v = "[" + ", ".join(f"{x:.4g}" for x in v) + "]"
        lines.append(f"{k:>34}: {v}")
    return lines


def plot(out: Dict[str, Any], path: str) -> None:
    """Loss curve, per-rank peak memory and bytes sent per step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    losses = out.get("losses") or [loss for _, loss in out.get("history", [])]
    axes[0].plot(losses)
    axes[0].set(xlabel="step", ylabel="loss", title=f"{out.get('strategy')} on "
                f"{out.get('ranks')} ranks")
    for ax, key, label in ((axes[1], "peak_bytes", "peak MiB"),
                           (axes[2], "bytes_sent_per_step", "MiB sent / step")):
        vals = np.asarray(out.get(key, []), dtype=float) / 2 ** 20
        ax.bar(range(len(vals)), vals)
        ax.set(xlabel="rank", ylabel=label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run one strategy on this rank; rank 0 prints (and plots) the figures."""
    args = parser().parse_args(argv)
    from needle.parallel import communicator
    comm = communicator.create(blas_threads=args.blas_threads)
    args.device = pick_device(args.device, comm)
    out = STRATEGIES[args.strategy](comm, args)
    if comm.rank != 0:
        wait_quietly(comm)  # rank 0 may still time a single-process run: leave it the cores
        return out
    print(f"{args.strategy} on {comm.size} ranks ({args.device}):", flush=True)
    print("\n".join(report(out)), flush=True)
    if args.plot:
        plot(out, args.plot)
        print(f"{'plot':>34}: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v for k, v in out.items()}, f, default=float)
    for r in range(1, comm.size):
        comm.send(np.zeros(1), r, DONE_TAG)
    return out


DONE_TAG = 77


def wait_quietly(comm: Any) -> None:
    """Wait for rank 0's word, sleeping between polls instead of spinning on a core."""
    work = comm.irecv(0, DONE_TAG)
    while not work.test():
        time.sleep(0.01)


if __name__ == "__main__":
    main()
