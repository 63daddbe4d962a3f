"""`make student`: write the student release of the course to ``build/student/``.

Every ``### BEGIN YOUR SOLUTION (exercise)`` ... ``### END YOUR SOLUTION`` region of the
reference code is replaced by ``raise NotImplementedError("<exercise>: ...")`` naming its exercise
of ``course/exercises.py`` (by ``pass`` where the region sits at module or class level, so the
release still imports). Everything outside the regions, docstrings and comments included, is kept
as it is: the spec of each exercise is the docstring of the function or class holding it.
A stub too long for a line is split over three, and a name the stubbed code no longer uses (an
import, a variable the region read, one the region set) gets a ``# noqa`` (ruff finds them), so
the release's ``make lint`` passes. Notebooks, tests, apps, benchmarks, docs and this course/
folder are copied as they are, less the instructor's material (``INSTRUCTOR_FILES``: the release
tools, the tests of them and of the reference tree, the GPU reports). The release's README is
the students' own (``course/README_student.md``); its Makefile leaves out the lines between
``# BEGIN INSTRUCTOR ONLY`` and ``# END INSTRUCTOR ONLY`` (``make student``, ``make demo``, which
needs every exercise written), its Markdown the blocks between ``<!-- BEGIN INSTRUCTOR ONLY -->``
and ``<!-- END INSTRUCTOR ONLY -->`` and the sections ``INSTRUCTOR_SECTIONS`` names.

    python -m course.make_student [--out build/student]
"""
import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from needle.backend_cuda.kernel_specs import KERNEL_STUB

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN YOUR SOLUTION", "### END YOUR SOLUTION"
# the opening marker names the region's exercise: ``### BEGIN YOUR SOLUTION (hw2.optim.adam)``;
# in CUDA C (``kernels/*.cu``) the markers are ``// BEGIN YOUR SOLUTION (hw3.cuda.backend)`` and
# ``// END YOUR SOLUTION``
_BEGIN_RE = re.compile(r"(?:###|//) BEGIN YOUR SOLUTION(?: \((?P<exercise>[\w.]+)\))?\Z")
_END_LINES = (END, "// END YOUR SOLUTION")
CUDA_SUFFIXES = (".cu", ".cuh")
SOURCE_SUFFIXES = (".py",) + CUDA_SUFFIXES
# a CUDA function's name: the first identifier before "(" that is not a CUDA keyword
_CUDA_DEF = re.compile(r"__(?:global|device)__.*?\b(?!__)(?P<name>[A-Za-z_]\w*)\s*\(")
# What a release holds: the package, its course material, and the files that build and test it.
# tools/testcluster: the multi-host tests' hosts; tools/sanitize.py: make test-cuda-sanitize
# and its test
SHIPPED_DIRS = ("needle", "apps", "tests", "notebooks", "course", "benchmarks", "docs",
                "tools/testcluster")
SHIPPED_FILES = ("Makefile", "setup.py", "pytest.ini", "ruff.toml", "mypy.ini", "conftest.py",
                 "README.md", ".gitignore", "tools/__init__.py", "tools/sanitize.py",
                 "tools/tsan.supp")
# Not in the student release: the tools that make and check it, the tests of those tools and
# of what only the reference tree holds (tools/gpu_check.py, tools/mutate.py, every solution),
# and the instructor's GPU reports. (Copies of the reference that the
# release check makes, ``only=...``, keep them: it runs course/pytest_forks.py there.)
INSTRUCTOR_FILES = ("course/make_student.py", "course/check_release.py",
                    "course/check_notebooks.py",
                    "course/notebook_questions.py", "course/region_docs.py",
                    "course/pytest_forks.py", "tests/test_course_tools.py",
                    "tests/test_student_release.py", "tests/test_notebooks.py",
                    "tests/notebook_demo_regions.py", "tests/test_pytest_forks.py",
                    "tests/test_gpu_check.py", "tests/test_mutate.py",
                    "tests/test_commands.py",  # its bad-input cases run the release tools
                    "benchmarks/gpu_check_h100.md", "benchmarks/gpu_check_h100.json",
                    # the backends' fast kernels beside an exercise, each its answer: the
                    # reductions (reduce.cu), softmax and layer norm (softmax.cu,
                    # layernorm.cu) and the CPU's one-pass Adam (hw2.optim.adam)
                    "needle/backend_cuda/kernels/reduce_fast.cu",
                    "needle/backend_cuda/kernels/norm_fast.cu",
                    "needle/backend_ndarray/adam_cpu_kernel.py")
# Markdown sections (heading lines, each up to the next heading of its level or above) that
# describe instructor-only commands
INSTRUCTOR_SECTIONS = {"benchmarks/README.md": ("## GPU (`make gpu-check`)",
                                                "## Test tooling: mutation score")}
SOLUTION_DIRS = ("needle", "apps")  # where exercises live (tests may quote the markers)
SKIPPED = ("__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")
STUDENT_README = Path("course") / "README_student.md"  # the release's README.md
INSTRUCTOR_ONLY = ("# BEGIN INSTRUCTOR ONLY", "# END INSTRUCTOR ONLY")
MARKDOWN_INSTRUCTOR_ONLY = ("<!-- BEGIN INSTRUCTOR ONLY", "<!-- END INSTRUCTOR ONLY")
LINE_LENGTH = 100  # ruff.toml's
# what ruff reports in stubbed code (the stub removed the code that used a name, or set it)
STUB_LINT = ("F401", "F811", "F841", "F821")


@dataclass(frozen=True)
class Region:
    """One solution region: the file (relative to the repo), its enclosing def, its lines,
    the exercise its marker names."""

    path: str
    qualname: str
    begin: int  # line of BEGIN (1-based)
    end: int    # line of END
    exercise: str = ""

    @property
    def key(self) -> str:
        """``path::qualname`` (several regions in one def share it)."""
        return f"{self.path}::{self.qualname}"


def _enclosing_defs(tree: ast.AST) -> List[tuple]:
    spans = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                spans.append((child.lineno, child.end_lineno, name, kind))
                walk(child, name + ".")
            else:
                walk(child, prefix)
    walk(tree, "")
    return spans


# CPython 3.11: two threads parsing at once raised "AST constructor recursion depth
# mismatch" (SystemError; see CPython gh-106905); check_release stubs from two threads.
_AST_LOCK = threading.Lock()


def _parse(text: str) -> ast.Module:
    """``ast.parse(text)``, one thread at a time."""
    with _AST_LOCK:
        return ast.parse(text)


def begin_exercise(line: str) -> Optional[str]:
    """The exercise named by a BEGIN marker line ('' when it names none); None for other lines."""
    match = _BEGIN_RE.match(line.strip())
    return None if match is None else (match["exercise"] or "")


def _python_qualname(text: str) -> Callable[[int], str]:
    """line -> the innermost def or class enclosing it ("<module>" outside any)."""
    spans = _enclosing_defs(_parse(text))

    def at(line: int) -> str:
        inner = [s for s in spans if s[0] <= line <= s[1]]
        return max(inner, key=lambda s: s[0])[2] if inner else "<module>"
    return at


def _cuda_qualname(lines: List[str]) -> Callable[[int], str]:
    """line -> the last CUDA function (``__global__`` / ``__device__``) opened above it."""
    def at(line: int) -> str:
        names = [m["name"] for text in lines[:line] for m in [_CUDA_DEF.search(text)] if m]
        return names[-1] if names else "<file>"
    return at


def find_regions(path: Path, root: Path = ROOT) -> List[Region]:
    """The solution regions of one Python file, with the def or class enclosing each and the
    exercise its marker names (a marker naming none is an error)."""
    text = path.read_text()
    lines = text.splitlines()
    qualname = _cuda_qualname(lines) if path.suffix in CUDA_SUFFIXES else _python_qualname(text)
    out, begin, exercise = [], None, ""
    for i, line in enumerate(lines, 1):
        named = begin_exercise(line)
        if named is not None:
            if begin is not None:
                raise ValueError(f"{path}:{i}: {BEGIN} inside another region (line {begin})")
            if not named:
                raise ValueError(f"{path}:{i}: {BEGIN} names no exercise; write "
                                 f"'{BEGIN} (hwN.unit.name)' with a name of course/exercises.py")
            begin, exercise = i, named
        elif line.strip() in _END_LINES:
            if begin is None:
                raise ValueError(f"{path}:{i}: {END} without a {BEGIN}")
            out.append(Region(str(path.relative_to(root)), qualname(begin), begin, i, exercise))
            begin = None
    if begin is not None:
        raise ValueError(f"{path}:{begin}: {BEGIN} is never closed")
    return out


def all_regions(root: Path = ROOT) -> List[Region]:
    """Every solution region of the Python and CUDA C sources a release ships (not tests)."""
    regions = []
    for top in SOLUTION_DIRS:
        for path in sorted(p for p in (root / top).rglob("*") if p.suffix in SOURCE_SUFFIXES):
            if not any(part in SKIPPED for part in path.parts):
                regions.extend(find_regions(path, root))
    return regions


def _in_function(path: Path) -> dict:
    """BEGIN line -> True when the region's innermost enclosing scope is a function ("cuda"
    for every region of a CUDA C file)."""
    if path.suffix in CUDA_SUFFIXES:
        return {i: "cuda" for i, line in enumerate(path.read_text().splitlines(), 1)
                if begin_exercise(line) is not None}
    spans = _enclosing_defs(_parse(path.read_text()))
    res = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if begin_exercise(line) is not None:
            inner = [s for s in spans if s[0] <= i <= s[1]]
            res[i] = bool(inner) and max(inner, key=lambda s: s[0])[3] == "def"
    return res


def stub_line(exercise: str, where: str, indent: str = "") -> str:
    """The statement a region in a function becomes: NotImplementedError naming the exercise
    (split over three lines when one would be longer than ``LINE_LENGTH``)."""
    message = f"{exercise}: write {where}"
    line = f"raise NotImplementedError({message!r})"
    cut = message.rfind(" in ") + 1
    if len(indent) + len(line) <= LINE_LENGTH or cut <= 0:
        return line
    inner = indent + "    "
    return (f"raise NotImplementedError(\n{inner}{message[:cut]!r}\n"
            f"{inner}{message[cut:]!r})")


def cuda_stub_line(exercise: str, where: str) -> str:
    """The comment a CUDA C region becomes; loading the file raises NotImplementedError with
    the rest of the line (``needle.backend_cuda.kernel_specs.source``)."""
    return f"{KERNEL_STUB}{exercise}: write {where}"


def strip_solutions(source: str, in_function: Optional[dict] = None,
                    where: Optional[dict] = None, only: Optional[Sequence[str]] = None) -> str:
    """``source`` with each region's body replaced by a stub (markers kept); with ``only``,
    just the regions of those exercises. ``where``: BEGIN line -> what the stub's message
    asks to write (default "this region")."""
    lines = source.splitlines(keepends=True)
    out, skipping = [], False
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        exercise = begin_exercise(line)
        if exercise is not None and (only is None or exercise in only):
            indent = line[:len(line) - len(line.lstrip())]
            kind = (in_function or {}).get(i, True)
            what = (where or {}).get(i, "this region")
            stub = (cuda_stub_line(exercise, what) if kind == "cuda"
                    else stub_line(exercise, what, indent) if kind else "pass")
            out += [line, f"{indent}{stub}\n"]
            skipping = True
        elif stripped in _END_LINES:
            out.append(line)
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out)


def _files(root: Path) -> Iterator[Path]:
    for name in SHIPPED_FILES:
        if (root / name).is_file():
            yield root / name
    for top in SHIPPED_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not any(p in SKIPPED or p.endswith(".egg-info")
                                          for p in rel.parts):
                yield path


def without_instructor_lines(text: str, markers: Tuple[str, str] = INSTRUCTOR_ONLY) -> str:
    """``text`` without its ``# BEGIN INSTRUCTOR ONLY`` ... ``# END INSTRUCTOR ONLY`` blocks
    (``markers``: the lines' beginnings)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(markers[0]):
            skipping = True
        elif line.startswith(markers[1]):
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out)


def without_sections(text: str, headings: Sequence[str]) -> str:
    """Markdown ``text`` without the sections whose heading line starts with one of
    ``headings``: each up to the next heading of its level or above."""
    out: List[str] = []
    level = 0  # of the section being left out; 0: keeping
    for line in text.splitlines(keepends=True):
        depth = len(line) - len(line.lstrip("#")) if line.startswith("#") else 0
        if level and 0 < depth <= level:
            level = 0
        if not level and depth and line.startswith(tuple(headings)):
            level = depth
        if not level:
            out.append(line)
    return "".join(out)


def _student_text(path: Path, root: Path) -> Optional[str]:
    """What a shipped file becomes for students when not copied as is: README, Makefile, and
    Markdown with instructor-only blocks or sections."""
    rel = path.relative_to(root)
    if rel == Path("README.md") and (root / STUDENT_README).is_file():
        return (root / STUDENT_README).read_text()
    if rel == Path("Makefile"):
        return without_instructor_lines(path.read_text())
    if path.suffix == ".md":
        text = without_instructor_lines(path.read_text(), MARKDOWN_INSTRUCTOR_ONLY)
        text = without_sections(text, INSTRUCTOR_SECTIONS.get(rel.as_posix(), ()))
        return text if text != path.read_text() else None
    return None


def make_release(out: Path, root: Path = ROOT, only: Optional[Sequence[str]] = None
                 ) -> List[Region]:
    """Write the release to ``out`` (replaced if present); returns the regions stubbed.
    ``only``: stub just these exercises' regions (``()``: a plain copy of the reference)."""
    if out.exists():
        shutil.rmtree(out)
    stubbed = []
    for path in _files(root):
        if only is None and path.relative_to(root).as_posix() in INSTRUCTOR_FILES:
            continue
        dest = out / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (path.suffix in SOURCE_SUFFIXES and path.relative_to(root).parts[0] in SOLUTION_DIRS
                and "BEGIN YOUR SOLUTION" in path.read_text()):
            text, regions = stub_file(path, root, only)
            dest.write_text(text)
            stubbed.extend(regions)
        elif only is None and _student_text(path, root) is not None:
            dest.write_text(_student_text(path, root) or "")
        else:
            shutil.copy2(path, dest)
    mark_unused_names(out, sorted({r.path for r in stubbed if r.path.endswith(".py")}))
    return stubbed


def mark_unused_names(out: Path, paths: Sequence[str]) -> Dict[str, List[int]]:
    """Add ``# noqa: <code>`` to the lines of the stubbed files ``paths`` (relative to
    ``out``) where ruff reports a name the stub left unused or undefined (``STUB_LINT``); the
    lines marked, per file. The names stay: they are the code around the student's answer."""
    if not paths:
        return {}
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "--exit-zero",
           "--output-format", "json", "--select", ",".join(STUB_LINT), *paths]
    try:
        found = json.loads(subprocess.run(cmd, cwd=out, capture_output=True, text=True,
                                          check=True, timeout=120).stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        print(f"make_student: ruff did not run ({err}): the release's make lint will report "
              "names the stubs left unused", file=sys.stderr)
        return {}
    codes: Dict[str, Dict[int, List[str]]] = {}
    for item in found:
        rel = Path(item["filename"]).resolve().relative_to(out.resolve()).as_posix()
        codes.setdefault(rel, {}).setdefault(item["location"]["row"], []).append(item["code"])
    for rel, by_line in codes.items():
        lines = (out / rel).read_text().splitlines(keepends=True)
        for row, names in by_line.items():
            body = lines[row - 1].rstrip("\n")
            if "# noqa: " in body:  # one directive per line: add the codes to it
                body, _, had = body.partition("# noqa: ")
                names += [c.strip() for c in had.split(",")]
                body = body.rstrip()
            lines[row - 1] = f"{body}  # noqa: {','.join(sorted(set(names)))}\n"
        (out / rel).write_text("".join(lines))
    return {rel: sorted(by_line) for rel, by_line in codes.items()}


def stub_file(path: Path, root: Path = ROOT, only: Optional[Sequence[str]] = None
              ) -> "tuple[str, List[Region]]":
    """``path``'s source with its regions (of the exercises ``only``, default all) stubbed, and
    the regions stubbed; each stub names its exercise and what to write."""
    regions = [r for r in find_regions(path, root) if only is None or r.exercise in only]
    where = {r.begin: f"{r.qualname} in {r.path}" for r in regions}
    return strip_solutions(path.read_text(), _in_function(path), where, only), regions


def _check_out(parser: argparse.ArgumentParser, out: Path) -> None:
    """``--out`` is deleted and rewritten: refuse a file, the reference tree or a folder above
    it, and a folder holding something other than an earlier release."""
    out, root = out.resolve(), ROOT.resolve()
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: is a file, not a folder")
    if out == root or out in root.parents:
        parser.error(f"--out {out}: would delete the reference tree {root}")
    if out.is_dir() and any(out.iterdir()) and not (out / "needle" / "__init__.py").is_file():
        parser.error(f"--out {out}: holds files that are not a student release (it would be "
                     "deleted); give a new or empty folder")


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Write the release and say what it holds."""
    from needle.cli import Parser  # one-line errors, unknown options refused
    parser = Parser(prog="python -m course.make_student", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build" / "student"),
                        help="output folder (replaced whole: new, empty, or an earlier release)")
    args = parser.parse_args(argv)
    _check_out(parser, Path(args.out))
    regions = make_release(Path(args.out))
    files = len({r.path for r in regions})
    print(f"student release in {args.out}: {len(regions)} solution regions in {files} files "
          "replaced by stubs")


if __name__ == "__main__":
    main()
