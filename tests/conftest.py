"""Test-suite configuration: a fast, deterministic hypothesis profile and per-test seeding."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import needle as ndl

# ~50 examples per property and no per-example deadline (the CI machine is shared and slow).
# CI runs the same examples every time; HYPOTHESIS_PROFILE=explore searches afresh each run.
settings.register_profile("needle", max_examples=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "needle"))


@pytest.fixture(autouse=True)
def _seed_and_restore_modes():
    """Seed NumPy's global RNG (used by ndl.init/randn) and restore autograd's global modes."""
    np.random.seed(0)
    lazy = ndl.autograd.LAZY_MODE
    grad_enabled = ndl.autograd._GRAD_ENABLED
    yield
    ndl.autograd.LAZY_MODE = lazy
    ndl.autograd._GRAD_ENABLED = grad_enabled
