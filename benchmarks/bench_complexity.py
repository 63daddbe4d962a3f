"""Cost growth of each op family: time at n and at 8n, and their ratio (8 when linear, 64 when
quadratic), forward and backward, on the CPU (NumPy backend).

Each family builds a graph whose size is n (pieces of a split, tensors in a stack or tuple,
nodes in a chain, uses of one tensor) or whose arrays hold n elements, then runs backward.
Runs at n and 8n alternate (so a change of machine speed hits both) and the median of
``--repeats`` is kept; time is process CPU time (robust to other jobs). PASS when the ratio
is at most 8 * 1.5 (linear, with slack for caches and fixed costs).

    python benchmarks/bench_complexity.py [--repeats 5] [--scale 1] [--only split]
"""
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

import needle as ndl
from needle import cli
from needle.backend_ndarray import NDArray

LINEAR_SLACK = 1.5  # the ratio may exceed 8 by this factor (caches, allocation, fixed costs)


def _sum_all(parts: List[ndl.Tensor]) -> ndl.Tensor:
    total = parts[0].sum()
    for p in parts[1:]:
        total = total + p.sum()
    return total


def split_backward(n: int) -> Callable[[], None]:
    """split an (n, 2) tensor into n pieces, sum them, backward."""
    x = ndl.Tensor(np.ones((n, 2)), dtype="float64")
    return lambda: _sum_all(list(ndl.ops.split(x, 0))).backward()


def stack_backward(n: int) -> Callable[[], None]:
    """stack n (2,) tensors, sum, backward."""
    xs = [ndl.Tensor(np.ones(2), dtype="float64") for _ in range(n)]
    return lambda: ndl.ops.stack(xs, 0).sum().backward()


def tuple_backward(n: int) -> Callable[[], None]:
    """make_tuple of n tensors, read every element (tuple_get_item), sum, backward."""
    xs = [ndl.Tensor(np.ones(2), dtype="float64") for _ in range(n)]

    def run() -> None:
        tup = ndl.ops.make_tuple(*xs)
        items = [ndl.ops.TupleGetItem(i)(tup, fold_const=False) for i in range(n)]
        _sum_all(items).backward()
    return run


def getitem_backward(n: int) -> Callable[[], None]:
    """x[1::2] of an (n, 4) tensor (n/2 rows out), backward (scatter into n rows)."""
    x = ndl.Tensor(np.ones((n, 4)), dtype="float64")
    return lambda: x[1::2].sum().backward()


def setitem(n: int) -> Callable[[], None]:
    """NDArray setitem: n/2 strided rows of an (n, 4) array written from an array."""
    a = NDArray(np.zeros((n, 4)))
    b = NDArray(np.ones((n // 2, 4)))

    def run() -> None:
        a[1::2] = b
    return run


def chain_backward(n: int) -> Callable[[], None]:
    """A chain of n ops (x * 1.0001 + 0.5 repeated): topological sort and backward."""
    x = ndl.Tensor(np.ones(4), dtype="float64")

    def run() -> None:
        y = x
        for _ in range(n // 2):
            y = y * 1.0001 + 0.5
        y.sum().backward()
    return run


def fan_in_backward(n: int) -> Callable[[], None]:
    """One tensor used n times: n partial gradients accumulated into one."""
    x = ndl.Tensor(np.ones(4), dtype="float64")
    return lambda: _sum_all([x * float(i) for i in range(n)]).backward()


def elementwise_backward(n: int) -> Callable[[], None]:
    """(a * b + a).sum() on n-element arrays, backward."""
    a = ndl.Tensor(np.ones(n), dtype="float64")
    b = ndl.Tensor(np.ones(n), dtype="float64")
    return lambda: (a * b + a).sum().backward()


def logsumexp_backward(n: int) -> Callable[[], None]:
    """logsumexp over the last axis of an (n, 8) array, backward."""
    x = ndl.Tensor(np.ones((n, 8)), dtype="float64")
    return lambda: ndl.ops.logsumexp(x, (1,)).sum().backward()


# family -> (builder, n): n is chosen so a run at n takes ~1-10 ms
FAMILIES: Dict[str, Tuple[Callable[[int], Callable[[], None]], int]] = {
    "split (n pieces) + backward": (split_backward, 100),
    "stack (n tensors) + backward": (stack_backward, 100),
    "make_tuple / tuple_get_item (n) + backward": (tuple_backward, 100),
    "getitem x[1::2], n rows + backward": (getitem_backward, 20000),
    "setitem a[1::2] = b, n rows (NDArray)": (setitem, 20000),
    "chain of n ops + backward (topo sort)": (chain_backward, 200),
    "one tensor used n times + backward (accumulation)": (fan_in_backward, 100),
    "elementwise, n elements + backward": (elementwise_backward, 100000),
    "logsumexp, n rows + backward": (logsumexp_backward, 10000),
}


def cpu_seconds(fn: Callable[[], None]) -> float:
    """Process CPU seconds of one call."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(build: Callable[[int], Callable[[], None]], n: int, repeats: int
            ) -> Tuple[float, float]:
    """Median seconds at n and at 8n, runs interleaved (after one warm-up of each)."""
    small, large = build(n), build(8 * n)
    small()
    large()
    times: Tuple[List[float], List[float]] = ([], [])
    for _ in range(repeats):
        times[0].append(cpu_seconds(small))
        times[1].append(cpu_seconds(large))
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=cli.count_type(lo=1), default=5)
    parser.add_argument("--scale", type=cli.positive_type(), default=1.0,
                        help="multiply every n by this")
    parser.add_argument("--only", default="", help="families whose name contains this")
    args = parser.parse_args()
    print("| op family | n | time at n (ms) | time at 8n (ms) | ratio | |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (build, n) in FAMILIES.items():
        if args.only not in name:
            continue
        n = max(2, int(n * args.scale))
        t_n, t_8n = measure(build, n, args.repeats)
        ratio = t_8n / max(t_n, 1e-9)
        verdict = "PASS" if ratio <= 8 * LINEAR_SLACK else "FAIL"
        print(f"| {name} | {n} | {t_n * 1e3:.2f} | {t_8n * 1e3:.2f} | {ratio:.1f} | {verdict} |",
              flush=True)
    t = cpu_seconds(split_backward(800))
    print(f"\nsplit of (800, 2) + backward: {t:.3f} s")


if __name__ == "__main__":
    main()
