"""Which exercises' solution regions each notebook question's demonstration cell runs.

    python tests/notebook_demo_regions.py OUT.json NOTEBOOK...   # run from notebooks/

Runs a notebook's generated question cells (``course/notebook_questions.py``) as a student
would, skipping the grading cells: the path and setup cells, then each demonstration, with a
line tracer on needle/ and apps/ (the reference, every exercise written). Per question: its
exercise, the exercises its text names as also needed, and the exercises whose regions the
demonstration ran (``tests/test_notebooks.py`` compares them).
"""
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

from course.make_student import all_regions
from course.notebook_questions import MARK
from needle.backend_selection import set_backend

ROOT = Path(__file__).resolve().parents[1]
_QUESTION = re.compile(r"### Question \d+: .*\((?P<exercise>[\w.]+)\)")
_NEEDS = re.compile(r"(?:also need written|demonstration also uses): (?P<names>.*)")


def _line_tracer(hit: Set[Tuple[str, int]]) -> Any:
    """A sys.settrace function recording (file, line) run in needle/ and apps/."""
    tops = (str(ROOT / "needle"), str(ROOT / "apps"))

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            hit.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def global_(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(tops) else None
    return global_


def _questions(path: Path) -> Tuple[List[str], List[Dict[str, Any]]]:
    """The setup cells' code, and per question its exercise, named needs and demonstration."""
    cells = [c for c in json.loads(path.read_text())["cells"]
             if MARK in c.get("metadata", {}).get("tags", [])]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    setup = [c for c in code if not c.startswith("grade(")][:2]
    out = []
    for i, cell in enumerate(cells):
        match = _QUESTION.search("".join(cell["source"]))
        if cell["cell_type"] != "markdown" or match is None:
            continue
        text = "".join(cell["source"])
        names = [n for m in _NEEDS.finditer(text) for n in re.findall(r"`([\w.]+)`", m["names"])]
        out.append({"exercise": match["exercise"], "needs": names,
                    "demo": "".join(cells[i + 2]["source"])})
    return setup, out


def demo_exercises(path: Path) -> List[Dict[str, Any]]:
    """Per question of ``path``: exercise, named needs, exercises its demonstration ran."""
    regions = all_regions(ROOT)
    setup, questions = _questions(path)
    scope: Dict[str, Any] = {"__name__": "__main__"}
    os.environ.pop("NEEDLE_BACKEND", None)  # each notebook's path cell picks its own
    for code in setup:
        exec(compile(code, f"{path.name}:setup", "exec"), scope)  # noqa: S102
    # needle reads NEEDLE_BACKEND once, at its first import (an earlier notebook's here)
    set_backend(os.environ.get("NEEDLE_BACKEND", "nd"))
    for q in questions:
        hit: Set[Tuple[str, int]] = set()
        sys.settrace(_line_tracer(hit))
        try:
            exec(compile(q["demo"], f"{path.name}:{q['exercise']}", "exec"), scope)  # noqa: S102
        finally:
            sys.settrace(None)
        q["ran"] = sorted({r.exercise for r in regions for f, n in hit
                           if f == str(ROOT / r.path) and r.begin < n < r.end})
    return questions


if __name__ == "__main__":
    # the demonstrations print: the result goes to a file
    Path(sys.argv[1]).write_text(json.dumps({p: demo_exercises(Path(p).resolve())
                                             for p in sys.argv[2:]}))
