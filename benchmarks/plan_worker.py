"""One strategy under mpiexec for ``bench_plan.py``: per-rank peak memory, ledger bytes per step,
median step time, and this rank's GEMM FLOP/s measured while every rank measures at once.

    mpiexec -n 2 python benchmarks/plan_worker.py ddp out.json [--steps 6] [--warmup 2]

A rank's step time is the median of ``steps`` timed steps after ``warmup`` untimed ones (the
first steps allocate the optimizer state and the buffers); the job's is the slowest rank's.
"""
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # apps/ beside needle/

import needle as ndl  # noqa: E402
from apps import data_parallel_strategies as dps  # noqa: E402
from apps import model_parallel_strategies as mps  # noqa: E402
from needle import cli, nn  # noqa: E402
from needle.memory import MemoryTracker  # noqa: E402
from needle.parallel import communicator  # noqa: E402
from needle.parallel.mesh import ProcessMesh  # noqa: E402
from needle.plan.cluster import measure_gemm_flops  # noqa: E402

DATA_PARALLEL = {"single": "ddp", "ddp": "ddp", "zero1": "zero1", "zero2": "zero2",
                 "zero3": "fsdp"}
LM = dict(batch=16, seq_len=32, d_model=64, heads=4, layers=4, lr=3e-3, chars=50_000,
          schedule="1f1b", microbatches=4, chunks=1, sequence_parallel=False)
MESH = {"tp": (1, 1, 0), "pp": (1, 0, 1), "3d": (2, 2, 1)}  # dp, pp (0 = all), tp (0 = all)


def _dp_args(strategy: str) -> Any:
    return SimpleNamespace(strategy=DATA_PARALLEL[strategy], task="digits", batch=32, seed=0,
                           lr=3e-3, dtype="float32", bucket_mb=25.0, mixed_precision=None,
                           device=ndl.cpu(), no_progress=True)


def data_parallel(comm: Any, strategy: str, steps: int, warmup: int) -> Dict[str, Any]:
    """DDP / ZeRO-1/2 / FSDP on the course's MLPResNet (apps' digits task)."""
    args = _dp_args(strategy)
    task = dps.TASKS["digits"](args, args.device)
    tracker = MemoryTracker(args.device)
    times: List[float] = []
    with tracker:
        model = task.model(args.seed + comm.rank)
        net, opt = dps.WRAPPERS[args.strategy](model, comm, args)
        batches = task.batches(comm.rank, comm.size)
        for i in range(warmup + steps):
            if i == warmup:
                comm.ledger.reset()
            x, y = next(batches)
            dps._timed_step(task, net, opt, x, y, times)
    return {"peak": tracker.peak_bytes, "bytes": comm.ledger.total() / steps,
            "step_s": float(np.median(times[warmup:]))}


def _lm_step(comm: Any, strategy: str) -> Any:
    """(step(i) -> loss, parameters, communicators) for tp / pp / 3d on the char transformer."""
    dp, pp, tp = MESH[strategy]
    pp, tp = pp or comm.size // (dp * max(tp, 1)), tp or comm.size // (dp * max(pp, 1))
    args = SimpleNamespace(**LM, dp=dp, pp=pp, tp=tp)
    mesh = ProcessMesh(comm, dp=dp, pp=pp, tp=tp)
    if pp == 1:
        get, vocab = mps.batches(args, tp)
        np.random.seed(0)
        model = nn.Sequential(*mps.char_transformer(args, vocab, mesh.tp))
        loss_fn = mps._loss_fn(mesh.tp)

        def step(i: int) -> float:
            x, y = get(i)
            loss = loss_fn(model(ndl.Tensor(x, dtype="int64")), ndl.Tensor(y, dtype="int64"))
            loss.backward(create_graph=False)
            return float(loss.numpy())
        return step, model.parameters(), mesh
    pipe, step = mps._pipeline(comm, args, mesh)
    return step, pipe.parameters(), mesh


def model_parallel(comm: Any, strategy: str, steps: int, warmup: int) -> Dict[str, Any]:
    """TP / PP / 3D (dp 2 x pp 2) on the character transformer of apps/."""
    tracker = MemoryTracker(ndl.cpu())
    times: List[float] = []
    with tracker:
        step, params, mesh = _lm_step(comm, strategy)
        opt = ndl.optim.Adam(params, lr=LM["lr"])
        comms = [comm, mesh.tp, mesh.pp, mesh.dp]
        for i in range(warmup + steps):
            for c in comms if i == warmup else ():
                c.ledger.reset()
            t0 = time.perf_counter()
            opt.reset_grad()
            step(i)
            if mesh.dp.size > 1:
                for q in params:
                    if q.grad is not None:
                        q.grad = ndl.Tensor(mesh.dp.allreduce(q.grad.numpy(), op="avg"),
                                            dtype=q.dtype, requires_grad=False)
            opt.step()
            times.append(time.perf_counter() - t0)
    sent = sum(c.ledger.total() for c in comms)
    return {"peak": tracker.peak_bytes, "bytes": sent / steps,
            "step_s": float(np.median(times[warmup:]))}


RUNNERS: Dict[str, Callable[[Any, str, int, int], Dict[str, Any]]] = {
    **{k: data_parallel for k in DATA_PARALLEL}, **{k: model_parallel for k in MESH}}


def main() -> None:
    """Run one strategy, gather every rank's figures, rank 0 writes them as JSON."""
    ap = cli.Parser()
    ap.add_argument("strategy", choices=sorted(RUNNERS))
    ap.add_argument("out")
    ap.add_argument("--steps", type=cli.count_type(lo=1), default=6, help="timed steps")
    ap.add_argument("--warmup", type=cli.count_type(lo=0), default=2,
                    help="untimed steps before them")
    ap.add_argument("--lm-batch", type=cli.count_type(lo=1), default=LM["batch"],
                    help="sequences per step of tp / pp / 3d")
    a = ap.parse_args()
    LM["batch"] = a.lm_batch
    comm = communicator.create()
    comm.barrier()
    flops = measure_gemm_flops(seconds=0.3)   # every rank at once: the cores are shared
    res = RUNNERS[a.strategy](comm, a.strategy, a.steps, a.warmup)
    rows = comm.allgather(np.array([[res["peak"], res["bytes"], res["step_s"], flops]]))
    if comm.rank == 0:
        Path(a.out).write_text(json.dumps({
            "strategy": a.strategy, "ranks": comm.size, "peak": rows[:, 0].tolist(),
            "bytes": rows[:, 1].tolist(), "step_s": float(rows[:, 2].max()),
            "gemm_flops": float(np.median(rows[:, 3]))}))


if __name__ == "__main__":
    main()
