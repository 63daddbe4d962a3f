"""Compile a CUDA source unchanged by ``$CXX`` (default g++) against ``cuda_emu.h`` into a host
shared library for the emulator, cached on disk (README.md, "Build cache"). A generated wrapper
takes the address of every name expression: exactly the instantiations CuPy's ``RawModule``
would compile exist.
"""
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

EMU_DIR = Path(__file__).resolve().parent
HEADERS = ("cuda_emu.h", "cuda_emu_engine.h", "cuda_emu_run.h", "cuda_emu_check.h")
WHEELS = {"cuda_runtime": "nvidia-cuda-runtime-cu12", "cuda_nvcc": "nvidia-cuda-nvcc-cu12",
          "cuda_cccl": "nvidia-cuda-cccl-cu12"}
BASE_FLAGS = ("-fPIC", "-shared", "-fvisibility=hidden", "-fno-gnu-unique", "-w", "-pthread")
# -O1: the kernels are short and mostly memory bound; -O2 roughly doubles compile time.
OPT_FLAGS = ("-O1",)
# Memory checking (cuda_emu_check.h): g++ calls __asan_loadN/storeN_noabort before every access
# (call mode, no shadow memory: the emulator defines those functions); -g1 keeps the line table
# that turns a faulting access's code address into file:line. TLS descriptors (gnu2) make the
# checker's per-access thread-local read a load instead of a call to __tls_get_addr.
CHECK_FLAGS = ("-O1", "-g1", "-DCUDA_EMU_MEMCHECK=1", "-fsanitize=kernel-address",
               *(("-mtls-dialect=gnu2",) if platform.machine() == "x86_64" else ()),
               "--param", "asan-instrumentation-with-call-threshold=0", "--param", "asan-stack=0",
               "--param", "asan-globals=0", "-fno-sanitize-address-use-after-scope")
# Under ThreadSanitizer the kernels' thread_locals are initial-exec: with glibc's default dynamic
# TLS, every CUDA thread's exit frees blocks inside ld.so, a race TSan reports and tsan.supp
# suppresses, and checking a suppression symbolizes, which freezes gcc's symbolizer (libbacktrace)
# to the libraries loaded so far: a later module's frames print as <null>. The static TLS this
# takes is reserved by sanitize.py (GLIBC_TUNABLES, STATIC_TLS_BYTES).
SANITIZE_FLAGS = {
    "thread": ("-fsanitize=thread", "-g", "-O1", "-ftls-model=initial-exec"),
    "address": ("-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"),
}
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+((?:__align__\(\s*\d+\s*\)\s+)?)([A-Za-z_][\w:<>, ]*?)\s+"
    r"([A-Za-z_]\w*)\s*\[\s*\]\s*;")


class EmulatorUnavailable(RuntimeError):
    """No C++ compiler, or NVIDIA's headers (the pip wheels) are missing."""


class EmulatorBuildError(RuntimeError):
    """The C++ compiler rejected a kernel source; the message holds its log."""


def compiler() -> str:
    """Path of the C++ compiler (``$CXX`` or g++); raises EmulatorUnavailable when absent."""
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        raise EmulatorUnavailable(f"the CUDA emulator needs a C++ compiler: {cxx!r} not found "
                                  f"(install g++ or set CXX)")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    """``cxx --version``'s first line (part of the cache key)."""
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def site_dirs() -> List[str]:
    """The site-packages folders this Python reads (where NVIDIA's wheels are)."""
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> Tuple[str, ...]:
    """The include folders of the three NVIDIA wheels; raises EmulatorUnavailable if one lacks."""
    found, missing = [], []
    for sub, wheel in WHEELS.items():
        hits = [os.path.join(d, "nvidia", sub, "include") for d in site_dirs()]
        hits = [h for h in hits if os.path.isdir(h)]
        if hits:
            found.append(hits[0])
        else:
            missing.append(wheel)
    if missing:
        raise EmulatorUnavailable("the CUDA emulator needs NVIDIA's headers: pip install "
                                  + " ".join(missing) + " (or pip install -e '.[dev]')")
    return tuple(found)


def translate_options(options: Sequence[str]) -> Tuple[List[str], List[str]]:
    """NVRTC options -> (g++ flags, include dirs); GPU-only options are dropped."""
    flags, incs = ["-std=c++17"], []
    it = iter(options)
    for opt in it:
        if opt in ("-I", "--include-path"):
            incs.append(next(it))
        elif opt.startswith("--include-path="):
            incs.append(opt.split("=", 1)[1])
        elif opt.startswith("-I"):
            incs.append(opt[2:])
        elif opt.startswith(("-std=", "--std=")):
            flags[0] = "-std=" + opt.split("=", 1)[1]
        elif opt.startswith(("-D", "--define-macro=")):
            flags.append("-D" + opt.split("=", 1)[1] if opt.startswith("--") else opt)
        # --gpu-architecture, -arch, --use_fast_math, -lineinfo ...: no meaning on the host
    return flags, incs


def _tool_env() -> Dict[str, str]:
    """The environment for g++ / objdump: without a sanitizer runtime preloaded into them."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def cache_dir() -> Path:
    """Where built libraries are kept ($NEEDLE_CUDA_EMULATOR_CACHE overrides)."""
    env = os.environ.get("NEEDLE_CUDA_EMULATOR_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "needle" / "cuda_emulator"


def rewrite_extern_shared(code: str) -> str:
    """``extern __shared__ T name[];`` -> a reference to this launch's dynamic shared memory."""
    return _EXTERN_SHARED.sub(
        lambda m: f"{m.group(2)} (&{m.group(3)})[] = "
                  f"*reinterpret_cast<{m.group(2)} (*)[]>(::cuda_emu::dynamic_shared());", code)


def wrapper_source(code: str, name_expressions: Sequence[str], filename: str) -> str:
    """The translation unit: emulator header, the kernel source, the table of kernels."""
    rows = "\n".join(f"  ::cuda_emu::entry({json.dumps(n)}, &{n})," for n in name_expressions)
    return (f'#include "cuda_emu.h"\n#line 1 {json.dumps(filename)}\n'
            f"{rewrite_extern_shared(code)}\n"
            f'#line 1 "cuda_emu_kernel_table"\n'
            f"static const ::cuda_emu::Entry cuda_emu_entries[] = {{\n{rows}\n}};\n"
            f"CUDA_EMU_API(cuda_emu_entries)\n")


def _headers_digest(include_dirs: Sequence[str]) -> str:
    h = hashlib.sha256()
    for name in (*HEADERS, "build.py"):  # the emulator itself, this file's parsing included
        h.update((EMU_DIR / name).read_bytes())
    for d in include_dirs:  # the headers a source can include from its -I folders
        for p in sorted(Path(d).glob("*")):
            if p.suffix in (".h", ".cuh", ".hpp", ".inc") and p.is_file():
                h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def build_command(cxx: str, flags: Sequence[str], include_dirs: Sequence[str], sanitize: str,
                  src: str, out: str, check: bool = False) -> List[str]:
    """The compiler command line for one module (``check``: memory-checked, cuda_emu_check.h)."""
    extra = SANITIZE_FLAGS[sanitize] if sanitize else (CHECK_FLAGS if check else OPT_FLAGS)
    incs = [str(EMU_DIR), *include_dirs, *cuda_include_dirs()]
    return [cxx, *flags, *BASE_FLAGS, *extra, *[f"-I{d}" for d in incs], src, "-o", out]


def static_shared(so_path: str) -> Dict[str, object]:
    """Function-local statics (the __shared__ variables) and function offsets, from objdump.

    Returns {"functions": {offset: name}, "statics": {owner function: bytes},
    "anchor": offset of cuda_emu_count,
    "shared": [[offset, bytes, short name, owner function], ...]}.
    """
    out = subprocess.run(["objdump", "-t", "-C", so_path], capture_output=True, text=True,
                         check=False, env=_tool_env()).stdout
    funcs: Dict[str, str] = {}
    objects: List[Tuple[str, int, int]] = []
    anchor = None
    sym = re.compile(r"^([0-9a-f]+)\s+\S+\s+([FO ])\s+(\S+)\s+([0-9a-f]+)\s+(.*)$")
    for line in out.splitlines():
        m = sym.match(line)
        if not m:
            continue
        addr, kind, section, size, name = m.groups()
        if kind == "F" and name == "cuda_emu_count":
            anchor = int(addr, 16)
        elif kind == "F" and section == ".text":
            funcs[str(int(addr, 16))] = re.sub(r"^void ", "", name)
        elif kind == "O" and section in (".bss", ".data") and "::" in name \
                and not name.startswith(("cuda_emu::", "guard variable")):
            objects.append((name, int(size, 16), int(addr, 16)))
    names = set(funcs.values())
    statics: Dict[str, int] = {}
    shared: List[Tuple[int, int, str, str]] = []
    for name, size, addr in objects:  # function-local statics: C++ "f(args)::x", "f::x"
        owner = name.rsplit("::", 1)[0]
        if owner.endswith(")") or owner in names:
            statics[owner] = statics.get(owner, 0) + size
            shared.append((addr, size, short_static_name(name), owner))
    return {"functions": funcs, "statics": statics, "anchor": anchor, "shared": shared}


def short_static_name(name: str) -> str:
    """``void ndl::row_stats<float, float>(float const*, ...)::sm`` -> ``sm (in row_stats)``."""
    owner, var = name.rsplit("::", 1)
    func = function_base_name(owner)
    return f"{var} (in {func})"


def without_params(signature: str) -> str:
    """``signature`` up to its parameter list: the first '(' outside <>."""
    depth = 0
    for i, ch in enumerate(signature):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            return signature[:i]
    return signature


def function_base_name(signature: str) -> str:
    """``void ndl::row_stats<float, float>(float const*, ...)`` -> ``row_stats``."""
    head = without_params(signature)
    depth, start = 0, 0
    for i, ch in enumerate(head):  # drop a return type: the last space outside <>
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            start = i + 1
    return head[start:].split("<", 1)[0].rsplit("::", 1)[-1]


def build(code: str, name_expressions: Sequence[str], options: Sequence[str] = (),
          filename: str = "kernel.cu", sanitize: str = "", check: bool = False
          ) -> Tuple[Path, Dict[str, object]]:
    """Compile (or find in the cache) the library; returns (path, static shared info).

    ``check`` builds the memory-checked variant (ignored under a sanitizer, which checks
    memory its own way)."""
    if sanitize and sanitize not in SANITIZE_FLAGS:
        raise ValueError(f"sanitize={sanitize!r}; expected '', 'thread' or 'address'")
    cxx = compiler()
    flags, incs = translate_options(options)
    src = wrapper_source(code, name_expressions, filename)
    check = check and not sanitize
    cmd = build_command(cxx, flags, incs, sanitize, "SRC", "OUT", check)
    key = hashlib.sha256("\0".join([src, " ".join(cmd), compiler_version(cxx),
                                    _headers_digest(incs)]).encode()).hexdigest()[:32]
    root = cache_dir()
    so = root / f"{key}.so"
    meta = root / f"{key}.json"
    if so.exists() and meta.exists():
        return so, json.loads(meta.read_text())
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
    try:
        (tmp / "module.cpp").write_text(src)
        cmd = build_command(cxx, flags, incs, sanitize, str(tmp / "module.cpp"),
                            str(tmp / "module.so"), check)
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_tool_env())
        if res.returncode != 0:
            raise EmulatorBuildError(f"{filename} failed to compile for the CUDA emulator:\n"
                                     f"{' '.join(cmd)}\n{res.stderr[-20000:]}")
        info = static_shared(str(tmp / "module.so"))
        (tmp / "module.json").write_text(json.dumps(info))
        os.replace(tmp / "module.json", meta)  # meta first: a visible .so has its .json
        os.replace(tmp / "module.so", so)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return so, info


def find_runtime(sanitize: str) -> Optional[str]:
    """Path of gcc's libtsan / libasan (for LD_PRELOAD), None when not installed."""
    lib = {"thread": "libtsan.so", "address": "libasan.so"}[sanitize]
    res = subprocess.run([compiler(), f"-print-file-name={lib}"], capture_output=True,
                         text=True, check=False)
    path = res.stdout.strip()
    return os.path.realpath(path) if os.path.isabs(path) and os.path.exists(path) else None
