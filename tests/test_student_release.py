"""The student release as a student lives in it: `make student` from a fresh clone, `make grade`
offline once installed, `make test` that a finished release passes, and no instructor-only
file or dangling reference shipped (course/make_student.py writes it)."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from course import installed
from course.make_student import make_release

ROOT = Path(__file__).resolve().parents[1]


def test_make_student_installs_first():
    """A fresh clone has no needle installed; make_student imports it, so the target installs
    (as every other target does)."""
    res = subprocess.run(["make", "-n", "student"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    pip = next(i for i, line in enumerate(lines) if "pip install -q -e" in line)
    assert pip < next(i for i, line in enumerate(lines) if "course.make_student" in line)


def test_installed_names_what_is_missing(monkeypatch):
    assert installed.missing() == []  # this checkout: needle and its dev extra
    assert installed.missing("no-such-distribution-x") == ["no-such-distribution-x"]
    real = installed.metadata.version

    def version(name: str) -> str:
        if name == "hypothesis":
            raise installed.metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(installed.metadata, "version", version)
    assert installed.missing() == ["hypothesis"]
    assert installed.main([]) == 1


def _python_without_pip(folder: Path) -> Path:
    """A `python` that fails on `python -m pip` (so a test can see that pip never ran, and no
    pip run can reinstall needle from a temporary release) and is this Python otherwise."""
    folder.mkdir()
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "pip" ]; then\n'
                       f'  echo "pip was run: $*" >&2; exit 9\nfi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


@pytest.mark.slow
def test_make_grade_in_an_installed_release_needs_no_network(tmp_path):
    """Once needle is installed, `make grade` in the release grades without pip: with the
    package index unreachable it scores (the first grade does not reinstall: offline, pip fails
    with "No matching distribution found for setuptools")."""
    release = tmp_path / "student"
    make_release(release)
    python = _python_without_pip(tmp_path / "bin")
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_NO_INDEX": "1",
           "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(tmp_path / "no-wheels")}
    res = subprocess.run(["make", "grade", f"PYTHON={python}",
                          "GRADE_ARGS=--exercise hw0.simple_ml.add"], cwd=release, env=env,
                         capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "pip was run" not in out and "make install" not in out
    assert "TOTAL 0/" in out and (release / "build" / "grade" / "report.json").is_file()


def test_a_long_stub_is_split_within_the_line_length(tmp_path):
    """A stub longer than a line (deep in a class, a long file name) is split over three lines
    of at most 100 characters and raises the same message."""
    from course.make_student import LINE_LENGTH, stub_file
    path = tmp_path / "a_module_with_a_rather_long_name_for_its_folder.py"
    path.write_text("class Holder:\n    class Inner:\n"
                    "        def a_method_with_a_long_name(self):\n"
                    "            ### BEGIN YOUR SOLUTION (hw1.ops.a_long_exercise_name)\n"
                    "            return 1\n            ### END YOUR SOLUTION\n")
    text = stub_file(path, tmp_path)[0]
    assert max(len(line) for line in text.splitlines()) <= LINE_LENGTH, text
    ns: dict = {}
    exec(compile(text, path.name, "exec"), ns)
    with pytest.raises(NotImplementedError) as err:
        ns["Holder"].Inner().a_method_with_a_long_name()
    assert str(err.value) == ("hw1.ops.a_long_exercise_name: write "
                              "Holder.Inner.a_method_with_a_long_name in " + path.name)


def test_release_lint_passes(student_release):
    """ruff on the release as shipped: the stubs leave no line too long and no name unused or
    undefined (those get a `# noqa`: the code around the answer stays), so `make lint` passes
    before anything is written; the release's lint runs no mypy (stubs leave attributes that
    only the exercises set)."""
    release, regions = student_release
    stubbed = sorted({r.path for r in regions if r.path.endswith(".py")})
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *stubbed],
                         cwd=release, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]  # (the rest is the reference's code)
    lint = subprocess.run(["make", "-n", "lint"], cwd=release, capture_output=True, text=True,
                          timeout=60)
    assert "ruff check" in lint.stdout and "mypy" not in lint.stdout, lint.stdout
    assert (release / "mypy.ini").is_file()  # `python -m mypy` works there for whoever wants it
    optimizer = (release / "needle/optim/optimizer.py").read_text()
    assert "b1, b2 = self.beta1, self.beta2  # noqa: F841" in optimizer


def test_release_ships_no_instructor_material(student_release):
    """No release tool, test of the reference tree or GPU report ships, nor the GPU and test
    tooling sections of benchmarks/README.md (commands a release does not have)."""
    from course.make_student import INSTRUCTOR_FILES
    release = student_release[0]
    for rel in INSTRUCTOR_FILES:
        assert (ROOT / rel).is_file(), f"{rel}: listed but not in the reference"
        assert not (release / rel).exists(), rel
    for rel in ("course/grade.py", "course/installed.py", "docs/dtypes.md", "tests/test_grader.py",
                "benchmarks/README.md"):
        assert (release / rel).is_file(), rel
    bench = (release / "benchmarks" / "README.md").read_text()
    assert "## Profiler overhead" in bench and "## Fault handling times" in bench
    for gone in ("gpu_check", "gpu-check", "tools/mutate.py", "make_student", "## GPU"):
        assert gone not in bench, gone
    emulator = (release / "docs" / "cuda_emulator.md").read_text()
    assert "gpu-check" not in emulator and "INSTRUCTOR ONLY" not in emulator


def test_release_has_no_dangling_reference(student_release):
    """No shipped file names a path, README section, `python -m` module or make target that
    the reference has and the release lacks (course/check_release.py checks the same)."""
    from course.check_release import dangling_references
    assert dangling_references(student_release[0]) == []


def test_dangling_references_are_found(tmp_path):
    release = tmp_path / "student"
    make_release(release)
    (release / "docs" / "extra.md").write_text(
        "See `tools/mutate.py`, README \"Which parallelism\", and run `make gpu-check` or "
        "python -m course.check_release; docs/dtypes.md is here.\n")
    from course.check_release import dangling_references
    assert dangling_references(release) == [
        "docs/extra.md:1: tools/mutate.py", 'docs/extra.md:1: README.md, "Which parallelism"',
        "docs/extra.md:1: python -m course.check_release", "docs/extra.md:1: make gpu-check"]


@pytest.mark.slow
def test_a_finished_release_collects_every_test(tmp_path):
    """With every exercise written (the reference's solved files over the release), every test
    module the release ships imports: none needs the reference tree or an instructor tool
    (tests/test_course_tools.py, test_gpu_check.py, test_mutate.py once did), and `make test`
    lints with ruff alone."""
    import shutil
    release = tmp_path / "student"
    for rel in {r.path for r in make_release(release)}:
        shutil.copy2(ROOT / rel, release / rel)
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "tests"], cwd=release,
                         env={**os.environ, "PYTHONPATH": str(release)}, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert " error" not in res.stdout.splitlines()[-1], res.stdout.splitlines()[-1]
    dry = subprocess.run(["make", "-n", "test"], cwd=release, capture_output=True, text=True,
                         timeout=60)
    assert "ruff check" in dry.stdout and "mypy" not in dry.stdout and "pytest" in dry.stdout


@pytest.mark.slow
def test_a_notebook_cell_needing_a_later_homework_stops_the_release_check(tmp_path):
    """course/check_notebooks.py runs each homework's notebooks in the release with only that
    homework and those before it written: a hw1 cell using hw2's logsumexp (as hw1's "putting
    it together" once did) is named, and so is a grading cell of a later homework's exercise.
    (`python -m course.check_release` checks every homework's notebooks the same way.)"""
    import json

    from course.check_notebooks import check_notebooks
    ref = tmp_path / "reference"
    make_release(ref, ROOT, only=())  # a copy of the reference, every exercise written
    path = ref / "notebooks" / "hw1_autograd.ipynb"
    clean = path.read_text()

    def plant(source: str) -> list:
        nb = json.loads(clean)
        nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "planted",
                            "metadata": {}, "outputs": [], "source": source})
        path.write_text(json.dumps(nb))
        return check_notebooks(tmp_path / "work", root=ref,
                               homeworks=["hw1"])["notebook_not_finishing"]

    found = plant("print(ops.logsumexp(ndl.Tensor([[1.0, 2.0]]), (1,)))")
    assert len(found) == 1 and found[0].startswith("hw1 written: hw1_autograd.ipynb stops"), found
    assert "NotImplementedError: hw2.ops.logsumexp" in found[0], found
    found = plant('grade("hw2.ops.logsumexp")')
    assert found == ["hw1 written: hw1_autograd.ipynb grades exercises not written yet: "
                     "['hw2.ops.logsumexp']"], found
    path.write_text(clean)
    assert check_notebooks(tmp_path / "work", root=ref, homeworks=["hw1"]) == {
        "notebook_not_finishing": []}
