"""What one training step asks of the GPU, counted on the CUDA emulator: per phase (forward,
backward, optimizer) of the course's transformer LM (4 layers, Adam) and of ResNet9 (Adam),
kernel launches, CuPy library calls (cuBLAS, ufuncs, reductions, gathers), device allocations
(new CuPy buffers: ``alloc``; every buffer needle's arrays asked for, most served by needle's
pool of freed buffers: ``buffers``), host-to-device and device-to-host copies, host
synchronisations, Python calls into needle's own functions, and the host's microseconds per
device operation with kernel bodies not executed.

    python benchmarks/bench_step_counts.py [--model lm|resnet9|both] [--reps 5] [--json]
    python benchmarks/bench_step_counts.py --host-time [--baseline DIR] [--rounds 5]

The counts depend on a model's structure, not its sizes or the card (the H100's 377 launches
and 516 allocations per LM step were the emulator's too), so the models here are small. The
suite holds upper bounds on them (``tests/backend_cuda/test_step_counts.py``). Host time is
this machine's CPU running needle's Python and the emulator's stand-in calls; it is not a GPU
figure. ``--host-time`` times whole steps with every kernel body and GEMM stubbed out in the
emulator (the same stubs for any checkout), in subprocesses; with ``--baseline DIR`` (an older
checkout, e.g. ``git worktree add DIR <commit>``) this checkout and DIR alternate round by
round, so both see the same machine.
"""
import argparse
import cProfile
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

os.environ.setdefault("NEEDLE_CUDA_EMULATOR", "force")
# the checkout measured: this one, or --baseline's (its workers get BENCH_STEP_ROOT)
ROOT = Path(os.environ.get("BENCH_STEP_ROOT") or Path(__file__).resolve().parents[1])
if str(ROOT) not in sys.path:  # run as a script: the checkout's needle and apps/
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import needle as ndl  # noqa: E402
from needle.process_state import switches  # noqa: E402

PHASES = ("forward", "backward", "optimizer")


def _counts() -> Any:
    """The emulator's counters (imported when used: an older checkout's --host-time worker
    has none)."""
    from needle.backend_cuda.emulator import counts
    return counts


def columns() -> Tuple[str, ...]:
    """What is counted per phase."""
    return (*_counts().KINDS, "buffers", "python_calls")
_NEEDLE = str(ROOT / "needle") + os.sep
_EMULATOR = str(ROOT / "needle" / "backend_cuda" / "emulator") + os.sep


def language_model(dev: Any) -> Tuple[Any, Any, Any]:
    """The course's transformer LM (4 layers, causal) on small sizes: model, input, labels."""
    from apps.models import LanguageModel
    t, b, vocab, d = 8, 2, 50, 16
    lm = LanguageModel(d, vocab, 32, 4, seq_model="transformer", seq_len=t, device=dev,
                       num_head=2, dim_head=d // 2, dropout=0.0, causal=True)
    ids = np.random.default_rng(0).integers(0, vocab, (t, b))
    x = ndl.Tensor(ids, device=dev, dtype="int64")
    return lm, x, ndl.Tensor(ids.reshape(-1), device=dev, dtype="int64")


def resnet9(dev: Any) -> Tuple[Any, Any, Any]:
    """The course's ResNet9 on a batch of two 32x32 images."""
    from apps.models import ResNet9
    rng = np.random.default_rng(0)
    x = ndl.Tensor(rng.standard_normal((2, 3, 32, 32), dtype=np.float32), device=dev)
    return ResNet9(device=dev), x, ndl.Tensor(rng.integers(0, 10, 2), device=dev, dtype="int64")


MODELS: Dict[str, Callable[[Any], Tuple[Any, Any, Any]]] = {"lm": language_model,
                                                           "resnet9": resnet9}


def step_phases(name: str, mode: str = "eager") -> Dict[str, Callable[[], None]]:
    """The phases of one Adam training step of model ``name`` on ``ndl.cuda()``: forward,
    backward, optimizer; with ``mode`` a ``needle.compile`` mode, the compiled forward and
    backward ("compiled": a plan replayed, or one CUDA graph launch), then the optimizer."""
    model, x, y = MODELS[name](ndl.cuda())
    opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = ndl.nn.SoftmaxLoss()
    box: Dict[str, Any] = {}
    if mode != "eager":
        def train(xb: Any, yb: Any) -> Any:
            out = model(xb)
            loss = loss_fn(out[0] if isinstance(out, tuple) else out, yb)
            loss.backward()
            return loss
        compiled = ndl.compile(train, mode=mode)

        def fused_step() -> None:
            box["loss"] = compiled(x, y)

        def update() -> None:
            opt.step()
            opt.reset_grad()
        fused_step.compiled = compiled  # type: ignore[attr-defined]
        return {"compiled": fused_step, "optimizer": update}

    def forward() -> None:
        out = model(x)
        box["loss"] = loss_fn(out[0] if isinstance(out, tuple) else out, y)

    def backward() -> None:
        box.pop("loss").backward()

    def optimizer() -> None:
        opt.step()
        opt.reset_grad()
    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def needle_calls(prof: cProfile.Profile) -> int:
    """Calls of functions defined in needle's own files (the emulator, CuPy's stand-in, aside)."""
    prof.create_stats()
    return sum(ncalls for (path, _, _), (_, ncalls, *_) in prof.stats.items()  # type: ignore
               if path.startswith(_NEEDLE) and not path.startswith(_EMULATOR))


def measure(name: str, mode: str = "eager") -> Dict[str, Dict[str, Any]]:
    """phase -> {kind: count, "buffers": n, "python_calls": n, "by_name": {kind: {name: n}}}
    for one step after two warm-up steps (kernels compiled, optimizer state made, and the
    pool of freed buffers filled: the second step still meets buffers the first kept alive)."""
    counts = _counts()
    phases = step_phases(name, mode)
    for _ in range(2):
        for run in phases.values():
            run()
    compiled = getattr(phases.get("compiled"), "compiled", None)
    for _ in range(4):  # compiled: until the plan replays (and a graph was captured)
        if compiled is None or compiled.replays >= 2:
            break
        for run in phases.values():
            run()
    out: Dict[str, Dict[str, Any]] = {}
    for phase, run in phases.items():
        prof, made = cProfile.Profile(), [0]
        hook, switches.alloc_cuda = switches.alloc_cuda, lambda a: made.__setitem__(0, made[0] + 1)
        try:
            with counts.counting() as c:
                prof.enable()
                run()
                prof.disable()
        finally:
            switches.alloc_cuda = hook
        row: Dict[str, Any] = dict(c.totals())
        row["buffers"] = made[0]
        row["python_calls"] = needle_calls(prof)
        row["by_name"] = {k: dict(v) for k, v in c.by_kind.items() if v}
        out[phase] = row
    return out


def host_us_per_op(name: str, reps: int) -> float:
    """Median host microseconds per device operation (launch or library call) of one step with
    kernel bodies skipped."""
    counts = _counts()
    phases = step_phases(name)
    for run in phases.values():
        run()
    counts.set_execute(False)
    try:
        times, ops = [], 0
        for _ in range(reps):
            with counts.counting() as c:
                t0 = time.perf_counter()
                for run in phases.values():
                    run()
                times.append(time.perf_counter() - t0)
            ops = c.total("launch") + c.total("library")
    finally:
        counts.set_execute(True)
    return statistics.median(times) / max(ops, 1) * 1e6


def stub_device_work() -> list:
    """Make every emulated kernel launch and cuBLAS / CuPy GEMM a no-op that only counts
    itself (the same stubs on any checkout's emulator); the counter, a one-item list."""
    from needle.backend_cuda.emulator import fake_cupy
    done = [0]

    def no_kernel(self: Any, *args: Any, **kwargs: Any) -> None:
        done[0] += 1

    def no_gemm(*args: Any, **kwargs: Any) -> Any:
        done[0] += 1
        return kwargs.get("out")
    fake_cupy.RawKernel.__call__ = no_kernel  # type: ignore[method-assign]
    fake_cupy.cublas.gemmStridedBatchedEx = no_gemm
    fake_cupy.matmul = no_gemm
    return done


def host_worker(name: str, steps: int) -> Dict[str, float]:
    """Host ms per step and us per device op (launches and GEMMs) of model ``name`` here."""
    phases = step_phases(name)
    for run in phases.values():
        run()
    done = stub_device_work()
    for run in phases.values():  # a step with the stubs in place before timing
        run()
    times, ops = [], 0
    for _ in range(steps):
        before, t0 = done[0], time.perf_counter()
        for run in phases.values():
            run()
        times.append(time.perf_counter() - t0)
        ops = done[0] - before
    ms = statistics.median(times) * 1e3
    return {"ms_per_step": ms, "device_ops": ops, "us_per_op": ms * 1e3 / max(ops, 1)}


def host_rounds(models: Tuple[str, ...], baseline: str, rounds: int, steps: int) -> None:
    """Host time per step, this checkout (and ``baseline``) in alternating subprocesses."""
    sides = [("this checkout", str(ROOT))] + ([("baseline", baseline)] if baseline else [])
    got: Dict[Tuple[str, str], list] = {}
    for _ in range(rounds):
        for model in models:
            for side, path in sides:
                env = dict(os.environ, PYTHONPATH=path, BENCH_STEP_ROOT=path,
                           NEEDLE_CUDA_EMULATOR="force", PYTHONDONTWRITEBYTECODE="1")
                res = subprocess.run([sys.executable, __file__, "--host-worker", model,
                                      "--reps", str(steps)], env=env, cwd=path,
                                     capture_output=True, text=True)
                if res.returncode:
                    raise SystemExit(f"{side} ({path}), {model}: the worker failed:\n"
                                     f"{res.stderr[-3000:]}")
                got.setdefault((model, side), []).append(json.loads(res.stdout))
    print(f"host time per training step, kernel bodies and GEMMs stubbed (median of {rounds} "
          f"rounds x {steps} steps)")
    for model in models:
        row = {side: {k: statistics.median(r[k] for r in got[(model, side)])
                      for k in ("ms_per_step", "device_ops", "us_per_op")} for side, _ in sides}
        for side, m in row.items():
            print(f"  {model:8s} {side:14s} {m['ms_per_step']:8.2f} ms/step "
                  f"{m['device_ops']:6.0f} device ops {m['us_per_op']:7.1f} us/op")
        if baseline:
            new, old = row["this checkout"], row["baseline"]
            print(f"  {model:8s} this / baseline: {new['ms_per_step'] / old['ms_per_step']:.2f}x "
                  f"per step, {new['us_per_op'] / old['us_per_op']:.2f}x per device op")


def report(name: str, reps: int, mode: str = "eager") -> Dict[str, Any]:
    """Counts per phase and in total, and (eager) the host time per device op."""
    phases = measure(name, mode)
    total = {k: sum(p[k] for p in phases.values()) for k in columns()}
    us = round(host_us_per_op(name, reps), 1) if mode == "eager" else None
    return {"model": name, "mode": mode, "phases": phases, "total": total,
            "host_us_per_device_op": us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("lm", "resnet9", "both"), default="both")
    ap.add_argument("--reps", type=int, default=5, help="steps timed for host us per op")
    ap.add_argument("--json", action="store_true", help="one JSON object per model")
    ap.add_argument("--names", action="store_true", help="also print counts by name")
    ap.add_argument("--compile", choices=("eager", "default", "reduce-overhead"),
                    default="eager", help="the step as needle.compile(mode=...) replays it "
                    "(reduce-overhead: one CUDA graph)")
    ap.add_argument("--host-time", action="store_true",
                    help="host ms per step with device work stubbed, in subprocesses")
    ap.add_argument("--baseline", default="", help="with --host-time: an older checkout")
    ap.add_argument("--rounds", type=int, default=5, help="with --host-time: rounds")
    ap.add_argument("--host-worker", choices=tuple(MODELS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reps < 1 or args.rounds < 1:
        ap.error(f"--reps and --rounds must be >= 1, got {args.reps} and {args.rounds}")
    if args.baseline and not (Path(args.baseline) / "needle").is_dir():
        ap.error(f"--baseline {args.baseline!r}: no needle/ folder there")
    models = ("lm", "resnet9") if args.model == "both" else (args.model,)
    if not getattr(ndl.cuda().mod, "EMULATED", False):
        raise SystemExit("bench_step_counts: ndl.cuda() is not the emulator here "
                         "(NEEDLE_CUDA_EMULATOR=force needs g++ and NVIDIA's header wheels)")
    if args.host_worker:
        print(json.dumps(host_worker(args.host_worker, args.reps)))
        return
    if args.host_time:
        host_rounds(models, args.baseline, args.rounds, args.reps)
        return
    for name in models:
        rep = report(name, args.reps, args.compile)
        if args.json:
            print(json.dumps(rep))
        else:
            print_report(rep, args.names)


def print_report(rep: Dict[str, Any], names: bool) -> None:
    """One model's counts as a table (and by name)."""
    cols = columns()
    mode = "" if rep.get("mode", "eager") == "eager" else f", compiled ({rep['mode']})"
    print(f"{rep['model']}: per training step{mode} (emulated CUDA; counts are the GPU's)")
    print(f"  {'phase':10s}" + "".join(f"{c:>13s}" for c in cols))
    for phase in (*rep["phases"], "total"):
        row = rep["total"] if phase == "total" else rep["phases"][phase]
        print(f"  {phase:10s}" + "".join(f"{row[c]:>13d}" for c in cols))
    if rep["host_us_per_device_op"] is not None:
        print(f"  host us per device op, kernels not executed: {rep['host_us_per_device_op']}")
    if names:
        for phase in rep["phases"]:
            for kind, by_name in rep["phases"][phase]["by_name"].items():
                top = sorted(by_name.items(), key=lambda kv: -kv[1])
                print(f"  {phase} {kind}: " + ", ".join(f"{k} {v}" for k, v in top))

if __name__ == "__main__":
    main()
