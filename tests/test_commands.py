"""Commands end bad input with one line on stderr and a nonzero status, before any work.

Each bad command line runs in-process (``main(argv)``): an exception other than ``SystemExit``
(a traceback) fails the test, so does a status of 0 or more than one line on stderr. A few run
as real processes, one under ``mpiexec -n 2`` (a world-size error found after MPI started).
"""
import argparse
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

from apps import demo
from apps import model_parallel_strategies as mps
from apps import train_parallel as tp
from needle.cli import check_output_path
from needle.memory.__main__ import main as memory_main
from needle.plan.__main__ import main as plan_main

MISSING = "/nonexistent-folder/out"


def train_parse(argv):
    """train_parallel's whole parsing stage (it runs nothing)."""
    p = tp.parser()
    return tp.finish_args(p, p.parse_args(argv))


def mp_parse(argv):
    """model_parallel_strategies' parsing stage: train_parallel's, its strategies alone."""
    p = tp.parser(sorted(mps.STRATEGIES), "python -m apps.model_parallel_strategies")
    return tp.finish_args(p, p.parse_args(argv))


def demo_parse(argv):
    """demo.main with its demos stubbed out: only the parsing stage runs."""
    mp = pytest.MonkeyPatch()
    for name in ("digits_demo", "char_lm_demo", "data_parallel_demo"):
        mp.setattr(demo, name, lambda *a: pytest.fail("the demo ran on bad input"))
    try:
        demo.main(argv)
    finally:
        mp.undo()


BAD = [  # (command, argv, a piece of the one line)
    (plan_main, ["--model", "gpt2-small", "--params", "1e9"], "either --model or --params"),
    (plan_main, ["--params", "1e9", "--top", "0"], "--top must be at least 1, not 0"),
    (plan_main, ["--params", "1e9", "--top", "3", "--all"], "either --top N or --all"),
    (plan_main, ["--params", "1e9", "--gpus", "-4"], "gpus must be a positive integer, got -4"),
    (plan_main, ["--params", "1e9", "--gpus"], "argument --gpus: expected one argument"),
    (plan_main, ["--params", "-5"], "params must be > 0"),
    (plan_main, ["--params", "1e9", "--cluster", "nosuch"], "unknown cluster preset 'nosuch'"),
    (plan_main, ["--params", "1e9", "--batch", "4", "--microbatch", "8"],
     "batch=4 is not divisible by microbatch=8"),
    (plan_main, ["--layers", "12"], "missing: hidden, heads, seq, vocab"),
    (memory_main, ["--zero", "2"], "--zero 2 shards the states over --dp ranks"),
    (memory_main, ["--sequence-parallel"], "--sequence-parallel splits the sequence over --tp"),
    (memory_main, ["--precision", "fp8"], "invalid choice: 'fp8'"),
    (memory_main, ["--layers"], "argument --layers: expected one argument"),
    (memory_main, ["--tp", "5"], "tensor-parallel degree 5 does not divide heads (12)"),
    (memory_main, ["--zero", "4", "--dp", "2"], "ZeRO stage must be 0, 1, 2 or 3, got 4"),
    (train_parse, [], "the following arguments are required: --strategy"),
    (train_parse, ["--strategy", "nosuch"], "invalid choice: 'nosuch'"),
    (train_parse, ["--strategy", "ddp", "--steps"], "argument --steps: expected one argument"),
    (train_parse, ["--strategy", "ddp", "--plot", MISSING + ".png"],
     "--plot /nonexistent-folder/out.png: the folder /nonexistent-folder does not exist"),
    (train_parse, ["--strategy", "ddp", "--json", "/"], "--json / is a folder, not a file"),
    (train_parse, ["--strategy", "pp", "--timeline", MISSING + ".png"], "--timeline"),
    (train_parse, ["--strategy", "ddp", "--bucket-mb", "0"], "--bucket-mb must be > 0, not 0.0"),
    (train_parse, ["--strategy", "ddp", "--blas-threads", "0"], "--blas-threads must be at least"),
    (train_parse, ["--strategy", "ps", "--consistency", "ssp", "--staleness", "-1"],
     "--staleness must be >= 0, not -1"),
    (train_parse, ["--strategy", "ps", "--straggler", "abc"], "--straggler must be RANK:FACTOR"),
    (train_parse, ["--strategy", "ps", "--straggler", "1:inf"], "not '1:inf'"),
    (train_parse, ["--strategy", "ddp", "--seed=-1"], "--seed must be from 0 to 4294967295"),
    (train_parse, ["--strategy", "ps", "--straggler", "\u0663:2"], "--straggler must be RANK"),
    (train_parse, ["--strategy", "ps", "--ps-lr", "0"], "--ps-lr must be > 0"),
    (train_parse, ["--strategy", "tp", "--heads", "3"], "--heads 3 does not divide --d-model 64"),
    (train_parse, ["--strategy", "tp", "--d-model", "0"], "--d-model must be at least 1, not 0"),
    (train_parse, ["--strategy", "tp", "--seq-len", "0"], "--seq-len must be at least 1, not 0"),
    (train_parse, ["--strategy", "tp", "--layers", "0"], "--layers must be at least 1, not 0"),
    (train_parse, ["--strategy", "tp", "--chars", "10"], "--chars 10 leaves 9 training"),
    (train_parse, ["--strategy", "3d", "--dp", "0"], "--dp must be at least 1, not 0"),
    (train_parse, ["--strategy", "pp", "--chunks", "3"], "--chunks applies to --schedule "
                                                         "interleaved, not 1f1b"),
    (train_parse, ["--strategy", "moe", "--top-k", "3"], "--top-k must be 1 or 2"),
    (train_parse, ["--strategy", "moe", "--experts", "0"], "--experts must be at least 1"),
    (demo_parse, ["--epochs", "0"], "--epochs must be at least 1, not 0"),
    (demo_parse, ["--budget", "nan"], "argument --budget: 'nan' must be a finite number"),
    (demo_parse, ["--budget", "0"], "--budget must be a positive number of seconds, not 0"),
    (demo_parse, ["--bogus"], "unrecognized arguments: --bogus"),
    # needle.numbers' rule through cli.Parser: ASCII digits, whole counts, finite reals
    (plan_main, ["--params", "1e9", "--gpus", "\u0663"],
     "argument --gpus: '\u0663' must be a whole number (ASCII digits)"),
    (plan_main, ["--params", "1e9", "--efficiency", "nan"],
     "argument --efficiency: 'nan' must be a finite number"),
    (plan_main, ["--params", "inf"], "argument --params: 'inf' must be a finite number"),
    (memory_main, ["--layers", "1.5"], "argument --layers: '1.5' must be a whole number"),
    (memory_main, ["--batch", "1_000"], "argument --batch: '1_000' must be a whole number"),
    (train_parse, ["--strategy", "ddp", "--lr", "inf"],
     "argument --lr: 'inf' must be a finite number"),
    (train_parse, ["--strategy", "tp", "--lr", "nan"], "argument --lr: 'nan'"),
    (train_parse, ["--strategy", "ddp", "--bucket-mb=-inf"], "argument --bucket-mb: '-inf'"),
    (train_parse, ["--strategy", "ddp", "--steps", "\u0663"], "argument --steps: '\u0663'"),
    (train_parse, ["--strategy", "ddp", "--profile", __file__],
     f"--profile {__file__} is a file, not a folder"),
    (train_parse, ["--strategy", "ddp", "--profile", __file__ + "/sub"],
     f"--profile {__file__}/sub: {__file__} is a file, not a folder"),
    (mp_parse, ["--strategy", "tp", "--lr", "inf"], "argument --lr: 'inf' must be a finite"),
    (mp_parse, ["--strategy", "tp", "--lr", "0"], "--lr must be > 0, not 0.0"),
    (mp_parse, ["--strategy", "tp", "--batch", "0"], "--batch must be at least 1, not 0"),
    (mp_parse, ["--strategy", "ddp"], "invalid choice: 'ddp'"),
    (mp_parse, ["--strategy", "tp", "--bogus"], "unrecognized arguments: --bogus"),
]


NAMES = {plan_main: "plan", memory_main: "memory", train_parse: "train_parallel",
         demo_parse: "demo", mp_parse: "model_parallel_strategies"}


@pytest.mark.parametrize("command,argv,text", BAD,
                         ids=[ascii(f"{NAMES[c]}:{' '.join(a)}") for c, a, _ in BAD])
def test_bad_command_line_is_one_line_and_nonzero(capsys, command, argv, text):
    status = 0
    try:
        status = command(argv)
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status not in (0, None), f"{argv} was accepted"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert text in err and ": error: " in err, err


def _args(strategy, **kw):
    base = dict(strategy=strategy, dp=1, pp=1, tp=1, heads=4, d_model=64, layers=4, chunks=2,
                schedule="1f1b", experts=4, straggler="", task="charlm", batch=8, seed=0,
                dtype="float32")
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("args,size,text", [
    (_args("3d", dp=2, pp=2, tp=2), 4, "= 8 ranks, but the job has 4"),
    (_args("tp", heads=6, d_model=66), 4, "tensor-parallel size 4 does not divide --heads 6"),
    (_args("pp", layers=1, schedule="interleaved", chunks=2), 2, "cannot fill 4 stages"),
    (_args("moe", experts=4), 3, "--experts 4 do not split evenly over 3 ranks"),
    (_args("ps"), 1, "needs at least 2 ranks"),
    (_args("ps", straggler="3:2"), 3, "--straggler 3:2 names a rank"),
    (_args("ddp", task="digits", batch=1000), 2, "--batch 1000 is more than the"),
])
def test_world_size_problems_are_named(args, size, text):
    assert text in tp.world_problem(args, size)


@pytest.mark.parametrize("args,size", [(_args("3d", dp=2, pp=1, tp=2), 4), (_args("tp"), 4),
                                       (_args("ps", straggler="2:3"), 3),
                                       (_args("ddp", task="digits", batch=32), 2)])
def test_world_sizes_that_work_are_accepted(args, size):
    assert tp.world_problem(args, size) is None


def test_output_path_check_creates_nothing(tmp_path):
    target = tmp_path / "figures.json"
    assert check_output_path(str(target), "--json") is None and not target.exists()
    assert "is a folder" in check_output_path(str(tmp_path), "--json")


def run(cmd, timeout=60):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=worker_env(), stdin=subprocess.DEVNULL)


def test_real_process_prints_one_line():
    res = run([sys.executable, "-m", "apps.train_parallel", "--strategy", "ddp", "--plot",
               MISSING + ".png"])
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "the folder /nonexistent-folder does not exist" in res.stderr


def test_model_parallel_strategies_alone_has_train_parallels_checks():
    """Run as its own command it once took --lr inf and trained to NaN, exiting 0."""
    res = run([sys.executable, "-m", "apps.model_parallel_strategies", "--strategy", "tp",
               "--lr", "inf"])
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "python -m apps.model_parallel_strategies: error: argument --lr: 'inf'" in res.stderr


@pytest.mark.mpi
def test_world_size_error_under_mpiexec_is_one_line():
    """Every rank finds it after MPI started; rank 0 alone says it; the job ends with 2."""
    res = run([mpiexec(), "-n", "2", sys.executable, "-m", "apps.train_parallel", "--strategy",
               "3d", "--dp", "2", "--pp", "2", "--tp", "2", "--steps", "1"], timeout=120)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        "python -m apps.train_parallel: error: --dp 2 x --pp 2 x --tp 2 = 8 ranks, but the "
        "job has 2"], res.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_grader_timeout_must_be_finite_and_positive(tmp_path, capsys, value):
    """A ``nan`` timeout once turned the grader's watchdog off: refused before any test runs."""
    from course import grade
    with pytest.raises(SystemExit) as exit_:
        grade.main(["--report", str(tmp_path / "report.json"), f"--timeout={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--timeout {value}: must be a positive number" in err, err


@pytest.mark.parametrize("n,text", [
    ("\u0663", "argument -n/--nproc: '\u0663' must be a whole number (ASCII digits)"),
    ("1.5", "argument -n/--nproc: '1.5' must be a whole number"),
    ("0", "-n must be at least 1, not 0"),
])
def test_launcher_rank_count_follows_the_number_rule(capsys, n, text):
    """mpiexec is never reached: MPICH dies of a floating-point exception on a non-ASCII digit."""
    from needle.parallel.launch import build_command
    with pytest.raises(SystemExit) as exit_:
        build_command(["-n", n, "script.py"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and text in err and len(err.strip().splitlines()) == 1, err


def _notebook_cases(tmp):
    (tmp / "text.ipynb").write_text("not json")
    (tmp / "nocells.ipynb").write_text('{"cells": 3}')
    (tmp / "magic.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ["%time 1"]}]}')
    return [([], "the following arguments are required: notebook"),
            (["--bogus", str(tmp / "text.ipynb")], "unrecognized arguments: --bogus"),
            ([str(tmp / "missing.ipynb")], "missing.ipynb: cannot be read (No such file"),
            ([str(tmp / "text.ipynb")], "text.ipynb: not a notebook (not JSON"),
            ([str(tmp / "nocells.ipynb")], "nocells.ipynb: not a notebook (no list of cells)"),
            ([str(tmp / "magic.ipynb")], "code cell 0 uses an IPython magic")]


def test_run_notebook_refuses_bad_input_in_one_line(tmp_path, capsys):
    """Each once ended in a traceback (or ran '--bogus' as a notebook path)."""
    from tools import run_notebook
    for argv, text in _notebook_cases(tmp_path):
        with pytest.raises(SystemExit) as exit_:
            run_notebook.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert err.startswith("python tools/run_notebook.py: error: ") and text in err, err


def _course_cases(tmp):
    from course import check_release, make_student
    (tmp / "notes.txt").write_text("mine")
    return [
        (check_release.main, ["nosuch.exercise"],
         "exercise nosuch.exercise: no such exercise or prefix; the exercises are hw0."),
        (check_release.main, ["--homework", "hw9"], "the homeworks are hw0, hw1"),
        (check_release.main, ["--notebooks", "hw9"], "--notebooks hw9: no such homework"),
        (check_release.main, ["--bogus"], "unrecognized arguments: --bogus"),
        (check_release.main, ["--out", str(tmp / "notes.txt")], "is a file, not a folder"),
        (make_student.main, ["--bogus"], "unrecognized arguments: --bogus"),
        (make_student.main, ["--out", str(ROOT)], "would delete the reference tree"),
        (make_student.main, ["--out", str(tmp / "notes.txt")], "is a file, not a folder"),
        (make_student.main, ["--out", str(tmp)], "holds files that are not a student release"),
    ]


def test_course_commands_refuse_unknown_input_before_any_work(tmp_path, capsys, monkeypatch):
    """check_release once ran the whole release check before naming an unknown exercise;
    make_student --out . would have deleted the reference tree."""
    from course import check_release, make_student
    monkeypatch.setattr(check_release, "requires_problems", lambda: pytest.fail("it ran"))
    monkeypatch.setattr(make_student, "make_release", lambda *a: pytest.fail("it ran"))
    for main, argv, text in _course_cases(tmp_path):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert ": error: " in err and text in err, (argv, err)
    assert (tmp_path / "notes.txt").read_text() == "mine"


# Benchmarks and dev tools: argparse's int() and float() took '٣', 'nan', 'inf' and counts of
# -3 (a timeout of nan never fired; --steps -3 timed nothing and printed a table of zeros).
SCRIPTS = [  # (script or -m module, bad argv, the error's text)
    ("benchmarks/bench_collectives.py", ["--batches", "0"], "--batches: '0' must be a whole"),
    ("benchmarks/bench_compile.py", ["--steps", "-3"], "--steps: '-3' must be a whole number"),
    ("benchmarks/bench_complexity.py", ["--scale", "nan"], "--scale: 'nan' must be a finite"),
    ("benchmarks/bench_data_parallel.py", ["--slow", "0.5"], "--slow: '0.5' must be a finite"),
    ("benchmarks/bench_model_parallel.py", ["--hidden", "\u0663"], "(ASCII digits)"),
    ("benchmarks/bench_moe.py", ["--capacity-factor", "inf"], "--capacity-factor: 'inf'"),
    ("benchmarks/bench_moe.py", ["--seed", "-1"], "--seed: '-1' must be a whole number in"),
    ("benchmarks/bench_multihost.py", ["--reps", "2.5"], "--reps: '2.5' must be a whole"),
    ("benchmarks/bench_op_overhead.py", ["--iters", "1e9"], "--iters: '1e9' must be a whole"),
    ("benchmarks/bench_plan.py", ["--timeout", "nan"], "--timeout: 'nan' must be a finite"),
    ("benchmarks/bench_plan.py", ["--ranks", "2", "0"], "--ranks: '0' must be a whole"),
    ("benchmarks/bench_profiler.py", ["--step-iters", "-1"], "--step-iters: '-1'"),
    ("benchmarks/bench_train.py", ["--threads", "0"], "--threads: '0' must be a whole"),
    ("benchmarks/fault_times.py", ["--timeout=-inf"], "--timeout: '-inf' must be a finite"),
    ("benchmarks/fuzz_checkpoints.py", ["--cases", "nan"], "--cases: 'nan' must be a whole"),
    ("benchmarks/plan_worker.py", ["ddp", "out.json", "--warmup", "-1"], "--warmup: '-1'"),
    ("tools/mutate.py", ["--timeout", "inf"], "--timeout: 'inf' must be a finite number > 0"),
    ("-m tools.testcluster", ["up", "--hosts", "0"], "--hosts: '0' must be a whole number"),
    ("-m tools.testcluster", ["command", "hostfile", "-n", "\u0663"], "(ASCII digits)"),
    ("benchmarks/bench_train.py", ["--bogus"], "unrecognized arguments: --bogus"),
]


def test_benchmarks_and_tools_refuse_bad_numbers_in_one_line():
    """Each script as a real process (they parse sys.argv): status 2, one line naming the
    option, the value and the rule, before any work (none of them may start timing)."""
    runs = []
    for script, argv, text in SCRIPTS:
        cmd = [sys.executable, *script.split(), *argv]
        runs.append((cmd, text, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)))
    for cmd, text, proc in runs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{cmd} ran on bad input")
        assert proc.returncode == 2, (cmd, proc.returncode, out, err)
        assert len(err.strip().splitlines()) == 1 and ": error: " in err, (cmd, err)
        assert text in err and "Traceback" not in err and not out, (cmd, err)
