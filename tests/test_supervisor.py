"""course/supervisor.py's restart policy, with the child pytest replaced by a script: after a
second crash in one test file (not the first), the rest of that file runs a fork per test, and
no other file does; each restart skips what is graded already."""
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from course import supervisor
from course.scoring import Outcome

FILE_A, FILE_B = "/x/test_a.py", "/x/test_b.py"
TESTS = {f"test_a.py::t{i}": ("hw9.a", 1, FILE_A) for i in range(5)}
TESTS.update({f"test_b.py::t{i}": ("hw9.b", 1, FILE_B) for i in range(2)})


def _option(cmd: List[str], name: str) -> Optional[List[str]]:
    """The lines of the file named by ``cmd``'s option ``name`` (None when not given)."""
    if name not in cmd:
        return None
    return [ln for ln in Path(cmd[cmd.index(name) + 1]).read_text().splitlines() if ln]


def _grade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashes: List[str]
           ) -> Tuple[supervisor.Graded, List[Dict[str, Optional[List[str]]]]]:
    """run_graded over TESTS where each test of ``crashes`` kills its child (in that order,
    one per child); what each child was told to skip and to fork."""
    seen: List[Dict[str, Optional[List[str]]]] = []
    todo = list(crashes)

    def child(cmd, output, reader, graded, timeout, cwd, env=None):
        seen.append({"forked": _option(cmd, "--grade-forked"),
                     "skip": _option(cmd, "--grade-skip")})
        graded.tests.update(TESTS)
        for nodeid in TESTS:
            if nodeid in graded.outcomes:
                continue
            if todo and nodeid == todo[0]:
                todo.pop(0)
                reader.running = nodeid
                return -6, "crashed: SIGABRT"
            graded.outcomes[nodeid] = Outcome("passed")
        return 0, None

    monkeypatch.setattr(supervisor, "_run_child", child)
    graded = supervisor.run_graded([], ["/x"], tmp_path, 5.0, lambda s: None, tmp_path)
    return graded, seen


def test_one_crash_restarts_the_child_without_forking(tmp_path, monkeypatch):
    graded, seen = _grade(tmp_path, monkeypatch, ["test_a.py::t1"])
    assert len(seen) == 2
    assert seen[0] == {"forked": None, "skip": None}
    assert seen[1]["forked"] == []  # one crash: the file still runs in one process
    assert seen[1]["skip"] == ["test_a.py::t0", "test_a.py::t1"]
    assert graded.outcomes["test_a.py::t1"] == Outcome("failed", "crashed: SIGABRT")
    assert sum(o.outcome == "passed" for o in graded.outcomes.values()) == len(TESTS) - 1


def test_a_second_crash_in_a_file_forks_the_rest_of_that_file_only(tmp_path, monkeypatch):
    graded, seen = _grade(tmp_path, monkeypatch, ["test_a.py::t1", "test_a.py::t3",
                                                  "test_b.py::t0"])
    # crash 1 in a, crash 2 in a (a forks from now on), crash 1 in b (b does not)
    assert [s["forked"] for s in seen] == [None, [], [FILE_A], [FILE_A]]
    failed = sorted(n for n, o in graded.outcomes.items() if o.outcome == "failed")
    assert failed == ["test_a.py::t1", "test_a.py::t3", "test_b.py::t0"]
    assert len(graded.outcomes) == len(TESTS)
