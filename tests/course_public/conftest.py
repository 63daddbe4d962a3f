"""The course's public tests of homework N (``test_hwN.py``) run on that homework's backend:
hw1's and hw2's on NumPy arrays (a list of floats is float64), as in the course."""
import pytest

from course.exercises import backend_of
from needle.backend_selection import use_backend


@pytest.fixture(autouse=True)
def _homework_backend(request: pytest.FixtureRequest):
    """hw1/hw2 modules on ``np``, the others on ``nd`` (course/exercises.py)."""
    homework = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    with use_backend(backend_of(homework)):
        yield
