"""Framework overhead per op: microseconds per small-tensor op with autograd graph building.

needle (NumPy backend) beside PyTorch eager on the CPU, in the same run, on the same 4x4
float32 inputs with requires_grad=True. Target: at most 5 us per op and at most 3x
PyTorch's per-op cost.

    python benchmarks/bench_op_overhead.py [--iters N]
"""
import statistics
import time
from typing import Callable, Dict, List

import numpy as np

import needle as ndl
from needle import cli

OPS = ("add", "mul", "add_scalar", "mul_scalar", "matmul", "relu", "exp", "sum", "reshape")


def needle_ops(x: "ndl.Tensor", w: "ndl.Tensor") -> Dict[str, Callable[[], object]]:
    """The op mix for needle."""
    return {
        "add": lambda: x + w, "mul": lambda: x * w, "add_scalar": lambda: x + 1.0,
        "mul_scalar": lambda: x * 2.0, "matmul": lambda: x @ w, "relu": lambda: ndl.ops.relu(x),
        "exp": lambda: ndl.ops.exp(x), "sum": lambda: ndl.ops.summation(x, (1,)),
        "reshape": lambda: ndl.ops.reshape(x, (16,)),
    }


def torch_ops(x, w) -> Dict[str, Callable[[], object]]:
    """The same op mix for PyTorch."""
    import torch
    return {
        "add": lambda: x + w, "mul": lambda: x * w, "add_scalar": lambda: x + 1.0,
        "mul_scalar": lambda: x * 2.0, "matmul": lambda: x @ w, "relu": lambda: torch.relu(x),
        "exp": lambda: torch.exp(x), "sum": lambda: x.sum(1), "reshape": lambda: x.reshape(16),
    }


def time_us(fn: Callable[[], object], iters: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` mean CPU microseconds per call (process time: robust to other load)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(iters):
            fn()
        best = min(best, (time.process_time() - t0) / iters * 1e6)
    return best


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=cli.count_type(lo=1), default=20000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    xa, wa = rng.standard_normal((4, 4), dtype=np.float32), rng.standard_normal((4, 4),
                                                                                 dtype=np.float32)
    nx, nw = ndl.Tensor(xa, requires_grad=True), ndl.Tensor(wa, requires_grad=True)
    n_fns = needle_ops(nx, nw)
    try:
        import torch
        torch.set_num_threads(1)
        tx = torch.tensor(xa, requires_grad=True)
        tw = torch.tensor(wa, requires_grad=True)
        t_fns = torch_ops(tx, tw)
        torch_version = torch.__version__
    except ImportError:
        t_fns, torch_version = {}, None
    print(f"per-op overhead, 4x4 float32, requires_grad=True, {args.iters} iters, best of 5")
    print(f"{'op':<12}{'needle us':>11}{'torch us':>11}{'ratio':>8}")
    n_all: List[float] = []
    t_all: List[float] = []
    for name in OPS:
        n_us = time_us(n_fns[name], args.iters)
        n_all.append(n_us)
        if t_fns:
            t_us = time_us(t_fns[name], args.iters)
            t_all.append(t_us)
            print(f"{name:<12}{n_us:>11.2f}{t_us:>11.2f}{n_us / t_us:>8.2f}")
        else:
            print(f"{name:<12}{n_us:>11.2f}{'-':>11}{'-':>8}")
    n_mean = statistics.mean(n_all)
    print(f"{'mean':<12}{n_mean:>11.2f}", end="")
    ok = n_mean <= 5.0
    if t_all:
        t_mean = statistics.mean(t_all)
        ratio = n_mean / t_mean
        ok = ok and ratio <= 3.0
        print(f"{t_mean:>11.2f}{ratio:>8.2f}   (torch {torch_version})")
    else:
        print("   (torch not installed: ratio not measured)")
    print(f"target: <= 5 us/op and <= 3x torch -> {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
