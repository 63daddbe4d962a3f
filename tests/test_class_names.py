"""Two classes never share a name in ``needle/``, but for the course's own pairs: an
op and the layer that calls it (``ops.ReLU`` / ``nn.ReLU``) and each backend's ``Array``."""
import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
# the backends' buffer class: each device module defines its own ``Array`` (the course's name)
BACKEND_ARRAYS = {"needle/backend_ndarray/ndarray_backend_numpy.py",
                  "needle/backend_cuda/ndarray_backend_cuda.py"}


def class_names(root: Path) -> Dict[str, List[str]]:
    """Every class defined under ``root/needle`` (nested ones too): name -> files, repeated."""
    found: Dict[str, List[str]] = defaultdict(list)
    for path in sorted((root / "needle").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(path.relative_to(root).as_posix())
    return found


def allowed(files: List[str]) -> bool:
    """One op in needle/ops/ and one layer in needle/nn/, or the backends' two Arrays."""
    if sorted(files) == sorted(BACKEND_ARRAYS):
        return True
    return len(files) == 2 and sorted(f.split("/")[1] for f in files) == ["nn", "ops"]


def duplicates(root: Path) -> Dict[str, List[str]]:
    """The names defined more than once that are not one of the course's pairs."""
    return {name: files for name, files in class_names(root).items()
            if len(files) > 1 and not allowed(files)}


def test_no_class_name_is_defined_twice_in_needle():
    assert duplicates(ROOT) == {}


def test_the_course_pairs_are_the_only_repeats():
    """The allowance is used as described (not, say, three ReLUs), and only by these."""
    repeated = {n: f for n, f in class_names(ROOT).items() if len(f) > 1}
    assert repeated["Array"] == sorted(BACKEND_ARRAYS)
    assert {"ReLU", "Conv", "Dropout"} <= set(repeated)
    assert all(allowed(files) for files in repeated.values())


def test_a_second_class_of_a_name_is_found(tmp_path):
    """The scan sees classes anywhere, nested ones included; an nn/ops pair may not grow."""
    for rel, text in {"needle/a.py": "class Group:\n    pass\n",
                      "needle/sub/b.py": "def f():\n    class Group:\n        pass\n",
                      "needle/ops/o.py": "class ReLU:\n    pass\n",
                      "needle/nn/n.py": "class ReLU:\n    pass\n",
                      "needle/nn/m.py": "class ReLU:\n    pass\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert duplicates(tmp_path) == {"Group": ["needle/a.py", "needle/sub/b.py"],
                                    "ReLU": ["needle/nn/m.py", "needle/nn/n.py",
                                             "needle/ops/o.py"]}
