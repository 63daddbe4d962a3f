"""needle's CUDA backend side by side with PyTorch on the same GPU, one run, PASS/FAIL per line.

    python benchmarks/bench_cuda.py            # everything (about 5 minutes on an H100)
    python benchmarks/bench_cuda.py --quick    # smaller sizes, a smoke test

Targets: cuBLAS matmul >= 0.9x torch; elementwise / reduction bandwidth >= 0.8x
torch; fused softmax / layer norm >= 0.8x torch and >= 2x needle's unfused version; a
transformer LM training step (d=1024, 8 layers, seq 512) <= 1.3x PyTorch eager's time.
Mixed precision rides along: that step under ``autocast("float16")`` >= 1.5x faster than
in float32. Ratios are speed ratios (higher is better) except the training step, a time ratio.

On a GPU machine with network: ``pip install -e .[cuda,dev]`` (cupy-cuda12x, or cupy-cuda13x on
CUDA 13) and a CUDA torch, then ``python -m needle.backend_cuda.compile_check``, ``pytest -q
tests -k "cuda or dlpack"``, this script and ``python benchmarks/bench_memory.py`` (its offload
section). On a GPU machine without network where CuPy and a CUDA torch are installed::

    python3 -m pip install --no-deps --no-build-isolation -e .
    python3 -c "import needle as ndl; print(ndl.cuda().enabled())"     # must print True
    python3 -m pytest -q tests -k "cuda or dlpack" -p no:cacheprovider
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_cuda.py | tee $OUT/bench_cuda.txt
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_memory.py | tee $OUT/bench_memory.txt
"""
import argparse
import time
from typing import Callable, List

import numpy as np

import needle as ndl
from needle.backend_ndarray import NDArray

RESULTS: List[bool] = []


def _sync() -> None:
    import cupy as cp
    import torch
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()


def timeit(fn: Callable[[], object], warmup: int = 3, iters: int = 10) -> float:
    """Mean seconds per call after warm-up, with the GPU synchronized around the timed loop."""
    for _ in range(warmup):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - t0) / iters


def report(name: str, needle_val: float, torch_val: float, unit: str, target: float,
           higher_is_better: bool = True) -> None:
    """Print one figure with its ratio to torch and PASS/FAIL against the target."""
    ratio = needle_val / torch_val
    ok = ratio >= target if higher_is_better else ratio <= target
    cmp = ">=" if higher_is_better else "<="
    RESULTS.append(ok)
    print(f"{name:<44} needle {needle_val:10.2f} {unit:<8} torch {torch_val:10.2f} {unit:<8}"
          f" ratio {ratio:5.2f} (target {cmp} {target})  {'PASS' if ok else 'FAIL'}", flush=True)


def info(name: str, value: float, unit: str) -> None:
    """Print a figure that has no target."""
    print(f"{name:<44} needle {value:10.2f} {unit}", flush=True)


def _gpu(x: np.ndarray, dtype: str) -> NDArray:
    return NDArray(x, device=ndl.cuda(), dtype=dtype)


def bench_matmul(sizes, torch) -> None:
    from needle.backend_cuda import _runtime as rt
    from needle.backend_cuda import ndarray_backend_cuda as mod
    dtypes = ["float32", "float16"] + (["bfloat16"] if rt.compute_capability(0) >= 80 else [])
    for n in sizes:
        flop = 2 * n ** 3
        for dt in dtypes:
            x = np.random.randn(n, n).astype(np.float32)
            y = np.random.randn(n, n).astype(np.float32)
            a, b = _gpu(x, dt), _gpu(y, dt)
            tx = torch.tensor(x, device="cuda", dtype=getattr(torch, dt))
            ty = torch.tensor(y, device="cuda", dtype=getattr(torch, dt))
            t_n = timeit(lambda: a @ b)
            t_t = timeit(lambda: tx @ ty)
            report(f"matmul {n}^3 {dt} cuBLAS (TFLOP/s)", flop / t_n / 1e12, flop / t_t / 1e12,
                   "TFLOP/s", 0.9)
            mod.set_matmul_kernel("tiled")
            try:
                t_k = timeit(lambda: a @ b, warmup=1, iters=3)
            finally:
                mod.set_matmul_kernel("cublas")
            info(f"matmul {n}^3 {dt} tiled teaching kernel", flop / t_k / 1e12, "TFLOP/s")


def bench_bandwidth(n_elem: int, torch) -> None:
    x = np.random.randn(n_elem).astype(np.float32)
    a, b = _gpu(x, "float32"), _gpu(x[::-1].copy(), "float32")
    tx, ty = torch.tensor(x, device="cuda"), torch.tensor(x[::-1].copy(), device="cuda")
    gb = n_elem * 4 / 1e9
    for name, fn_n, fn_t, traffic in [
        ("add", lambda: a + b, lambda: tx + ty, 3),
        ("mul scalar", lambda: a * 3.0, lambda: tx * 3.0, 2),
        ("exp", lambda: a.exp(), lambda: tx.exp(), 2),
        ("sum all", lambda: a.sum(), lambda: tx.sum(), 1),
    ]:
        report(f"{name} {n_elem:.1e} float32 (GB/s)", traffic * gb / timeit(fn_n),
               traffic * gb / timeit(fn_t), "GB/s", 0.8)
    rows = 16384
    cols = n_elem // rows
    a2, t2 = a.reshape((rows, cols)), tx.reshape(rows, cols)
    report(f"sum rows ({rows},{cols}) (GB/s)", gb / timeit(lambda: a2.sum(axis=1)),
           gb / timeit(lambda: t2.sum(dim=1)), "GB/s", 0.8)
    report(f"max rows ({rows},{cols}) (GB/s)", gb / timeit(lambda: a2.max(axis=1)),
           gb / timeit(lambda: t2.amax(dim=1)), "GB/s", 0.8)
    report(f"sum cols ({rows},{cols}) (GB/s)", gb / timeit(lambda: a2.sum(axis=0)),
           gb / timeit(lambda: t2.sum(dim=0)), "GB/s", 0.8)


def bench_fused(rows: int, cols: int, torch) -> None:
    from needle.backend_ndarray import fused_ops as F
    for dt in ("float32", "float16"):
        x = np.random.randn(rows, cols).astype(np.float32)
        a = _gpu(x, dt)
        tx = torch.tensor(x, device="cuda", dtype=getattr(torch, dt))
        gb = 2 * rows * cols * a._handle.array.itemsize / 1e9  # read + write once
        t_f = timeit(lambda: F.softmax(a))
        report(f"softmax ({rows},{cols}) {dt} vs torch (GB/s)", gb / t_f,
               gb / timeit(lambda: torch.softmax(tx, dim=-1)), "GB/s", 0.8)
        report(f"softmax ({rows},{cols}) {dt} vs unfused", gb / t_f,
               gb / timeit(lambda: F.softmax_naive(a)), "GB/s", 2.0)
        w, b = _gpu(np.random.randn(cols), dt), _gpu(np.random.randn(cols), dt)
        tw, tb = (torch.tensor(v.numpy().astype(np.float32), device="cuda",
                               dtype=getattr(torch, dt)) for v in (w, b))
        t_f = timeit(lambda: F.layer_norm(a, w, b))
        report(f"layer norm ({rows},{cols}) {dt} vs torch (GB/s)", gb / t_f,
               gb / timeit(lambda: torch.nn.functional.layer_norm(tx, (cols,), tw, tb)),
               "GB/s", 0.8)
        report(f"layer norm ({rows},{cols}) {dt} vs unfused", gb / t_f,
               gb / timeit(lambda: F.layer_norm_naive(a, w, b)), "GB/s", 2.0)


def bench_transformer(batch: int, seq: int, d: int, layers: int, heads: int, vocab: int,
                      torch) -> None:
    from needle import nn, optim
    dev = ndl.cuda()
    model = nn.Transformer(d, 4 * d, layers, num_head=heads, dim_head=d // heads, dropout=0.0,
                           causal=True, device=dev, dtype="float32", batch_first=True,
                           sequence_len=seq)
    head = nn.Linear(d, vocab, device=dev, dtype="float32")
    loss_fn = nn.SoftmaxLoss()
    params = model.parameters() + head.parameters()
    opt = optim.Adam(params, lr=1e-4)
    x = ndl.Tensor(np.random.randn(batch, seq, d).astype(np.float32), device=dev)
    y = ndl.Tensor(np.random.randint(0, vocab, batch * seq), device=dev, dtype="int64")

    def step_needle():
        opt.reset_grad()
        out, _ = model(x)
        loss = loss_fn(head(out.reshape((batch * seq, d))), y)
        loss.backward()
        opt.step()

    layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=True)
    enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda()
    thead = torch.nn.Linear(d, vocab).cuda()
    tpos = torch.nn.Parameter(torch.randn(seq, d, device="cuda") * 0.02)  # like needle's
    topt = torch.optim.Adam(list(enc.parameters()) + list(thead.parameters()) + [tpos], lr=1e-4)
    tx = torch.tensor(x.numpy(), device="cuda")
    ty = torch.tensor(y.numpy(), device="cuda").long()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device="cuda")

    def step_torch():
        topt.zero_grad(set_to_none=True)
        out = enc(tx + tpos, mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(thead(out.reshape(batch * seq, d)), ty)
        loss.backward()
        topt.step()

    t_n = timeit(step_needle, warmup=2, iters=5)
    t_t = timeit(step_torch, warmup=2, iters=5)
    report(f"transformer LM step d={d} L={layers} T={seq} B={batch} (ms)", t_n * 1e3,
           t_t * 1e3, "ms", 1.3, higher_is_better=False)


def bench_amp(batch: int, seq: int, d: int, layers: int, heads: int, vocab: int) -> None:
    """Mixed precision on the GPU: the same needle transformer step under autocast(float16) with a
    GradScaler against float32; the figure is the speedup (float32 time / mixed time)."""
    from needle import nn, optim
    from needle.amp import GradScaler, autocast
    dev = ndl.cuda()
    np.random.seed(0)
    model = nn.Transformer(d, 4 * d, layers, num_head=heads, dim_head=d // heads, dropout=0.0,
                           causal=True, device=dev, dtype="float32", batch_first=True,
                           sequence_len=seq)
    head = nn.Linear(d, vocab, device=dev, dtype="float32")
    loss_fn = nn.SoftmaxLoss()
    opt = optim.Adam(model.parameters() + head.parameters(), lr=1e-4)
    x = ndl.Tensor(np.random.randn(batch, seq, d).astype(np.float32), device=dev)
    y = ndl.Tensor(np.random.randint(0, vocab, batch * seq), device=dev, dtype="int64")

    def step(dtype):
        scaler = GradScaler(enabled=dtype is not None)

        def run():
            opt.reset_grad()
            with autocast(dtype or "float16", enabled=dtype is not None):
                out, _ = model(x)
                loss = loss_fn(head(out.reshape((batch * seq, d))), y)
            scaler.scale(loss).backward(create_graph=False)
            scaler.step(opt)
            scaler.update()
        return run

    t32 = timeit(step(None), warmup=2, iters=5)
    t16 = timeit(step("float16"), warmup=2, iters=5)
    report(f"amp fp16 speedup over fp32, d={d} L={layers}", t32 / t16, 1.0, "x", 1.5)


def main() -> int:
    """Run every benchmark; exit status 1 when any figure misses its target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", choices=["matmul", "bandwidth", "fused", "transformer", "amp"])
    args = parser.parse_args()
    import torch
    if not ndl.cuda().enabled() or not torch.cuda.is_available():
        print("needs a CUDA GPU with CuPy and a CUDA build of torch")
        return 2
    from needle.backend_cuda import memory_stats
    print(f"GPU: {torch.cuda.get_device_name(0)}  torch {torch.__version__}")
    np.random.seed(0)
    q = args.quick
    runs = {
        "matmul": lambda: bench_matmul([1024] if q else [4096, 8192], torch),
        "bandwidth": lambda: bench_bandwidth(1 << (22 if q else 28), torch),
        "fused": lambda: bench_fused(1024 if q else 16384, 1024 if q else 4096, torch),
        "transformer": lambda: bench_transformer(2 if q else 8, 128 if q else 512,
                                                 256 if q else 1024, 2 if q else 8,
                                                 4 if q else 16, 1000 if q else 8192, torch),
        "amp": lambda: bench_amp(2 if q else 8, 128 if q else 512, 256 if q else 1024,
                                 2 if q else 8, 4 if q else 16, 1000 if q else 8192),
    }
    for name, run in runs.items():
        if args.only in (None, name):
            run()
    stats = memory_stats(0)
    print(f"needle GPU memory: peak {stats['peak_bytes_in_use'] / 2**30:.2f} GiB in use, "
          f"{stats['bytes_reserved'] / 2**30:.2f} GiB reserved by CuPy's pool")
    print(f"{sum(RESULTS)}/{len(RESULTS)} targets met")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
