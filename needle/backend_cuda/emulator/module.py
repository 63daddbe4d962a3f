"""Load an emulated CUDA module and launch its kernels like CuPy's ``RawModule`` / ``RawKernel``,
with a GPU's launch limits and argument types checked (README.md, "Launch limits", "Arguments").
"""
import ctypes
import functools
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import build as _build
from .build import EmulatorBuildError, EmulatorUnavailable
from .errors import EmulatorError, EmulatorKernelError
from .memcheck import (
    CHECK_LEVELS,
    CheckSpec,
    EmulatorMemoryError,
    block_seed,
    check_level,
    describe_errors,
    param_names,
    pointer_region,
    set_shared_table,
)

__all__ = ["load_module", "KernelLibrary", "Kernel", "EmulatorError", "EmulatorLaunchError",
           "EmulatorKernelError", "EmulatorMemoryError", "EmulatorBuildError",
           "EmulatorUnavailable", "default_engine", "check_level", "ENGINES"]

ENGINES = {"fiber": 0, "threads": 1}
MAX_THREADS = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_SHARED = 48 * 1024
_ERRBUF = 4096
# The threads engine runs blocks of a kernel without __shared__ memory side by side, this many
# CUDA threads (OS threads) at most at once, so that ThreadSanitizer sees races between blocks.
CONCURRENT_THREADS = 2048


class EmulatorLaunchError(EmulatorError):
    """A launch a GPU would refuse; ``status`` is the CUDA driver's name for it."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


def default_engine() -> str:
    """``$NEEDLE_CUDA_EMULATOR_ENGINE`` ("fiber" or "threads"); "threads" when sanitizing."""
    if sanitize_mode():
        return "threads"
    engine = os.environ.get("NEEDLE_CUDA_EMULATOR_ENGINE", "fiber").strip().lower() or "fiber"
    if engine not in ENGINES:
        raise ValueError(f"NEEDLE_CUDA_EMULATOR_ENGINE={engine!r}; expected fiber or threads")
    return engine


def sanitize_mode() -> str:
    """``$NEEDLE_CUDA_EMULATOR_SANITIZE``: "", "thread" or "address" (build with that sanitizer)."""
    mode = os.environ.get("NEEDLE_CUDA_EMULATOR_SANITIZE", "").strip().lower()
    if mode not in ("", "thread", "address"):
        raise ValueError(f"NEEDLE_CUDA_EMULATOR_SANITIZE={mode!r}; expected thread or address")
    return mode


def _dims(what: str, kernel: str, dims: Any) -> Tuple[int, int, int]:
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"kernel '{kernel}': {what} must be an int or a tuple of 1 to 3 ints, "
                        f"got {dims!r}")
    x, y, z = [int(d) for d in dims] + [1] * (3 - len(dims))
    return x, y, z


def check_launch(kernel: str, grid: Tuple[int, int, int], block: Tuple[int, int, int],
                 static_shared: int, dynamic_shared: int) -> None:
    """Raise EmulatorLaunchError where a GPU would refuse the launch."""
    def bad(why: str) -> EmulatorLaunchError:
        return EmulatorLaunchError("CUDA_ERROR_INVALID_VALUE",
                                   f"invalid argument (kernel '{kernel}': {why})")
    if min(grid) < 1 or min(block) < 1:
        raise bad(f"grid {grid} and block {block} must be >= 1 in every dimension")
    for axis, (b, lim) in enumerate(zip(block, MAX_BLOCK)):
        if b > lim:
            raise bad(f"blockDim.{'xyz'[axis]} = {b} exceeds {lim}")
    if block[0] * block[1] * block[2] > MAX_THREADS:
        raise bad(f"block {block} has {block[0] * block[1] * block[2]} threads; at most "
                  f"{MAX_THREADS} per block")
    for axis, (g, lim) in enumerate(zip(grid, MAX_GRID)):
        if g > lim:
            raise bad(f"gridDim.{'xyz'[axis]} = {g} exceeds {lim}")
    if dynamic_shared < 0:
        raise bad(f"shared_mem = {dynamic_shared} is negative")
    if static_shared + dynamic_shared > MAX_SHARED:
        raise bad(f"{static_shared} bytes of static + {dynamic_shared} bytes of dynamic shared "
                  f"memory exceed {MAX_SHARED} bytes (48 KiB) per block")


# ---------------------------------------------------------------------- arguments
def _numpy_dtype(code: str) -> Optional[np.dtype]:
    if code == "bf2":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(code) if code == "?" or code[0] in "iuf" else None


def convert_arg(kernel: str, index: int, code: str, value: Any) -> bytes:
    """The bytes the kernel's parameter ``index`` (type ``code``) receives for ``value``."""
    def err(why: str) -> TypeError:
        return TypeError(f"kernel '{kernel}': argument {index} ({_describe(code)}) {why}; "
                         f"on a GPU it would be misread")
    if code == "p":
        return _pointer(value, err)
    want = _numpy_dtype(code)
    if want is None:
        return _struct(value, code, err)
    if isinstance(value, np.generic):
        return _numpy_scalar(value, want, code, err)
    if isinstance(value, (bool, int, float)):
        return _python_scalar(value, want, code, err)
    raise err(f"got {type(value).__name__}")


def _pointer(value: Any, err: Callable[[str], TypeError]) -> bytes:
    """A device pointer: an array's ``.data.ptr``, or an int address."""
    ptr = getattr(getattr(value, "data", None), "ptr", None)
    if ptr is None and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        ptr = int(value)
    if ptr is None:
        raise err(f"is a pointer but got {type(value).__name__} (pass an array with "
                  f".data.ptr or an int address)")
    return int(ptr).to_bytes(8, "little", signed=False)


def _struct(value: Any, code: str, err: Callable[[str], TypeError]) -> bytes:
    """A struct parameter: raw bytes of the right size."""
    raw = bytes(value) if isinstance(value, (bytes, bytearray)) else np.asarray(value).tobytes()
    if len(raw) != int(code[1:]):
        raise err(f"needs {code[1:]} bytes, got {len(raw)}")
    return raw


def _python_scalar(value: Any, want: np.dtype, code: str, err: Callable[[str], TypeError]
                   ) -> bytes:
    """A Python bool, int or float, as CuPy passes it (1-byte bool, long long, double)."""
    if isinstance(value, bool):
        if code != "?":
            raise err("got a Python bool (CuPy passes it as a 1-byte bool)")
        return np.bool_(value).tobytes()
    if isinstance(value, int):
        if code not in ("i8", "u8"):
            raise err(f"got the Python int {value} (CuPy passes it as a 64-bit long long): "
                      f"pass np.{want.name}({value})")
        try:
            return np.array(value, dtype=want).tobytes()
        except OverflowError:
            raise err(f"got {value}, out of range") from None
    if code != "f8":
        raise err(f"got the Python float {value} (CuPy passes it as a double): "
                  f"pass np.{want.name}({value})")
    return np.float64(value).tobytes()


def _numpy_scalar(value: np.generic, want: np.dtype, code: str, err) -> bytes:
    got = value.dtype
    if got.itemsize != want.itemsize:
        raise err(f"got {got.name} ({got.itemsize} bytes)")
    same = got == want or (got.kind in "iu" and want.kind in "iu")
    raw_bits = code in ("f2", "bf2") and got.kind in "iu"  # 16-bit floats as their raw bits
    if not (same or raw_bits):
        raise err(f"got {got.name}")
    return value.tobytes()


def _describe(code: str) -> str:
    names = {"p": "pointer", "?": "bool", "f2": "__half", "bf2": "__nv_bfloat16", "f4": "float",
             "f8": "double", "i1": "signed char", "i2": "short", "i4": "int", "i8": "long long",
             "u1": "unsigned char", "u2": "unsigned short", "u4": "unsigned int",
             "u8": "unsigned long long"}
    return names.get(code, f"{code[1:]}-byte struct")


# ---------------------------------------------------------------------- module and kernels
class Kernel:
    """One kernel of an emulated module, callable like ``cupy.RawKernel``."""

    def __init__(self, module: "KernelLibrary", index: int, name: str, params: List[str],
                 static_shared: int):
        self.module, self.index, self.name = module, index, name
        self.param_types = params  # type codes: "p", "f4", "i8", "bf2", ...
        self.static_shared_bytes = static_shared

    def __call__(self, grid: Any, block: Any, args: Sequence[Any], shared_mem: int = 0,
                 **kwargs: Any) -> None:
        """Run the kernel over ``grid`` x ``block`` threads with ``args``."""
        g, b = _dims("grid", self.name, grid), _dims("block", self.name, block)
        check_launch(self.name, g, b, self.static_shared_bytes, int(shared_mem))
        args = tuple(args)
        if len(args) != len(self.param_types):
            raise TypeError(f"kernel '{self.name}' takes {len(self.param_types)} arguments "
                            f"({', '.join(map(_describe, self.param_types))}), got {len(args)}")
        slots = [convert_arg(self.name, i, c, a) for i, (c, a) in
                 enumerate(zip(self.param_types, args))]
        bufs = [ctypes.create_string_buffer(s, max(len(s), 16)) for s in slots]
        argv = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(x) for x in bufs])
        spec = self._check_spec(args, int(shared_mem))
        err = ctypes.create_string_buffer(_ERRBUF)
        rc = self.module.lib.cuda_emu_launch(self.index, (ctypes.c_uint * 3)(*g),
                                             (ctypes.c_uint * 3)(*b), int(shared_mem), argv,
                                             ENGINES[self.module.engine], ctypes.byref(spec),
                                             err, _ERRBUF)
        if rc != 0:
            raise describe_errors(err.value.decode(errors="replace"), self.module.path)

    def _check_spec(self, args: Sequence[Any], shared_mem: int) -> CheckSpec:
        """What the launch checks (each pointer argument's allocation), the block order, and
        whether the threads engine runs blocks side by side: only without __shared__ memory,
        of which there is one static copy per module."""
        level = self.module.check
        names = param_names(self.module.code, self.name.split("<", 1)[0])
        regions = [pointer_region(i, names[i] if i < len(names) else "", a)
                   for i, (c, a) in enumerate(zip(self.param_types, args)) if c == "p"]
        side_by_side = self.module.engine == "threads" and shared_mem == 0 \
            and self.static_shared_bytes == 0
        return CheckSpec.make(CHECK_LEVELS[level], block_seed(level), regions,
                              CONCURRENT_THREADS if side_by_side else 0)


class KernelLibrary:
    """A compiled source's kernels (like ``cupy.RawModule``)."""

    def __init__(self, path: Path, info: Dict[str, Any], engine: str, check: str = "off",
                 code: str = ""):
        self.path, self.engine, self.check, self.code = path, engine, check, code
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        lib.cuda_emu_name.restype = ctypes.c_char_p
        lib.cuda_emu_signature.restype = ctypes.c_char_p
        lib.cuda_emu_address.restype = ctypes.c_void_p
        lib.cuda_emu_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        self.lib = lib
        address = ctypes.cast(lib.cuda_emu_count, ctypes.c_void_p).value
        assert address is not None, "a loaded library's function has an address"
        base = address - int(info["anchor"])
        count = lib.cuda_emu_count()
        funcs = [info["functions"].get(str(lib.cuda_emu_address(i) - base), "")
                 for i in range(count)]
        if hasattr(lib, "cuda_emu_set_shared"):
            set_shared_table(lib, info.get("shared", []), funcs, code)
        # __shared__ variables of __device__ functions count for every kernel: an upper bound,
        # since which kernel calls which function is not in the symbol table
        elsewhere = sum(v for owner, v in info["statics"].items() if owner not in funcs)
        self.kernels: Dict[str, Kernel] = {}
        for i in range(count):
            name = lib.cuda_emu_name(i).decode()
            sig = lib.cuda_emu_signature(i).decode()
            shared = info["statics"].get(funcs[i], 0) + elsewhere
            self.kernels[name] = Kernel(self, i, name, sig.split(",") if sig else [], shared)

    def get_function(self, name: str) -> Kernel:
        """The kernel for a name expression given to ``load_module``."""
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in this module; it has "
                           f"{sorted(self.kernels)}") from None


def load_module(code: str, name_expressions: Sequence[str], options: Sequence[str] = (),
                engine: Optional[str] = None, filename: Optional[str] = None) -> KernelLibrary:
    """Compile ``code`` (cached) with ``name_expressions`` instantiated and load it.

    ``filename`` names the source in error messages (default: the kernels/*.cu file whose text
    ``code`` is, else the first kernel's name).
    """
    engine = default_engine() if engine is None else engine
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; expected one of {sorted(ENGINES)}")
    filename = filename or source_name(code)
    sanitize = sanitize_mode()
    return _load(code, tuple(name_expressions), tuple(options), engine, filename, sanitize,
                 "off" if sanitize else check_level())


def source_name(code: str) -> str:
    """A name for ``code`` in messages: the file its first ``#line`` directive names (the
    backend's kernels/*.cu sources carry one), else its first kernel's name."""
    m = re.search(r'^\s*#line\s+\d+\s+"([^"]+)"', code, re.M)
    if m:
        return m.group(1)
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", code)
    return f"{m.group(1)}.cu" if m else "kernel.cu"


@functools.lru_cache(maxsize=None)
def _load(code: str, names: Tuple[str, ...], options: Tuple[str, ...], engine: str,
          filename: str, sanitize: str, check: str) -> KernelLibrary:
    path, info = _build.build(code, names, options, filename, sanitize, check != "off")
    return KernelLibrary(path, info, engine, check, code)
