"""Graph compilation: compiled needle training steps beside eager needle and PyTorch (CPU).

The models and step are bench_train.py's (MLP 784-1024-1024-10 batch 256; Transformer LM
4 layers d=256 seq 128 batch 8), float32, one step = forward + loss + backward + Adam. The
compiled step is ``needle.compile`` over forward + loss + backward (Adam stays eager: its
bias corrections change every step, so recordings of it would differ and never compile).
Eager needle, compiled needle and PyTorch eager are timed in the same run, in alternating
blocks, with the same thread count, each block after a 0.5 s pause (so OpenBLAS's or
OpenMP's worker threads left spinning by the previous block are asleep: without it torch's
median moved between 15 and 31 ms on the MLP from run to run); ``torch.compile`` is timed
too where it runs.

Reported: ms per step and ratios (targets: compiled / torch eager <= 1.0), the compile time
(trace + check + fusion + kernel build: the first calls minus an eager call), and where a
speed-up comes from (primitive calls and bytes moved before/after fusion, from the program).

    python benchmarks/bench_compile.py [--steps 9] [--threads 2] [--only mlp|transformer]
                                       [--no-torch-compile] [--breakdown]
"""
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import numpy as np
from bench_train import (
    BATCH,
    FFN,
    LAYERS,
    SEQ,
    VOCAB,
    D,
    blas_setup,
    blas_threads,
    torch_mlp_step,
    torch_threads,
    torch_transformer_step,
)

import needle as ndl
from needle import cli, nn

TARGET = 1.0


def needle_step(kind: str, compiled: bool) -> "tuple[Callable[[], None], object]":
    """(step closure, the compiled function or None) for bench_train's model ``kind``."""
    np.random.seed(0)
    loss_fn = nn.SoftmaxLoss()
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                              nn.ReLU(), nn.Linear(1024, 10))
        params = model.parameters()
        x = ndl.Tensor(np.random.rand(256, 784).astype(np.float32), requires_grad=False)
        y = ndl.Tensor(np.random.randint(0, 10, 256), dtype="int64")

        def fwd_bwd(x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss
    else:
        emb = nn.Embedding(VOCAB, D, gather=True)
        body = nn.Transformer(D, FFN, LAYERS, num_head=8, dim_head=32, sequence_len=SEQ)
        head = nn.Linear(D, VOCAB)
        params = emb.parameters() + body.parameters() + head.parameters()
        tokens = np.random.randint(0, VOCAB, size=(SEQ + 1, BATCH))
        x = ndl.Tensor(tokens[:-1], dtype="int64", requires_grad=False)
        y = ndl.Tensor(tokens[1:].reshape(-1), dtype="int64", requires_grad=False)

        def fwd_bwd(x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
            out, _ = body(emb(x))
            loss = loss_fn(head(out.reshape((SEQ * BATCH, D))), y)
            loss.backward()
            return loss
    opt = ndl.optim.Adam(params, lr=1e-3)
    fn = ndl.compile(fwd_bwd) if compiled else fwd_bwd

    def step() -> None:
        opt.reset_grad()
        loss = fn(x, y)
        opt.step()
        loss.numpy()
    return step, (fn if compiled else None)


def torch_compiled(make: Callable[[], Callable[[], None]]) -> "tuple[Optional[Callable], str]":
    """A torch.compile'd version of a torch step, or (None, why not)."""
    try:
        import torch
        import torch._dynamo
        torch._dynamo.config.suppress_errors = False
        step = make()
        compiled = torch.compile(step)
        t0 = time.perf_counter()
        compiled()
        return compiled, f"compiled in {time.perf_counter() - t0:.1f} s"
    except Exception as exc:  # no C++ compiler, unsupported Python, ...
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def time_blocks(steps: Dict[str, Callable[[], None]], n: int, rounds: int = 3,
                settle: float = 0.0) -> Dict[str, float]:
    """Median ms per step of each step, timed in alternating blocks (first of each untimed).

    ``settle``: seconds to sleep before each block, so the BLAS/OpenMP worker threads the
    previous block left spinning go to sleep and do not take the cores from this one."""
    times: Dict[str, List[float]] = {k: [] for k in steps}
    block = max(1, n // rounds)
    for _ in range(rounds):
        for name, step in steps.items():
            time.sleep(settle)
            step()
            for _ in range(block):
                t0 = time.perf_counter()
                step()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _kind(fn: Callable, flat: list) -> str:
    """The class of one program entry, for the time breakdown."""
    name = getattr(fn, "__name__", "")
    if name == "fused_elementwise":
        from needle.backend_ndarray import fused_elementwise_cpu
        numpy_engine = any(f in flat[0] for f in fused_elementwise_cpu._TRANSCENDENTAL)
        return "fused reduction" if flat[4] else (
            "fused, NumPy engine (exp/log/sqrt)" if numpy_engine else "fused, numba")
    if name in ("matmul", "matmul_tiled"):
        return "matmul (BLAS)"
    if name.startswith("reduce_"):
        return "unfused reduction"
    if name in ("compact", "ewise_strided"):
        return "strided copy / broadcast op"
    return "other (gather, scatter, small ops)"


def breakdown(step: Callable[[], None], cf: object, torch: object, reps: int = 3) -> None:
    """Where the compiled step's time goes, and the same matmuls run by NumPy and by torch.

    Every kernel of the program is timed over ``reps`` steps; then the step's matrix products
    (same shapes and transposes, in order) run alone with NumPy's BLAS and with torch's,
    alternating, median of 5: the BLAS floor each framework starts from.
    """
    program = cf.program()
    saved, totals = program.bound, {}

    def timed(fn: Callable, kind: str) -> Callable:
        def run(*a: object) -> None:
            t0 = time.perf_counter()
            fn(*a)
            totals[kind] = totals.get(kind, 0.0) + time.perf_counter() - t0
        return run
    program.bound = [(timed(fn, _kind(fn, flat)), flat, holes) for fn, flat, holes in saved]
    products = _matmul_products(program, saved)
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    total = (time.perf_counter() - t0) / reps * 1e3
    program.bound = saved
    print(f"  breakdown of the compiled step ({total:.1f} ms, {reps} instrumented steps):")
    for kind, sec in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:38s} {sec / reps * 1e3:7.1f} ms")
    print(f"    {'outside the program (Adam, Python)':38s} "
          f"{total - sum(totals.values()) / reps * 1e3:7.1f} ms")
    if torch is not None and products:
        _matmuls_alone(products, torch)


def _matmul_products(program: object, bound: list) -> list:
    """(batch, m, n, p, transpose a, transpose b, dtype) of each matmul the program calls."""
    products = []
    for fn, flat, _ in bound:
        if getattr(fn, "__name__", "") == "matmul":
            dt = program.trace.dtype(int(flat[2])) if not hasattr(flat[2], "array") \
                else flat[2].array.dtype  # the output is a per-call buffer or a static one
            products.append(tuple(flat[3:9]) + (dt,))
    return products


def _matmuls_alone(products: list, torch: object) -> None:
    """The step's matmuls alone, NumPy's BLAS and torch's alternating, median of 5."""
    rng = np.random.default_rng(0)
    np_ops, t_ops = [], []
    for batch, m, n, p, ta, tb, dt in products:
        a = rng.standard_normal((batch, n, m) if ta else (batch, m, n)).astype(dt)
        b = rng.standard_normal((batch, p, n) if tb else (batch, n, p)).astype(dt)
        x = a.transpose(0, 2, 1) if ta else a
        y = b.transpose(0, 2, 1) if tb else b
        out = np.empty((batch, m, p), dt)
        np_ops.append((x[0], y[0], out[0]) if batch == 1 else (x, y, out))
        tx, ty = torch.from_numpy(a), torch.from_numpy(b)
        t_ops.append(((tx.transpose(1, 2) if ta else tx), (ty.transpose(1, 2) if tb else ty)))

    def run_np() -> None:
        for x, y, out in np_ops:
            np.matmul(x, y, out=out)

    def run_torch() -> None:
        for x, y in t_ops:
            torch.matmul(x, y)
    ms = time_blocks({"numpy": run_np, "torch": run_torch}, 5, rounds=5, settle=0.5)
    flops = sum(2 * b * m * n * p for b, m, n, p, *_ in products)
    print(f"  the step's {len(products)} matmuls alone: NumPy (OpenBLAS) {ms['numpy']:.1f} ms "
          f"({flops / ms['numpy'] / 1e6:.0f} GFLOP/s), torch {ms['torch']:.1f} ms "
          f"({flops / ms['torch'] / 1e6:.0f} GFLOP/s)")


def _steps(kind: str, torch: object, no_torch_compile: bool) -> tuple:
    """(the steps to time by name, the compiled function, seconds beyond 3 eager steps, note)."""
    eager, _ = needle_step(kind, False)
    comp, cf = needle_step(kind, True)
    t0 = time.perf_counter()
    eager()
    t_eager = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(3):  # record, record + compare + build, first replay (kernel builds)
        comp()
    extra = max(0.0, time.perf_counter() - t0 - 3 * t_eager)
    steps = {"needle eager": eager, "needle compiled": comp}
    make_torch = torch_mlp_step if kind == "mlp" else torch_transformer_step
    note = "torch not installed" if torch is None else "not run (--no-torch-compile)"
    if torch is not None:
        steps["torch eager"] = make_torch()
        if not no_torch_compile:
            tc, note = torch_compiled(make_torch)
            if tc is not None:
                steps["torch.compile"] = tc
    return steps, cf, extra, note


def _report(kind: str, ms: dict, cf: object, extra: float, note: str) -> bool:
    """Print one model's figures; False when compiled needle misses its target."""
    st = cf.program().stats() if cf.program() is not None else {}
    print(f"\n[{kind}] " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()))
    print(f"  compile: {extra:.2f} s beyond three eager steps "
          f"(program build {cf.compile_seconds() * 1e3:.0f} ms); torch.compile: {note}")
    if st:
        print(f"  program: {st['steps']} primitive calls -> {st['kernels']} kernels "
              f"({st['fused_groups']} fused); bytes moved {st['bytes_before'] / 2**20:.0f}"
              f" -> {st['bytes_after'] / 2**20:.0f} MiB; intermediates never written "
              f"{st['dead_bytes'] / 2**20:.0f} MiB")
    print(f"  compiled vs eager needle: {ms['needle eager'] / ms['needle compiled']:.2f}x "
          f"faster")
    ok = True
    if "torch eager" in ms:
        ratio = ms["needle compiled"] / ms["torch eager"]
        ok = ratio <= TARGET
        print(f"  compiled needle / torch eager: {ratio:.2f}x (target <= {TARGET}x) "
              f"{'PASS' if ok else 'FAIL'}; eager needle / torch eager: "
              f"{ms['needle eager'] / ms['torch eager']:.2f}x")
    if "torch.compile" in ms:
        print(f"  compiled needle / torch.compile: "
              f"{ms['needle compiled'] / ms['torch.compile']:.2f}x")
    return ok


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=cli.count_type(lo=1), default=9)
    parser.add_argument("--threads", type=cli.count_type(lo=1), default=2)
    parser.add_argument("--only", choices=["mlp", "transformer"], default=None)
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--breakdown", action="store_true",
                        help="time each class of kernel in the compiled step, and its matmuls "
                             "alone in NumPy and torch")
    args = parser.parse_args()
    threads = blas_threads(args.threads)
    torch = torch_threads(threads)
    from needle.backend_ndarray import fused_elementwise_cpu
    print(f"threads {threads}; fused engine {fused_elementwise_cpu.ENGINE}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"BLAS: {blas_setup()}")
    failed = False
    for kind in ("mlp", "transformer"):
        if args.only and kind != args.only:
            continue
        steps, cf, extra, note = _steps(kind, torch, args.no_torch_compile)
        ms = time_blocks(steps, args.steps, settle=0.5)
        failed |= not _report(kind, ms, cf, extra, note)
        if args.breakdown and cf.program() is not None:
            breakdown(steps["needle compiled"], cf, torch)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
