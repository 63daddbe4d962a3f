"""Repository-wide pytest setup: the course grader plugin (course/grade_plugin.py) for every run."""
pytest_plugins = ("course.grade_plugin",)
