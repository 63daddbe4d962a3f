"""Memory checking of emulated kernels: what a launch tells the checker, and its reports.
``NEEDLE_CUDA_EMULATOR_CHECK`` picks the level: ``bounds`` (default), ``full`` or ``off``
(README.md, "Memory checking").
"""
import ctypes
import functools
import os
import re
import shutil
import subprocess
import weakref
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .build import function_base_name, without_params
from .errors import EmulatorKernelError, EmulatorMemoryError

__all__ = ["CHECK_LEVELS", "check_level", "block_seed", "pointer_region", "CheckSpec",
           "describe_errors", "EmulatorMemoryError", "on_empty", "set_shared_table",
           "param_names"]

CHECK_ENV = "NEEDLE_CUDA_EMULATOR_CHECK"
SEED_ENV = "NEEDLE_CUDA_EMULATOR_SEED"
CHECK_LEVELS = {"off": 0, "bounds": 1, "full": 2}  # cuda_emu_engine.h's CheckLevel
_MEMORY_ERRORS = ("out-of-bounds", "shared-memory race", "uninitialised")
POISON = 0xA5  # what cupy.empty's bytes hold in full mode until something writes them
# full mode: allocation address -> one byte per byte of it, 1 once a kernel wrote it
_UNWRITTEN: Dict[int, np.ndarray] = {}


def check_level() -> str:
    """``$NEEDLE_CUDA_EMULATOR_CHECK``: "bounds" (default), "full" or "off"."""
    level = os.environ.get(CHECK_ENV, "bounds").strip().lower() or "bounds"
    if level not in CHECK_LEVELS:
        raise ValueError(f"{CHECK_ENV}={level!r}; expected bounds (default: out-of-bounds "
                         f"accesses), full (also uninitialised shared reads and shared-memory "
                         f"races) or off")
    return level


def block_seed(level: str) -> int:
    """The block order's seed: ``$NEEDLE_CUDA_EMULATOR_SEED``, else 1 in full mode, else 0."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return 1 if level == "full" else 0
    try:
        seed = int(raw, 0)
    except ValueError:
        seed = -1
    if seed < 0:
        raise ValueError(f"{SEED_ENV}={raw!r}; expected a non-negative integer")
    return seed


class Region(ctypes.Structure):
    """One pointer argument's allocation (cuda_emu_engine.h's Region)."""
    _fields_ = [("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64), ("ptr", ctypes.c_uint64),
                ("label", ctypes.c_char_p), ("init", ctypes.c_void_p)]


def on_empty(arr: np.ndarray) -> None:
    """Full mode: poison a new ``cupy.empty`` allocation and track which bytes get written."""
    if check_level() != "full" or arr.nbytes == 0:
        return
    raw = arr.view(np.ndarray).reshape(-1).view(np.uint8)
    raw[...] = POISON
    addr = int(arr.__array_interface__["data"][0])
    _UNWRITTEN[addr] = np.zeros(arr.nbytes, np.uint8)
    weakref.finalize(arr, _UNWRITTEN.pop, addr, None)


def _init_shadow(mem: Any, lo: int) -> Optional[np.ndarray]:
    """The written-bytes map of a tracked allocation, or None once it counts as initialised
    (every byte written, or the host changed a byte the kernels did not write)."""
    shadow = _UNWRITTEN.get(lo)
    if shadow is None:
        return None
    raw = np.asarray(mem).reshape(-1).view(np.uint8)
    unwritten = shadow == 0
    if not unwritten.any() or (raw[unwritten] != POISON).any():
        _UNWRITTEN.pop(lo, None)
        return None
    return shadow


class CheckSpec(ctypes.Structure):
    """What one launch checks (cuda_emu_engine.h's CheckSpec)."""
    _fields_ = [("level", ctypes.c_int32), ("nregions", ctypes.c_int32),
                ("unbounded", ctypes.c_int32), ("concurrent", ctypes.c_int32),
                ("seed", ctypes.c_uint64), ("regions", ctypes.POINTER(Region))]

    @classmethod
    def make(cls, level: int, seed: int, regions: Sequence[Optional[Region]],
             concurrent: int = 0) -> "CheckSpec":
        """A spec over ``regions`` (None: a pointer argument without known bounds); with
        ``concurrent``, the threads engine runs that many CUDA threads of several blocks at
        once."""
        known = [r for r in regions if r is not None]
        array = (Region * max(len(known), 1))(*known)
        spec = cls(level, len(known), int(len(known) < len(regions)), concurrent, seed, array)
        spec._keep = (array, known)  # the array and its labels must outlive the launch
        return spec


def pointer_region(index: int, name: str, value: Any) -> Optional[Region]:
    """The allocation a pointer argument points into, or None where it is unknown."""
    mem = getattr(getattr(value, "data", None), "mem", None)
    ptr = getattr(getattr(value, "data", None), "ptr", None)
    iface = getattr(mem, "__array_interface__", None)
    if ptr is None or iface is None:
        return None
    lo = int(iface["data"][0])
    nbytes = int(getattr(mem, "nbytes", 0))
    dtype = getattr(value, "dtype", None)
    kind = f"{dtype}, " if dtype is not None else ""
    label = f"argument {index}" + (f" '{name}'" if name else "") + f" ({kind}{nbytes} bytes)"
    shadow = _init_shadow(mem, lo) if _UNWRITTEN else None
    return Region(lo, lo + nbytes, int(ptr), label.encode(),
                  None if shadow is None else shadow.ctypes.data)


def describe_errors(message: str, library: Path) -> EmulatorKernelError:
    """The exception for a failed launch's message, with code addresses as file:line."""
    text = re.sub(r"\{pc:0x([0-9a-f]+)\}", lambda m: _where(str(library), int(m.group(1), 16)),
                  message)
    kind = EmulatorMemoryError if any(k in text for k in _MEMORY_ERRORS) else EmulatorKernelError
    return kind(text)


@functools.lru_cache(maxsize=256)
def _where(library: str, offset: int) -> str:
    """``file:line`` of a code address (its return address: the call is one byte before),
    with the call sites it was inlined into."""
    frames = addr2line(library, offset - 1)
    if not frames:
        return f"{Path(library).name}+0x{offset:x} (no line table)"
    (func, loc), callers = frames[0], frames[1:]
    text = f"{loc} (in {func})"
    for caller_func, caller_loc in callers:
        text += f", inlined into {caller_func} at {caller_loc}"
    return text


def addr2line(library: str, offset: int) -> List[Any]:
    """[(function, file:line), ...] innermost first, from the library's line table."""
    tool = shutil.which("addr2line")
    if tool is None:
        return []
    out = subprocess.run([tool, "-e", library, "-f", "-C", "-i", hex(offset)],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    frames = []
    for func, loc in zip(out[0::2], out[1::2]):
        loc = re.sub(r" \(discriminator \d+\)$", "", loc)
        if not loc.startswith("??"):
            frames.append((without_params(re.sub(r"^void ", "", func)), loc))
    return frames


# ---------------------------------------------------------------------- names
def set_shared_table(lib: ctypes.CDLL, shared: Sequence[Sequence[Any]], kernels: List[str],
                     code: str) -> None:
    """Tell a memory-checked library where its __shared__ variables are, and which kernel owns
    each (-1: a __device__ function's, legal in every kernel; -2: a kernel's not in the table)."""
    globals_ = _global_names(code)

    def owner(name: str) -> int:
        if name in kernels:
            return kernels.index(name)
        return -2 if function_base_name(name) in globals_ else -1
    n = len(shared)
    owners = (ctypes.c_int * max(n, 1))(*[owner(s[3]) for s in shared])
    offsets = (ctypes.c_ulonglong * max(n, 1))(*[int(s[0]) for s in shared])
    sizes = (ctypes.c_ulonglong * max(n, 1))(*[int(s[1]) for s in shared])
    names = (ctypes.c_char_p * max(n, 1))(*[str(s[2]).encode() for s in shared])
    lib.cuda_emu_set_shared(n, offsets, sizes, names, owners)  # copies the names


def _global_names(code: str) -> List[str]:
    """The names of the source's __global__ functions."""
    return re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", code)


@functools.lru_cache(maxsize=None)
def param_names(code: str, kernel: str) -> List[str]:
    """The parameter names of the __global__ function ``kernel`` in ``code`` ([] if absent)."""
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?" + re.escape(kernel)
                  + r"\s*\(([^)]*)\)", code)
    if not m:
        return []
    return [re.findall(r"\w+", p)[-1] if re.findall(r"\w+", p) else ""
            for p in m.group(1).split(",")]
