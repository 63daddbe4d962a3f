"""`make grade` (course/grade.py, course/supervisor.py, course/forked.py, course/scoring.py):
a crashing or hanging test fails alone with its cause named, the table comes last, a setup
error is a failure, and command-line mistakes are one line before any test runs."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from course import scoring

ROOT = Path(__file__).resolve().parents[1]

CRASHING = textwrap.dedent('''\
    import ctypes
    import os
    import time

    import pytest


    @pytest.mark.grade("hw9.crash.abort", points=2)
    def test_abort():
        os.abort()


    @pytest.mark.grade("hw9.crash.abort", points=2)
    def test_after_the_abort():
        assert True


    @pytest.mark.grade("hw9.crash.segv", points=1)
    def test_segfault():
        ctypes.string_at(0)


    @pytest.mark.grade("hw9.crash.segv", points=1)
    def test_segfault_again():
        ctypes.string_at(0)


    @pytest.mark.grade("hw9.crash.hang", points=1)
    def test_hang():
        time.sleep(120)


    @pytest.fixture
    def broken():
        raise RuntimeError("fixture boom")


    @pytest.mark.grade("hw9.crash.setup", points=1)
    def test_setup_raises(broken):
        pass


    @pytest.mark.grade("hw9.crash.ok", points=1)
    def test_ok():
        assert True
''')


# a hang in a file that never crashed: the grader's own watchdog kills the child (in
# test_crashing.py the hang comes after two crashes, so it runs forked, with forked.py's limit)
HANGING = textwrap.dedent('''\
    import time

    import pytest


    @pytest.mark.grade("hw9.hang.alone", points=1)
    def test_hang_alone():
        time.sleep(120)


    @pytest.mark.grade("hw9.hang.alone", points=1)
    def test_after_the_hang():
        assert True
''')


def _grade(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course.grade", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_grading_survives_an_abort_a_segfault_and_a_hang(tmp_path):
    """A graded test that aborts, segfaults or hangs fails alone, its cause named; the rest is
    graded (one file: the child restarts after each crash, then forks per test there); the
    score table comes last, then one line per failing exercise; --strict exits 1."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_crashing.py").write_text(CRASHING)
    (hidden / "test_hanging.py").write_text(HANGING)
    report = tmp_path / "out" / "report.json"
    # -k: only the hidden file's tests run (the rubric's files are still collected)
    # a 1 s limit: the two hangs cost 1 s (forked) and 1 + 5 s (the watchdog's margin)
    res = _grade("--hidden", str(hidden), "--report", str(report), "--timeout", "1",
                 "--strict", "-k", "test_crashing or test_hanging")
    out = res.stdout.splitlines()
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads(report.read_text())
    by_test = {t["test"].split("::")[-1]: t for ex in rep["exercises"] for t in ex["tests"]}
    assert by_test["test_abort"]["message"].startswith("crashed: SIGABRT"), by_test
    assert by_test["test_segfault"]["message"].startswith("crashed: SIGSEGV"), by_test
    assert by_test["test_segfault_again"]["message"].startswith("crashed: SIGSEGV"), by_test
    assert by_test["test_hang"]["message"].startswith("timed out after 1 s"), by_test
    assert by_test["test_hang_alone"]["message"].startswith("timed out after 1 s"), by_test
    assert by_test["test_after_the_hang"]["outcome"] == "passed"
    assert by_test["test_setup_raises"]["outcome"] == "failed"
    assert "fixture boom" in by_test["test_setup_raises"]["message"]
    assert by_test["test_after_the_abort"]["outcome"] == "passed"
    assert by_test["test_ok"]["outcome"] == "passed"
    # the table, then only the failing exercises' lines
    total = max(i for i, line in enumerate(out) if line.startswith("TOTAL"))
    tail = out[total + 1:]
    assert tail[0].startswith("failing exercises"), out[-15:]
    named = {line.split(":")[0].strip() for line in tail[1:]}
    assert named == {"hw9.crash.abort", "hw9.crash.segv", "hw9.crash.hang",
                     "hw9.crash.setup", "hw9.hang.alone"}, tail
    assert any("SIGABRT" in line and "test_abort" in line for line in tail), tail
    assert any("timed out after 1 s" in line for line in tail), tail
    details = (report.parent / "details.txt").read_text()
    assert "fixture boom" in details and "Fatal Python error" not in res.stdout[:200]


def _report(when: str, outcome: str, message: str = "boom") -> pytest.TestReport:
    longrepr = None if outcome != "failed" else message
    if outcome == "skipped":
        longrepr = ("f.py", 1, "Skipped: no GPU")
    return pytest.TestReport("t.py::test", ("t.py", 1, "test"), {}, outcome, longrepr, when, [])


@pytest.mark.parametrize("phases, expected", [
    ([("setup", "failed")], "failed"),
    ([("setup", "failed"), ("teardown", "passed")], "failed"),
    ([("setup", "passed"), ("call", "passed"), ("teardown", "failed")], "failed"),
    ([("setup", "passed"), ("call", "failed"), ("teardown", "passed")], "failed"),
    ([("setup", "passed"), ("teardown", "passed")], "failed"),  # no call phase ran
    ([("setup", "skipped"), ("teardown", "passed")], "skipped"),
    ([("setup", "passed"), ("call", "passed"), ("teardown", "passed")], "passed"),
])
def test_a_test_passes_only_when_its_call_passed_and_no_phase_failed(phases, expected):
    outcome = scoring.outcome_of([_report(when, o) for when, o in phases])
    assert outcome.outcome == expected, (phases, outcome)
    if phases[0] == ("setup", "failed"):
        assert outcome.message == "error in setup: boom"


def test_status_and_failure_lines_name_the_cause():
    tests = {"a::1": ("hw1.x", 2), "a::2": ("hw1.x", 2), "a::3": ("hw1.y", 1),
             "a::4": ("hw1.z", 1), "a::5": ("hw1.w", 1)}
    outcomes = {"a::1": ("passed", ""), "a::2": ("failed", "crashed: SIGSEGV (Segmentation "
                                                           "fault): in compact (x.py:3)"),
                "a::3": ("failed", "NotImplementedError: hw1.y: write f in y.py"),
                "a::4": ("failed", "NotImplementedError: hw1.y: write f in y.py"),
                "a::5": ("failed", "AssertionError: 1 != 2")}
    rep = scoring.score(tests, outcomes)
    status = {ex["exercise"]: ex["status"] for ex in rep["exercises"]}
    assert status == {"hw1.x": "crashed: SIGSEGV", "hw1.y": "not written",
                      "hw1.z": "needs hw1.y first", "hw1.w": "failing"}
    lines = scoring.failure_lines(rep)
    assert len(lines) == 2 and lines[0] == "hw1.w: a::5: AssertionError: 1 != 2"
    assert lines[1].startswith("hw1.x: a::2: crashed: SIGSEGV")
    assert (scoring.waiting_line(rep) or "").startswith("2 exercise(s) not written yet")
    table = scoring.format_table(rep)
    assert table.splitlines()[-1].startswith("TOTAL") and "needs hw1.y first" in table


@pytest.mark.parametrize("args, says", [
    (["--exercise", "nope"], "--exercise nope: no such exercise or prefix"),
    (["--report", "/proc/no/such/report.json"], "--report /proc/no/such/report.json: cannot"),
    (["--report", "{tmp}"], "is a folder"),
    (["--hidden", "{tmp}/absent"], "no such folder"),
    (["--timeout", "0"], "--timeout 0: must be a positive number"),
    (["--exercise", "hw0.simple_ml.add", "--no-such-pytest-option"],
     "unrecognized arguments: --no-such-pytest-option"),
    (["--exercise", "hw0.simple_ml.add", "-k", "matches_nothing"], "no graded test matched"),
])
def test_command_errors_are_one_line_before_any_test_runs(args, says, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--report" not in args:
        args += ["--report", str(tmp_path / "r" / "report.json")]
    start = time.perf_counter()
    res = _grade(*args, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr
    assert time.perf_counter() - start < 60  # no test ran


def test_a_long_failure_line_keeps_its_source_location():
    """The line after the score table names the kernel's file:line even when the message is
    cut to the width, and an exception's module path is dropped."""
    message = ("needle.backend_cuda.emulator.errors.EmulatorMemoryError: kernel 'compact': "
               "block (0, 0, 0) thread (12, 0, 0): out-of-bounds write " + "x" * 200
               + " at /tmp/t/needle/backend_cuda/kernels/strided.cu:52 (in compact)")
    line = scoring._one_line("hw3.cuda.backend: t.py::test: " + message, 160)
    assert len(line) <= 160
    assert line.endswith("at strided.cu:52")
    assert ": EmulatorMemoryError: kernel 'compact': " in line  # (the block goes when cut)
    assert "thread (12, 0, 0): out-of-bounds write" in line


def test_a_cut_failure_line_keeps_the_errors_kind_and_location():
    """A long test id and a long kernel error: the line keeps the error's kind (``out-of-bounds
    write``), kernel and thread, and the file:line, and cuts the test's parameters instead."""
    message = ("needle.backend_cuda.emulator.errors.EmulatorMemoryError: kernel 'compact': "
               "block (1, 0, 0) thread (129, 0, 0): out-of-bounds write of 4 bytes: buffer out "
               "at index 4096 (4096 elements of 4 bytes from the pointer to the end of the "
               "allocation), address 0x7f3a2c001000, at "
               "/tmp/r/needle/backend_cuda/kernels/strided.cu:52 (in compact)")
    test = "test_cuda_backend.py::test_compact_strided_views[shape3-permuted-float32-cuda]"
    line = scoring._one_line(f"hw3.cuda.backend: {test}: {message}", 200)
    assert len(line) <= 200 and line.startswith("hw3.cuda.backend: test_cuda_backend.py::")
    for kept in ("EmulatorMemoryError: kernel 'compact'", "thread (129, 0, 0): out-of-bounds "
                 "write of 4 bytes", "permuted-float32-cuda]"):
        assert kept in line, (kept, line)
    assert line.endswith(" ... at strided.cu:52")
    race = ("EmulatorMemoryError: kernel 'reduce_rows_block<float, float, ndl::SumOp>': block "
            "(0, 4, 0) thread (32, 0, 0): shared-memory race (write-after-read hazard) on "
            "__shared__ smem (in reduce_rows_block)[1] (byte 4 of 128): thread (32, 0, 0) "
            "writes it at /r/kernels/reduce.cu:66 (in reduce_rows_block<float, float, "
            "ndl::SumOp>) after thread (1, 0, 0) read it at /r/kernels/reduce.cu:68 (in "
            "reduce_rows_block<float, float, ndl::SumOp>) with no __syncthreads() between")
    line = scoring._one_line(f"hw3.cuda.backend: test_cuda_backend.py::test_reductions"
                             f"[(100003,)-None-float32]: {race}", 200)
    assert len(line) <= 200 and line.endswith(" ... at reduce.cu:66, reduce.cu:68"), line
    for kept in ("kernel 'reduce_rows_block<...>'", "thread (32, 0, 0): shared-memory race",
                 "test_cuda_bac"):
        assert kept in line, (kept, line)


def test_score_table_lists_homework_in_course_order():
    tests = {f"t::{hw}": (f"{hw}.unit.x", 1) for hw in ("collectives", "hw9", "hw4", "hw0",
                                                         "hw1")}
    rep = scoring.score(tests, {n: ("passed", "") for n in tests})
    rows = [line.split()[0] for line in scoring.format_table(rep).splitlines()
            if not line.startswith((" ", "exercise", "TOTAL"))]
    assert rows == ["hw0", "hw1", "hw4", "collectives", "hw9"]


def test_notebook_grade_prints_lines_and_returns_none(monkeypatch, capsys):
    """A notebook's `grade(...)` cell shows one line per exercise, not the report dict."""
    import course.notebook

    def fake_run(cmd, **kwargs):
        report = Path(cmd[cmd.index("--report") + 1])
        report.write_text(json.dumps({"exercises": [{
            "exercise": "hw1.ops.multiply", "passed": 3, "failed": 0, "earned": 1,
            "points": 1, "tests": [{"test": "t::a", "outcome": "passed", "message": ""}]}]}))
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(course.notebook.subprocess, "run", fake_run)
    assert course.notebook.grade("hw1.ops.multiply") is None
    assert capsys.readouterr().out == "hw1.ops.multiply: 3/3 tests, 1/1 points\n"


def test_only_cuda_failures_that_name_no_kernel_are_rerun_checked():
    from course.checked_rerun import RERUNS_PER_EXERCISE, to_rerun
    from course.scoring import Outcome
    from course.supervisor import Graded
    messages = {"a": "AssertionError: Not equal to tolerance", "b": "AssertionError: 1 != 2",
                "c": "AssertionError: again", "d": "EmulatorMemoryError: kernel 'k': ...",
                "e": "crashed: SIGSEGV", "f": "NotImplementedError: hw3.cuda.backend: write"}
    graded = Graded(tests={f"t::{k}": ("hw3.cuda.backend", 4, "t.py") for k in messages},
                    outcomes={f"t::{k}": Outcome("failed", m) for k, m in messages.items()})
    graded.tests["t::cpu"] = ("hw3.ndarray.views", 3, "t.py")
    graded.outcomes["t::cpu"] = Outcome("failed", "AssertionError: wrong")
    graded.tests["t::ok"] = ("hw3.cuda.backend", 4, "t.py")
    graded.outcomes["t::ok"] = Outcome("passed")
    assert to_rerun(graded) == ["t::a", "t::b", "t::c"][:RERUNS_PER_EXERCISE]


# planted in reduce_rows_block (reduce.cu): what the line is, what it becomes, and what the
# grader's line must then name
KERNEL_BUGS = {
    "missing barrier": ("    if (lane == 0) smem[warp] = acc;\n    __syncthreads();\n",
                        "    if (lane == 0) smem[warp] = acc;\n",
                        ("shared-memory race", "reduce.cu:66")),
    "uninitialised read": ("(lane < nwarps) ? smem[lane] : Op::template identity<A>()",
                           "smem[lane]", ("uninitialised", "reduce.cu:69")),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(KERNEL_BUGS))
def test_a_kernel_bug_giving_wrong_numbers_is_named_by_make_grade(tmp_path, bug):
    """A removed __syncthreads() or a read of shared memory no thread wrote, in
    reduce_rows_block, gives wrong numbers only; the grader reruns the failing test under
    NEEDLE_CUDA_EMULATOR_CHECK=full and its line names the fault: kernel, thread, line."""
    # the reference tree (the student release has no make_student, nor reduce.cu's answer)
    make_release = pytest.importorskip("course.make_student").make_release
    tree = tmp_path / "tree"
    make_release(tree, only=())  # the reference, every exercise written
    kernel = tree / "needle" / "backend_cuda" / "kernels" / "reduce.cu"
    site, planted, names = KERNEL_BUGS[bug]
    assert kernel.read_text().count(site) == 1, "the mutation site moved"
    kernel.write_text(kernel.read_text().replace(site, planted))
    res = subprocess.run([sys.executable, "-m", "course.grade", "--exercise",
                          "hw3.cuda.backend", "--report", str(tmp_path / "r.json"),
                          "-k", "test_reductions"], cwd=tree, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(tree)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("  hw3.cuda.backend: "))
    assert "NEEDLE_CUDA_EMULATOR_CHECK=full" in res.stdout
    for named in ("EmulatorMemoryError: kernel 'reduce_rows_block", "thread (", *names):
        assert named in line, (named, line)
