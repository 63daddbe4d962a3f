"""pytest plugin behind `make grade`: graded tests, their outcomes, the score table and JSON.

Loaded for every run by the repository's top-level ``conftest.py``. A graded test carries
``@pytest.mark.grade("hw1.ops.matmul", points=2)``, written on the test or given at collection
from the rubric (``course/exercises.py``). Options:

    --graded               run only graded tests
    --exercise E [E ...]   run only the graded tests of these exercises (ids or prefixes such
                           as ``hw2.optim``; implies --graded)
    --grade-report PATH    print the score per exercise and homework, and write it as JSON
    --coverage-contexts    under ``coverage run``, record each test's lines under its node id
                           (the release check reads which exercises' regions a test runs)
"""
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from .exercises import EXERCISES, backend_of

_KEY = pytest.StashKey[Dict[str, Any]]()

try:  # HYPOTHESIS_PROFILE=grade-failfast: a failing property test fails at once (no shrinking),
    # so the student release, where every graded test fails, is checked in seconds
    from hypothesis import HealthCheck, Phase, settings
    settings.register_profile("grade-failfast", max_examples=10, deadline=None,
                              derandomize=True, database=None, report_multiple_bugs=False,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate),
                              suppress_health_check=list(HealthCheck))
except ImportError:  # hypothesis is a dev dependency
    pass


def _rubric() -> Dict[str, List[Tuple["re.Pattern[str]", str, int]]]:
    """test module -> [(test-id regex, exercise, points)] in rubric order."""
    table: Dict[str, List[Tuple["re.Pattern[str]", str, int]]] = {}
    for ex in EXERCISES:
        for pattern in ex.tests:
            module, _, test = pattern.partition("::")
            regex = re.compile("".join(".*" if part == "*" else re.escape(part)
                                       for part in re.split(r"(\*)", test)) + r"\Z")
            table.setdefault(module, []).append((regex, ex.name, ex.points))
    return table


# A test case on the cuda device (its id names it as a parameter) is graded only by the CUDA
# exercises: an op's score must not depend on the CUDA backend (or on a GPU being there).
_CUDA_CASE = re.compile(r"[\[-]cuda[\]-]")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grade", "course grader (make grade)")
    group.addoption("--graded", action="store_true", help="run only graded tests")
    group.addoption("--exercise", action="append", default=[], metavar="E",
                    help="run only the graded tests of exercise E (an id or a prefix such as "
                         "hw2.optim; repeat or separate with commas for several)")
    group.addoption("--grade-report", default=None, metavar="PATH",
                    help="print the score table and write it as JSON to PATH")
    group.addoption("--coverage-contexts", action="store_true",
                    help="under coverage run: one coverage context per test (its node id)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "grade(exercise, points=1): a graded test of `exercise`")
    config.stash[_KEY] = {"tests": {}, "reports": []}
    config.pluginmanager.register(_Recorder(config.stash[_KEY]["reports"]), "grade-recorder")
    config.pluginmanager.register(_HomeworkBackend(), "grade-homework-backend")


class _Recorder:
    """Keeps every test report (the summary hook reads them back)."""

    def __init__(self, reports: List[pytest.TestReport]) -> None:
        self.reports = reports

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)


class _HomeworkBackend:
    """Runs a graded test (setup, call and teardown) on its homework's array backend
    (``HOMEWORK_BACKEND``: hw1's and hw2's on NumPy, ``NEEDLE_BACKEND=np``, so they need no
    hw3 exercise), hidden tests outside tests/ included."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]
                                ) -> Any:
        marker = item.get_closest_marker("grade")
        try:
            from needle.backend_selection import use_backend
        except Exception:  # a needle that does not import fails the test itself
            marker = None
        if marker is None:
            yield
            return
        with use_backend(backend_of(marker.args[0])):
            yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """With --coverage-contexts, the lines a test runs are recorded under its node id."""
    cov = None
    if item.config.getoption("--coverage-contexts"):
        import coverage
        cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")


def select_exercises(wanted: List[str], names: List[str]) -> List[str]:
    """The exercises of ``names`` that ``wanted`` (ids or dotted prefixes) picks; an entry
    picking none is an error naming the exercises there are."""
    picked = []
    for want in wanted:
        hits = [n for n in names if n == want or n.startswith(want.rstrip(".") + ".")]
        if not hits:
            raise pytest.UsageError(f"--exercise {want}: no such exercise or prefix; the "
                                    f"exercises are {', '.join(names)}")
        picked += [n for n in hits if n not in picked]
    return picked


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    state = config.stash[_KEY]
    rubric = _rubric()
    wanted = [w for opt in config.getoption("--exercise") for w in opt.split(",") if w]
    graded_only = config.getoption("--graded") or bool(wanted)
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("grade")
        if marker is not None:
            exercise, points = marker.args[0], marker.kwargs.get("points", 1)
        else:
            exercise = None
            for regex, name, pts in rubric.get(Path(str(item.fspath)).stem, ()):
                if regex.match(item.name) and not (_CUDA_CASE.search(item.name)
                                                   and not name.startswith("hw3.cuda.")):
                    exercise, points = name, pts
                    item.add_marker(pytest.mark.grade(name, points=pts))
                    break
        if exercise is not None:
            state["tests"][item.nodeid] = (exercise, points)
        (keep if exercise is not None or not graded_only else drop).append(item)
    if wanted:
        names = sorted({ex.name for ex in EXERCISES} | {e for e, _ in state["tests"].values()})
        picked = set(select_exercises(wanted, names))
        drop += [item for item in keep if state["tests"][item.nodeid][0] not in picked]
        keep = [item for item in keep if state["tests"][item.nodeid][0] in picked]
        state["tests"] = {k: v for k, v in state["tests"].items() if v[0] in picked}
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _outcomes(tests: Dict[str, Tuple[str, int]], reports: List[pytest.TestReport]
              ) -> Dict[str, Tuple[str, str]]:
    """nodeid -> (passed | failed | skipped, first line of the failure)."""
    res: Dict[str, Tuple[str, str]] = {}
    for rep in reports:
        if rep.nodeid not in tests:
            continue
        if rep.failed:
            crash = getattr(rep.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(rep.longrepr)[-500:]
            res[rep.nodeid] = ("failed", message)
        elif rep.skipped and rep.nodeid not in res:
            res[rep.nodeid] = ("skipped", "")
        elif rep.when == "call" and rep.passed and rep.nodeid not in res:
            res[rep.nodeid] = ("passed", "")
    return res


_STUB = re.compile(r"NotImplementedError: ([\w.]+): write ")


def missing_prerequisite(message: str, exercise: str) -> Optional[str]:
    """The other exercise whose stub a failure of ``exercise``'s test hit, or None."""
    match = _STUB.search(message)
    return match[1] if match is not None and match[1] != exercise else None


def score(tests: Dict[str, Tuple[str, int]], outcomes: Dict[str, Tuple[str, str]]
          ) -> Dict[str, Any]:
    """The report: per exercise (points x passed / run) and per homework."""
    exercises: Dict[str, Dict[str, Any]] = {}
    for nodeid, (name, points) in tests.items():
        ex = exercises.setdefault(name, {"exercise": name, "points": points, "passed": 0,
                                         "failed": 0, "skipped": 0, "tests": []})
        outcome, message = outcomes.get(nodeid, ("skipped", "not run"))
        ex[outcome] += 1
        needs = missing_prerequisite(message, name) if outcome == "failed" else None
        if needs is not None:
            message = f"needs {needs} first: {message}"
            ex.setdefault("needs", [])
            ex["needs"] += [needs] if needs not in ex["needs"] else []
        ex["tests"].append({"test": nodeid, "outcome": outcome, "message": message})
    homeworks: Dict[str, Dict[str, float]] = {}
    for ex in exercises.values():
        run = ex["passed"] + ex["failed"]
        ex["earned"] = round(ex["points"] * ex["passed"] / run, 2) if run else 0.0
        ex["max"] = ex["points"] if run else 0
        hw = homeworks.setdefault(ex["exercise"].split(".")[0], {"earned": 0.0, "max": 0})
        hw["earned"] = round(hw["earned"] + ex["earned"], 2)
        hw["max"] += ex["max"]
    total = {"earned": round(sum(h["earned"] for h in homeworks.values()), 2),
             "max": sum(h["max"] for h in homeworks.values())}
    return {"total": total, "homeworks": homeworks,
            "exercises": sorted(exercises.values(), key=lambda e: e["exercise"])}


def format_table(report: Dict[str, Any]) -> str:
    """The score table, one block per homework."""
    lines = []
    by_hw: Dict[str, List[Dict[str, Any]]] = {}
    for ex in report["exercises"]:
        by_hw.setdefault(ex["exercise"].split(".")[0], []).append(ex)
    for hw in sorted(by_hw):
        lines.append(f"{hw:<44}{'tests':>12}{'points':>12}")
        for ex in by_hw[hw]:
            run = ex["passed"] + ex["failed"]
            tests = f"{ex['passed']}/{run}" + (f" ({ex['skipped']} skip)" if ex["skipped"]
                                               else "")
            pts = f"{ex['earned']:>9g}/{ex['max']:<2}" if run else f"{'skipped':>12}"
            lines.append(f"  {ex['exercise']:<42}{tests:>12}{pts}")
            lines += [f"      needs {n} first" for n in ex.get("needs", ())]
        h = report["homeworks"][hw]
        lines.append(f"  {'total ' + hw:<42}{'':>12}{h['earned']:>9g}/{h['max']:<2}")
        lines.append("")
    t = report["total"]
    lines.append(f"TOTAL {t['earned']:g}/{t['max']}")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    path: Optional[str] = config.getoption("--grade-report")
    if not path:
        return
    state = config.stash[_KEY]
    report = score(state["tests"], _outcomes(state["tests"], state["reports"]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))
    terminalreporter.write_sep("=", "grade")
    terminalreporter.write_line(format_table(report))
    terminalreporter.write_line(f"report: {path}")
