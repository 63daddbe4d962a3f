"""Check the student release against the reference: what `make student` promises.

1. the release imports, and ``python -m apps.demo`` there fails only with NotImplementedError;
2. every graded test fails in the release, with NotImplementedError: nothing written scores 0;
3. every graded test passes in the reference, and every solution region runs under the graded
   tests (line coverage of one graded run; ``UNTRACED`` regions are named in the rubric);
4. every rubric pattern names at least one test, and the ``requires`` graph names real
   exercises without a cycle and follows the course order (no exercise requires one of a later
   homework; every mode checks this first and stops on it); in that same coverage run (one
   context per test), every region a graded test of E runs belongs to E or to an exercise E
   requires (no missing declaration);
5. isolation, per exercise E: the reference with only E's regions stubbed fails every graded
   test of E with the NotImplementedError naming E. A test passing there means some code outside
   E's regions (a fused or tuned copy, a helper) computes E's answer: a student could pass E
   without writing it. Only E's graded tests run, from their own test modules, each session
   forked from a pytest server that imported the heavy libraries once (course/pytest_forks.py),
   two copies of the tree side by side.
6. ``--restore-each``: per exercise E, the release with E and its requirements written scores
   exactly their points. With 2 (no missing declaration) and 5 (no leak) this is the rubric
   rule of course/exercises.py; it runs a graded run per exercise, so CI runs it for a few.
7. ``--homework``: per homework H, the release with H's exercises and those of the homeworks
   before it written, none of a later one, scores all of H's points (hw1 and hw2 compute on
   NumPy, ``NEEDLE_BACKEND=np``: they need no hw3 exercise).
8. no shipped file points to what the release lacks (``dangling_references``): a path, a
   README section, a ``python -m`` module or a ``make`` target the reference has.
9. ``--notebooks`` (and the default run): per homework H, the release with H and the homeworks
   before it written runs every notebook of those homeworks to its end (course/check_notebooks.py).

    python -m course.check_release [--out build/student-check] [--isolation-only]
                                   [--restore-each] [--homework] [--notebooks] [E or H ...]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .check_notebooks import check_notebooks
from .exercises import (
    EXERCISES,
    HOMEWORKS,
    UNTRACED,
    Exercise,
    requirements,
    requires_problems,
    test_files,
)
from .grade_plugin import select_exercises
from .make_student import CUDA_SUFFIXES, ROOT, Region, all_regions, make_release, stub_file

# a module that fails to import in the release (it builds a stubbed layer at import) must not
# stop the graded run: its tests are simply not collected
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--graded",
          "--continue-on-collection-errors"]


def _env(root: Path) -> Dict[str, str]:
    # the release's own packages first, whatever is installed (pip install -e of the reference)
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def _graded_run(root: Path, report: Path, prefix: Sequence[str] = (), timeout: float = 1800,
                env: Optional[Dict[str, str]] = None, args: Sequence[str] = ("tests",)
                ) -> Dict[str, Any]:
    cmd = [sys.executable, *prefix, *PYTEST, "--grade-report", str(report), *args]
    subprocess.run(cmd, cwd=root, env={**_env(root), **(env or {})}, capture_output=True,
                   text=True, timeout=timeout)
    if not report.exists():
        raise RuntimeError(f"graded run in {root} wrote no report: {' '.join(cmd)}")
    return json.loads(report.read_text())


def _tests(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [t for ex in report["exercises"] for t in ex["tests"]]


def check_imports_and_demo(release: Path) -> List[str]:
    """Problems with importing the release or with its demo's failure."""
    problems = []
    code = ("import needle, apps.simple_ml, apps.mlp_resnet, apps.models, apps.demo; "
            "print(needle.__file__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=release, env=_env(release),
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        problems.append(f"the release does not import:\n{res.stderr[-2000:]}")
    elif not Path(res.stdout.strip()).resolve().is_relative_to(release.resolve()):
        problems.append(f"the release imported the reference needle: {res.stdout.strip()}")
    res = subprocess.run([sys.executable, "-m", "apps.demo", "--epochs", "1", "--budget", "1",
                          "--no-progress"], cwd=release, env=_env(release),
                         capture_output=True, text=True, timeout=300)
    last = res.stderr.strip().splitlines()[-1:] or [""]
    if res.returncode == 0 or not last[0].startswith("NotImplementedError"):
        problems.append(f"the release's demo should fail with NotImplementedError, got rc "
                        f"{res.returncode}: {last[0]!r}")
    return problems


def check_release_fails(release: Path, workdir: Path) -> List[str]:
    """Graded tests that do not fail with NotImplementedError in the release."""
    report = _graded_run(release, workdir / "release.json",
                         env={"HYPOTHESIS_PROFILE": "grade-failfast"})
    bad = [f"{t['test']}: {t['outcome']} {t['message'][:200]}" for t in _tests(report)
           if t["outcome"] == "passed" or (t["outcome"] == "failed"
                                           and "NotImplementedError" not in t["message"])]
    if report["total"]["earned"] != 0:
        bad.append(f"the release (nothing written) scores {report['total']['earned']}, not 0")
    return bad


def check_reference(workdir: Path, root: Path = ROOT) -> Dict[str, List[str]]:
    """Graded tests failing in the reference, regions no graded test runs, empty patterns."""
    rc = workdir / "coveragerc"
    rc.write_text(f"[run]\ndata_file = {workdir / 'coverage.dat'}\n"
                  f"source = {root / 'needle'},{root / 'apps'}\n")
    report = _graded_run(root, workdir / "reference.json",
                         prefix=["-m", "coverage", "run", f"--rcfile={rc}"],
                         args=("--coverage-contexts", "tests"))
    failing = [f"{t['test']}: {t['message'][:200]}" for t in _tests(report)
               if t["outcome"] == "failed"]
    import coverage
    data = coverage.CoverageData(basename=str(workdir / "coverage.dat"))
    data.read()
    executed = {Path(f).resolve(): set(data.lines(f) or ()) for f in data.measured_files()}
    exercises = {ex.name for ex in EXERCISES}
    uncovered = []
    for region in all_regions(root):
        if region.key in UNTRACED or Path(region.path).suffix in CUDA_SUFFIXES:
            continue  # CUDA C is not traced: its regions are stubbed with their exercise
        lines = executed.get((root / region.path).resolve(), set())
        if not any(region.begin < n < region.end for n in lines):
            uncovered.append(f"{region.key} (line {region.begin})")
    keys = {r.key for r in all_regions(root)}
    stale = [f"UNTRACED names no region: {k}" for k in UNTRACED if k not in keys]
    stale += [f"UNTRACED names no exercise: {v}" for v in UNTRACED.values() if v not in exercises]
    seen = {ex["exercise"] for ex in report["exercises"]}
    stale += [f"exercise {n} matches no test" for n in sorted(exercises - seen)]
    return {"failing": failing, "uncovered": uncovered, "stale": stale,
            "undeclared_requires": undeclared_requires(data, root, report),
            "requires_graph": requires_problems()}


class _Forks:
    """A ``course.pytest_forks`` server in ``root``: graded sessions forked from one process
    that imported the heavy libraries once (a fresh interpreter per session cost most of the
    isolation check's time)."""

    def __init__(self, root: Path, env: Dict[str, str], timeout: float, log: Path) -> None:
        self.root = root
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "course.pytest_forks", "--timeout", str(timeout)],
                cwd=root, env={**_env(root), **env}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True)

    def graded_run(self, report: Path, args: Sequence[str]) -> Dict[str, Any]:
        """The graded report of one session ``args`` (as ``_graded_run``'s)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"args": [*PYTEST[2:], "--grade-report", str(report), *args],
                   "log": str(report.with_suffix(".out"))}
        report.unlink(missing_ok=True)  # a report left from an earlier run must not count
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the pytest server in {self.root} ended (exit status "
                               f"{self.proc.wait()}): see its log")
        if not report.exists():
            raise RuntimeError(f"graded run in {self.root} wrote no report ({answer.strip()}): "
                               f"{' '.join(request['args'])}; its output: {request['log']}")
        return json.loads(report.read_text())

    def close(self) -> None:
        """End the server (it ends when its stdin closes)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _isolated_run(ex: Exercise, copy: Path, root: Path, regions: List[Region],
                  workdir: Path, forks: _Forks) -> Dict[str, Any]:
    """The graded report of ``ex``'s tests in ``copy`` with only ``ex``'s regions stubbed."""
    files = sorted({r.path for r in regions if r.exercise == ex.name})
    try:
        for rel in files:
            (copy / rel).write_text(stub_file(root / rel, root, only=[ex.name])[0])
        return forks.graded_run(workdir / f"isolation-{ex.name}.json",
                                [f"--exercise={ex.name}", *test_files([ex.name], copy)])
    finally:
        for rel in files:
            shutil.copy2(root / rel, copy / rel)


def check_isolation(workdir: Path, root: Path = ROOT, names: Sequence[str] = (),
                    log: Any = None, workers: int = 2) -> Dict[str, List[str]]:
    """Per exercise (``names``: ids or prefixes, default all): its graded tests that do not fail
    with the NotImplementedError naming it when only its regions are stubbed; the exercises
    no region names; and those none of whose tests ran here (all skipped: e.g. CUDA).
    ``workers`` copies of the tree, each with its own pytest server, check side by side."""
    regions = all_regions(root)
    picked = set(select_exercises(list(names), [e.name for e in EXERCISES])) if names else None
    todo = [ex for ex in EXERCISES if picked is None or ex.name in picked]
    res: Dict[str, List[str]] = {"not_isolated": [], "no_region": [], "isolation_unchecked": []}
    res["no_region"] = [ex.name for ex in todo if not any(r.exercise == ex.name for r in regions)]
    todo = [ex for ex in todo if ex.name not in res["no_region"]]
    shares = [todo[i::workers] for i in range(workers) if todo[i::workers]]
    with ThreadPoolExecutor(max_workers=max(1, len(shares))) as pool:
        found = [pool.submit(_isolate_share, share, workdir / f"isolation-copy-{i}", root,
                             regions, workdir, log) for i, share in enumerate(shares)]
        lines = {name: problems for f in found for name, problems in f.result().items()}
    for ex in todo:  # in rubric order, whichever copy checked it
        not_isolated, unchecked = lines[ex.name]
        res["not_isolated"] += not_isolated
        res["isolation_unchecked"] += unchecked
    return res


def _isolate_share(share: List[Exercise], copy: Path, root: Path, regions: List[Region],
                   workdir: Path, log: Any) -> Dict[str, Tuple[List[str], List[str]]]:
    """exercise -> (not isolated lines, unchecked lines) of ``share``, checked one after the
    other in ``copy`` (the reference as shipped) by one pytest server."""
    make_release(copy, root, only=())  # nothing stubbed yet
    forks = _Forks(copy, {"HYPOTHESIS_PROFILE": "grade-failfast"}, timeout=600,
                   log=copy.with_name(copy.name + "-server.txt"))
    try:
        return {ex.name: _isolate(ex, copy, root, regions, workdir, forks, log) for ex in share}
    finally:
        forks.close()


def _isolate(ex: Exercise, copy: Path, root: Path, regions: List[Region], workdir: Path,
             forks: _Forks, log: Any) -> Tuple[List[str], List[str]]:
    """(graded tests of ``ex`` not failing with its NotImplementedError when only its regions
    are stubbed, a line if none of its tests ran)."""
    start = time.perf_counter()
    tests = _tests(_isolated_run(ex, copy, root, regions, workdir, forks))
    not_isolated = [f"{ex.name}: {t['test']}: {t['outcome']} {t['message'][:200]}"
                    for t in tests if t["outcome"] == "passed" or (
                        t["outcome"] == "failed" and not (
                            "NotImplementedError" in t["message"] and ex.name in t["message"]))]
    unchecked = ([] if any(t["outcome"] != "skipped" for t in tests)
                 else [f"{ex.name}: none of its {len(tests)} tests ran"])
    if log is not None:
        log(f"isolation {ex.name}: {len(tests)} tests, {time.perf_counter() - start:.1f}s")
    return not_isolated, unchecked


def _written_run(workdir: Path, root: Path, written: Set[str], graded: Sequence[str],
                 tag: str) -> Tuple[float, int, List[str]]:
    """(earned, points, failing tests) of the exercises ``graded`` in the release with only
    the exercises ``written`` written (their regions restored, every other region stubbed)."""
    every = [e.name for e in EXERCISES]
    release = workdir / "restored"
    make_release(release, root, only=[n for n in every if n not in written])
    rep = _graded_run(release, workdir / f"restored-{tag}.json", timeout=900,
                      env={"HYPOTHESIS_PROFILE": "grade-failfast"},
                      args=[f"--exercise={','.join(sorted(graded))}",
                            *test_files(sorted(graded), release)])
    expected = sum(e.points for e in EXERCISES if e.name in graded)
    failing = [f"{t['test']}: {t['message'][:200]}" for t in _tests(rep)
               if t["outcome"] == "failed"]
    return rep["total"]["earned"], expected, failing


def check_restored(workdir: Path, root: Path = ROOT, names: Sequence[str] = (),
                   log: Any = None) -> Dict[str, List[str]]:
    """Per exercise E (``names``: ids or prefixes, default all): the release with E and its
    requirements written (their regions restored from the reference, every other region
    stubbed) must score exactly their points. Lines name the tests of E or of a requirement
    failing there, and the exercise whose stub a failure hit (a missing declaration)."""
    every = [e.name for e in EXERCISES]
    picked = select_exercises(list(names), every) if names else every
    res: Dict[str, List[str]] = {"restored_not_scoring": []}
    for name in picked:
        start = time.perf_counter()
        written = {name} | requirements(name)
        earned, expected, failing = _written_run(workdir, root, written, sorted(written), name)
        res["restored_not_scoring"] += _not_scoring(name, earned, expected, failing)
        if log is not None:
            log(f"restored {name} (+{len(written) - 1} required): {earned}/{expected} points, "
                f"{time.perf_counter() - start:.1f}s")
    return res


def _not_scoring(label: str, earned: float, expected: float, failing: List[str]
                 ) -> List[str]:
    """What kept ``label``'s run from its points: its failing tests, else the shortfall."""
    if failing:
        return [f"{label}: {line}" for line in failing]
    return [] if earned == expected else [f"{label}: scored {earned} of {expected}"]


def check_homeworks(workdir: Path, root: Path = ROOT, homeworks: Sequence[str] = (),
                    log: Any = None) -> Dict[str, List[str]]:
    """Per homework H (default all): the release with H's exercises and those of the
    homeworks before it written, none of a later one, must score all of H's points (the
    course's order: a student at hw1 has written no hw3 exercise)."""
    res: Dict[str, List[str]] = {"homework_not_scoring": []}
    for hw in homeworks or HOMEWORKS:
        if hw not in HOMEWORKS:
            raise ValueError(f"--homework {hw}: the homeworks are {', '.join(HOMEWORKS)}")
        start = time.perf_counter()
        before = HOMEWORKS[:HOMEWORKS.index(hw) + 1]
        written = {e.name for e in EXERCISES if e.homework in before}
        graded = [e.name for e in EXERCISES if e.homework == hw]
        earned, expected, failing = _written_run(workdir, root, written, graded, hw)
        res["homework_not_scoring"] += _not_scoring(hw, earned, expected, failing)
        if log is not None:
            log(f"{hw} written (with {', '.join(before[:-1]) or 'nothing'} before it): "
                f"{earned}/{expected} points, {time.perf_counter() - start:.1f}s")
    return res


def region_dependencies(data: Any, root: Path, tests: Dict[str, str]
                        ) -> Dict[str, Dict[str, str]]:
    """exercise E -> {other exercise X whose regions E's graded tests ran: one such test},
    read from a coverage run with one context per test (``--coverage-contexts``)."""
    measured = {Path(f).resolve(): f for f in data.measured_files()}
    deps: Dict[str, Dict[str, str]] = {}
    for region in all_regions(root):
        fname = measured.get((root / region.path).resolve())
        if fname is None:
            continue
        by_line = data.contexts_by_lineno(fname)
        for n in range(region.begin + 1, region.end):
            for ctx in by_line.get(n, ()):
                ex = tests.get(ctx)
                if ex is not None and ex != region.exercise:
                    deps.setdefault(ex, {}).setdefault(region.exercise, ctx)
    return deps


def undeclared_requires(data: Any, root: Path, report: Dict[str, Any]) -> List[str]:
    """Graded tests of E running the regions of an exercise E does not require."""
    tests = {t["test"]: ex["exercise"] for ex in report["exercises"] for t in ex["tests"]}
    return [f"{ex} does not require {other}, but its test {test} runs {other}'s regions"
            for ex, found in sorted(region_dependencies(data, root, tests).items())
            for other, test in sorted(found.items()) if other not in requirements(ex)]


_EXT = r"(?:py|md|ipynb|cu|cuh|h|json|ini|toml|txt|sh|png|cfg|supp)"
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\." + _EXT + r")\b")
# README, "Dtypes" / README.md's "GPU" / benchmarks/README.md, "Figures ..." (in JSON: \")
_SECTION = re.compile(r"((?:[\w.-]+/)*README(?:\.md)?)(?:'s|,)? \\?\"([^\"\\]+)")
_MODULE = re.compile(r"python3? -m ((?:needle|apps|course|tools|benchmarks)(?:\.\w+)+)")
_MAKE = re.compile(r"`make ([\w-]+)")


def _headings(path: Path) -> List[str]:
    """The headings of a Markdown file, lower case ([] when there is none)."""
    if not path.is_file():
        return []
    return [line.lstrip("#").strip().lower() for line in path.read_text().splitlines()
            if line.startswith("#")]


def _module_exists(root: Path, module: str) -> bool:
    base = root.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def _targets(makefile: Path) -> Set[str]:
    return set(re.findall(r"^([\w-]+):", makefile.read_text(), re.M))


def _line_references(line: str, here: Path, release: Path, root: Path) -> List[str]:
    """What one line of a shipped file (``here``: its folder in the release) points to that the
    reference has and the release lacks."""
    out = []
    for match in _PATH.finditer(line):
        for base in (Path("."), here):
            if (root / base / match[1]).exists() and not (release / base / match[1]).exists():
                out.append(match[1])
    for match in _SECTION.finditer(line):
        name = match[1] if match[1].endswith(".md") else match[1] + ".md"
        section = match[2].lower()
        if (any(section in h for h in _headings(root / name))
                and not any(section in h for h in _headings(release / name))):
            out.append(f'{name}, "{match[2]}"')
    for match in _MODULE.finditer(line):
        if _module_exists(root, match[1]) and not _module_exists(release, match[1]):
            out.append(f"python -m {match[1]}")
    targets = _targets(release / "Makefile")
    for match in _MAKE.finditer(line):
        if match[1] in _targets(root / "Makefile") and match[1] not in targets:
            out.append(f"make {match[1]}")
    return out


# Pointers outside course/, docs/ and the Makefile that still name instructor material: (file,
# what it names), to fix where they are written (a comment naming the tool that writes kernel
# stubs; the demo's docstrings; the instructor tests' release fixture)
KNOWN_DANGLING = {("needle/backend_cuda/kernel_specs.py", "course/make_student.py"),
                  ("apps/demo.py", "make demo"),
                  ("apps/data_parallel_strategies.py", "make demo"),
                  ("tests/conftest.py", "make student")}


def dangling_references(release: Path, root: Path = ROOT) -> List[str]:
    """``file:line: what`` for each path, README section, ``python -m`` module or ``make``
    target that a shipped text file names, the reference has and the release does not (less
    ``KNOWN_DANGLING``)."""
    out = []
    for path in sorted(p for p in release.rglob("*") if p.is_file()):
        rel = path.relative_to(release)
        if rel.parts[0] == "build" or path.suffix in (".png", ".so", ".pyc", ".npz", ".gz"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            out += [f"{rel}:{n}: {what}"
                    for what in _line_references(line, rel.parent, release, root)
                    if (rel.as_posix(), what) not in KNOWN_DANGLING]
    return out


def run_all(workdir: Path) -> Dict[str, List[str]]:
    """Every check; an empty list per key means it holds."""
    release = workdir / "student"
    regions: List[Region] = make_release(release)
    # the two graded runs are subprocesses: run them side by side (about 40% less wall time)
    with ThreadPoolExecutor(max_workers=2) as pool:
        rel = pool.submit(check_release_fails, release, workdir)
        ref = pool.submit(check_reference, workdir)
        res = {"stubbed": [f"{len(regions)} regions"],
               "imports_and_demo": check_imports_and_demo(release),
               "dangling_references": dangling_references(release),
               "release_not_failing": rel.result()}
        res.update(ref.result())
    res["release_not_failing"] += not_run_in_release(workdir / "reference.json",
                                                     workdir / "release.json")
    res.update(check_notebooks(workdir))
    return res


def not_run_in_release(reference: Path, release: Path) -> List[str]:
    """Graded tests run in the reference that did not run (and fail) in the release: a release
    run that collects or runs nothing must not pass for one where everything fails."""
    ran = {t["test"] for t in _tests(json.loads(reference.read_text()))
           if t["outcome"] != "skipped"}
    failed = {t["test"] for t in _tests(json.loads(release.read_text()))
              if t["outcome"] == "failed"}
    return [f"{t}: not run in the release" for t in sorted(ran - failed)]


def _check_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An unknown exercise id (or homework, with --homework) is refused, naming the known
    ones, before any check runs; so is an --out that cannot be a folder."""
    import pytest  # select_exercises raises its UsageError

    from needle.cli import check_output_dir
    problem = check_output_dir(args.out or "", "--out")
    if problem:
        parser.error(problem)
    if args.homework or args.notebooks:
        unknown = [h for h in args.exercises if h not in HOMEWORKS]
        if unknown:
            option = "--homework" if args.homework else "--notebooks"
            parser.error(f"{option} {unknown[0]}: no such homework; the homeworks are "
                         f"{', '.join(HOMEWORKS)}")
    elif args.exercises:
        try:
            select_exercises(list(args.exercises), [e.name for e in EXERCISES])
        except pytest.UsageError as err:
            parser.error(str(err).replace("--exercise ", "exercise ", 1))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the checks and print what does not hold."""
    from needle.cli import Parser  # one-line errors, unknown options refused
    parser = Parser(prog="python -m course.check_release", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--isolation-only", action="store_true",
                        help="run only the per-exercise isolation check")
    parser.add_argument("--restore-each", action="store_true",
                        help="instead: per exercise, the release with only it and its "
                             "requirements written must score exactly their points")
    parser.add_argument("--homework", action="store_true",
                        help="instead: per homework (the arguments, default all), the release "
                             "with it and the homeworks before it written must score all its "
                             "points")
    parser.add_argument("--notebooks", action="store_true",
                        help="instead: per homework (the arguments, default all), the release "
                             "with it and the homeworks before it written runs their notebooks "
                             "to the end")
    parser.add_argument("exercises", nargs="*",
                        help="only these exercise ids or prefixes (--homework, --notebooks: "
                             "homeworks)")
    args = parser.parse_args(argv)
    _check_names(parser, args)  # at once: the release check runs for many minutes
    graph = requires_problems()
    if graph:  # cheap, and every other check reads the graph: stop here
        print("requires_graph: the rubric's requires graph (course/exercises.py) is wrong:")
        for line in graph:
            print("   ", line)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.out or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        log = lambda line: print(line, flush=True)  # noqa: E731
        if args.restore_each:
            res = check_restored(workdir, names=args.exercises, log=log)
        elif args.homework:
            res = check_homeworks(workdir, homeworks=args.exercises, log=log)
        elif args.notebooks:
            res = check_notebooks(workdir, homeworks=args.exercises, log=log)
        else:
            res = {} if args.isolation_only else run_all(workdir)
            res.update(check_isolation(workdir, names=args.exercises, log=log))
        print(f"checked in {time.perf_counter() - start:.0f}s")
    bad = 0
    for key, items in res.items():
        if key not in ("stubbed", "isolation_unchecked"):
            bad += len(items)
        print(f"{key}: {len(items)}")
        for item in items:
            print("   ", item)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
