"""Test-suite configuration: a fast, deterministic hypothesis profile and per-test seeding.

Without a GPU the CUDA copies of tests run on the CUDA emulator (the backend's own kernels built
with the host compiler, ``needle/backend_cuda/emulator``): ``NEEDLE_CUDA_EMULATOR`` defaults to 1
here (ignored where a GPU is present), with two emulated devices
(``NEEDLE_CUDA_EMULATOR_DEVICES``); set NEEDLE_CUDA_EMULATOR to 0 to skip them instead. Each
test marked ``cuda`` that runs emulated has a wall-clock bound (``NEEDLE_CUDA_TEST_TIMEOUT`` s).
"""
import os
import sys

os.environ.setdefault("NEEDLE_CUDA_EMULATOR", "1")  # before needle is imported: see above
# two emulated GPUs, so that the multi-GPU tests run without them (ignored on a real GPU)
os.environ.setdefault("NEEDLE_CUDA_EMULATOR_DEVICES", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import wall_clock_bound  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import needle as ndl  # noqa: E402
from needle import process_state  # noqa: E402

CUDA_TEST_TIMEOUT = float(os.environ.get("NEEDLE_CUDA_TEST_TIMEOUT", "300"))

# ~50 examples per property and no per-example deadline (the CI machine is shared and slow).
# CI runs the same examples every time; HYPOTHESIS_PROFILE=explore searches afresh each run.
settings.register_profile("needle", max_examples=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "needle"))


@pytest.fixture(autouse=True)
def _seed_and_restore_modes():
    """Seed NumPy's global RNG (used by ndl.init/randn) and PyTorch's (the reference layers'
    initial weights: unseeded, they depended on which tests ran before), and restore the
    process-wide modes (grad, lazy, autocast) afterwards."""
    np.random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)
    with process_state.saved():
        yield


@pytest.fixture(autouse=True)
def _bound_emulated_cuda_tests(request: pytest.FixtureRequest):
    """Fail an emulated ``cuda`` test past the bound; kill the run if a kernel never returns."""
    emulated = getattr(ndl.cuda().mod, "EMULATED", False)
    if not emulated or request.node.get_closest_marker("cuda") is None:
        yield
        return
    with wall_clock_bound(CUDA_TEST_TIMEOUT, f"an emulated CUDA test ran past "
                          f"{CUDA_TEST_TIMEOUT:.0f} s (NEEDLE_CUDA_TEST_TIMEOUT)"):
        yield


@pytest.fixture(scope="session")
def student_release(tmp_path_factory: pytest.TempPathFactory):
    """(folder, regions) of the student release (``make student``), built once per session:
    the tests given it only read it (a test that changes a release builds its own)."""
    from course.make_student import make_release
    folder = tmp_path_factory.mktemp("release") / "student"
    return folder, make_release(folder)
