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
    package index unreachable it scores (the first grade used to reinstall, and offline pip
    failed: "No matching distribution found for setuptools")."""
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
