"""CuPy plumbing shared by the CUDA primitives and fused ops: each launch under the output's
``cupy.cuda.Device``; modules compiled per (file, dtype, GPU) on first use."""
import functools
import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ..backend_ndarray.dtypes import bfloat16 as BF16
from ..process_state import switches
from . import buffer_pool, kernel_specs
from .emulator import cupy_module

cp = cupy_module()  # CuPy, or the emulator's stand-in under NEEDLE_CUDA_EMULATOR

# dtype -> its name: NumPy 2's ``dtype.name`` is Python code, and every launch needs the name
DTYPE_NAME: Dict[np.dtype, str] = {np.dtype(t): np.dtype(t).name for t in (
    np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
    np.uint32, np.int64, np.uint64, np.bool_)}
DTYPE_NAME[BF16] = "bfloat16"
_META_CACHE: Dict[Tuple[int, Tuple[int, ...]], Any] = {}
_META_CACHE_MAX = 4096
PEAK: Dict[int, int] = {}  # bytes in use at most, per GPU (read and set by Array too)


@functools.lru_cache(maxsize=None)
def device(index: int) -> Any:
    """The CuPy device object for GPU ``index`` (usable as a context manager)."""
    return cp.cuda.Device(index)


def device_count() -> int:
    """Number of visible GPUs (0 when the driver or runtime is missing); a bad setting (the
    emulator's NEEDLE_CUDA_EMULATOR_DEVICES=x) raises, naming it, rather than reading as 0."""
    try:
        return cp.cuda.runtime.getDeviceCount()
    except ValueError:  # a setting the user wrote: not "no GPU"
        raise
    except Exception:  # no driver, no GPU, or a runtime/driver mismatch
        return 0


@functools.lru_cache(maxsize=None)
def num_sms(index: int) -> int:
    """Streaming multiprocessors on GPU ``index``."""
    return int(device(index).attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def compute_capability(index: int) -> int:
    """Compute capability as an int, e.g. 90 for an H100."""
    return int(device(index).compute_capability)


def check_bfloat16(index: int) -> None:
    """Raise TypeError unless GPU ``index`` computes in bfloat16 (sm_80 and newer)."""
    cc = compute_capability(index)
    if cc < 80:
        raise TypeError(f"bfloat16 on cuda({index}) needs compute capability >= 8.0 "
                        f"(Ampere or newer); this GPU is {cc // 10}.{cc % 10}. "
                        f"Use float16 or float32.")


@functools.lru_cache(maxsize=None)
def _module(filename: str, dtype: str, index: int) -> Any:
    with device(index):
        return cp.RawModule(code=kernel_specs.named_source(filename),
                            options=kernel_specs.NVRTC_OPTIONS + kernel_specs.include_options(),
                            name_expressions=kernel_specs.name_expressions(filename, dtype))


@functools.lru_cache(maxsize=None)
def kernel(filename: str, name: str, dtype: str, index: int) -> Any:
    """The compiled kernel ``name`` (a name expression) from ``filename`` on GPU ``index``.

    ``dtype`` selects which instantiations the module holds ("" for all of the file's).
    """
    with device(index):
        return _module(filename, dtype, index).get_function(name)


def launch(k: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
           index: int) -> None:
    """Launch ``k`` (a ``cupy.RawKernel``) on GPU ``index`` on CuPy's current stream."""
    if switches.profiler is not None:  # needle.profiler records: the launch timed
        switches.profiler.launch(_launch, k, grid, block, args, index)
        return
    with device(index):  # _launch's body, inline: it runs for every kernel
        k(tuple(grid), tuple(block), tuple(args))


def _launch(k: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
            index: int) -> None:
    with device(index):
        k(tuple(grid), tuple(block), tuple(args))


# the buffers of the CUDA graph being captured (graphs.graph), which cached device arrays join
CAPTURE_KEEP: List[Any] = [None]
# > 0 while a CUDA graph's work is warmed up and captured: cached device arrays stay cached
# (a capture cannot upload the one a clear dropped)
HOLD_CACHES = [0]


def keep_for_capture(*arrays: Any) -> None:
    """A CUDA graph being captured keeps these cached device arrays alive (it reads them
    through addresses, and a cache may drop them later)."""
    if CAPTURE_KEEP[0] is not None:
        CAPTURE_KEEP[0].extend(arrays)


def view_meta(shape: Sequence[int], strides: Sequence[int], offset: int, index: int) -> Any:
    """A cached device int64 array [ndim, offset, *shape, *strides] for the strided kernels."""
    key = (index, tuple(kernel_specs.view_meta(tuple(shape), tuple(strides), offset)))
    meta = _META_CACHE.get(key)
    if meta is None:
        if len(_META_CACHE) >= _META_CACHE_MAX and not HOLD_CACHES[0]:
            _META_CACHE.clear()
        with device(index):
            meta = cp.asarray(np.array(key[1], dtype=np.int64))
        _META_CACHE[key] = meta
    if CAPTURE_KEEP[0] is not None:  # (a global read, not a call: this runs per launch)
        keep_for_capture(meta)
    return meta


def scalar_arg(val: Any, dtype: str) -> Any:
    """``val`` as the accumulator-typed NumPy scalar a ``scalar_*`` kernel takes."""
    return np.float64(val) if dtype == "float64" else np.float32(val)


def acc_arg(val: float, x: Any) -> Any:
    """``val`` as the accumulation-typed scalar (float32, float64 for float64) of Array ``x``."""
    return scalar_arg(val, DTYPE_NAME[x.dtype])


# ---------------------------------------------------------------------- memory accounting
def memory_stats(index: int = 0) -> Dict[str, int]:
    """Bytes in use / reserved / free-in-pool / peak-in-use on GPU ``index``: CuPy's pool,
    with the buffers waiting in needle's pool (``buffer_pool``) counted as free.

    The peak is sampled whenever needle makes a buffer on that GPU (``Array``; CuPy keeps none).
    """
    with device(index):
        pool = cp.get_default_memory_pool()
        held = buffer_pool.held_bytes(index)
        used = pool.used_bytes() - held
        return {"bytes_in_use": used, "bytes_reserved": pool.total_bytes(),
                "bytes_free_in_pool": pool.free_bytes() + held,
                "peak_bytes_in_use": max(PEAK.get(index, 0), used)}


def reset_peak_memory(index: int = 0) -> None:
    """Restart the peak from the bytes in use now."""
    with device(index):
        PEAK[index] = cp.get_default_memory_pool().used_bytes() - buffer_pool.held_bytes(index)


def matmul_mode_from_env() -> str:
    """NEEDLE_CUDA_MATMUL: "cublas" (default), "tiled" or "naive"."""
    mode = os.environ.get("NEEDLE_CUDA_MATMUL", "cublas").strip().lower()
    if mode not in ("cublas", "tiled", "naive"):
        raise ValueError(f"NEEDLE_CUDA_MATMUL={mode!r}; expected cublas, tiled or naive")
    return mode


def reduce_mode(mode: str, where: str) -> str:
    """``mode`` when it is a kernel path this tree has ("fast": reduce_fast.cu and
    norm_fast.cu, "course": reduce.cu, softmax.cu and layernorm.cu), else ValueError naming
    ``where`` it was asked for."""
    if mode not in ("fast", "course"):
        raise ValueError(f"{where}: unknown reduce kernel {mode!r}; expected fast or course")
    if mode == "fast" and not fast_kernels():
        raise ValueError(f"{where}: this tree has no fast reduction kernels (a student "
                         f"release reduces with the course's reduce.cu)")
    return mode


def fast_kernels() -> bool:
    """Whether this tree has the fast reductions, softmax and layer norm (not a student
    release)."""
    return all(f in kernel_specs.KERNEL_FILES for f in kernel_specs.FAST_FILES)


def reduce_mode_from_env() -> str:
    """NEEDLE_CUDA_REDUCE: "fast" (the default where the fast kernels exist) or "course"."""
    default = "fast" if fast_kernels() else "course"
    raw = os.environ.get("NEEDLE_CUDA_REDUCE", default).strip().lower()
    return reduce_mode(raw, f"NEEDLE_CUDA_REDUCE={raw!r}")


# The reductions', softmax's and layer norm's kernels: "fast" or "course" (ndarray_backend_cuda's
# set_reduce_kernel changes it)
REDUCE_MODE = [reduce_mode_from_env()]
