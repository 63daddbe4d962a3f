"""course/grade_plugin.py's rules on collected items and reports, with stand-in items: a CUDA case
is graded only by a CUDA exercise; a later skip never hides a failure."""
import types

from course import grade_plugin, scoring


def _config(state):
    options = {"--exercise": [], "--graded": False}
    return types.SimpleNamespace(
        stash={grade_plugin._KEY: state}, getoption=options.__getitem__,
        hook=types.SimpleNamespace(pytest_deselected=lambda items: None))


def _item(module, name):
    markers = []
    return types.SimpleNamespace(
        name=name, nodeid=f"tests/{module}.py::{name}", fspath=f"/repo/tests/{module}.py",
        get_closest_marker=lambda _: None, add_marker=markers.append, markers=markers)


def _wildcard_rule():
    """A rubric rule ``prefix*`` of a non-CUDA exercise: (module, a test name it grades,
    exercise)."""
    for module, rules in grade_plugin._rubric().items():
        for regex, name, _ in rules:
            stem = regex.pattern[:-len(r".*\Z")]
            if regex.pattern.endswith(r".*\Z") and not name.startswith("hw3.cuda."):
                return module, stem.replace("\\", "") + "case", name
    raise AssertionError("the rubric has no wildcard rule of a non-CUDA exercise")


def test_cuda_case_is_not_graded_by_a_non_cuda_exercise():
    module, test, exercise = _wildcard_rule()
    state = {"tests": {}, "skip": set()}
    cpu, cuda = _item(module, f"{test}[x-cpu]"), _item(module, f"{test}[x-cuda]")
    grade_plugin.pytest_collection_modifyitems(_config(state), [cpu, cuda])
    assert state["tests"] == {cpu.nodeid: (exercise, state["tests"][cpu.nodeid][1])}
    assert cpu.markers and not cuda.markers


def _report(when, outcome):
    return types.SimpleNamespace(nodeid="t::x", when=when, failed=outcome == "failed",
                                 skipped=outcome == "skipped", passed=outcome == "passed",
                                 longrepr="AssertionError: wrong")


def test_a_later_skip_does_not_hide_a_failure():
    reports = [_report("setup", "passed"), _report("call", "failed"),
               _report("teardown", "skipped")]
    assert scoring.outcome_of(reports).outcome == "failed"


def test_a_teardown_error_after_a_skip_is_a_failure():
    """Any phase that failed fails the test, even after a skipped call (a fixture's teardown
    that raises must not be hidden by the test's own skip)."""
    reports = [_report("setup", "passed"), _report("call", "skipped"),
               _report("teardown", "failed")]
    assert scoring.outcome_of(reports).outcome == "failed"
