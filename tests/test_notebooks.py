"""Every notebook in notebooks/ runs top to bottom through a real Jupyter kernel (its code cells
hold their own asserts), and is committed without outputs."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(str(path), as_version=4)
    assert any(c.cell_type == "code" for c in nb.cells), f"{path.name} has no code cells"
    # run from notebooks/ as a student would; the repository root on the path finds needle/apps
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    env_cell = nbformat.v4.new_code_cell(
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import matplotlib; matplotlib.use('Agg')")
    nb.cells.insert(0, env_cell)
    client.execute()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, "notebooks/ should hold at least one homework notebook"
