"""Repository-wide pytest setup: the course grader plugin (course/grading.py) for every run."""
pytest_plugins = ("course.grading",)
