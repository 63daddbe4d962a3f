"""`make grade`: run the graded tests, print the score per homework, write a JSON report.

    python -m course.grade [--exercise E ...] [--hidden DIR] [--report build/grade/report.json]
                           [--timeout S] [--strict] [pytest args...]

``--exercise E`` runs only E's graded tests (several ids, or a prefix such as ``hw2.optim``).

``--hidden DIR`` adds an instructor's folder of tests (not shipped in the student release);
they are graded by their own ``@pytest.mark.grade("hwN.unit.name", points=k)`` markers.

The tests run in a child process (``course/supervisor.py``): a test that crashes it (an abort,
a segfault, a CUDA kernel's out-of-bounds write) or runs past ``--timeout`` seconds fails, with
the signal or the time limit named, and grading goes on. The score table is printed last, then
one line per exercise whose code fails; every traceback goes to ``details.txt`` beside the
report. A failing CUDA test whose failure names no kernel (wrong numbers: a missing
``__syncthreads()``, a read of unwritten ``__shared__`` memory) is rerun once with
``NEEDLE_CUDA_EMULATOR_CHECK=full``, and its line names what that check finds (kernel, thread,
file:line; ``course/checked_rerun.py``). Exit status: 0 when the report was written, whatever
the score (``--strict``: 1 unless every graded test that ran passed); 2 for a bad command line;
3 when grading itself failed.
Everything runs locally; nothing is sent anywhere.
"""
import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

import pytest

from .checked_rerun import rerun_checked
from .exercises import EXERCISES, test_files
from .grade_plugin import select_exercises
from .scoring import failure_lines, format_table, score, waiting_line
from .supervisor import Graded, run_graded

ROOT = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> _Parser:
    parser = _Parser(prog="python -m course.grade", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", default=None, help="a folder of hidden graded tests")
    parser.add_argument("--report", default=str(ROOT / "build" / "grade" / "report.json"),
                        help="where to write the JSON report (details.txt goes beside it)")
    parser.add_argument("--exercise", nargs="+", default=[], metavar="E",
                        help="only these exercises' graded tests (ids or prefixes: hw2.optim)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="a graded test running longer fails (default 300 s)")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 unless every graded test that ran passed")
    return parser


def _check_output_dir(parser: _Parser, report: Path) -> None:
    """The report's folder exists (or is made) and takes a new file: checked before any test."""
    if report.is_dir():
        parser.error(f"--report {report}: is a folder; give a file name such as "
                     f"{report / 'report.json'}")
    try:
        report.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=report.parent):
            pass
    except OSError as err:
        parser.error(f"--report {report}: cannot write to {report.parent} ({err.strerror})")


def _test_paths(parser: _Parser, args: argparse.Namespace) -> List[str]:
    """The test files to collect: the rubric's (those of --exercise), plus --hidden."""
    names = [ex.name for ex in EXERCISES]
    if args.exercise:
        wanted = [w for e in args.exercise for w in e.split(",") if w]
        if not wanted:  # '' picked nothing, and pytest then collected every test there is
            parser.error(f"--exercise {' '.join(args.exercise)!r}: give an exercise id or "
                         f"prefix, such as hw2.optim")
        try:
            names = select_exercises(wanted, names)
        except pytest.UsageError as err:
            parser.error(str(err))
    paths = [str(ROOT / f) for f in test_files(names, ROOT)]
    if args.hidden:
        hidden = Path(args.hidden).resolve()
        if not hidden.is_dir():
            parser.error(f"--hidden {args.hidden}: no such folder")
        paths.append(str(hidden))
    return paths


def _unimportable(graded: Graded) -> Tuple[Dict[str, Tuple[str, int]], Dict[str, Any]]:
    """A failed stand-in test per exercise graded in a test file that did not import."""
    tests: Dict[str, Tuple[str, int]] = {}
    outcomes: Dict[str, Any] = {}
    for nodeid, message in graded.collect_errors.items():
        stem = Path(nodeid.split("::")[0]).stem
        last = [line for line in message.splitlines() if line.strip()][-1:] or [""]
        for ex in EXERCISES:
            if any(p.partition("::")[0] == stem for p in ex.tests):
                tests[f"{nodeid}::<import>"] = (ex.name, ex.points)
                outcomes[f"{nodeid}::<import>"] = ("failed", f"could not import: {last[0]}")
    return tests, outcomes


def _details(graded: Graded, report: Dict[str, Any], output: Path) -> str:
    """Every failed test's traceback (or cause), by exercise; then the collection errors."""
    parts = [f"Full output of the test runs: {output}\n"]
    for ex in report["exercises"]:
        for t in ex["tests"]:
            if t["outcome"] == "failed":
                body = graded.details.get(t["test"], t["message"])
                parts.append(f"{'=' * 20} {ex['exercise']}: {t['test']}\n{body}\n")
    for nodeid, message in graded.collect_errors.items():
        parts.append(f"{'=' * 20} could not collect {nodeid}\n{message}\n")
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Grade; returns the exit status (see the module docstring)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # SIGTERM ends the grader through Python (not at once), so its child is killed too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report_path = Path(args.report).resolve()
    _check_output_dir(parser, report_path)
    paths = _test_paths(parser, args)
    if not 0 < args.timeout < float("inf"):  # nan and inf would turn the watchdog off
        parser.error(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    report_path.unlink(missing_ok=True)
    workdir = report_path.parent
    # -p course.grade_plugin: the plugin also where ROOT/conftest.py is not loaded (a rerun of
    # hidden tests only, outside ROOT); the child runs in ROOT, so `course` is this one
    base = ["-q", "-p", "no:cacheprovider", "-p", "course.grade_plugin", "--rootdir", str(ROOT),
            "-c", str(ROOT / "pytest.ini"), "--graded", "--continue-on-collection-errors",
            "-o", "console_output_style=classic",
            *[f"--exercise={e}" for e in args.exercise], *extra]
    graded = run_graded(base, paths, workdir, args.timeout, echo=lambda s: print(s, flush=True),
                        cwd=ROOT)
    if not graded.tests and not graded.collect_errors:  # a pytest option it does not know,
        # or -k matching nothing
        said = (graded.problems[0] if graded.problems and graded.status != 5
                else "no graded test matched the selection (--exercise, -k)")
        print(f"{parser.prog}: error: {said}", file=sys.stderr)
        return 2 if graded.status in (0, 4, 5) else 3
    # a CUDA test failing on numbers alone: once more with the emulator's full check
    rerun_checked(base, graded, workdir, args.timeout, echo=lambda s: print(s, flush=True),
                  cwd=ROOT)
    tests = {n: (ex, pts) for n, (ex, pts, _) in graded.tests.items()}
    outcomes: Dict[str, Any] = dict(graded.outcomes)
    extra_tests, extra_outcomes = _unimportable(graded)
    report = score({**tests, **extra_tests}, {**outcomes, **extra_outcomes})
    report_path.write_text(json.dumps(report, indent=1))
    details = workdir / "details.txt"
    details.write_text(_details(graded, report, workdir / "pytest-output.txt"))
    for problem in graded.problems:
        print(f"grading problem: {problem}")
    print(f"report: {report_path}; every traceback: {details}\n")
    print(format_table(report))
    lines = failure_lines(report)
    if lines:
        print("failing exercises (the first failure of each):")
        print("\n".join(f"  {line}" for line in lines))
    waiting = waiting_line(report)
    if waiting:
        print(waiting)
    if graded.problems:
        return 3
    ran = [t for ex in report["exercises"] for t in ex["tests"] if t["outcome"] != "skipped"]
    return 1 if args.strict and any(t["outcome"] == "failed" for t in ran) else 0


if __name__ == "__main__":
    sys.exit(main())
