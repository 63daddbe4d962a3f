"""Adam's step on the CPU: the backend's one-pass numba step (``multi_tensor_adam``,
backend_ndarray/adam_cpu.py) beside the course's composed step (``Adam.step`` with it hidden)
and torch.optim.Adam (its default foreach step, one thread), nanoseconds per parameter, the
three alternating step by step on the same parameters' sizes.

    python benchmarks/bench_adam_cpu.py [--params 4000000] [--tensors 20] [--steps 30]
"""
import statistics
import time
from typing import Callable, Dict, List

import numpy as np

import needle as ndl
from needle import cli
from needle.backend_ndarray import adam_cpu


def _needle_step(sizes: List[int], fast: bool) -> Callable[[], None]:
    """One Adam step over float32 parameters of ``sizes`` (the gradients fixed)."""
    rng = np.random.default_rng(0)
    params = [ndl.nn.Parameter(ndl.Tensor(rng.standard_normal(n).astype(np.float32)))
              for n in sizes]
    for p in params:
        p.grad = ndl.Tensor(rng.standard_normal(p.shape).astype(np.float32))
    opt = ndl.optim.Adam(params, lr=1e-3)
    dev = ndl.cpu()

    def step() -> None:
        saved = getattr(dev, "multi_tensor_adam", None)
        if not fast:
            dev.multi_tensor_adam = None  # the composed step: hw2's Adam.step
        try:
            opt.step()
        finally:
            dev.multi_tensor_adam = saved
    return step


def _torch_step(sizes: List[int]) -> Callable[[], None]:
    import torch
    torch.set_num_threads(1)
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3)
    return opt.step


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=cli.count_type(lo=1000), default=4_000_000)
    parser.add_argument("--tensors", type=cli.count_type(lo=1, hi=10_000), default=20)
    parser.add_argument("--steps", type=cli.count_type(lo=3, hi=10_000), default=30)
    args = parser.parse_args()
    if not adam_cpu.AVAILABLE:
        parser.error("numba is not installed: the CPU has no one-pass Adam step to measure")
    sizes = [args.params // args.tensors] * args.tensors
    steps: Dict[str, Callable[[], None]] = {"numba (multi_tensor_adam)": _needle_step(sizes, True),
                                            "composed (Adam.step)": _needle_step(sizes, False)}
    try:
        steps["torch.optim.Adam"] = _torch_step(sizes)
    except ImportError:
        print("torch not installed: its row is left out")
    times: Dict[str, List[float]] = {k: [] for k in steps}
    for fn in steps.values():  # warm-up: numba's compile, first buffers
        fn()
    for _ in range(args.steps):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    total = sum(sizes)
    base = statistics.median(times["numba (multi_tensor_adam)"])
    print(f"Adam step, {total:,} float32 parameters in {args.tensors} tensors, median of "
          f"{args.steps} alternating steps")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:<28} {med * 1e9 / total:6.2f} ns/param  ({med / base:4.2f}x numba's)")


if __name__ == "__main__":
    main()
