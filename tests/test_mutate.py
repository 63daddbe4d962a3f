"""tools/mutate.py's mutants still apply to the sources: each ``before`` is found once in its
file, and the mutated file still compiles (a mutant is a bug, not a syntax error)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
mutate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutate)


def test_every_mutant_applies_to_the_current_sources():
    assert mutate.problems() == []


@pytest.mark.parametrize("m", mutate.MUTANTS, ids=[m.name for m in mutate.MUTANTS])
def test_each_mutant_compiles_and_has_tests(m):
    source = (ROOT / m.path).read_text()
    compile(source.replace(m.before, m.after, 1), m.path, "exec")
    assert m.tests and all((ROOT / t.split("::")[0]).exists() for t in m.tests)


def test_a_rotten_mutant_is_reported(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    rotten = [mutate.Mutant("a.gone", "a.py", "x = 2", "x = 3")]
    assert mutate.problems(tmp_path, rotten) == ["a.gone: 'x = 2' found 0 times in a.py"]
