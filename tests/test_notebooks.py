"""Every notebook in notebooks/ runs top to bottom (its code cells hold their own asserts)."""
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    code = [("".join(c["source"]), i) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    namespace = {"__name__": "__notebook__"}
    for src, i in code:
        exec(compile(src, f"{path.name}[cell {i}]", "exec"), namespace)


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, "notebooks/ should hold at least one homework notebook"
