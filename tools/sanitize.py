"""Run kernel tests on the emulator's thread engine under ThreadSanitizer and AddressSanitizer.

Each CUDA thread is an OS thread named "B<block> T<thread>", so TSan reports a missing
``__syncthreads()`` as a race. Python is not instrumented: the runtime is preloaded into a child
pytest (arguments after ``--``). Usage: README, "CUDA without a GPU".
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from needle.backend_cuda.emulator import build

SANITIZER_EXIT = 66
DEFAULT_TESTS = ("tests/backend_cuda/emulator/test_emu_kernels.py",)
# Static TLS that glibc keeps for dlopen'ed libraries: TSan-built kernels hold their thread_locals
# there (build.SANITIZE_FLAGS says why), 56 bytes a module; glibc's default 512 fits nine.
STATIC_TLS_BYTES = 65536
ASAN_REDZONE = 256  # bytes of poisoned memory at least around every allocation


def sanitizer_env(mode: str, base: Optional[Dict[str, str]] = None,
                  log_path: str = "") -> Dict[str, str]:
    """The environment of a child process whose emulated kernels run under ``mode``; with
    ``log_path``, reports go to ``log_path.<pid>`` (pytest would swallow them on stderr)."""
    runtime = build.find_runtime(mode)
    if runtime is None:
        pkg = {"thread": "libtsan2", "address": "libasan8"}[mode]
        raise build.EmulatorUnavailable(f"gcc's {mode} sanitizer runtime is not installed "
                                        f"(apt-get install {pkg})")
    env = dict(os.environ if base is None else base)
    log = f" log_path={log_path}" if log_path else ""
    env.update({
        "LD_PRELOAD": runtime,
        "NEEDLE_CUDA_EMULATOR_SANITIZE": mode,
        "NEEDLE_CUDA_EMULATOR_ENGINE": "threads",
        # report the first problem and fail the process; Python's own leaks are not ours
        "TSAN_OPTIONS": f"halt_on_error=1 exitcode={SANITIZER_EXIT} report_signal_unsafe=0 "
                        f"suppressions={Path(__file__).with_name('tsan.supp')}{log}",
        # redzone: an access up to 256 bytes past a buffer is a heap-buffer-overflow; with the
        # default 16 it lands in a neighbour, often a freed one ("heap-use-after-free")
        "ASAN_OPTIONS": f"detect_leaks=0 halt_on_error=1 exitcode={SANITIZER_EXIT} "
                        f"allocator_may_return_null=1 redzone={ASAN_REDZONE}{log}",
        "PYTHONMALLOC": "malloc",  # every Python allocation through the sanitizer's malloc
        "GLIBC_TUNABLES": ":".join(filter(None, (
            env.get("GLIBC_TUNABLES", ""),
            f"glibc.rtld.optional_static_tls={STATIC_TLS_BYTES}"))),
    })
    return env


def run_pytest(mode: str, pytest_args: Sequence[str], timeout: float = 1800,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """``python -m pytest`` under the ``mode`` sanitizer, its reports appended to stderr."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    with tempfile.TemporaryDirectory(prefix="needle-sanitize-") as logs:
        log_path = os.path.join(logs, mode)
        res = subprocess.run(cmd, env=sanitizer_env(mode, log_path=log_path),
                             capture_output=True, text=True, timeout=timeout, cwd=cwd)
        reports = [p.read_text(errors="replace") for p in sorted(Path(logs).iterdir())]
    res.stderr += "".join(reports)
    return res


def split_args(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(arguments before ``--``, pytest arguments after it)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: Optional[List[str]] = None) -> int:
    """Command line: run the kernel tests under each requested sanitizer."""
    ours, pytest_args = split_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s [--mode M] [TEST ...] [-- PYTEST_ARG ...]")
    parser.add_argument("--mode", choices=("thread", "address", "both"), default="both")
    parser.add_argument("tests", nargs="*", help=f"test paths (default: {DEFAULT_TESTS[0]})")
    args = parser.parse_args(ours)
    modes = ("thread", "address") if args.mode == "both" else (args.mode,)
    rest = [*(args.tests or DEFAULT_TESTS), *pytest_args]
    root = str(Path(__file__).resolve().parents[1])
    status = 0
    for mode in modes:
        res = run_pytest(mode, rest, cwd=root)
        print(f"== {mode} sanitizer: exit {res.returncode} (python -m pytest {' '.join(rest)})")
        print(res.stdout[-6000:])
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)  # every report in full
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
