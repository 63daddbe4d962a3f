"""Run many pytest sessions, each in a forked child of one process that imported the heavy
libraries once.

The release check's isolation runs one graded pytest session per exercise (57 of them), each on
a tree where only that exercise is stubbed. Started afresh, each session spent most of its time
starting Python and importing NumPy, SciPy, hypothesis, pytest and torch; forked from this
server, it pays only for its own tests. Nothing of the tree under test (``needle``, ``apps``,
``tests``) is imported before the fork (checked at start), so each child imports the files as
they are when its request arrives: a file stubbed between two requests is what the next child
runs.

    python -m course.pytest_forks [--timeout S]   (in the tree to test)

Requests are lines of JSON on stdin: ``{"args": [pytest arguments], "log": path}``. The server
forks, the child runs ``pytest.main(args)`` (its output to ``log``) in its own process group and
exits, and the server answers one line of JSON on stdout: ``{"status": n}``, the child's exit
status (negative: killed by that signal), or ``null`` when it ran past ``--timeout`` seconds
and was killed with everything it started.
"""
import argparse
import gc
import importlib
import importlib.metadata
import json
import os
import sys
from typing import List, Optional, Sequence

import pytest

from .forked import wait_child

# what graded test modules import at collection (measured), plus torch, which the tests that
# compare with PyTorch import; each is skipped where it is not installed
PRELOAD = ("numpy", "scipy", "scipy.special", "hypothesis", "pygments", "cupy", "torch")
# the code under test: never imported here, or every child would run the server's copy of it
UNDER_TEST = ("needle", "apps", "tests", "conftest")


def preload(names: Sequence[str] = PRELOAD) -> List[str]:
    """Import ``names`` (those installed) and the installed pytest plugins; the modules of the
    tree under test this imported."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # every session loads these (anyio's imports trio): a third of a small session's time
    for entry in importlib.metadata.entry_points(group="pytest11"):
        try:
            entry.load()
        except Exception:  # noqa: BLE001 -- pytest itself reports a plugin that fails to load
            pass
    # what is loaded now stays: a child's garbage collections (pytest runs 5 at the end of a
    # session) need not walk it, and its pages stay shared with the server
    gc.freeze()
    return sorted(m for m in sys.modules if m.split(".")[0] in UNDER_TEST)


def _child(args: List[str], log: str) -> None:
    """In the forked child: run the pytest session, output to ``log``; never return."""
    code = 3
    try:
        os.setpgid(0, 0)  # its own group: a timeout kills what the tests started too
        with open(log, "wb") as out, open(os.devnull, "rb") as devnull:
            os.dup2(devnull.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        # the streams of fds 1 and 2 (a parent capturing its output may have replaced them)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = [sys.argv[0], *args]  # as `python -m pytest ARGS` would see it
        code = int(pytest.main(args))
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def run(args: List[str], log: str, timeout: float) -> Optional[int]:
    """One pytest session ``args`` in a forked child: its exit status, None past ``timeout``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        # the preloaded plugins are not assertion-rewritten: expected here, not worth a warning
        _child(["-W", "ignore::pytest.PytestAssertRewriteWarning", *args], log)
    return wait_child(pid, timeout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Serve requests from stdin until it closes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="a session running longer is killed (default 600 s)")
    opts = parser.parse_args(argv)
    leaked = preload()
    if leaked:
        print(f"course.pytest_forks: preloading imported the code under test: {leaked}",
              file=sys.stderr)
        return 2
    for line in sys.stdin:
        request = json.loads(line)
        status = run(request["args"], request["log"], opts.timeout)
        print(json.dumps({"status": status}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
