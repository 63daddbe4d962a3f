"""Every notebook in notebooks/ runs top to bottom through a real Jupyter kernel (its code cells
hold their own asserts), and is committed without outputs."""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course.check_notebooks import PRINT_GRADED, RECORD_GRADES

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


# the notebook's grading cells record the exercises they grade (course/check_notebooks.py's
# first cell); the test grades them all at the end in one `course.grade` run (a run per cell,
# two Python processes each, was most of a homework notebook's time)
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    """Every cell runs, and every exercise a grading cell names passes its graded tests."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from course.notebook import grade
    nb = nbformat.read(str(path), as_version=4)
    assert any(c.cell_type == "code" for c in nb.cells), f"{path.name} has no code cells"
    # run from notebooks/ as a student would; the repository root on the path finds needle/apps
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    nb.cells.insert(0, nbformat.v4.new_code_cell(RECORD_GRADES.format(root=str(ROOT))))
    nb.cells.append(nbformat.v4.new_code_cell(PRINT_GRADED))
    client.execute()
    graded = json.loads(nb.cells[-1].outputs[0]["text"])
    asked = [e for c in nb.cells[1:-1] if c.cell_type == "code"
             for args in re.findall(r"^grade\((.*)\)\s*$", c.source, re.M)
             for e in ast.literal_eval(f"({args},)")]
    assert graded == asked, (graded, asked)  # every grading cell ran
    if graded:
        grade(*graded)  # raises ExerciseNotPassed naming the exercise


# the assignments: in the student release each stops at its first question, naming it
FIRST_QUESTION = {"hw1_autograd.ipynb": "hw1.autograd.make_from_op",
                  "hw2_nn_training.ipynb": "hw2.ops.logsoftmax",
                  "hw3_ndarray.ipynb": "hw3.ndarray.views",
                  "hw4_cnn_rnn_transformer.ipynb": "hw4.ops.dilate",
                  "hw_collectives.ipynb": "collectives.reference",
                  "hw3_cuda_kernels.ipynb": "hw3.cuda.backend"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIRST_QUESTION))
def test_release_notebook_stops_at_the_first_unwritten_question(name, student_release):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if name == "hw3_cuda_kernels.ipynb":
        from needle.backend_cuda import emulator
        if emulator.unavailable_reason():
            pytest.skip(f"no GPU emulator here: {emulator.unavailable_reason()}")
    release = student_release[0]
    path = release / "notebooks" / name
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        f"import sys; sys.path.insert(0, {str(release)!r})\n"
        "import matplotlib; matplotlib.use('Agg')"))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        client.execute()
    message = str(err.value)
    assert FIRST_QUESTION[name] in message and "ExerciseNotPassed" in message, message[-2000:]
    assert "NotImplementedError" in message, message[-2000:]
    ran = [c for c in nb.cells if c.cell_type == "code" and c.get("execution_count")]
    assert 'grade("' in ran[-1].source  # it stopped at the grading cell of question 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, "notebooks/ should hold at least one homework notebook"


@pytest.mark.slow
def test_each_demonstration_uses_only_what_its_question_needs(tmp_path):
    """Run in the release after its grading cell passes, a question's demonstration may use
    only the exercises written by then: its own, those its question names (graded tests' needs,
    demonstration's needs) and those of the questions before it. Traced on the reference
    (tests/notebook_demo_regions.py): which exercises' solution regions each demonstration
    runs."""
    names = sorted(FIRST_QUESTION)
    out = tmp_path / "demos.json"
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_demo_regions.py"),
                          str(out), *names], cwd=ROOT / "notebooks", capture_output=True,
                         text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "NEEDLE_CUDA_EMULATOR": "1",
                              "MPLBACKEND": "Agg"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    gaps = []
    for name, questions in json.loads(out.read_text()).items():
        assert questions, f"{name}: no questions found"
        written = set()
        for q in questions:
            written |= {q["exercise"], *q["needs"]}  # what the notebook says
            extra = sorted(set(q["ran"]) - written)
            if extra:
                gaps.append(f"{name}: the demonstration of {q['exercise']} also runs {extra}")
    assert not gaps, "\n".join(gaps)


def _generated(cells: list) -> list:
    from course.notebook_questions import MARK
    return [c for c in cells if MARK in c.get("metadata", {}).get("tags", [])]


def _asked(path: Path) -> list:
    """The exercises of a notebook's questions, in the order the notebook asks them."""
    titles = ["".join(c["source"]) for c in _generated(json.loads(path.read_text())["cells"])]
    return [m["exercise"] for t in titles
            for m in [re.match(r"### Question \d+: .*\((?P<exercise>[\w.]+)\)", t)] if m]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_questions_come_after_the_questions_they_require(path: Path) -> None:
    """Answered in order, every grading cell can pass: an exercise's requirements (course/
    exercises.py, transitively) of the same notebook are asked before it."""
    from course.exercises import requirements
    asked = _asked(path)
    late = [f"{ex} (question {i + 1}) needs {req} (question {asked.index(req) + 1})"
            for i, ex in enumerate(asked) for req in sorted(requirements(ex))
            if req in asked[i + 1:]]
    assert not late, f"{path.name}: " + "; ".join(late)


def test_first_question_is_the_notebooks_first() -> None:
    assert {name: _asked(ROOT / "notebooks" / name)[0] for name in FIRST_QUESTION} == FIRST_QUESTION


@pytest.mark.parametrize("name", sorted(FIRST_QUESTION))
def test_question_cells_say_what_the_code_says(name: str) -> None:
    """The generated cells are those ``python -m course.notebook_questions`` writes today from
    the docstrings beside the solution regions (a docstring changed: regenerate)."""
    from course.notebook_questions import NOTEBOOKS, questions
    qs, path_cell = NOTEBOOKS[name]
    committed = _generated(json.loads((ROOT / "notebooks" / name).read_text())["cells"])
    fresh = questions(qs, path_cell)
    assert ["".join(c["source"]) for c in committed] == ["".join(c["source"]) for c in fresh], (
        f"{name} is stale: run `python -m course.notebook_questions`")
