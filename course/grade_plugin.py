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

and, for ``course/grade.py``, which runs this plugin in a child process and survives it:
``--grade-log PATH`` (one JSON line per graded test started and finished), ``--grade-skip PATH``
(node ids already graded), ``--grade-forked PATH`` (test files whose tests each run in a forked
child, ``course/forked.py``) and ``--grade-timeout S`` (the time limit of a forked test).
"""
import json
import re
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Tuple

import pytest

from .exercises import EXERCISES, backend_of
from .forked import run_forked
from .scoring import Outcome, format_table, outcome_of, score

_KEY = pytest.StashKey[Dict[str, Any]]()

try:  # HYPOTHESIS_PROFILE=grade-failfast: a failing property test fails at once (no shrinking),
    # so the student release, where every graded test fails, is checked in seconds
    from hypothesis import HealthCheck, Phase, settings
    settings.register_profile("grade-failfast", max_examples=10, deadline=None,
                              derandomize=True, database=None, report_multiple_bugs=False,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate),
                              suppress_health_check=list(HealthCheck))
    # `make grade` (course/grade.py): the examples of tests/conftest.py's "needle" profile, so a
    # solution passes here as under `make test`, but a failure is reported as found, unshrunk
    # (shrinking a stub's failure took minutes per property test)
    settings.register_profile("grade", max_examples=50, deadline=None, derandomize=True,
                              database=None, report_multiple_bugs=False,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate),
                              suppress_health_check=[HealthCheck.too_slow])
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
    group.addoption("--grade-log", default=None, metavar="PATH",
                    help="(course.grade) write each graded test's start and outcome to PATH")
    group.addoption("--grade-skip", default=None, metavar="PATH",
                    help="(course.grade) a file of node ids already graded: deselect them")
    group.addoption("--grade-forked", default=None, metavar="PATH",
                    help="(course.grade) a file of test files whose tests each run forked")
    group.addoption("--grade-timeout", type=float, default=300.0, metavar="S",
                    help="(course.grade) time limit of a forked test, seconds")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "grade(exercise, points=1): a graded test of `exercise`")
    path = config.getoption("--grade-log")
    log = open(path, "a", buffering=1) if path else None
    forked = {str(Path(f).resolve()) for f in _lines(config.getoption("--grade-forked"))}
    config.stash[_KEY] = {"tests": {}, "outcomes": {}, "log": log, "forked": forked,
                          "skip": set(_lines(config.getoption("--grade-skip")))}
    config.pluginmanager.register(_Recorder(config.stash[_KEY]), "grade-recorder")
    config.pluginmanager.register(_HomeworkBackend(), "grade-homework-backend")


def _lines(path: Optional[str]) -> List[str]:
    return Path(path).read_text().splitlines() if path else []


def _write(log: Optional[IO[str]], entry: Dict[str, Any]) -> None:
    if log is not None:
        log.write(json.dumps(entry) + "\n")


class _Recorder:
    """Gathers each graded test's reports into one outcome (and logs it for course.grade)."""

    def __init__(self, state: Dict[str, Any]) -> None:
        self.state = state
        self.reports: Dict[str, List[pytest.TestReport]] = {}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            _write(self.state["log"], {"collect_error": report.nodeid,
                                       "message": str(report.longrepr)[-2000:]})

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if nodeid in self.state["tests"]:
            _write(self.state["log"], {"start": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        reports = self.reports.pop(nodeid, [])
        if nodeid not in self.state["tests"]:
            return
        outcome = outcome_of(reports)
        self.state["outcomes"][nodeid] = outcome
        details = "\n\n".join(f"[{r.when}] {r.longreprtext}" for r in reports if r.failed)
        _write(self.state["log"], {"done": nodeid, "outcome": outcome.outcome,
                                   "message": outcome.message, "details": details})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]
                                ) -> Optional[bool]:
        """A test of a file listed by --grade-forked runs in a forked child (forked.py)."""
        if str(item.fspath) not in self.state["forked"]:
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in run_forked(item, nextitem, item.config.getoption("--grade-timeout")):
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    log = session.config.stash[_KEY]["log"]
    if log is not None:
        log.close()


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
    keep: List[pytest.Item] = []
    drop: List[pytest.Item] = []
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
    if state["skip"]:  # a resumed course.grade run: these were graded before a crash
        drop += [item for item in keep if item.nodeid in state["skip"]]
        keep = [item for item in keep if item.nodeid not in state["skip"]]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """Log the graded tests that will run (after every deselection, -k's included)."""
    state = session.config.stash[_KEY]
    _write(state["log"], {"graded": {item.nodeid: [*state["tests"][item.nodeid],
                                                   str(item.fspath)]
                                     for item in session.items if item.nodeid in state["tests"]}})


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    path: Optional[str] = config.getoption("--grade-report")
    if not path:
        return
    state = config.stash[_KEY]
    outcomes: Dict[str, Outcome] = state["outcomes"]
    report = score(state["tests"], dict(outcomes))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))
    terminalreporter.write_sep("=", "grade")
    terminalreporter.write_line(format_table(report))
    terminalreporter.write_line(f"report: {path}")
