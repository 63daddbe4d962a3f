"""Mutation testing of needle's critical modules: plant one bug at a time, see if a test fails.

    python tools/mutate.py                 # every mutant: caught/survived each, then the score
    python tools/mutate.py --only fusion   # the mutants whose name starts with "fusion"
    python tools/mutate.py --only doors.,profiler.offset   # several prefixes
    python tools/mutate.py --list          # the mutants and their tests, running nothing

Each mutant is one small source edit (a flipped comparison, a dropped check, an off-by-one)
of a module the rest trusts: grading, serialization, the compiler's fusion pass, the
communicator, the sharded states. The tree is copied once to a temporary folder (the working
tree is never touched); each mutant is applied there alone, the tests that cover its module run
with a timeout, and the file is restored. A mutant is *caught* when those tests fail (or time
out), *survived* when they pass: a survivor is a bug the suite would let through. The
unmutated tests must pass first, or no result means anything.

``tests/test_mutate.py`` checks that each mutant's ``before`` text is still in its file once,
so that the list follows the sources. ``make mutate`` runs it all (minutes; not part of
``make test``).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from needle import cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300.0  # seconds per mutant's test run

# The tests that cover each module, slow ones included (multi-process `mpi` tests are left out:
# mpiexec may be absent), except where SKIPPED says. Each set runs in order and stops at its first
# failure, so the fast, direct tests come first. A mutant may name its own tests instead (node
# ids too): those run with their slow ones whatever its module's marks.
TESTS: Dict[str, Tuple[str, ...]] = {
    "grading": ("tests/test_grading_rules.py", "tests/test_supervisor.py",
                "tests/test_course_tools.py", "tests/test_grader.py"),
    "serialization": ("tests/test_serialization.py", "tests/test_serialization_edges.py"),
    "fusion": ("tests/compiler/test_fusion.py", "tests/compiler/test_capture.py",
               "tests/compiler/test_compile.py"),
    "comm": ("tests/parallel/comm/test_args.py", "tests/parallel/comm/test_timeout_message.py",
             "tests/parallel/comm/test_p2p.py"),
    "optim": ("tests/optim/test_hyper.py", "tests/optim/test_adafactor.py",
              "tests/backend_ndarray/test_adam_cpu.py"),
    "profiler": ("tests/profiler/test_clock_offset.py", "tests/profiler/test_profiler.py",
                 "tests/profiler/test_profiler_distributed.py"),
    "doors": ("tests/test_doors.py", "tests/test_doors_round2.py"),
    "sharded": ("tests/parallel/zero/test_zero_state.py", "tests/parallel/zero/test_fsdp.py",
                "tests/parallel/tensor_parallel/test_tp_checkpoint.py",
                "tests/parallel/pipeline/test_pp_checkpoint.py"),
    "agreement": ("tests/parallel/test_rank_agreement.py",),
}
# the course tools' slow tests build and grade whole student releases (tens of minutes a run):
# a grading mutant that only they catch names them itself
SKIPPED: Dict[str, str] = {"grading": "not mpi and not slow"}


class Mutant(NamedTuple):
    """One planted bug: replace ``before`` (found once in ``path``) by ``after``; ``catchers``,
    when given, are the tests to run instead of its module's."""

    name: str
    path: str
    before: str
    after: str
    catchers: Tuple[str, ...] = ()

    @property
    def tests(self) -> Tuple[str, ...]:
        """The tests that should catch it: ``catchers``, else its module's (its name's first
        part)."""
        return self.catchers or TESTS[self.name.split(".")[0]]

    @property
    def marks(self) -> str:
        """The pytest -m expression its tests run with."""
        return "not mpi" if self.catchers else SKIPPED.get(self.name.split(".")[0], "not mpi")


GRADING, SERIAL = "course/grade_plugin.py", "needle/serialization.py"
SCORING = "course/scoring.py"
FUSION, COMM = "needle/compiler/fusion.py", "needle/parallel/comm/engine/communicator.py"
ARGS = "needle/parallel/comm/engine/args.py"
HYPER, OPTIM = "needle/optim/hyper.py", "needle/optim/optimizer.py"
SUPERVISOR = "course/supervisor.py"
FORK_TESTS = ("tests/test_supervisor.py",  # the policy, then make grade's crashes end to end
              "tests/test_grader.py::test_grading_survives_an_abort_a_segfault_and_a_hang")

MUTANTS: List[Mutant] = [
    Mutant("grading.earned-off-by-one", SCORING,
           'ex["points"] * ex["passed"] / run, 2)', 'ex["points"] * ex["passed"] / (run + 1), 2)'),
    Mutant("grading.homework-max-overwritten", SCORING,
           'hw["max"] += ex["max"]', 'hw["max"] = ex["max"]'),
    Mutant("grading.prerequisite-flipped", SCORING,
           "match[1] != exercise else None", "match[1] == exercise else None"),
    Mutant("grading.cuda-cases-graded-anywhere", GRADING,
           'and not name.startswith("hw3.cuda.")', 'and name.startswith("hw3.cuda.")'),
    Mutant("grading.skip-overrides-failure", SCORING,
           "for rep in reports:\n        if rep.failed:",
           "for rep in reports:\n        if rep.skipped:\n            return Outcome(\"skipped\")"
           "\n        if rep.failed:"),
    Mutant("grading.prefix-not-whole-parts", GRADING,
           'n.startswith(want.rstrip(".") + ".")', "n.startswith(want)"),
    Mutant("serialization.crc-dropped", SERIAL,
           "if row.crc is not None and _crc(arr) != row.crc:",
           "if False and _crc(arr) != row.crc:"),
    Mutant("serialization.nbytes-check-dropped", SERIAL,
           "if any(s < 0 for s in shape) or math.prod(shape) * dtype.itemsize != nbytes:",
           "if any(s < 0 for s in shape):"),
    Mutant("serialization.past-the-end-off-by-one", SERIAL,
           "if end > size:", "if end > size + 1:"),
    Mutant("serialization.header-length-flipped", SERIAL,
           "if 16 + hlen > size:", "if 16 + hlen > size + 1:"),
    Mutant("serialization.bool-keys-allowed", SERIAL,
           "if not isinstance(k, (str, int)) or isinstance(k, bool):",
           "if not isinstance(k, (str, int)):"),
    Mutant("fusion.version-check-dropped", FUSION,
           "if any(self.version.get(lb, 0) != lv for lb, lv, _ in p.leaves):", "if False:"),
    Mutant("fusion.protected-inlined", FUSION,
           "!= 1 or b in self.protected or p.reduce:", "!= 1 or p.reduce:"),
    Mutant("fusion.strided-read-inlined", FUSION,
           "if p.size != g.size or not _is_flat(view, p.size) or p.dtype != g.dtype:",
           "if p.size != g.size or p.dtype != g.dtype:"),
    Mutant("fusion.two-shapes-inlined", FUSION,
           "if p.shape is not None and g.shape is not None and p.shape != g.shape:",
           "if False:"),
    Mutant("fusion.two-readers-inlined", FUSION,
           "self.readers.get((b, ver)) != 1", "self.readers.get((b, ver)) > 2"),
    Mutant("comm.call-number-stale", COMM, "        st.waiting.seq = self._seq\n", ""),
    Mutant("comm.rank-range-off-by-one", ARGS,
           "if not 0 <= n < size:", "if not 0 <= n <= size:"),
    Mutant("comm.tag-range-off-by-one", ARGS,
           "not 0 <= n < tag_ub:", "not 0 <= n <= tag_ub:"),
    Mutant("comm.zero-timeout-allowed", ARGS, "hi=MAX_TIMEOUT, lo_open=True)",
           "hi=MAX_TIMEOUT, lo_open=False)"),
    Mutant("comm.endless-timeout-allowed", ARGS, "MAX_TIMEOUT = 1e6", "MAX_TIMEOUT = 1e300"),
    Mutant("optim.momentum-of-one-allowed", OPTIM, "momentum = Hyper(lo=0, hi=1, hi_open=True)",
           "momentum = Hyper(lo=0, hi=1)"),
    Mutant("optim.unchecked-when-set", HYPER, "obj.__dict__[self.name] = self.check(",
           "obj.__dict__[self.name] = (lambda n, v: v)("),
    Mutant("optim.string-accepted", HYPER, "if not isinstance(value, abc.Real) or isinstance(",
           "if isinstance(value, list) or isinstance("),
    Mutant("profiler.nested-profile-allowed", "needle/profiler/profile.py",
           "        if active is not None:\n", "        if False:\n"),
    Mutant("doors.integer-cast-wraps", "needle/backend_ndarray/ndarray.py",
           'if to.kind not in "iu" or src.size == 0', "if True"),
    Mutant("doors.rnn-state-unchecked", "needle/nn/nn_sequence.py",
           "    if tuple(h.shape) != want:", "    if False:"),
    Mutant("doors.virtual-ranks-unbounded", "needle/parallel/virtual.py",
           "hi=MAX_RANKS)", "hi=None)"),
    Mutant("sharded.zero-rank-unchecked", "needle/parallel/zero/zero_optimizer.py",
           'or state.get("rank") != self.comm.rank:', ":"),
    Mutant("sharded.fsdp-world-unchecked", "needle/parallel/zero/fsdp_checkpoint.py",
           'if index["world_size"] != comm.size:', "if False:"),
    Mutant("sharded.pp-layer-off-by-one", "needle/parallel/pipeline/stage_state.py",
           "first_layer <= _index(n) < end}", "first_layer <= _index(n) <= end}"),
    Mutant("grading.fork-after-one-crash", SUPERVISOR,
           "for f, n in crashes.items() if n >= 2)", "for f, n in crashes.items() if n >= 1)",
           FORK_TESTS),
    Mutant("grading.fork-after-three-crashes", SUPERVISOR,
           "for f, n in crashes.items() if n >= 2)", "for f, n in crashes.items() if n >= 3)",
           FORK_TESTS),
    Mutant("grading.fork-every-file", SUPERVISOR,
           "for f, n in crashes.items() if n >= 2)", "for f, n in crashes.items())", FORK_TESTS),
    Mutant("profiler.offset-from-arrival", "needle/profiler/distributed.py",
           "t_r - (t0 + t1) // 2", "t_r - t1"),
    Mutant("profiler.offset-from-departure", "needle/profiler/distributed.py",
           "t_r - (t0 + t1) // 2", "t_r - t0"),
    Mutant("profiler.offset-of-longest-trip", "needle/profiler/distributed.py",
           "t1 - t0 < best_trip", "t1 - t0 > best_trip"),
    Mutant("profiler.offset-at-start-only", "needle/profiler/profile.py",
           "(self._offset0 + offset1) // 2", "self._offset0"),
    Mutant("profiler.offset-halved", "needle/profiler/profile.py",
           "(self._offset0 + offset1) // 2", "(self._offset0 + offset1) // 4"),
    Mutant("doors.fan-in-truncated", "needle/init/init_initializers.py",
           'fan_in = numbers.count_arg(fan_in, "initializer fan_in", lo=1)',
           "fan_in = int(fan_in)"),
    Mutant("agreement.crc-of-values-dropped", "needle/parallel/input_agreement.py",
           "return zlib.crc32(a.reshape(-1).view(np.uint8).data, head)", "return head"),
    Mutant("agreement.allgathered-values-not-compared", "needle/parallel/input_agreement.py",
           "    lines = _differing(names, every.tolist())\n",
           "    lines = _differing(names, every.tolist()[:1])\n"),
    Mutant("optim.adam-step-counted-after", "needle/backend_ndarray/adam_cpu.py",
           "        steps.array[slot] += 1\n        t = int(steps.array[slot])\n",
           "        t = int(steps.array[slot])\n        steps.array[slot] += 1\n"),
    Mutant("optim.adam-step-counted-twice", "needle/backend_ndarray/adam_cpu.py",
           "        steps.array[slot] += 1\n", "        steps.array[slot] += 2\n"),
    Mutant("fusion.unknown-engine-accepted", "needle/backend_ndarray/fused_elementwise_cpu.py",
           "    if name not in ENGINES:\n", "    if False:\n"),
    Mutant("sharded.tp-split-unchecked", "needle/parallel/tensor_parallel/tp_checkpoint.py",
           "    if full.shape[axis] % size:\n", "    if False:\n"),
]


def problems(root: Path = ROOT, mutants: Sequence[Mutant] = MUTANTS) -> List[str]:
    """Why some mutants no longer apply (``before`` missing or found twice), or []."""
    out = []
    for m in mutants:
        path = root / m.path
        text = path.read_text() if path.exists() else ""
        count = text.count(m.before)
        if count != 1:
            out.append(f"{m.name}: {m.before!r} found {count} times in {m.path}")
        if m.before == m.after:
            out.append(f"{m.name}: before and after are the same")
    names = [m.name for m in mutants]
    out += [f"{n}: the name is used twice" for n in sorted({n for n in names
                                                           if names.count(n) > 1})]
    return out


def copy_tree(dest: Path) -> None:
    """The working tree (without git's data and caches) at ``dest``."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
        "build", "*.egg-info"))


class Run(NamedTuple):
    """A test run: 'passed' | 'failed' | 'timeout', its seconds, the first failure's line."""

    outcome: str
    seconds: float
    first_failure: str


def run_tests(tree: Path, tests: Sequence[str], timeout: float, marks: str = "not mpi") -> Run:
    """``tests`` run in ``tree`` with ``-m marks`` (stopping at the first failure)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider",
           "-m", marks, *tests]
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Run("timeout", time.monotonic() - start, "")
    # which test caught it (an ERROR line is a collection or import failure: a weaker catch)
    first = next((line for line in res.stdout.splitlines()
                  if line.startswith(("FAILED ", "ERROR "))), "")
    return Run("passed" if res.returncode == 0 else "failed", time.monotonic() - start,
               first[:110])


def imports_from(tree: Path) -> bool:
    """True when Python started in ``tree`` imports that tree's needle (not an installed one)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", "import needle; print(needle.__file__)"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    return out.returncode == 0 and Path(out.stdout.strip()).resolve().is_relative_to(
        tree.resolve())


def mutate(tree: Path, mutants: Sequence[Mutant], timeout: float) -> List[Tuple[Mutant, str]]:
    """Each mutant applied alone in ``tree``, its tests run, the file restored."""
    results = []
    for m in mutants:
        path = tree / m.path
        original = path.read_text()
        path.write_text(original.replace(m.before, m.after, 1))
        try:
            run = run_tests(tree, m.tests, timeout, m.marks)
        finally:
            path.write_text(original)
        verdict = "survived" if run.outcome == "passed" else "caught"
        note = " (timed out)" if run.outcome == "timeout" else ""
        print(f"{verdict:<9} {m.name:<42} {run.seconds:6.1f} s{note}", flush=True)
        if run.first_failure:
            print(f"          by {run.first_failure}", flush=True)
        results.append((m, verdict))
    return results


def main(argv: Optional[List[str]] = None) -> int:
    """Run the mutants; 0 when every chosen mutant ran, 2 on a broken list or baseline."""
    ap = cli.Parser(prog="python tools/mutate.py", description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="",
                    help="run the mutants whose name starts with this (prefixes: a,b)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--timeout", type=cli.positive_type(), default=TIMEOUT,
                    help="seconds per test run")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if m.name.startswith(tuple(args.only.split(",")))]
    broken = problems()
    if broken or not chosen:
        print("\n".join(broken) or f"no mutant starts with {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(f"{m.name:<42} {m.path}: {' '.join(m.tests)}" for m in chosen))
        return 0
    with tempfile.TemporaryDirectory(prefix="needle-mutate-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        if not imports_from(tree):
            print("python does not import needle from the copy: is PYTHONPATH overridden?",
                  file=sys.stderr)
            return 2
        for tests, marks in sorted({(m.tests, m.marks) for m in chosen}):
            run = run_tests(tree, tests, args.timeout, marks)
            print(f"baseline  {' '.join(tests)}: {run.outcome} ({run.seconds:.1f} s)",
                  flush=True)
            if run.outcome != "passed":
                print("the unmutated tests do not pass: fix them first", file=sys.stderr)
                return 2
        results = mutate(tree, chosen, args.timeout)
    caught = sum(v == "caught" for _, v in results)
    print(f"mutation score: {caught}/{len(results)} caught ({100 * caught / len(results):.0f}%)"
          + "".join(f"\n  survived: {m.name}" for m, v in results if v == "survived"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
