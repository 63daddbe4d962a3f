"""Run one pytest test in a forked child, so that a crash or a hang fails that test only.

The grader (``course/grade.py``) runs a test module this way once one of its tests has killed
the test process (an abort, a segfault, a CUDA kernel writing out of bounds) or hung: the rest
of that module then runs a fork per test (as pytest-forked does), and each crash or timeout
becomes that test's failure, its signal or time limit named. Modules that never crash run in
one process, which is faster (no fork, no per-test module setup).
"""
import faulthandler
import json
import os
import re
import signal
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional

import pytest
from _pytest.runner import runtestprotocol

from .scoring import crash_cause

_FATAL = re.compile(r"Fatal Python error: [^\n]*")
_LIBRARIES = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.M)


def fatal_error_summary(text: str) -> str:
    """'Fatal Python error: Aborted in compact (file.py:12)' from a faulthandler dump: the
    innermost named function (not a dunder, private or ``launch`` frame) outside Python's and
    the installed packages' files, or ''."""
    fatal = next(iter(_FATAL.findall(text)), "")
    frames = _FRAME.findall(text)  # innermost first ("most recent call first")
    if not frames:
        return fatal
    # the code being graded, not the library a corrupted heap happened to abort in
    ours = [f for f in frames if not f[0].startswith(_LIBRARIES)] or frames
    named = [f for f in ours if not f[2].startswith("_") and f[2] != "launch"] or ours
    path, line_no, func = named[0]
    where = f"in {func} ({Path(path).name}:{line_no})"
    return f"{fatal} {where}" if fatal else where


def _child(item: pytest.Item, nextitem: Optional[pytest.Item], out: Path, dump: Path) -> None:
    """In the forked child: run the test, write its reports, never return."""
    code = 0
    try:
        with open(dump, "w") as fh:
            faulthandler.enable(file=fh)
            reports = runtestprotocol(item, log=False, nextitem=nextitem)
            hook = item.config.hook
            data = [hook.pytest_report_to_serializable(config=item.config, report=r)
                    for r in reports]
            out.write_text(json.dumps(data))
    except BaseException:  # noqa: BLE001 -- anything here must end the child, not pytest
        code = 3
    finally:
        os._exit(code)


def wait_child(pid: int, timeout: float) -> Optional[int]:
    """The child's return code (negative: killed by that signal), None if it timed out (then
    it is killed with its process group, where it made one)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # no group of its own (yet)
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def run_forked(item: pytest.Item, nextitem: Optional[pytest.Item], timeout: float
               ) -> List[Any]:
    """The test's reports, run in a forked child; a crash or timeout is one failed report."""
    with tempfile.TemporaryDirectory(prefix="grade-fork-") as tmp:
        out, dump = Path(tmp) / "reports.json", Path(tmp) / "faulthandler.txt"
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(item, nextitem, out, dump)
        code = wait_child(pid, timeout)
        if code == 0 and out.exists():
            hook = item.config.hook
            return [hook.pytest_report_from_serializable(config=item.config, data=d)
                    for d in json.loads(out.read_text())]
        cause = (f"timed out after {timeout:g} s" if code is None else crash_cause(code))
        text = dump.read_text() if dump.exists() else ""
        detail = fatal_error_summary(text)
        message = f"{cause}: {detail}" if detail else cause
        return [pytest.TestReport(item.nodeid, item.location, dict(item.keywords), "failed",
                                  f"{message}\n\n{text}".strip(), "call", [],
                                  time.perf_counter() - start)]
