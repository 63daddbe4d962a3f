"""mpi4py's MPI module, imported on first use: importing it initialises MPI, which
``faults.start_mpi`` watches (start-up waits for every rank to arrive, within a deadline)."""
from typing import Any

_MPI_MODULE: Any = None


def mpi() -> Any:
    """mpi4py's MPI module (MPI initialised on the first call)."""
    global _MPI_MODULE
    if _MPI_MODULE is None:
        from ...faults import start_mpi  # (faults imports the communicator's parts: lazily)
        _MPI_MODULE = start_mpi("waited in MPI start-up")
    return _MPI_MODULE
