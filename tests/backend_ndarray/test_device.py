"""The device registry: backends above the array layer register a device kind by name."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray, device
from needle.backend_ndarray import ndarray_backend_numpy as numpy_backend


@pytest.fixture
def scratch_kind():
    """A device kind that exists only for one test."""
    yield "scratch"
    device._FACTORIES.pop("scratch", None)
    for key in [k for k in device._DEVICES if k[0] == "scratch"]:
        del device._DEVICES[key]


def test_importing_needle_registers_cuda():
    assert "cuda" in device._FACTORIES
    assert ndl.cuda(0) is device.device("cuda", 0)
    assert device.device("cpu") is ndl.cpu()


def test_an_unregistered_kind_is_a_disabled_device(scratch_kind):
    d = device.device(scratch_kind, 3)
    assert not d.enabled() and d.index == 3
    with pytest.raises(AttributeError, match=r"scratch\(\) is not enabled.*'compact'"):
        d.compact  # noqa: B018


def test_registering_a_kind_builds_its_devices_with_the_factory(scratch_kind):
    calls = []

    def factory(index):
        calls.append(index)
        return numpy_backend if index < 2 else None  # index 2 cannot run here

    assert not device.device(scratch_kind, 1).enabled()  # made before registering
    device.register_device_kind(scratch_kind, factory)
    one = device.device(scratch_kind, 1)
    assert one.enabled() and one is device.device(scratch_kind, 1) and calls == [1]
    assert not device.device(scratch_kind, 2).enabled() and calls == [1, 2]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(NDArray(x, device=one).numpy(), x)


def test_cpu_cannot_be_registered():
    with pytest.raises(ValueError, match="'cpu' is built in"):
        device.register_device_kind("cpu", lambda index: None)
