"""Fixtures for the CUDA emulator's tests: skip without g++ or NVIDIA's headers, and a
wall-clock bound on every test."""
import faulthandler
import os
import signal

import pytest

from needle.backend_cuda.emulator import unavailable_reason

EMU_TEST_TIMEOUT = float(os.environ.get("NEEDLE_CUDA_EMU_TEST_TIMEOUT", "240"))


@pytest.fixture(autouse=True)
def _emulator_or_skip():
    """Skip (printing why) where g++ or the nvidia-cuda-* wheels are missing."""
    why = unavailable_reason()
    if why:
        pytest.skip(why)


def _timed_out(signum: int, frame: object) -> None:
    raise TimeoutError(f"an emulator test ran past {EMU_TEST_TIMEOUT:.0f} s "
                       f"(NEEDLE_CUDA_EMU_TEST_TIMEOUT)")


@pytest.fixture(autouse=True)
def _wall_clock_bound():
    """Fail a test past the bound; kill the run if a kernel never returns to Python."""
    old = signal.signal(signal.SIGALRM, _timed_out)
    signal.setitimer(signal.ITIMER_REAL, EMU_TEST_TIMEOUT)
    faulthandler.dump_traceback_later(EMU_TEST_TIMEOUT + 60, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
