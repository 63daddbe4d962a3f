"""Run kernel tests on the emulator's thread engine under ThreadSanitizer and AddressSanitizer.

Each CUDA thread is an OS thread, so ThreadSanitizer sees a missing ``__syncthreads()`` as a
data race between two threads of a block, and AddressSanitizer sees an out-of-bounds read or
write of a device buffer (host memory here) or of a ``__shared__`` array. The kernels are built
with ``-fsanitize=...`` (build.py); Python itself is not instrumented, so the sanitizer's
runtime (gcc's libtsan / libasan) is preloaded into a child process that runs the tests.

    python -m needle.backend_cuda.emulator.sanitize                  # both, all kernel tests
    python -m needle.backend_cuda.emulator.sanitize --mode thread -- -k float32

The exit status is non-zero when a test fails or a sanitizer reports (halt_on_error).
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import build

SANITIZER_EXIT = 66
DEFAULT_TESTS = ("tests/backend_cuda/emulator/test_emu_kernels.py",)


def sanitizer_env(mode: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a child process whose emulated kernels run under ``mode``."""
    runtime = build.find_runtime(mode)
    if runtime is None:
        pkg = {"thread": "libtsan2", "address": "libasan8"}[mode]
        raise build.EmulatorUnavailable(f"gcc's {mode} sanitizer runtime is not installed "
                                        f"(apt-get install {pkg})")
    env = dict(os.environ if base is None else base)
    env.update({
        "LD_PRELOAD": runtime,
        "NEEDLE_CUDA_EMULATOR_SANITIZE": mode,
        "NEEDLE_CUDA_EMULATOR_ENGINE": "threads",
        # report the first problem and fail the process; Python's own leaks are not ours
        "TSAN_OPTIONS": f"halt_on_error=1 exitcode={SANITIZER_EXIT} report_signal_unsafe=0 "
                        f"suppressions={Path(__file__).with_name('tsan.supp')}",
        "ASAN_OPTIONS": f"detect_leaks=0 halt_on_error=1 exitcode={SANITIZER_EXIT} "
                        f"allocator_may_return_null=1",
        "PYTHONMALLOC": "malloc",  # every Python allocation through the sanitizer's malloc
    })
    return env


def run_pytest(mode: str, pytest_args: Sequence[str], timeout: float = 1800,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """``python -m pytest pytest_args`` in a child process under the ``mode`` sanitizer."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    return subprocess.run(cmd, env=sanitizer_env(mode), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def main(argv: Optional[List[str]] = None) -> int:
    """Command line: run the kernel tests under each requested sanitizer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("thread", "address", "both"), default="both")
    parser.add_argument("pytest_args", nargs="*", help="after --: tests and pytest options")
    args = parser.parse_args(argv)
    modes = ("thread", "address") if args.mode == "both" else (args.mode,)
    tests = [a for a in args.pytest_args if not a.startswith("-")]
    rest = list(args.pytest_args) if tests else [*DEFAULT_TESTS, *args.pytest_args]
    root = str(Path(__file__).resolve().parents[3])
    status = 0
    for mode in modes:
        res = run_pytest(mode, rest, cwd=root)
        print(f"== {mode} sanitizer: exit {res.returncode}")
        print(res.stdout[-6000:])
        if res.returncode != 0:
            print(res.stderr[-20000:], file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
