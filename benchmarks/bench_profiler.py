"""What needle.profiler costs: microseconds per op with the profiler off and on, beside
torch.profiler on the same ops and the same model step, in interleaved rounds.

    python benchmarks/bench_profiler.py [--rounds 7] [--step-iters 100] [--parts] [--baseline DIR]

Per op: 4x4 float32 ops with requires_grad=True (as bench_op_overhead.py), CPU time (process
time) per op, each side timed in turn within every round; the median over rounds is printed.
"On" records everything each profiler can: needle.profiler with input shapes and memory,
torch.profiler with ``record_shapes=True, profile_memory=True``. Model: an MLP 64-256-256-10
training step (batch 32, SGD), per step and per op of the step. Each side starts from a
collected heap (``gc.collect()`` before it), so none pays for the garbage of the one before (a
torch.profiler session leaves much). ``--parts``: also each profiler with less recorded (needle:
ops alone, then with input shapes; torch: ops alone), what ops, shapes and memory each cost.
``--baseline DIR``: a checkout without the profiler's hooks (e.g. ``git archive <commit> | tar
-x -C DIR``); its per-op times, with this checkout's profiler off, in alternating subprocesses,
show what the hooks cost when off. Targets: off costs nothing measurable (within the rounds'
spread); on adds at most 3 us per op.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

from needle import cli

OPS = ("add", "mul", "matmul", "relu", "sum")
ITERS = 2000


def needle_ops(ndl: Any) -> Dict[str, Callable[[], Any]]:
    """The op mix on needle tensors."""
    rng = np.random.default_rng(0)
    x = ndl.Tensor(rng.standard_normal((4, 4)), dtype="float32", requires_grad=True)
    w = ndl.Tensor(rng.standard_normal((4, 4)), dtype="float32", requires_grad=True)
    return {"add": lambda: x + w, "mul": lambda: x * w, "matmul": lambda: x @ w,
            "relu": lambda: ndl.ops.relu(x), "sum": lambda: ndl.ops.summation(x, (1,))}


def torch_ops(torch: Any) -> Dict[str, Callable[[], Any]]:
    """The same op mix on torch tensors."""
    x = torch.randn(4, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    return {"add": lambda: x + w, "mul": lambda: x * w, "matmul": lambda: x @ w,
            "relu": lambda: torch.relu(x), "sum": lambda: x.sum(1)}


def one_blas_thread() -> None:
    """NumPy's BLAS on one thread, as torch's: process time then counts one core's work."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)


def per_call_us(fn: Callable[[], Any], iters: int) -> float:
    """Mean CPU microseconds per call over ``iters`` calls."""
    t0 = time.process_time()
    for _ in range(iters):
        fn()
    return (time.process_time() - t0) / iters * 1e6


def needle_step(ndl: Any) -> Callable[[], None]:
    """One training step of the MLP in needle."""
    from needle import nn
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = ndl.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x = ndl.Tensor(rng.standard_normal((32, 64)), dtype="float32", requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, 32), dtype="int64", requires_grad=False)
    loss_fn = nn.SoftmaxLoss()

    def step() -> None:
        opt.reset_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def torch_step(torch: Any) -> Callable[[], None]:
    """The same step in PyTorch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step


Timer = Callable[[Callable[[], Any], int], float]


def sides(ndl: Any, torch: Any, parts: bool = False) -> Dict[str, Timer]:
    """side name -> time(fn, iters) with that profiler off or on (``parts``: and partly on)."""
    from needle import profiler

    def needle_on(shapes: bool = True, memory: bool = True) -> Timer:
        less: Dict[str, Any] = ({} if shapes and memory else
                                {"record_shapes": shapes, "profile_memory": memory})

        def timer(fn: Callable[[], Any], iters: int) -> float:
            with profiler.profile(**less):  # (the defaults: older checkouts time too)
                return per_call_us(fn, iters)
        return timer

    def torch_on(shapes: bool = True, memory: bool = True) -> Timer:
        def timer(fn: Callable[[], Any], iters: int) -> float:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        record_shapes=shapes, profile_memory=memory):
                return per_call_us(fn, iters)
        return timer
    out = {"needle off": per_call_us, "needle on": needle_on(), "torch off": per_call_us,
           "torch on": torch_on()}
    if parts:
        out.update({"needle ops": needle_on(False, False), "needle +shapes": needle_on(True, False),
                    "torch ops": torch_on(False, False)})
    return out


def ops_per_step(ndl: Any, torch: Any) -> Dict[str, int]:
    """Ops one model step records: needle's ops, torch's operator events (aten::...)."""
    from needle import profiler
    step = needle_step(ndl)
    with profiler.profile() as prof:
        step()
    tstep = torch_step(torch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tprof:
        tstep()
    return {"needle": prof.record.ops, "torch": len(tprof.events())}


def run_rounds(rounds: int, step_iters: int, parts: bool = False
               ) -> Dict[str, Dict[str, List[float]]]:
    """Interleaved rounds: every (case, side) timed once per round."""
    import torch

    import needle as ndl
    torch.set_num_threads(1)
    one_blas_thread()
    n_ops, t_ops = needle_ops(ndl), torch_ops(torch)
    fns = {f"op {k}": (n_ops[k], t_ops[k], ITERS) for k in OPS}
    fns["MLP step"] = (needle_step(ndl), torch_step(torch), step_iters)
    timers = sides(ndl, torch, parts)
    out: Dict[str, Dict[str, List[float]]] = {c: {s: [] for s in timers} for c in fns}
    for _ in range(rounds):
        for case, (nf, tf, iters) in fns.items():
            for side, timer in timers.items():
                gc.collect()  # no side pays for collecting the garbage of the one before
                out[case][side].append(timer(nf if side.startswith("needle") else tf, iters))
    return out


def report(times: Dict[str, Dict[str, List[float]]], per_step: Dict[str, int]) -> None:
    """The table: median us per op (per step for the model) and what profiling adds."""
    med = {c: {s: statistics.median(v) for s, v in sides.items()} for c, sides in times.items()}
    print(f"{'case':<14} {'needle off':>10} {'needle on':>10} {'+/op':>8} "
          f"{'torch off':>10} {'torch on':>10} {'+/op':>8}   (us, median of rounds)")
    for case, m in med.items():
        n = per_step["needle"] if case == "MLP step" else 1
        t = per_step["torch"] if case == "MLP step" else 1
        print(f"{case:<14} {m['needle off']:>10.2f} {m['needle on']:>10.2f} "
              f"{(m['needle on'] - m['needle off']) / n:>8.2f} {m['torch off']:>10.2f} "
              f"{m['torch on']:>10.2f} {(m['torch on'] - m['torch off']) / t:>8.2f}")
    print(f"MLP step: {per_step['needle']} needle ops, {per_step['torch']} torch operator "
          f"events per step; '+/op' of the step divides by them")
    if "needle ops" not in med["op add"]:
        return
    cols = (("needle ops", "needle off"), ("needle +shapes", "needle off"),
            ("needle on", "needle off"), ("torch ops", "torch off"), ("torch on", "torch off"))
    print(f"\nadded per op (us): {'needle ops':>10} {'+shapes':>10} {'+memory':>10} "
          f"{'torch ops':>10} {'torch all':>10}")
    for case, m in med.items():
        n = per_step["needle"] if case == "MLP step" else 1
        t = per_step["torch"] if case == "MLP step" else 1
        print(f"{case:<18} " + " ".join(
            f"{(m[on] - m[off]) / (n if on.startswith('needle') else t):>10.2f}"
            for on, off in cols))


def baseline_rounds(baseline: str, rounds: int) -> None:
    """Per-op times off: this checkout against ``baseline`` in alternating subprocesses."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got: Dict[str, List[Dict[str, float]]] = {"this checkout (hooks, off)": [], "baseline": []}
    for _ in range(rounds):
        for name, path in (("this checkout (hooks, off)", here), ("baseline", baseline)):
            env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")
            res = subprocess.run([sys.executable, __file__, "--worker-off"], env=env, cwd=path,
                                 capture_output=True, text=True, check=True)
            got[name].append(json.loads(res.stdout))
    print(f"{'op':<8} " + " ".join(f"{n:>28}" for n in got) + "   (us, median of rounds)")
    for op in OPS:
        print(f"{op:<8} " + " ".join(f"{statistics.median(r[op] for r in runs):>28.3f}"
                                     for runs in got.values()))


def worker_off() -> None:
    """Print this interpreter's needle per-op times (profiler off) as JSON."""
    import needle as ndl
    one_blas_thread()
    ops = needle_ops(ndl)
    print(json.dumps({k: min(per_call_us(ops[k], ITERS * 5) for _ in range(3)) for k in OPS}))


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=cli.count_type(lo=1), default=7)
    parser.add_argument("--step-iters", type=cli.count_type(lo=1), default=100,
                        help="model steps per timing")
    parser.add_argument("--parts", action="store_true",
                        help="also time each profiler with less recorded")
    parser.add_argument("--baseline", default="", help="a checkout without the hooks")
    parser.add_argument("--worker-off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_off:
        worker_off()
        return
    import torch

    import needle as ndl
    report(run_rounds(args.rounds, args.step_iters, args.parts), ops_per_step(ndl, torch))
    if args.baseline:
        baseline_rounds(args.baseline, args.rounds)


if __name__ == "__main__":
    main()
