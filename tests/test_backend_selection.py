"""NEEDLE_BACKEND=np|nd (needle/backend_selection.py) and the backend each homework grades on."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import needle as ndl
from course.exercises import EXERCISES, backend_of
from needle import backend_selection
from needle.backend_selection import use_backend

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, backend: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEEDLE_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_environment_picks_the_backend():
    code = "import needle as ndl; t = ndl.Tensor([1.5]); print(t.dtype, type(t.cached_data))"
    res = _python(code, "np")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == "float64" and "NumpyArray" in res.stdout
    res = _python(code, "nd")
    assert res.stdout.split()[0] == "float32" and "NDArray" in res.stdout
    res = _python(code, "torch")
    assert res.returncode != 0 and "NEEDLE_BACKEND='torch'" in res.stderr


def test_use_backend_restores_the_previous_one():
    before = backend_selection.backend()
    with use_backend("np"):
        assert backend_selection.backend() == "np"
        with pytest.raises(RuntimeError):
            with use_backend("nd"):
                assert ndl.Tensor([1.0]).dtype == "float32"
                raise RuntimeError
        assert ndl.Tensor([1.0]).dtype == "float64"
    assert backend_selection.backend() == before
    with pytest.raises(ValueError, match="'cupy'.*'nd'.*'np'"):
        backend_selection.set_backend("cupy")


def test_hw1_and_hw2_grade_on_numpy_the_rest_on_the_ndarray():
    for ex in EXERCISES:
        want = "np" if ex.homework in ("hw1", "hw2") else "nd"
        assert backend_of(ex.name) == want, ex.name


HIDDEN = '''
import pytest
import needle as ndl


@pytest.mark.grade("hw1.hidden.lists", points=1)
def test_hw1_hidden():
    assert ndl.Tensor([1.5]).dtype == "float64"


@pytest.mark.grade("hw3.hidden.lists", points=1)
def test_hw3_hidden():
    assert ndl.Tensor([1.5]).dtype == "float32"


def test_not_graded():
    assert ndl.Tensor([1.5]).dtype == "float32"
'''


@pytest.mark.slow
def test_grader_runs_each_graded_test_on_its_homeworks_backend(tmp_path):
    """Hidden tests outside tests/ included: the grading plugin, not a conftest, switches."""
    (tmp_path / "test_hidden_backend.py").write_text(HIDDEN)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "course.grade_plugin", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_hidden_backend.py")],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout[-3000:]
