"""Fixtures for the CUDA emulator's tests: skip without g++ or NVIDIA's headers, and a
wall-clock bound on every test."""
import os

import pytest
from helpers import wall_clock_bound

from needle.backend_cuda.emulator import unavailable_reason

EMU_TEST_TIMEOUT = float(os.environ.get("NEEDLE_CUDA_EMU_TEST_TIMEOUT", "240"))


@pytest.fixture(autouse=True)
def _emulator_or_skip():
    """Skip (printing why) where g++ or the nvidia-cuda-* wheels are missing."""
    why = unavailable_reason()
    if why:
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _wall_clock_bound():
    """Fail a test past the bound; kill the run if a kernel never returns to Python."""
    with wall_clock_bound(EMU_TEST_TIMEOUT, f"an emulator test ran past {EMU_TEST_TIMEOUT:.0f} s "
                          f"(NEEDLE_CUDA_EMU_TEST_TIMEOUT)"):
        yield
