"""The grading cell of the homework notebooks: ``grade("hw1.ops.multiply")``.

Runs ``python -m course.grade --exercise ...`` (only those exercises' graded tests, in a fresh
process, so the code as saved is what is graded), prints the score and raises when a test fails,
so a notebook run stops at the first question not yet solved, with the exercise named.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ExerciseNotPassed(AssertionError):
    """Some graded test of the exercise fails (the message names it and the first failure)."""


def grade(*exercises: str, timeout: float = 600) -> None:
    """Grade ``exercises`` (ids or prefixes): print one line per exercise, or raise
    ExerciseNotPassed. Returns None, so a notebook cell shows the lines and not the report
    (``build/grade/report.json`` of ``make grade`` has it all)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        # property tests stop at their first failing example (no shrinking): quick feedback
        env = {"HYPOTHESIS_PROFILE": "grade-failfast", **os.environ}
        res = subprocess.run([sys.executable, "-m", "course.grade", "--report", str(report),
                              "--exercise", *exercises], cwd=ROOT, capture_output=True,
                             text=True, timeout=timeout, env=env)
        if not report.exists():
            raise RuntimeError(f"grading {exercises} wrote no report:\n{res.stdout[-3000:]}"
                               f"{res.stderr[-3000:]}")
        rep = json.loads(report.read_text())
    for ex in rep["exercises"]:
        print(f"{ex['exercise']}: {ex['passed']}/{ex['passed'] + ex['failed']} tests, "
              f"{ex['earned']:g}/{ex['points']} points")
    failed = [(ex["exercise"], t) for ex in rep["exercises"] for t in ex["tests"]
              if t["outcome"] == "failed"]
    if failed:
        name, first = failed[0]
        raise ExerciseNotPassed(f"{name}: {len(failed)} graded test(s) fail; first: "
                                f"{first['test']}: {first['message'][:300]}")
