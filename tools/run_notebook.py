"""Run a notebook's code cells in order in this process, without Jupyter (for machines that
have no Jupyter kernel); exit 1 at the first failing cell, 2 (one
line on stderr) when the notebook cannot be read or an option is unknown.

    python tools/run_notebook.py notebooks/hw3_cuda_kernels.ipynb

Cells run in one namespace from the notebook's folder, as a kernel started there would run
them; IPython magics and shell escapes (``%`` / ``!`` lines) are refused, not skipped.
(argparse, not ``needle.cli``: a cell may set needle's environment before needle is imported.)
"""
import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import List, NoReturn, Optional

PROG = "python tools/run_notebook.py"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def code_cells(path: Path) -> List[str]:
    """The source of each code cell of the notebook at ``path`` (ValueError when ``path`` is
    not a notebook: unreadable, not JSON, or without a list of cells)."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") \
            from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a notebook (not JSON: {err})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or not all(
            isinstance(c, dict) and "cell_type" in c for c in nb["cells"]):
        raise ValueError(f"{path}: not a notebook (no list of cells)")
    cells = [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]
    for i, src in enumerate(cells):
        if any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()):
            raise ValueError(f"{path}: code cell {i} uses an IPython magic or shell escape, "
                             f"which this runner cannot run without IPython")
    return cells


def _source(cell: dict) -> str:
    """A cell's source: a string or a list of lines (nbformat writes either)."""
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def run(path: Path) -> int:
    """Run every code cell; 0 when all ran, 1 at the first failure (its traceback printed)."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # no display: figures are drawn, not shown
    cells = code_cells(path)
    os.chdir(path.parent)
    namespace = {"__name__": "__main__"}
    for i, src in enumerate(cells):
        t0 = time.perf_counter()
        try:
            exec(compile(src, f"{path.name}:cell{i}", "exec"), namespace)  # noqa: S102
        except Exception:  # noqa: BLE001 - report the cell and stop, as a kernel would
            traceback.print_exc()
            print(f"FAILED {path.name} code cell {i}", flush=True)
            return 1
        print(f"ok {path.name} code cell {i} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line and run the notebook: 0, 1 (a cell failed) or 2 (bad input)."""
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="the .ipynb file to run")
    args = parser.parse_args(argv)
    path = Path(args.notebook).resolve()
    try:
        code_cells(path)  # refused before any cell runs
    except ValueError as err:
        parser.error(str(err))
    return run(path)


if __name__ == "__main__":
    sys.exit(main())
