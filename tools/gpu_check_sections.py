"""The sections of ``tools/gpu_check.py`` that are Python code, one per command:

    python tools/gpu_check_sections.py SECTION [--dry-run]   # env, kernels, train-step,
                                                            # step-profile, step-counts,
                                                            # emu-vs-gpu
    python tools/gpu_check_sections.py pytest-no-pool PYTEST_ARGS...   # CuPy's pool off

Each writes its figures as {"rows": [...]} to $GPU_CHECK_FIGURES. With --dry-run (the CUDA
emulator, no GPU) sizes are tiny, PyTorch is not timed, and every row says "emulated".
"""
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

NEEDED = ("numpy", "ml_dtypes", "cupy", "torch", "pytest", "hypothesis", "mpi4py", "numba",
          "threadpoolctl", "sklearn", "tqdm", "matplotlib")
ROWS: List[Dict[str, Any]] = []


def emit(**row: Any) -> None:
    """One figure row (printed, and kept for $GPU_CHECK_FIGURES)."""
    ROWS.append(row)
    print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def timed(fn: Callable[[], Any], sync: Callable[[], None], reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after warm-up, synchronized each run (one
    warm-up for a single run, as a dry run takes: the first compiles the kernels)."""
    for _ in range(1 if reps == 1 else 2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def timed_pair(fn_a: Callable[[], Any], fn_b: Callable[[], Any], sync: Callable[[], None],
               reps: int) -> Tuple[float, float]:
    """Median seconds of ``fn_a`` and of ``fn_b``, run alternately (a, b, a, b, ...) so that
    clock and thermal drift fall on both alike; warm-up as ``timed``."""
    for _ in range(1 if reps == 1 else 2):
        fn_a()
        fn_b()
    sync()
    times: Tuple[List[float], List[float]] = ([], [])
    for _ in range(reps):
        for fn, out in ((fn_a, times[0]), (fn_b, times[1])):
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t0)
    return float(np.median(times[0])), float(np.median(times[1]))


def _sync(torch: Any) -> Callable[[], None]:
    def sync() -> None:
        import needle as ndl
        if not getattr(ndl.cuda().mod, "EMULATED", True):
            import cupy
            cupy.cuda.Device().synchronize()
        if torch is not None:
            torch.cuda.synchronize()
    return sync


def _torch_cuda(dry: bool) -> Any:
    if dry:
        return None
    import torch
    return torch if torch.cuda.is_available() else None


# ---------------------------------------------------------------------- env
def env(dry: bool) -> None:
    """What the machine has: GPU, driver, versions, and any package the check misses."""
    import needle as ndl
    emit(python=platform.python_version(), machine=platform.machine(),
         needle_cuda=repr(ndl.cuda()), enabled=ndl.cuda().enabled(), mode="emulated" if dry
         else "gpu")
    missing = []
    dists = importlib.metadata.packages_distributions()
    for name in NEEDED:  # found and versioned without importing (torch alone takes seconds)
        if importlib.util.find_spec(name) is None:
            missing.append(name)
            continue
        dist = (dists.get(name) or [name])[0]
        try:
            emit(package=name, version=importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            emit(package=name, version="?")
    if missing:
        emit(missing=", ".join(missing))
    if not dry:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        emit(nvidia_smi=smi.stdout.strip() or smi.stderr.strip())
        if not ndl.cuda().enabled():
            raise SystemExit("ndl.cuda() is not enabled on this GPU machine")


# ---------------------------------------------------------------------- kernels
def _ceilings(torch: Any) -> Dict[str, float]:
    """The card's two ceilings, measured: a device-to-device copy and torch's matmuls."""
    sync = _sync(torch)
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    copy_s = timed(lambda: b.copy_(a), sync, 10)
    n = 8192
    x = torch.randn(n, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    f32_s = timed(lambda: x @ x, sync, 5)
    xb = x.bfloat16()
    bf16_s = timed(lambda: xb @ xb, sync, 10)
    return {"copy_GBps": 2 * a.numel() * 4 / copy_s / 1e9,
            "fp32_TFLOPs": 2 * n ** 3 / f32_s / 1e12, "bf16_TFLOPs": 2 * n ** 3 / bf16_s / 1e12}


def _torch_adam(torch: Any, x: np.ndarray) -> Any:
    """One step of torch's fused Adam over ``x``'s elements (None without a GPU)."""
    if torch is None:
        return None
    p = torch.nn.Parameter(torch.tensor(x, device="cuda"))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    return opt.step


def _adam(F: Any, p: Any, g: Any, mom: List[Any]) -> Callable[[], None]:
    """Successive Adam steps on ``p`` through the multi-tensor primitive (a table of one)."""
    state, step = F.MultiTensorState(p.device, 1), [0]

    def run() -> None:
        step[0] += 1
        F.multi_tensor_adam([p], [g], [mom[0]], [mom[1]], [0], [step[0]], state, 1e-3)
    return run


def _course(mod: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the course's reduce.cu, softmax.cu and layernorm.cu (the backend's default
    is reduce_fast.cu and norm_fast.cu)."""
    def run() -> Any:
        old = mod.get_reduce_kernel()
        mod.set_reduce_kernel("course")
        try:
            return fn()
        finally:
            mod.set_reduce_kernel(old)
    return run


def _bandwidth_row(name: str, nbytes: int, fn_n: Callable[[], Any],
                   fn_t: Optional[Callable[[], Any]], sync: Callable[[], None], reps: int,
                   peak: Dict[str, float], mode: str) -> None:
    """One kernel row: needle's GB/s, and where torch runs, torch's GB/s timed alternately
    with needle's and needle's bandwidth as a fraction of torch's."""
    if fn_t is None:
        s, t = timed(fn_n, sync, reps), 0.0
    else:
        s, t = timed_pair(fn_n, fn_t, sync, reps)
    row: Dict[str, Any] = {"kernel": name, "needle_GBps": round(nbytes / s / 1e9, 2)}
    if t:
        row.update(torch_GBps=round(nbytes / t / 1e9, 2), needle_vs_torch=round(t / s, 3))
    if peak:
        row["needle_pct_of_copy"] = round(100 * nbytes / s / 1e9 / peak["copy_GBps"], 1)
    emit(**row, mode=mode)


def kernels(dry: bool) -> None:
    """needle's kernels beside torch on the same inputs: GB/s and TFLOP/s, and % of peak."""
    import needle as ndl
    from needle.backend_cuda import ndarray_backend_cuda as mod
    from needle.backend_ndarray import NDArray
    from needle.backend_ndarray import fused_ops as F
    torch = _torch_cuda(dry)
    sync, reps = _sync(torch), 1 if dry else 20
    peak = _ceilings(torch) if torch is not None else {}
    if peak:
        emit(ceiling="measured", **{k: round(v, 1) for k, v in peak.items()})
    n_el, rows, cols, mm = (1 << 12, 64, 64, 64) if dry else (1 << 26, 8192, 4096, 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n_el, dtype=np.float32)
    m2 = rng.standard_normal((rows, cols), dtype=np.float32)
    w, bias = np.ones(cols, np.float32), np.zeros(cols, np.float32)
    cu = {k: NDArray(v, device=ndl.cuda()) for k, v in
          {"x": x, "y": x[::-1].copy(), "m2": m2, "w": w, "b": bias}.items()}
    tt = ({k: torch.tensor(v.numpy(), device="cuda") for k, v in cu.items()}
          if torch is not None else {})
    mom = [NDArray(np.zeros(n_el, np.float32), device=ndl.cuda()) for _ in range(2)]
    cases = [  # name, bytes moved, needle fn, torch fn
        ("add", 12 * n_el, lambda: cu["x"] + cu["y"], lambda: tt["x"] + tt["y"]),
        ("sum rows", 4 * rows * cols, lambda: cu["m2"].sum(axis=1), lambda: tt["m2"].sum(1)),
        ("max rows", 4 * rows * cols, lambda: cu["m2"].max(axis=1),
         lambda: tt["m2"].amax(1)),
        ("sum cols", 4 * rows * cols, lambda: cu["m2"].sum(axis=0), lambda: tt["m2"].sum(0)),
        ("sum rows course", 4 * rows * cols, _course(mod, lambda: cu["m2"].sum(axis=1)), None),
        ("max rows course", 4 * rows * cols, _course(mod, lambda: cu["m2"].max(axis=1)), None),
        ("sum cols course", 4 * rows * cols, _course(mod, lambda: cu["m2"].sum(axis=0)), None),
        ("softmax fused", 8 * rows * cols, lambda: F.softmax(cu["m2"]),
         lambda: torch.softmax(tt["m2"], -1)),
        ("layer norm fused", 8 * rows * cols, lambda: F.layer_norm(cu["m2"], cu["w"], cu["b"]),
         lambda: torch.nn.functional.layer_norm(tt["m2"], (cols,), tt["w"], tt["b"])),
        ("softmax fused course", 8 * rows * cols, _course(mod, lambda: F.softmax(cu["m2"])),
         lambda: torch.softmax(tt["m2"], -1)),
        ("layer norm fused course", 8 * rows * cols,
         _course(mod, lambda: F.layer_norm(cu["m2"], cu["w"], cu["b"])),
         lambda: torch.nn.functional.layer_norm(tt["m2"], (cols,), tt["w"], tt["b"])),
        ("adam fused", 28 * n_el, _adam(F, cu["x"], cu["y"], mom), _torch_adam(torch, x)),
    ]
    for name, nbytes, fn_n, fn_t in cases:
        _bandwidth_row(name, nbytes, fn_n, fn_t if torch is not None else None, sync, reps,
                       peak, "emulated" if dry else "gpu")
    a = NDArray(rng.standard_normal((mm, mm), dtype=np.float32), device=ndl.cuda())
    flop = 2 * mm ** 3
    for path in ("naive", "tiled", "cublas"):
        mod.set_matmul_kernel(path)
        try:
            s = timed(lambda: a @ a, sync, min(reps, 2) if path == "naive" else reps)
        finally:
            mod.set_matmul_kernel("cublas")
        row = {"kernel": f"matmul {mm}^3 float32 {path}", "needle_TFLOPs": round(flop / s / 1e12,
                                                                                  3)}
        if peak:
            row["pct_of_torch_fp32"] = round(100 * flop / s / 1e12 / peak["fp32_TFLOPs"], 1)
        emit(**row, mode="emulated" if dry else "gpu")
    if torch is not None:
        ta = torch.tensor(a.numpy(), device="cuda")
        emit(kernel=f"matmul {mm}^3 float32 torch (TF32 off)",
             torch_TFLOPs=round(flop / timed(lambda: ta @ ta, sync, reps) / 1e12, 3), mode="gpu")


def pytest_no_pool(args: List[str]) -> int:
    """pytest with CuPy's memory pool off: each buffer its own cudaMalloc, so memcheck sees
    an access past a buffer's end instead of inside the pool's larger block."""
    import cupy
    import pytest
    cupy.cuda.set_allocator(None)
    os.environ["NEEDLE_CUDA_POOL"] = "0"  # needle's own pool of freed buffers too (read at import)
    return int(pytest.main(args))


def main(argv: List[str]) -> int:
    """Run one section; write its rows to $GPU_CHECK_FIGURES."""
    if argv[:1] == ["pytest-no-pool"]:
        return pytest_no_pool(argv[1:])
    import gpu_check_models as models
    import gpu_check_sections as me  # this file as a module: gpu_check_models emits into it
    run = {"env": me.env, "kernels": me.kernels, "train-step": models.train_step,
           "step-profile": models.step_profile, "step-counts": models.step_counts,
           "emu-vs-gpu": models.emu_vs_gpu, "graphs": models.cuda_graphs}
    if not argv or argv[0] not in run:
        raise SystemExit(f"usage: gpu_check_sections.py {{{','.join(run)}}} [--dry-run]")
    try:
        run[argv[0]]("--dry-run" in argv[1:])
    finally:
        figures = os.environ.get("GPU_CHECK_FIGURES")
        if figures:
            with open(figures, "w") as f:
                json.dump({"rows": me.ROWS}, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
