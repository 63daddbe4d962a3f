"""The CUDA emulator's own figures: kernel build time (cold and cached) and time per launch.

    python benchmarks/bench_cuda_emulator.py            # sets NEEDLE_CUDA_EMULATOR=force
    python benchmarks/bench_cuda_emulator.py --quick    # smaller sizes
    python benchmarks/bench_cuda_emulator.py --memcheck # per-launch cost of memory checking

These are CPU timings of needle's CUDA kernels run by the emulator (every CUDA thread of a
block a fiber on one core), NOT GPU figures: they say what a test or a homework costs on a
laptop, nothing about a GPU. Each op is timed beside NumPy doing the same on the same host
(the reference, one BLAS thread), interleaved, and the ratio emulator / NumPy is printed.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

os.environ["NEEDLE_CUDA_EMULATOR"] = "force"  # before needle: emulate even beside a GPU

import needle as ndl  # noqa: E402
from needle.backend_cuda import kernel_specs as K  # noqa: E402
from needle.backend_ndarray import NDArray  # noqa: E402
from needle.backend_ndarray import fused_ops as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine() -> str:
    """CPU model, cores, the BLAS threadpoolctl reports and the load average."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    blas = "?"
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{i['internal_api']} {i.get('architecture', '')}".strip()
                         for i in threadpool_info() if i["user_api"] == "blas")
    except ImportError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, BLAS {blas}, load average {load}"


def load_all(cache: str) -> Dict[str, float]:
    """Seconds to load each kernel file's float32 module from the cache folder ``cache``."""
    from needle.backend_cuda.emulator import module
    os.environ["NEEDLE_CUDA_EMULATOR_CACHE"] = cache
    times = {}
    for filename in K.KERNEL_FILES:
        dtype = "" if filename == "strided.cu" else "float32"
        t0 = time.perf_counter()
        module.load_module(K.source(filename), K.name_expressions(filename, dtype),
                           K.NVRTC_OPTIONS + K.include_options(), filename=filename)
        times[filename] = time.perf_counter() - t0
    return times


def bench_build() -> None:
    """Build time of each kernel file's float32 module: cold (an empty cache, this process),
    then cached (a fresh process loading the built library from the same cache folder)."""
    with tempfile.TemporaryDirectory() as cache:
        cold = load_all(cache)
        script = (f"import json, sys; sys.argv = ['x']; sys.path.insert(0, {HERE!r}); "
                  f"import bench_cuda_emulator as b; print(json.dumps(b.load_all({cache!r})))")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": ROOT})
        cached = json.loads(out.stdout.strip().splitlines()[-1])
    for filename in K.KERNEL_FILES:
        dtype = "" if filename == "strided.cu" else "float32"
        print(f"build {filename:<14} {len(K.name_expressions(filename, dtype)):3d} kernels  "
              f"cold {cold[filename]:6.2f} s  cached {cached[filename] * 1e3:7.1f} ms",
              flush=True)
    print(f"build all {len(K.KERNEL_FILES)} files (float32)   cold {sum(cold.values()):6.2f} s"
          f"  cached {sum(cached.values()) * 1e3:7.1f} ms", flush=True)


def interleaved(fns: Tuple[Callable[[], object], Callable[[], object]], reps: int
                ) -> Tuple[float, float]:
    """Median seconds per call of each function, calls alternating (after one warm-up each)."""
    times: List[List[float]] = [[], []]
    for f in fns:
        f()
    for _ in range(reps):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - t0)
    return float(np.median(times[0])), float(np.median(times[1]))


def _ops(q: bool) -> Dict[str, Tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (the op on emulated cuda, the same op in NumPy)."""
    from needle.backend_cuda import ndarray_backend_cuda as cuda_backend
    rng = np.random.default_rng(0)
    ops = {}
    for n in ((10 ** 4, 10 ** 5) if q else (10 ** 4, 10 ** 6)):
        x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        a, b = NDArray(x, device=ndl.cuda()), NDArray(y, device=ndl.cuda())
        ops[f"add {n:.0e} float32"] = (lambda a=a, b=b: a + b, lambda x=x, y=y: x + y)
    side = 256 if q else 1000
    m = rng.standard_normal((side, side), np.float32)
    g = NDArray(m, device=ndl.cuda())
    ops[f"compact transpose {side}x{side}"] = (lambda: g.permute((1, 0)).compact(),
                                               lambda: np.ascontiguousarray(m.T))
    ops[f"sum rows {side}x{side}"] = (lambda: g.sum(axis=1), lambda: m.sum(axis=1))
    rows, cols = (64, 1024) if q else (256, 1024)
    s = rng.standard_normal((rows, cols), np.float32)
    gs = NDArray(s, device=ndl.cuda())

    def np_softmax():
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    ops[f"softmax rows {rows}x{cols}"] = (lambda: F.softmax(gs), np_softmax)
    k = 128 if q else 256
    u, v = rng.standard_normal((k, k), np.float32), rng.standard_normal((k, k), np.float32)
    gu, gv = NDArray(u, device=ndl.cuda()), NDArray(v, device=ndl.cuda())
    for mode in ("tiled", "naive"):
        def run(mode=mode):
            cuda_backend.set_matmul_kernel(mode)
            try:
                return gu @ gv
            finally:
                cuda_backend.set_matmul_kernel("cublas")
        ops[f"matmul {k}^3 {mode} kernel"] = (run, lambda: u @ v)
    return ops


def bench_launches(q: bool, reps: int) -> None:
    """Time per op (one or two kernel launches each) on the emulator beside NumPy."""
    for name, fns in _ops(q).items():
        emu, ref = interleaved(fns, reps)
        print(f"{name:<32} emulator {emu * 1e3:9.3f} ms  NumPy {ref * 1e3:8.3f} ms  "
              f"ratio {emu / ref:8.1f}x", flush=True)


CHECK_LEVELS = ("off", "bounds", "full")  # off: the build before the memory checker


def _kernel_cases(q: bool) -> Dict[str, Tuple[str, str, str, tuple, tuple, Callable]]:
    """name -> (file, kernel, dtype, grid, block, make(cp) -> args): launches as the backend
    makes them, on the emulator's CuPy arrays (whose bounds the checker knows)."""
    n, side, (rows, cols), k = (10 ** 5, 256, (64, 1024), 128) if q else \
        (10 ** 6, 512, (256, 1024), 256)
    rng = np.random.default_rng(0)

    def arr(cp, *shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32))
    meta = np.array(K.view_meta((side, side), (1, side), 0), np.int64)
    grid_mm, block_mm = K.matmul_launch(1, k, k, "tiled")
    return {
        f"ewise add {n:.0e}": ("ewise.cu", K.binary_name("add", "float32"), "float32",
                               (K.ewise_launch(n)[0],), (K.ewise_launch(n)[1],),
                               lambda cp: (arr(cp, n), arr(cp, n), arr(cp, n), np.int64(n))),
        f"compact transpose {side}^2": (
            "strided.cu", K.strided_name("compact", 4), "", (K.ewise_launch(side ** 2)[0],),
            (K.ewise_launch(side ** 2)[1],),
            lambda cp: (arr(cp, side, side), arr(cp, side * side), cp.asarray(meta),
                        np.int64(side * side))),
        f"softmax rows {rows}x{cols}": (
            "softmax.cu", K.typed_name("softmax_rows", "float32"), "float32", (rows,),
            (K.row_block(cols),), lambda cp: (arr(cp, rows, cols), arr(cp, rows, cols),
                                              np.int64(rows), np.int64(cols))),
        f"matmul tiled {k}^3": (
            "matmul.cu", K.typed_name("matmul_tiled", "float32"), "float32", grid_mm, block_mm,
            lambda cp: (arr(cp, k, k), arr(cp, k, k), arr(cp, k, k), np.int32(k), np.int32(k),
                        np.int32(k))),
    }


def bench_memcheck(q: bool, reps: int) -> None:
    """Time per launch under each NEEDLE_CUDA_EMULATOR_CHECK level, levels interleaved."""
    from needle.backend_cuda.emulator import fake_cupy as cp
    from needle.backend_cuda.emulator import module
    for name, (filename, kname, dtype, grid, block, make) in _kernel_cases(q).items():
        args = make(cp)
        kernels = []
        for level in CHECK_LEVELS:
            os.environ["NEEDLE_CUDA_EMULATOR_CHECK"] = level
            mod = module.load_module(K.source(filename), K.name_expressions(filename, dtype),
                                     K.NVRTC_OPTIONS + K.include_options())
            kernels.append(mod.get_function(kname))
        times: List[List[float]] = [[] for _ in CHECK_LEVELS]
        for _ in range(reps):
            for i, kern in enumerate(kernels):
                t0 = time.perf_counter()
                kern(grid, block, args)
                times[i].append(time.perf_counter() - t0)
        med = [float(np.median(t)) for t in times]
        cells = "  ".join(f"{lv} {m * 1e3:9.2f} ms ({m / med[0]:4.1f}x)"
                          for lv, m in zip(CHECK_LEVELS, med))
        print(f"{name:<26} {cells}", flush=True)
    os.environ.pop("NEEDLE_CUDA_EMULATOR_CHECK", None)


def main() -> None:
    """Print the build and launch figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--memcheck", action="store_true",
                        help="only the per-launch cost of each memory-checking level")
    args = parser.parse_args()
    try:  # the emulator runs a launch on one core: give the NumPy reference one BLAS thread too
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass
    print(f"CUDA emulator (CPU timings, not GPU figures) on {machine()}", flush=True)
    print(f"device {ndl.cuda()}, engine {os.environ.get('NEEDLE_CUDA_EMULATOR_ENGINE', 'fiber')}")
    if args.memcheck:
        bench_memcheck(args.quick, 3 if args.quick else 7)
        return
    bench_build()
    bench_launches(args.quick, 3 if args.quick else 7)


if __name__ == "__main__":
    main()
