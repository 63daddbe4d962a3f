"""Run under mpiexec by ``mpi_helpers.run_ranks``: call one test function on this rank.

    mpiexec -n K python tests/rank_main.py CALL.pkl

``CALL.pkl`` holds (source file, function name, args). The result is pickled to
``rank<r>.pkl`` beside it; an exception aborts the whole job (``communicator.create``).
"""
import importlib.util
import pickle
import sys
from pathlib import Path


def main() -> None:
    spec_path = Path(sys.argv[1])
    source, name, args = pickle.loads(spec_path.read_bytes())
    module_name = Path(source).stem
    sys.path.insert(0, str(Path(source).parent))  # its sibling modules, as pytest imports it
    spec = importlib.util.spec_from_file_location(module_name, source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    from needle.parallel import communicator
    comm = communicator.create()
    result = getattr(module, name)(comm, *args)
    (spec_path.parent / f"rank{comm.rank}.pkl").write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main()
