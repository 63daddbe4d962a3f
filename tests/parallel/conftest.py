"""Fixtures of the multi-rank tests."""
from typing import Callable

import pytest
from mpi_helpers import make_run_mpi


@pytest.fixture
def run_mpi() -> Callable:
    """Launch ``mpiexec -n k`` on a worker under tests/parallel/ (see ``mpi_helpers``)."""
    return make_run_mpi()
