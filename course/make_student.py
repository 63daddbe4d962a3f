"""`make student`: write the student release of the course to ``build/student/``.

Every ``### BEGIN YOUR SOLUTION (exercise)`` ... ``### END YOUR SOLUTION`` region of the
reference code is replaced by ``raise NotImplementedError("<exercise>: ...")`` naming its exercise
of ``course/exercises.py`` (by ``pass`` where the region sits at module or class level, so the
release still imports). Everything outside the regions, docstrings and comments included, is kept
as it is: the spec of each exercise is the docstring of the function or class holding it.
Notebooks, tests, apps, benchmarks and this course/ folder are copied as they are. The release's
README is the students' own (``course/README_student.md``), and its Makefile leaves out the
lines between ``# BEGIN INSTRUCTOR ONLY`` and ``# END INSTRUCTOR ONLY`` (``make student``,
``make demo``, which needs every exercise written).

    python -m course.make_student [--out build/student]
"""
import argparse
import ast
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

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
# tools/testcluster and tools/measure: the multi-host tests' hosts and --cluster here's workers;
# tools/sanitize.py: make test-cuda-sanitize and its test
SHIPPED_DIRS = ("needle", "apps", "tests", "notebooks", "course", "benchmarks",
                "tools/testcluster", "tools/measure")
SHIPPED_FILES = ("Makefile", "setup.py", "pytest.ini", "ruff.toml", "conftest.py", "README.md",
                 ".gitignore", "tools/__init__.py", "tools/sanitize.py", "tools/tsan.supp")
SOLUTION_DIRS = ("needle", "apps")  # where exercises live (tests may quote the markers)
SKIPPED = ("__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")
STUDENT_README = Path("course") / "README_student.md"  # the release's README.md
INSTRUCTOR_ONLY = ("# BEGIN INSTRUCTOR ONLY", "# END INSTRUCTOR ONLY")


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


def stub_line(exercise: str, where: str) -> str:
    """The statement a region in a function becomes: NotImplementedError naming the exercise."""
    return f"raise NotImplementedError({f'{exercise}: write {where}'!r})"


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
                    else stub_line(exercise, what) if kind else "pass")
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


def without_instructor_lines(text: str) -> str:
    """``text`` without its ``# BEGIN INSTRUCTOR ONLY`` ... ``# END INSTRUCTOR ONLY`` blocks."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(INSTRUCTOR_ONLY[0]):
            skipping = True
        elif line.startswith(INSTRUCTOR_ONLY[1]):
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out)


def _student_text(path: Path, root: Path) -> Optional[str]:
    """What a shipped file becomes for students when not copied as is: README, Makefile."""
    rel = path.relative_to(root)
    if rel == Path("README.md") and (root / STUDENT_README).is_file():
        return (root / STUDENT_README).read_text()
    if rel == Path("Makefile"):
        return without_instructor_lines(path.read_text())
    return None


def make_release(out: Path, root: Path = ROOT, only: Optional[Sequence[str]] = None
                 ) -> List[Region]:
    """Write the release to ``out`` (replaced if present); returns the regions stubbed.
    ``only``: stub just these exercises' regions (``()``: a plain copy of the reference)."""
    if out.exists():
        shutil.rmtree(out)
    stubbed = []
    for path in _files(root):
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
    return stubbed


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
