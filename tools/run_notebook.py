"""Run a notebook's code cells in order in this process, without Jupyter (for machines that
have no Jupyter kernel, such as the lent GPU machines); exit 1 at the first failing cell.

    python tools/run_notebook.py notebooks/hw3_cuda_kernels.ipynb

Cells run in one namespace from the notebook's folder, as a kernel started there would run
them; IPython magics and shell escapes (``%`` / ``!`` lines) are refused, not skipped.
"""
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import List


def code_cells(path: Path) -> List[str]:
    """The source of each code cell of the notebook at ``path``."""
    nb = json.loads(path.read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    for i, src in enumerate(cells):
        if any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()):
            raise ValueError(f"{path}: code cell {i} uses an IPython magic or shell escape, "
                             f"which this runner cannot run without IPython")
    return cells


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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(run(Path(sys.argv[1]).resolve()))
