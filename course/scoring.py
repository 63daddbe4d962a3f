"""The grade from the tests' outcomes: one outcome per test, the score, the table a student reads.

Pure functions over plain data (no pytest run): ``course/grade_plugin.py`` (the pytest plugin) and
``course/grade.py`` (``make grade``, which runs the tests in a child process) both use them.
"""
import re
import signal
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from .exercises import HOMEWORKS

_STUB = re.compile(r"NotImplementedError: ([\w.]+): write ")


class Outcome(NamedTuple):
    """What became of one graded test: passed | failed | skipped, and the first failure line."""

    outcome: str
    message: str = ""


def report_message(report: Any) -> str:
    """The one-line cause of a failed pytest report (its crash line, else its text's end)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, str):  # course/forked.py's: the cause, then the dump
        return report.longrepr.split("\n", 1)[0]
    return str(report.longrepr)[-500:]


def outcome_of(reports: Iterable[Any]) -> Outcome:
    """One test's outcome from its setup/call/teardown reports: failed if any phase failed
    (an error in setup or teardown is a failure), skipped if any skipped, passed only when its
    call phase ran and passed."""
    reports = list(reports)
    for rep in reports:
        if rep.failed:
            where = "" if rep.when == "call" else f"error in {rep.when}: "
            return Outcome("failed", where + report_message(rep))
    if any(rep.skipped for rep in reports):
        return Outcome("skipped")
    if any(rep.when == "call" and rep.passed for rep in reports):
        return Outcome("passed")
    return Outcome("failed", "the test did not run (no call phase)")


def crash_cause(returncode: int) -> str:
    """'crashed: SIGABRT (Aborted)' for a process killed by a signal, else its exit status."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
            return f"crashed: {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"crashed: signal {-returncode}"
    return f"the test process exited with status {returncode} during the test"


def missing_prerequisite(message: str, exercise: str) -> Optional[str]:
    """The other exercise whose stub a failure of ``exercise``'s test hit, or None."""
    match = _STUB.search(message)
    return match[1] if match is not None and match[1] != exercise else None


def not_written(message: str, exercise: str) -> bool:
    """Whether a failure is ``exercise``'s own stub raising (nothing written there yet)."""
    match = _STUB.search(message)
    return match is not None and match[1] == exercise


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
        ex["status"] = status(ex)
        hw = homeworks.setdefault(ex["exercise"].split(".")[0], {"earned": 0.0, "max": 0})
        hw["earned"] = round(hw["earned"] + ex["earned"], 2)
        hw["max"] += ex["max"]
    total = {"earned": round(sum(h["earned"] for h in homeworks.values()), 2),
             "max": sum(h["max"] for h in homeworks.values())}
    return {"total": total, "homeworks": homeworks,
            "exercises": sorted(exercises.values(), key=lambda e: e["exercise"])}


def first_failure(ex: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The exercise's first failed test (its entry in the report), or None."""
    return next((t for t in ex["tests"] if t["outcome"] == "failed"), None)


def status(ex: Dict[str, Any]) -> str:
    """A word or two for the table: done, not written, needs X, failing, crashed, skipped."""
    first = first_failure(ex)
    if first is None:
        return "done" if ex["passed"] else "skipped"
    if ex.get("needs") and first["message"].startswith("needs "):
        return f"needs {ex['needs'][0]} first"
    if not_written(first["message"], ex["exercise"]):
        return "not written"
    if first["message"].startswith("crashed: "):
        return "crashed: " + first["message"].split(" ")[1].rstrip(":")
    if first["message"].startswith("timed out"):
        return first["message"].split(":")[0]
    return "failing"


def format_table(report: Dict[str, Any]) -> str:
    """The score table: per homework its total, then one row per exercise with its status."""
    lines = [f"{'exercise':<38}{'tests':>13}{'points':>9}{'':4}status"]
    by_hw: Dict[str, List[Dict[str, Any]]] = {}
    for ex in report["exercises"]:
        by_hw.setdefault(ex["exercise"].split(".")[0], []).append(ex)
    for hw in sorted(by_hw, key=homework_order):
        h = report["homeworks"][hw]
        lines.append(f"{hw:<51}{h['earned']:>7g}/{h['max']:<3}")
        for ex in by_hw[hw]:
            run = ex["passed"] + ex["failed"]
            tests = f"{ex['passed']}/{run}" + (f" ({ex['skipped']} skip)" if ex["skipped"]
                                               else "")
            pts = f"{ex['earned']:>7g}/{ex['max']:<3}" if run else f"{'-':>7} {'':<3}"
            lines.append(f"  {ex['exercise']:<36}{tests:>13}{pts}  {status(ex)}")
    t = report["total"]
    lines.append(f"TOTAL {t['earned']:g}/{t['max']} points")
    return "\n".join(lines)


def homework_order(hw: str) -> Tuple[int, str]:
    """Sort key: the course's homework in course order (hw0 ... hw4, collectives), then any
    other (an instructor's hidden hw9) by name."""
    return (HOMEWORKS.index(hw), "") if hw in HOMEWORKS else (len(HOMEWORKS), hw)


def failure_lines(report: Dict[str, Any], width: int = 200) -> List[str]:
    """One line per exercise whose own code fails: its first failure."""
    lines = []
    for ex in report["exercises"]:
        first = first_failure(ex)
        if first is None or _waiting(ex):
            continue
        path, sep, name = first["test"].partition("::")  # the file's name is enough here
        test = path.rsplit("/", 1)[-1] + sep + name
        lines.append(_one_line(f"{ex['exercise']}: {test}: {first['message']}", width))
    return lines


_MODULE_PREFIX = re.compile(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Z]\w*(?:Error|Exception)\b)")
_LOCATION = re.compile(r"([\w.-]+\.(?:cu|cuh|h|py)):(\d+)")
# the emulator's kernel errors name block and thread, then the error's kind: "thread (129, 0,
# 0): out-of-bounds write of 4 bytes: buffer ...", "thread (16, 0, 0) of block (0, 4, 0): read
# of uninitialised __shared__ smem ..."
_THREAD = re.compile(r"thread \(\d+, \d+, \d+\)(?: of block \(\d+, \d+, \d+\))?: ")
_KIND_MAX = 60  # characters of the kind kept at most
_BLOCK = re.compile(r"block \(\d+, \d+, \d+\) | of block \(\d+, \d+, \d+\)")


def _kind_end(line: str) -> Optional[int]:
    """Where the error's kind ends in ``line`` (its clause after the thread), or None."""
    who = _THREAD.search(line)
    if who is None:
        return None
    clause = re.search(r"[:,]| at | on ", line[who.end():who.end() + _KIND_MAX])
    return who.end() + (clause.start() if clause else _KIND_MAX)


def _cut_test_id(head: str, budget: int) -> str:
    """``head`` with the middle of its test id (between "exercise: " and the ": " before the
    error) cut to fit ``budget``, keeping at least 24 characters of it."""
    start, stop = head.find(": ") + 2, head.find(": ", head.find("::") + 2)
    excess = len(head) - budget + 3
    if not 0 < start < stop or stop - start - excess < 24:
        excess = stop - start - 24
    if excess <= 3:
        return head
    keep = (stop - start - excess) // 2
    return head[:start + keep] + "..." + head[stop - (stop - start - excess - keep):]


def _shorten(head: str, budget: int) -> str:
    """The beginning of a kernel error, up to its kind, shortened toward ``budget``: template
    arguments of the kernel's name go first, then the block, then the test's parameters."""
    for step in (lambda h: re.sub(r"<[^<>']*>", "<...>", h),
                 lambda h: _BLOCK.sub("", h),
                 lambda h: _cut_test_id(h, budget)):
        if len(head) <= budget:
            break
        head = step(head)
    return head


def _one_line(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters: exception names without their
    module path; when cut, the beginning up to the error's kind (``out-of-bounds write``) and
    the first two source locations (``strided.cu:52``) are kept, the middle goes (for a kernel
    error: its template arguments, the block, the test's parameters, then the details)."""
    line = _MODULE_PREFIX.sub("", text.replace("\n", " "))
    if len(line) <= width:
        return line
    places = list(dict.fromkeys(f"{m[1]}:{m[2]}" for m in _LOCATION.finditer(line)))[:2]
    tail = f" ... at {', '.join(places)}" if places else " ..."
    budget = width - len(tail)
    end = _kind_end(line)
    head = line[:budget] if end is None or end <= budget else _shorten(line[:end], budget)
    return head[:budget] + tail


def waiting_line(report: Dict[str, Any]) -> Optional[str]:
    """A line counting the exercises not written yet or waiting on another one, or None."""
    waiting = sum(1 for ex in report["exercises"] if first_failure(ex) and _waiting(ex))
    return (f"{waiting} exercise(s) not written yet or waiting on another exercise (the "
            "status column says which one to write first)") if waiting else None


def _waiting(ex: Dict[str, Any]) -> bool:
    return status(ex) == "not written" or status(ex).startswith("needs ")
