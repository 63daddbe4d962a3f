"""Name the kernel behind a CUDA exercise's wrong numbers: `make grade` reruns such a test once
under the emulator's full check.

By default the CUDA emulator checks every load and store against its buffer's bounds (an
out-of-bounds access fails the test naming kernel, block, thread and ``.cu`` file:line). A
missing ``__syncthreads()`` or a read of ``__shared__`` memory no thread wrote gives wrong
numbers only ("Not equal to tolerance"). ``NEEDLE_CUDA_EMULATOR_CHECK=full`` finds both
(shared-memory races with both threads and lines, uninitialised reads) but makes every launch
slower, so the grader runs the CUDA tests with the default check and reruns a few of those that
failed naming no kernel, with the full check (``NEEDLE_CUDA_EMULATOR=force``: on the emulator
even where a GPU is present). A test the checker fails has its message replaced by what the
checker says, with the numbers kept after it; otherwise the message says the checker found
nothing.
"""
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .scoring import Outcome
from .supervisor import Graded, run_graded

CUDA_EXERCISES = "hw3.cuda."
CHECKED_ENV = {"NEEDLE_CUDA_EMULATOR": "force", "NEEDLE_CUDA_EMULATOR_CHECK": "full"}
RERUNS_PER_EXERCISE = 2  # each costs a kernel build with checking: 15-30 s
# failures that already say why: a kernel error, a crash, a limit, a stub, a missing exercise
_NAMED = ("Emulator", "crashed: ", "timed out", "NotImplementedError", "needs ", "not run",
          "could not import")


def to_rerun(graded: Graded) -> List[str]:
    """The failed tests of CUDA exercises whose failure names no kernel (wrong numbers, an
    assertion), the first ``RERUNS_PER_EXERCISE`` of each exercise, in grading order."""
    picked: Dict[str, List[str]] = {}
    for nodeid, (exercise, _, _) in graded.tests.items():
        outcome = graded.outcomes.get(nodeid)
        if (exercise.startswith(CUDA_EXERCISES) and outcome is not None
                and outcome.outcome == "failed"
                and not any(word in outcome.message for word in _NAMED)):
            tests = picked.setdefault(exercise, [])
            if len(tests) < RERUNS_PER_EXERCISE:
                tests.append(nodeid)
    return [n for tests in picked.values() for n in tests]


def rerun_checked(base: Sequence[str], graded: Graded, workdir: Path, timeout: float,
                  echo: Callable[[str], None], cwd: Path) -> List[str]:
    """Rerun ``to_rerun(graded)`` under the full check and fold what it found into
    ``graded``'s outcomes and details; the tests rerun."""
    nodes = to_rerun(graded)
    if not nodes:
        return []
    echo(f"rerunning {len(nodes)} failing CUDA test(s) that name no kernel with "
         "NEEDLE_CUDA_EMULATOR_CHECK=full (races, uninitialised shared reads)")
    folder = workdir / "checked"
    folder.mkdir(exist_ok=True)
    checked = run_graded(base, nodes, folder, timeout, echo=lambda line: None, cwd=cwd,
                         env=CHECKED_ENV)
    for nodeid in nodes:
        first = graded.outcomes[nodeid].message
        found = checked.outcomes.get(nodeid)
        if found is not None and found.outcome == "failed" and "Emulator" in found.message:
            graded.outcomes[nodeid] = Outcome(
                "failed", f"{found.message} (NEEDLE_CUDA_EMULATOR_CHECK=full; by default: "
                f"{first})")
            graded.details[nodeid] = (f"NEEDLE_CUDA_EMULATOR_CHECK=full:\n"
                                      f"{checked.details.get(nodeid, found.message)}\n\n"
                                      f"by default:\n{graded.details.get(nodeid, first)}")
        else:
            graded.outcomes[nodeid] = Outcome(
                "failed", f"{first} (NEEDLE_CUDA_EMULATOR_CHECK=full found no shared-memory race "
                "or uninitialised read)")
    return nodes
