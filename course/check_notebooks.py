"""The homework notebooks in the student release, run as a student at each point of the course
runs them: with hw0..hwN written (N over ``HOMEWORKS``), every notebook of those homeworks runs
to its end, and with all written, the walkthroughs (the notebooks of no homework). A notebook
belongs to the homework of its first question (``course/notebook_questions.py``); a cell
needing a later homework's exercise stops it there, with the NotImplementedError naming that
exercise.

Each notebook runs in a Jupyter kernel (nbclient), from the release's notebooks/ folder. Its
grading cells record the exercises they name instead of grading them (a graded run per cell
was most of the time); each named exercise must be written in that state. Whether the written
exercises score is ``python -m course.check_release --homework``'s question.

    python -m course.check_release --notebooks [H ...]
"""
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set

from .exercises import EXERCISES, HOMEWORKS
from .make_student import ROOT, make_release, stub_file
from .notebook_questions import NOTEBOOKS

# the first cell run: matplotlib without a display, and grading cells that record
RECORD_GRADES = """import sys
sys.path.insert(0, {root!r})
import matplotlib
matplotlib.use('Agg')
import course.notebook
_GRADED = []


def _record_grade(*exercises, timeout=600):
    assert exercises and all(isinstance(e, str) for e in exercises), exercises
    _GRADED.extend(exercises)


course.notebook.grade = _record_grade
"""
PRINT_GRADED = "import json; print(json.dumps(_GRADED))"


def notebook_homework() -> Dict[str, str]:
    """notebook file name -> the homework of its first question."""
    return {name: qs[0][0].split(".")[0] for name, (qs, _) in NOTEBOOKS.items()}


def written_release(out: Path, written: Set[str], root: Path = ROOT) -> None:
    """The student release at ``out`` (as ``make student`` writes it) with the exercises
    ``written`` written: their regions as in the reference, every other region stubbed."""
    regions = make_release(out, root)
    unwritten = [e.name for e in EXERCISES if e.name not in written]
    for rel in sorted({r.path for r in regions if r.exercise in written}):
        (out / rel).write_text(stub_file(root / rel, root, only=unwritten)[0])


def run_notebook(path: Path, written: Set[str], timeout: float = 300) -> Optional[str]:
    """None when every cell of the notebook at ``path`` ran and each exercise its grading
    cells named is in ``written``; else what stopped it (the failing cell's error, last)."""
    import nbclient
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    root = path.resolve().parents[1]
    nb.cells.insert(0, nbformat.v4.new_code_cell(RECORD_GRADES.format(root=str(root))))
    nb.cells.append(nbformat.v4.new_code_cell(PRINT_GRADED))
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_")}
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as err:
        ran = [c for c in nb.cells if c.cell_type == "code" and c.get("execution_count")]
        source = ran[-1].source.splitlines()[:1] if ran else [""]
        return f"stops at the cell {source[0]!r}: {err.ename}: {err.evalue[:300]}"
    graded = json.loads(nb.cells[-1].outputs[0]["text"])
    early = sorted(set(graded) - written)
    return f"grades exercises not written yet: {early}" if early else None


def walkthroughs(root: Path = ROOT) -> List[str]:
    """The notebooks that belong to no homework (no question of theirs is graded): they use
    what the homeworks wrote, so they are run with every exercise written."""
    belongs = notebook_homework()
    return sorted(p.name for p in (root / "notebooks").glob("*.ipynb") if p.name not in belongs)


def check_notebooks(workdir: Path, root: Path = ROOT, homeworks: Sequence[str] = (),
                    log: Any = None) -> Dict[str, List[str]]:
    """Per homework H (default all): in the release with H and the homeworks before it
    written, every notebook of those homeworks runs to its end; with the last written (all
    of them), the walkthroughs too. A line per notebook that does not: ``<H> written:
    <notebook> <what stopped it>``."""
    belongs = notebook_homework()
    res: Dict[str, List[str]] = {"notebook_not_finishing": []}
    for hw in homeworks or HOMEWORKS:
        if hw not in HOMEWORKS:
            raise ValueError(f"--notebooks {hw}: the homeworks are {', '.join(HOMEWORKS)}")
        before = HOMEWORKS[:HOMEWORKS.index(hw) + 1]
        names = sorted(n for n, h in belongs.items() if h in before)
        if hw == HOMEWORKS[-1]:
            names += walkthroughs(root)
        if not names:
            continue
        written = {e.name for e in EXERCISES if e.homework in before}
        release = workdir / "notebooks-release"
        written_release(release, written, root)
        for name in names:
            start = time.perf_counter()
            problem = run_notebook(release / "notebooks" / name, written)
            if problem:
                res["notebook_not_finishing"].append(f"{hw} written: {name} {problem}")
            if log is not None:
                log(f"{hw} written: {name} {'stops' if problem else 'runs'}, "
                    f"{time.perf_counter() - start:.1f}s")
    return res
