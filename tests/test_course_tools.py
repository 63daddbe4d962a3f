"""The course tooling: `make student` (course/make_student.py), `make grade` (course/grade.py,
course/grade_plugin.py) and the release check (course/check_release.py)."""
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from course import check_release, exercises, grade_plugin, scoring
from course.exercises import EXERCISES, UNTRACED, requirements, requires_problems
from course.make_student import all_regions, find_regions, make_release, strip_solutions, stub_file
from needle.backend_cuda import kernel_specs
from needle.backend_cuda.kernel_specs import KERNEL_STUB

ROOT = Path(__file__).resolve().parents[1]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
# exercises graded only against PyTorch: without it (make install WITH_TORCH=0) their graded
# tests skip, so nothing checks their isolation and they score nothing
TORCH_ONLY = [] if HAVE_TORCH else [ex for ex in EXERCISES
                                     if all("torch" in pattern for pattern in ex.tests)]

SOURCE = textwrap.dedent('''\
    """doc"""
    X = 1


    def f(a):
        b = a + 1
        ### BEGIN YOUR SOLUTION (hw0.simple_ml.add)
        c = b * 2
        return c
        ### END YOUR SOLUTION


    class K:
        ### BEGIN YOUR SOLUTION (hw0.simple_ml.add)
        y = 3
        ### END YOUR SOLUTION

        def g(self):
            ### BEGIN YOUR SOLUTION (hw0.simple_ml.add)
            return self.y
            ### END YOUR SOLUTION
''')


def test_regions_are_found_with_their_enclosing_def(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    regions = find_regions(path, tmp_path)
    assert [(r.qualname, r.begin, r.end) for r in regions] == [
        ("f", 7, 10), ("K", 14, 16), ("K.g", 19, 21)]


def test_stubs_raise_in_functions_and_pass_at_class_level(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    from course.make_student import _in_function
    stripped = strip_solutions(SOURCE, _in_function(path))
    assert "c = b * 2" not in stripped and "y = 3" not in stripped
    ns: dict = {}
    exec(compile(stripped, "m.py", "exec"), ns)  # the stubbed module still imports
    with pytest.raises(NotImplementedError, match="hw0.simple_ml.add"):
        ns["f"](1)
    with pytest.raises(NotImplementedError):
        ns["K"]().g()
    assert stripped.count("### BEGIN YOUR SOLUTION") == 3


def test_unclosed_region_is_an_error(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    ### BEGIN YOUR SOLUTION (hw0.simple_ml.add)\n    return 1\n")
    with pytest.raises(ValueError, match="never closed"):
        find_regions(path, tmp_path)


def test_region_naming_no_exercise_is_an_error(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    ### BEGIN YOUR SOLUTION\n    return 1\n"
                    "    ### END YOUR SOLUTION\n")
    with pytest.raises(ValueError, match="names no exercise"):
        find_regions(path, tmp_path)


def test_every_region_names_one_exercise_and_every_exercise_has_a_region():
    names = {ex.name for ex in EXERCISES}
    regions = all_regions()
    unknown = [f"{r.key}: {r.exercise}" for r in regions if r.exercise not in names]
    assert not unknown, unknown
    assert names == {r.exercise for r in regions}, names - {r.exercise for r in regions}
    assert all(UNTRACED[r.key] == r.exercise for r in regions if r.key in UNTRACED)


def test_stub_names_its_exercise_and_what_to_write(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    from course.make_student import stub_file
    text, regions = stub_file(path, tmp_path)
    assert len(regions) == 3
    assert "raise NotImplementedError('hw0.simple_ml.add: write f in m.py')" in text
    assert stub_file(path, tmp_path, only=["hw9.other"])[0] == SOURCE  # nothing of hw9: kept


def test_release_has_no_solution_left(student_release):
    release, regions = student_release
    assert len(regions) == len(all_regions()) > 50
    for rel in {r.path for r in regions}:
        ref = (ROOT / rel).read_text()
        out = (release / rel).read_text()
        stub = KERNEL_STUB if rel.endswith(".cu") else "raise NotImplementedError("
        assert out.count(stub) >= 1
        split = out.count("raise NotImplementedError(\n")  # stubs split over three lines
        assert len(out.splitlines()) - 2 * split < len(ref.splitlines())
    assert (release / "notebooks").is_dir()
    assert (release / "tests" / "conftest.py").is_file()
    for tool in ("__init__.py", "testcluster/netns.py"):  # tests use them
        assert (release / "tools" / tool).is_file(), tool


def test_release_is_made_for_students(student_release):
    """The release's README is the students' (start, order, notebooks, grading, CUDA), names
    only commands its Makefile has and notebooks it ships, and no instructor-only command."""
    import re
    release = student_release[0]
    readme, makefile = (release / "README.md").read_text(), (release / "Makefile").read_text()
    for needed in ("make install", "make grade", "jupyter notebook notebooks/", "--strict",
                   "NEEDLE_CUDA_EMULATOR=1", "## The order of the homework"):
        assert needed in readme, needed
    for instructor in ("make student", "check_release", "make demo", "INSTRUCTOR ONLY"):
        assert instructor not in readme + makefile, instructor
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    assert {"install", "grade", "test"} <= targets and not {"student", "demo"} & targets
    assert set(re.findall(r"(?:^|`)make ([\w-]+)", readme, re.M)) <= targets
    for notebook in re.findall(r"notebooks/(\w+\.ipynb)", readme):
        assert (release / "notebooks" / notebook).is_file(), notebook
    reference = (ROOT / "Makefile").read_text()  # the instructor's keeps both
    assert "\nstudent:" in reference and "\ndemo: install" in reference


def test_rubric_is_consistent():
    names = [ex.name for ex in EXERCISES]
    assert len(names) == len(set(names))
    assert all(ex.points > 0 and ex.tests and ex.homework for ex in EXERCISES)
    assert set(UNTRACED.values()) <= set(names)
    keys = {r.key for r in all_regions()}
    assert set(UNTRACED) <= keys, set(UNTRACED) - keys


def test_score_shares_points_over_tests_and_skips_do_not_count():
    tests = {"a::1": ("hw1.x", 2), "a::2": ("hw1.x", 2), "a::3": ("hw2.y", 3),
             "a::4": ("hw2.z", 1)}
    outcomes = {"a::1": ("passed", ""), "a::2": ("failed", "boom"), "a::3": ("passed", ""),
                "a::4": ("skipped", "")}
    rep = scoring.score(tests, outcomes)
    assert rep["homeworks"] == {"hw1": {"earned": 1.0, "max": 2},
                                "hw2": {"earned": 3.0, "max": 3}}
    assert rep["total"] == {"earned": 4.0, "max": 5}
    table = scoring.format_table(rep)
    assert "hw1.x" in table and "TOTAL 4/5" in table and "skipped" in table


HIDDEN_TEST = textwrap.dedent('''\
    import pytest

    @pytest.mark.grade("hw9.hidden.sum", points=4)
    def test_hidden_passes():
        assert 1 + 1 == 2

    @pytest.mark.grade("hw9.hidden.sum", points=4)
    def test_hidden_fails():
        assert 1 + 1 == 3

    def test_not_graded():
        raise AssertionError("never run by the grader")
''')


@pytest.mark.slow
def test_grade_runs_rubric_and_hidden_tests(tmp_path):
    """`make grade HIDDEN=dir`: the rubric's tests (one module here) plus hidden ones."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden.py").write_text(HIDDEN_TEST)
    report = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "course.grade", "--hidden", str(hidden),
                          "--report", str(report), "-k", "hidden or topo_sort"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads(report.read_text())
    by_name = {ex["exercise"]: ex for ex in rep["exercises"]}
    assert by_name["hw9.hidden.sum"]["passed"] == 1 and by_name["hw9.hidden.sum"]["failed"] == 1
    assert by_name["hw9.hidden.sum"]["earned"] == 2.0
    assert by_name["hw1.autograd.topo_sort"]["failed"] == 0
    assert not any("not_graded" in t["test"] for ex in rep["exercises"] for t in ex["tests"])
    assert "TOTAL" in res.stdout and "hw9" in res.stdout


@pytest.mark.slow
def test_student_release_against_reference(tmp_path):
    """The release imports, its demo and every graded test fail with NotImplementedError,
    every graded test passes here, every solution region runs under a graded test, and with
    hw0..hwN written each of those homeworks' notebooks runs to its end."""
    res = check_release.run_all(tmp_path)
    for key in ("imports_and_demo", "release_not_failing", "failing", "uncovered", "stale",
                "undeclared_requires", "requires_graph", "notebook_not_finishing"):
        assert res[key] == [], f"{key}:\n" + "\n".join(res[key])


def _ship_adam_answer(root: Path) -> None:
    """Append to ``root``'s optimizer.py a copy of Adam.step outside any region, bound in
    place of the method: the answer ships although the release stubs Adam.step's region."""
    path = root / "needle/optim/optimizer.py"
    text = path.read_text()
    start = text.index("    def step(self) -> None:\n        \"\"\"Exercise hw2.optim.adam")
    method = text[start:text.index("class AdamW(Adam):")]
    body = "".join(line[4:] if "### " not in line else "\n"
                   for line in method.splitlines(keepends=True))
    path.write_text(text + "\n\n" + body.replace("def step(", "def _shipped_step(", 1)
                    + "\n\nAdam.step = _shipped_step\n")


@pytest.mark.slow
def test_isolation_check_catches_a_shipped_answer(tmp_path):
    """A shipped answer: a copy of Adam.step outside any region replaces the method, so Adam's
    graded tests pass although Adam.step's region is stubbed. The isolation check must flag
    it (that it passes on the tree as it is, Adam included, is
    test_every_exercise_is_isolated)."""
    ref = tmp_path / "ref"
    make_release(ref, only=())
    _ship_adam_answer(ref)
    res = check_release.check_isolation(tmp_path / "work-shipped", root=ref,
                                        names=["hw2.optim.adam"])
    # the rule test flags it with or without PyTorch; the comparison with torch where it runs
    flags = ["::test_adam_rule_step_by_step"] + ["test_optimizers_match_torch[adam-"] * HAVE_TORCH
    for flag in flags:
        assert any(flag in line for line in res["not_isolated"]), (flag, res)
    assert res["no_region"] == res["isolation_unchecked"] == [], res


# one test of each exercise made to pass with nothing written: the first of one exercise's
# graded tests, the last of the other's (file order), so a check skipping any one is caught
LEAKS = {"hw0.simple_ml.parse_mnist": ("tests/data/test_data.py",
                                       "test_mnist_reader_on_written_files"),
         "hw1.autograd.compute_gradient": ("tests/test_autograd.py",
                                           "test_gradient_accumulates_over_uses_and_out_grad")}


@pytest.mark.slow
def test_isolation_check_flags_any_one_leaking_test(tmp_path):
    """Each exercise's only leaking test (redefined to pass) is flagged, first or last."""
    ref = tmp_path / "ref"
    make_release(ref, only=())
    for path, name in LEAKS.values():
        with open(ref / path, "a") as f:
            f.write(f"\n\ndef {name}():  # passes without the exercise written\n    pass\n")
    work = tmp_path / "work"
    res = check_release.check_isolation(work, root=ref, names=sorted(LEAKS))
    assert len(res["not_isolated"]) == len(LEAKS), res["not_isolated"]
    for exercise, (_, name) in LEAKS.items():
        assert any(line.startswith(f"{exercise}: ") and f"::{name}: passed" in line
                   for line in res["not_isolated"]), (exercise, res["not_isolated"])
    order = {ex: [t["test"] for t in check_release._tests(
        json.loads((work / f"isolation-{ex}.json").read_text()))] for ex in LEAKS}
    first, last = sorted(LEAKS)  # the leak sits first in one exercise and last in the other
    assert order[first][0].endswith(LEAKS[first][1]) and len(order[first]) > 1, order
    assert order[last][-1].endswith(LEAKS[last][1]) and len(order[last]) > 1, order


def test_isolation_copy_stubs_only_the_named_exercise(tmp_path):
    ref = tmp_path / "ref"
    regions = make_release(ref, only=["hw2.optim.adam"])
    assert regions and {r.exercise for r in regions} == {"hw2.optim.adam"}
    text = (ref / "needle/optim/optimizer.py").read_text()
    assert "hw2.optim.adam: write Adam.step in needle/optim/optimizer.py" in text
    assert "hw2.optim.sgd" in text and "s[\"u\"] *= self.momentum" in text  # SGD kept


@pytest.mark.slow
def test_every_exercise_is_isolated(tmp_path):
    """The isolation check (`python -m course.check_release` runs the same): for each exercise,
    the reference with only its regions stubbed fails every graded test of it with the
    NotImplementedError naming it. Only each exercise's graded tests run (about 2 CPU-minutes;
    CUDA exercises are reported unchecked where no GPU runs them)."""
    res = check_release.check_isolation(tmp_path)
    assert res["no_region"] == [], res["no_region"]
    assert res["not_isolated"] == [], "\n".join(res["not_isolated"])
    assert set(res["isolation_unchecked"]) <= {
        f"{name}: none of its {n} tests ran"
        for name in ["hw3.cuda.backend"] + [ex.name for ex in TORCH_ONLY]
        for n in range(1000)}, res["isolation_unchecked"]


def test_select_exercises_takes_ids_and_prefixes():
    names = ["hw2.optim.sgd", "hw2.optim.adam", "hw2.nn.linear", "hw1.ops.matmul"]
    select = grade_plugin.select_exercises
    assert select(["hw2.optim"], names) == ["hw2.optim.sgd", "hw2.optim.adam"]
    assert select(["hw1.ops.matmul", "hw2.nn"], names) == ["hw1.ops.matmul", "hw2.nn.linear"]
    assert select(["hw2.optim."], names) == ["hw2.optim.sgd", "hw2.optim.adam"]
    with pytest.raises(pytest.UsageError, match="hw2.opt: no such exercise"):
        select(["hw2.opt"], names)  # a prefix is whole dotted parts


@pytest.mark.slow
def test_grade_exercise_runs_only_that_exercises_tests(tmp_path):
    report = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "course.grade", "--report", str(report),
                          "--exercise", "hw1.autograd.topo_sort", "hw0.simple_ml"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert {ex["exercise"] for ex in rep["exercises"]} == {
        "hw1.autograd.topo_sort", "hw0.simple_ml.add", "hw0.simple_ml.parse_mnist",
        "hw0.simple_ml.softmax_loss", "hw0.simple_ml.epochs"}
    assert all(ex["failed"] == 0 and ex["passed"] > 0 for ex in rep["exercises"])
    bad = subprocess.run([sys.executable, "-m", "course.grade", "--report", str(report),
                          "--exercise", "hw9.nothing"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode != 0 and "hw9.nothing: no such exercise" in bad.stdout + bad.stderr


def test_release_keeps_docstrings_and_comments_outside_regions():
    from course.make_student import stub_file
    path = ROOT / "needle" / "nn" / "nn_basic.py"
    text, regions = stub_file(path)
    for spec in ("kaiming_uniform(out_features, 1)", "shape (1, out_features)"):
        assert spec in path.read_text() and spec in text, spec  # Linear's spec is kept
    autograd = stub_file(ROOT / "needle" / "autograd.py")[0]
    for spec in ("_run_grad_hooks", "_run_post_accumulate_hooks", "retain_grad"):
        assert spec in autograd, spec
    lines = path.read_text().splitlines()
    inside = {n for r in regions for n in range(r.begin + 1, r.end)}
    outside = [line for n, line in enumerate(lines, 1) if n not in inside
               and (line.strip().startswith("#") or '"""' in line)]
    released = text.splitlines()
    assert outside and all(line in released for line in outside)


def test_release_run_that_runs_nothing_is_flagged(tmp_path):
    """A release whose graded run collected nothing (a module failing at import stops the
    session) reports every test 'skipped': the check flags it."""
    ref = {"exercises": [{"tests": [{"test": "t::a", "outcome": "passed", "message": ""},
                                    {"test": "t::cuda", "outcome": "skipped", "message": ""}]}]}
    rel = {"exercises": [{"tests": [{"test": "t::a", "outcome": "skipped", "message": "not run"},
                                    {"test": "t::cuda", "outcome": "skipped", "message": ""}]}]}
    (tmp_path / "ref.json").write_text(json.dumps(ref))
    (tmp_path / "rel.json").write_text(json.dumps(rel))
    assert check_release.not_run_in_release(tmp_path / "ref.json", tmp_path / "rel.json") == [
        "t::a: not run in the release"]
    rel["exercises"][0]["tests"][0]["outcome"] = "failed"
    (tmp_path / "rel.json").write_text(json.dumps(rel))
    assert check_release.not_run_in_release(tmp_path / "ref.json", tmp_path / "rel.json") == []


# ---------------------------------------------------------------------- CUDA C
def test_cuda_kernels_ship_stubbed_with_their_exercise(student_release, monkeypatch):
    """The kernels of hw3's CUDA exercise (strided copies, matmul, reductions) are regions:
    the release ships them stubbed, and loading a stubbed kernel file raises the
    NotImplementedError naming the exercise (before anything is compiled)."""
    kernels = {r.path.rpartition("/")[2]: r for r in all_regions()
               if r.path.startswith("needle/backend_cuda/kernels/")}
    assert {"strided.cu", "matmul.cu", "reduce.cu", "layernorm.cu", "softmax.cu"} <= set(kernels)
    assert {r.exercise for r in kernels.values()} == {"hw3.cuda.backend"}
    names = {r.qualname for r in all_regions() if r.path.endswith(".cu")}
    assert {"strided_index", "compact", "matmul_naive", "matmul_tiled",
            "reduce_rows_block", "block_sum", "block_merge"} <= names
    released = student_release[0] / "needle" / "backend_cuda" / "kernels"
    text = (released / "strided.cu").read_text()
    assert "idx += (i % s) * strides[d];" not in text  # the answer is gone
    assert "idx += (i % s) * strides[d];" in kernel_specs.source("strided.cu")
    monkeypatch.setattr(kernel_specs, "KERNEL_DIR", released)
    for name in ("strided.cu", "matmul.cu", "reduce.cu", "layernorm.cu", "softmax.cu"):
        with pytest.raises(NotImplementedError, match=f"hw3.cuda.backend: write .*{name}"):
            kernel_specs.source(name)
    assert kernel_specs.source("ewise.cu")  # no region there: ships as it is


def test_no_shipped_kernel_gives_the_block_reduction_away(student_release):
    """reduce_rows_block's tree (warp partials, one per warp in __shared__ memory, then warp 0)
    is the exercise: the release holds no complete copy of it (common.cuh's block_sum once
    sat beside the complete softmax and layer norm kernels); their block sum and block merge
    are regions of hw3.cuda.backend, graded by the fused softmax and layer norm tests."""
    per_warp_store = re.compile(r"\w+\[warp\]\s*=")
    kernels = ROOT / "needle" / "backend_cuda" / "kernels"
    released = student_release[0] / "needle" / "backend_cuda" / "kernels"
    found = {p.name for p in kernels.iterdir() if per_warp_store.search(p.read_text())}
    assert {"reduce.cu", "layernorm.cu", "softmax.cu"} <= found  # the pattern is the tree's
    assert [p.name for p in sorted(released.iterdir())
            if per_warp_store.search(p.read_text())] == []
    fused = {ex.name: ex for ex in EXERCISES}["hw3.cuda.backend"].tests
    assert any("test_fused_layer_norm" in t for t in fused)
    assert any("test_fused_softmax_logsumexp" in t for t in fused)


def test_cuda_stub_keeps_the_markers_and_only_the_named_exercise():
    path = ROOT / "needle/backend_cuda/kernels/matmul.cu"
    out, regions = stub_file(path, ROOT)
    assert len(regions) == 2 and out.count("// BEGIN YOUR SOLUTION (hw3.cuda.backend)") == 2
    assert out.count(KERNEL_STUB + "hw3.cuda.backend: write matmul_") == 2
    assert "acc[i][j] += ra[i] * rb[j]" not in out
    assert stub_file(path, ROOT, only=["hw2.optim.adam"])[0] == path.read_text()


# ---------------------------------------------------------------------- requires
def test_requires_graph_is_acyclic_and_names_real_exercises(monkeypatch):
    assert requires_problems() == []
    assert all(r in {e.name for e in EXERCISES} for ex in EXERCISES for r in ex.requires)
    assert "hw1.ops.multiply" in requirements("hw2.optim.adam")  # through nn.linear / autograd
    assert requirements("hw3.ndarray.views") == set()
    broken = [exercises.Exercise("a.b.c", 1, ("t::x",), ("a.b.d",)),
              exercises.Exercise("a.b.d", 1, ("t::y",), ("a.b.c", "hw9.nope"))]
    monkeypatch.setattr(exercises, "EXERCISES", broken)
    problems = exercises.requires_problems()
    assert "a.b.d requires hw9.nope: no such exercise" in problems
    assert any(p.startswith("a.b.c requires itself") for p in problems)


def test_a_requirement_from_a_later_homework_fails_the_release_check(monkeypatch, capsys):
    """The course order: hw1 computes on NumPy, so no hw1 exercise may require a hw3 one."""
    assert exercises.order_problems() == []
    late = [exercises.Exercise("hw3.ndarray.views", 3, ("t::v",)),
            exercises.Exercise("hw1.ops.reshape", 1, ("t::r",), ("hw3.ndarray.views",)),
            exercises.Exercise("hw2.nn.linear", 1, ("t::l",), ("hw1.ops.reshape",)),
            exercises.Exercise("hw7.new", 1, ("t::n",))]
    monkeypatch.setattr(exercises, "EXERCISES", late)
    problems = exercises.requires_problems()
    assert problems == [
        "hw7.new: its homework hw7 is not in the course order ('hw0', 'hw1', 'hw2', 'hw3', "
        "'hw4', 'collectives') (course/exercises.py)",
        "hw1.ops.reshape requires hw3.ndarray.views, of hw3, which the course teaches after "
        "hw1: a student at hw1 cannot have written it"]
    monkeypatch.setattr(check_release, "requires_problems", exercises.requires_problems)
    assert check_release.main(["--restore-each", "hw1.ops.reshape"]) == 1  # before any run
    out = capsys.readouterr().out
    assert "requires_graph" in out and "hw1.ops.reshape requires hw3.ndarray.views" in out


def test_grade_report_names_the_missing_prerequisite():
    tests = {"t::a": ("hw2.optim.adam", 2), "t::b": ("hw2.optim.adam", 2)}
    outcomes = {"t::a": ("failed", "NotImplementedError: hw1.ops.multiply: write "
                                   "EWiseMul.gradient in needle/ops/ops_mathematic.py"),
                "t::b": ("failed", "NotImplementedError: hw2.optim.adam: write Adam.step")}
    rep = scoring.score(tests, outcomes)
    (ex,) = rep["exercises"]
    assert ex["needs"] == ["hw1.ops.multiply"] and ex["earned"] == 0
    messages = sorted(t["message"] for t in ex["tests"])
    assert messages[0].startswith("NotImplementedError: hw2.optim.adam")  # its own stub
    assert messages[1].startswith("needs hw1.ops.multiply first: ")
    assert "needs hw1.ops.multiply first" in scoring.format_table(rep)


def test_cuda_cases_are_graded_only_by_the_cuda_exercises():
    assert grade_plugin._CUDA_CASE.search("test_x[multiply-3x4_3x4-cuda]")
    assert grade_plugin._CUDA_CASE.search("test_x[cuda-float32]")
    assert not grade_plugin._CUDA_CASE.search("test_x[multiply-3x4_3x4-cpu]")
    assert not grade_plugin._CUDA_CASE.search("test_cuda_backend_thing[3]")


@pytest.mark.slow
def test_release_with_an_exercise_and_its_requirements_scores_exactly_their_points(tmp_path):
    """The rubric rule, for representative exercises (all of them take a graded
    run each, about 30 min on 2 cores: `python -m course.check_release --restore-each`):
    one with no requirement (hw3.ndarray.views), a hw1 op on NumPy with hw1's ops it needs and
    no hw3 exercise (hw1.ops.matmul), and an optimizer that needs hw1's ops, autograd and nn
    (hw2.optim.sgd)."""
    res = check_release.check_restored(
        tmp_path, names=["hw3.ndarray.views", "hw1.ops.matmul", "hw2.optim.sgd"])
    assert res["restored_not_scoring"] == [], "\n".join(res["restored_not_scoring"])


@pytest.mark.slow
def test_hw1_and_hw2_score_fully_with_no_later_homework_written(tmp_path):
    """The student's path: with only hw0 and hw1 written every hw1 graded test passes, and
    with hw2 too every hw2 one, no hw3 exercise written (hw1/hw2 grade on NumPy)."""
    res = check_release.check_homeworks(tmp_path, homeworks=["hw1", "hw2"])
    short = {}  # homework -> points missed; only the PyTorch-only exercises' where it is absent
    for line in res["homework_not_scoring"]:
        m = re.fullmatch(r"(hw\d): scored ([\d.]+) of (\d+)", line)
        assert m, "\n".join(res["homework_not_scoring"])
        short[m[1]] = float(m[3]) - float(m[2])
    torch_only = {hw: float(sum(ex.points for ex in TORCH_ONLY if ex.homework == hw))
                  for hw in ("hw1", "hw2")}
    assert short == {hw: pts for hw, pts in torch_only.items() if pts}, res


# ---------------------------------------------------------------------- notebooks
def test_cuda_notebook_lists_every_stubbed_kernel():
    """The hw3 CUDA notebook's "You implement" table names every function with a region of
    hw3.cuda.backend, kernel file by kernel file (matmul.cu and reduce.cu were missing)."""
    nb = json.loads((ROOT / "notebooks" / "hw3_cuda_kernels.ipynb").read_text())
    intro = "".join(nb["cells"][0]["source"])
    table = intro[intro.index("**You implement**"):intro.index("Grade them on a CPU")]
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines()
            if line.startswith("| `")}
    for region in all_regions():
        if region.exercise == "hw3.cuda.backend":
            assert region.path in rows, region.path
            assert f"`{region.qualname}`" in rows[region.path], (region.path, region.qualname)


def test_gradient_check_demo_says_its_threshold(capsys):
    """The notebooks' gradcheck prints the error beside its threshold and a verdict."""
    from course.notebook_questions import SETUP
    ns: dict = {}
    exec(compile(SETUP, "setup", "exec"), ns)
    assert ns["gradcheck"](lambda a, b: a * b, (2, 3), (2, 3)) is None
    out = capsys.readouterr().out
    assert "threshold 1e-06: ok" in out and out.startswith("max |gradient - numerical")
    ns["gradcheck"](lambda a, b: a * b, (2,), (2,), eps=1e-1, tol=0.0)
    assert "WRONG" in capsys.readouterr().out
