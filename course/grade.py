"""`make grade`: run the graded tests, print the score per homework, write a JSON report.

    python -m course.grade [--exercise E ...] [--hidden DIR] [--report build/grade/report.json]
                           [pytest args...]

``--exercise E`` runs only E's graded tests (several ids, or a prefix such as ``hw2.optim``).

``--hidden DIR`` adds an instructor's folder of tests (not shipped in the student release);
they are graded by their own ``@pytest.mark.grade("hwN.unit.name", points=k)`` markers.
Everything runs locally; nothing is sent anywhere.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from .exercises import EXERCISES, test_files
from .grading import select_exercises

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the grader; returns 0 when a report was written (whatever the score)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", default=None, help="a folder of hidden graded tests")
    parser.add_argument("--report", default=str(ROOT / "build" / "grade" / "report.json"),
                        help="where to write the JSON report")
    parser.add_argument("--exercise", nargs="+", default=[], metavar="E",
                        help="only these exercises' graded tests (ids or prefixes: hw2.optim)")
    args, extra = parser.parse_known_args(argv)
    picked = [f"--exercise={e}" for e in args.exercise]
    paths: List[str] = [str(ROOT / "tests")]
    if args.exercise:  # collect only the modules holding those exercises' tests (faster)
        names = select_exercises([w for e in args.exercise for w in e.split(",") if w],
                                 [ex.name for ex in EXERCISES])
        paths = [str(ROOT / f) for f in test_files(names, ROOT)]
    if args.hidden:
        hidden = Path(args.hidden).resolve()
        if not hidden.is_dir():
            parser.error(f"--hidden {args.hidden}: no such folder")
        paths.append(str(hidden))
    Path(args.report).unlink(missing_ok=True)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                        "-c", str(ROOT / "pytest.ini"), "--graded",
                        "--continue-on-collection-errors", "--grade-report",
                        args.report, "-o", "console_output_style=classic", *picked, *extra,
                        *paths])
    # 1 = some tests failed: a score, not an error
    return 0 if code in (0, 1) and Path(args.report).exists() else int(code)


if __name__ == "__main__":
    sys.exit(main())
