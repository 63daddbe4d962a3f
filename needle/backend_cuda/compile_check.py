"""Compile every kernel source through NVRTC, with no GPU and no CuPy (used by CI).
NVRTC and headers come from the ``nvidia-cuda-*-cu12`` wheels; templates for every dtype."""
import argparse
import ctypes
import functools
import glob
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from . import kernel_specs
from .emulator.build import site_dirs as _site_dirs


class NVRTCError(RuntimeError):
    """A kernel failed to compile; the message holds NVRTC's log."""


def _cuda_roots() -> List[str]:
    """CUDA toolkit folders: $CUDA_PATH, $CUDA_HOME, /usr/local/cuda."""
    roots = [os.environ.get(var, "") for var in ("CUDA_PATH", "CUDA_HOME")]
    return [r for r in roots + ["/usr/local/cuda"] if r and os.path.isdir(r)]


def find_nvrtc() -> Optional[str]:
    """Path of libnvrtc.so (or $NEEDLE_NVRTC), None when absent: the pip wheels' first
    (``nvidia/cuda_nvrtc/lib`` for CUDA 12, ``nvidia/cu13/lib`` for CUDA 13), then a toolkit's."""
    env = os.environ.get("NEEDLE_NVRTC")
    if env:
        return env
    folders = [os.path.join(d, "nvidia", "*", "lib") for d in _site_dirs()]
    folders += [os.path.join(r, "lib64") for r in _cuda_roots()]
    for folder in folders:
        hits = sorted(glob.glob(os.path.join(folder, "libnvrtc.so*")))
        hits = [h for h in hits if ".alt." not in h and "builtins" not in h]
        if hits:
            return hits[0]
    return None


def find_cuda_include() -> Optional[str]:
    """A folder holding cuda_fp16.h: the one beside libnvrtc first (the headers of the same
    CUDA version), then the pip runtime wheels', then a toolkit's."""
    nvrtc = find_nvrtc()
    cands = [os.path.join(os.path.dirname(os.path.dirname(nvrtc)), "include")] if nvrtc else []
    cands += [os.path.join(d, "nvidia", "cuda_runtime", "include") for d in _site_dirs()]
    cands += [c for d in _site_dirs() for c in sorted(glob.glob(os.path.join(d, "nvidia", "cu*",
                                                                              "include")))]
    cands += [os.path.join(r, "include") for r in _cuda_roots()]
    for c in cands:
        if os.path.isfile(os.path.join(c, "cuda_fp16.h")):
            return c
    return None


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    path = find_nvrtc()
    if path is None:
        raise FileNotFoundError("libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12")
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise NVRTCError(f"{what}: {lib.nvrtcGetErrorString(status).decode()}")


def compile_source(src: str, name: str = "kernel.cu", name_expressions: Sequence[str] = (),
                   arch: str = "compute_90", options: Sequence[str] = ()) -> str:
    """Compile CUDA C ``src`` to PTX with NVRTC; raise NVRTCError with the log on failure."""
    lib = _lib()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0,
                                       None, None), "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(lib, lib.nvrtcAddNameExpression(prog, expr.encode()),
                   f"nvrtcAddNameExpression({expr})")
        opts = [f"--gpu-architecture={arch}", *kernel_specs.NVRTC_OPTIONS,
                *kernel_specs.include_options(), *options]
        inc = find_cuda_include()
        if inc is not None:
            opts.append("-I" + inc)
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if status != 0:
            raise NVRTCError(f"{name} failed to compile ({' '.join(opts)}):\n"
                             f"{log.value.decode(errors='replace')}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_kernel_file(filename: str, arch: str = "compute_90") -> str:
    """Compile ``kernels/<filename>`` with every template instantiation; returns PTX."""
    return compile_source(kernel_specs.source(filename), filename,
                          kernel_specs.name_expressions(filename), arch)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line entry point: compile all kernels and print one line per file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="compute_90")
    args = parser.parse_args(argv)
    for f in kernel_specs.KERNEL_FILES:  # raises on the first that fails
        n = len(compile_kernel_file(f, args.arch))
        print(f"ok  {f:<14} {n:>9} bytes of PTX  ({Path(kernel_specs.KERNEL_DIR, f)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
