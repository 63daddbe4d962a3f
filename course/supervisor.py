"""Run the graded tests in a child pytest process and survive it: `make grade`'s engine.

A student's code can kill the process running it (a CUDA kernel writing out of bounds aborts
it, a NumPy view past its buffer segfaults it) or loop forever. The graded tests therefore run
in a child ``python -m pytest`` with the grader plugin (``course/grade_plugin.py``), which logs each
graded test's start and outcome to a file. When the child dies inside a test, or a test runs
past the time limit (the child is then killed), that test fails with the cause named, and a
new child grades the rest. After a second crash in one test file, the rest of that file runs a
fork per test (``course/forked.py``), so that a kernel failing every test costs two restarts,
not one per test; files that do not crash run in one process (a fork per test costs 0.1 to
0.6 s per test: imports and module fixtures again in every child).
"""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .forked import fatal_error_summary
from .scoring import Outcome, crash_cause


@dataclass
class Graded:
    """What the child runs found: each graded test (exercise, points, file), outcomes, the
    failure text of each failed test, the collection errors, and problems of the run."""

    tests: Dict[str, Tuple[str, int, str]] = field(default_factory=dict)
    outcomes: Dict[str, Outcome] = field(default_factory=dict)
    details: Dict[str, str] = field(default_factory=dict)
    collect_errors: Dict[str, str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    status: int = 0  # pytest's exit status when it graded nothing (4: a usage error)


def _last_words(output: Path) -> str:
    """What a child that graded nothing said: pytest's error line, else its last line."""
    lines = [ln.strip() for ln in output.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln.split("error: ", 1)[1] for ln in lines if "error: " in ln]
    return errors[-1] if errors else lines[-1] if lines else f"no output (see {output})"


class _LogReader:
    """Reads the child's JSON-lines log as it grows (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.running: Optional[str] = None  # the test started and not finished
        self.started = 0.0

    def read(self, graded: Graded) -> None:
        """Apply the entries written since the last read."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].decode().splitlines():
            self._apply(json.loads(line), graded)

    def _apply(self, entry: Dict[str, Any], graded: Graded) -> None:
        if "graded" in entry:
            for nodeid, (exercise, points, path) in entry["graded"].items():
                graded.tests.setdefault(nodeid, (exercise, points, path))
        elif "start" in entry:
            self.running, self.started = entry["start"], time.monotonic()
        elif "done" in entry:
            graded.outcomes[entry["done"]] = Outcome(entry["outcome"], entry["message"])
            if entry["details"]:
                graded.details[entry["done"]] = entry["details"]
            self.running = None
        elif "collect_error" in entry:
            graded.collect_errors[entry["collect_error"]] = entry["message"]


def _kill(proc: "subprocess.Popen[bytes]") -> None:
    """Kill the child and anything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_child(cmd: List[str], output: Path, reader: _LogReader, graded: Graded,
               timeout: float, cwd: Path, extra_env: Optional[Dict[str, str]] = None
               ) -> Tuple[int, Optional[str]]:
    """Run one child to its end (or kill it when a test passes ``timeout``): its return code
    and, when it died inside a test, why (the test is ``reader.running``)."""
    with open(output, "ab") as out:
        start = out.tell()
        # property tests: the examples of `make test`, a failure reported unshrunk (grade_plugin.py)
        env = {**os.environ, "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "grade"),
               **(extra_env or {})}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                reader.read(graded)
                # a forked test has its own limit (course/forked.py): this one is for the rest
                if reader.running is not None and time.monotonic() - reader.started > timeout + 5:
                    _kill(proc)
                    timed_out = True
        except BaseException:  # Ctrl-C or SIGTERM: the child (its own session) goes too
            _kill(proc)
            raise
    reader.read(graded)
    if reader.running is None:
        return proc.returncode, None
    if timed_out:
        return proc.returncode, f"timed out after {timeout:g} s"
    with open(output, "rb") as f:
        f.seek(start)
        tail = f.read().decode(errors="replace")[-20000:]
    detail = fatal_error_summary(tail)
    cause = crash_cause(proc.returncode)
    # the dump (if any) goes to details.txt under the test
    fatal = tail[tail.find("Fatal Python error"):] if "Fatal Python error" in tail else ""
    graded.details[reader.running] = f"{cause}\n\n{fatal}".strip()
    return proc.returncode, f"{cause}: {detail}" if detail else cause


def _paths_holding(paths: Sequence[str], files: Set[str]) -> List[str]:
    """The entries of ``paths`` (files or folders) that hold one of ``files``: collecting the
    same entries keeps every test's node id as it was in the first run."""
    def holds(path: str) -> bool:
        top = Path(path).resolve()
        return any(top == Path(f) or top in Path(f).parents for f in files)
    return [p for p in paths if holds(p)]


def run_graded(base: Sequence[str], paths: Sequence[str], workdir: Path, timeout: float,
               echo: Callable[[str], None], cwd: Path, max_restarts: int = 50,
               env: Optional[Dict[str, str]] = None) -> Graded:
    """Grade in child processes ``python -m pytest *base *paths`` (run in ``cwd``, with ``env``
    added to the environment) until every graded test has an outcome; a test that kills its
    child or passes ``timeout`` seconds fails with the cause."""
    log, output = workdir / "grade-log.jsonl", workdir / "pytest-output.txt"
    skip, forked = workdir / "grade-skip.txt", workdir / "grade-forked.txt"
    for path in (log, output, skip, forked):
        path.unlink(missing_ok=True)
    graded, reader = Graded(), _LogReader(log)
    forked_files: List[str] = []
    crashes: Dict[str, int] = {}  # test file -> crashes so far
    for run in range(max_restarts + 1):
        cmd = [sys.executable, "-m", "pytest", *base, "--grade-log", str(log),
               "--grade-timeout", str(timeout)]
        if run:
            skip.write_text("\n".join(graded.outcomes) + "\n")
            forked.write_text("\n".join(forked_files) + "\n")
            cmd += ["--grade-skip", str(skip), "--grade-forked", str(forked)]
        rc, cause = _run_child(cmd + list(paths), output, reader, graded, timeout, cwd, env)
        if run == 0 and graded.tests:
            n = len({ex for ex, _, _ in graded.tests.values()})
            echo(f"grading {len(graded.tests)} graded tests of {n} exercise{'s' * (n != 1)} "
                 f"(the test output: {output})")
        if cause is None:
            if rc not in (0, 1):  # it ended between tests: collecting, or pytest itself
                _ended_early(graded, rc, output)
            return graded
        crashed = reader.running
        assert crashed is not None
        graded.outcomes[crashed] = Outcome("failed", cause)
        reader.running = None
        echo(f"{crashed}: {cause}; grading the rest")
        remaining = [n for n in graded.tests if n not in graded.outcomes]
        if not remaining:
            return graded
        crashes[graded.tests[crashed][2]] = crashes.get(graded.tests[crashed][2], 0) + 1
        # a second crash in a file: the rest of it runs a fork per test (one crash, one
        # restart costs a few seconds; a fork per test costs 0.1-0.6 s per test, measured)
        forked_files = sorted(f for f, n in crashes.items() if n >= 2)
        paths = _paths_holding(paths, {graded.tests[n][2] for n in remaining})
    graded.problems.append(f"stopped after {max_restarts} restarts")
    _fail_the_rest(graded, f"not run: {max_restarts} crashes before it")
    return graded


def _ended_early(graded: Graded, rc: int, output: Path) -> None:
    """A child that ended outside any test with status ``rc``: say why, fail what it left."""
    graded.status = rc
    said = _last_words(output)
    if rc < 0:  # killed while importing the tests: name the signal and where
        said = (f"the test run {crash_cause(rc)} outside any test: "
                f"{fatal_error_summary(output.read_text(errors='replace')[-20000:])}")
    graded.problems.append(said)
    _fail_the_rest(graded, f"not run: the test run ended with status {rc} ({said})")


def _fail_the_rest(graded: Graded, message: str) -> None:
    """Every graded test without an outcome fails with ``message``."""
    for nodeid in graded.tests:
        graded.outcomes.setdefault(nodeid, Outcome("failed", message))
