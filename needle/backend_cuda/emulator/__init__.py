"""CUDA on the CPU (README, "CUDA without a GPU"). ``cupy_module(name)`` is the one switch: the
backend imports CuPy, ``cupyx`` and cuBLAS through it, so its code path is a GPU's."""
import functools
import importlib
import os
import warnings
from types import ModuleType

ENV = "NEEDLE_CUDA_EMULATOR"
_MODES = {**dict.fromkeys(("", "0", "false", "no", "off"), "off"),
          **dict.fromkeys(("1", "true", "yes", "on"), "on"), "force": "force"}
# the real module -> the attribute of fake_cupy standing in for it
_STAND_INS = {"cupy": None, "cupyx": "cupyx", "cupy_backends.cuda.libs.cublas": "cublas"}


def setting() -> str:
    """``off``, ``on`` or ``force``: what NEEDLE_CUDA_EMULATOR asks for."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw not in _MODES:
        raise ValueError(f"{ENV}={raw!r}; expected 1 (emulate CUDA when no GPU is present), "
                         f"force (emulate even with a GPU) or 0")
    return _MODES[raw]


def real_gpu_count() -> int:
    """GPUs the real CuPy sees (0 without CuPy, a driver or a GPU)."""
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, or a runtime/driver mismatch
        return 0


@functools.lru_cache(maxsize=None)
def unavailable_reason() -> str:
    """Why kernels cannot be built here (no C++ compiler, NVIDIA's header wheels missing), or ""."""
    from . import build
    try:
        build.compiler()
        build.cuda_include_dirs()
    except build.EmulatorUnavailable as e:
        return str(e)
    return ""


@functools.lru_cache(maxsize=None)
def active() -> bool:
    """True when this process emulates CUDA (decided once, at the first CUDA import)."""
    mode = setting()
    wanted = mode == "force" or (mode == "on" and real_gpu_count() == 0)
    if wanted and unavailable_reason():
        warnings.warn(f"{ENV}={os.environ[ENV]} but the CUDA emulator cannot run here: "
                      f"{unavailable_reason()}; ndl.cuda() stays disabled", RuntimeWarning,
                      stacklevel=2)
        return False
    return wanted


def cupy_module(name: str = "cupy") -> ModuleType:
    """The real ``cupy`` / ``cupyx`` / ``cupy_backends.cuda.libs.cublas``, or its stand-in."""
    if name not in _STAND_INS:
        raise ValueError(f"cupy_module: no stand-in for {name!r}; known: {sorted(_STAND_INS)}")
    if not active():
        return importlib.import_module(name)  # ImportError without CuPy: cuda stays disabled
    from . import fake_cupy
    attr = _STAND_INS[name]
    return fake_cupy if attr is None else getattr(fake_cupy, attr)
