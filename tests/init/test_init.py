"""needle.init: constructors and initializers against NumPy's global RNG and analytic formulas."""
import math

import numpy as np
import pytest
from helpers import DEVICES

import needle as ndl
from needle import init

pytestmark = pytest.mark.hw2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rand_randn_follow_numpy_global_rng(device, dtype):
    np.random.seed(3)
    a = init.rand(4, 5, low=-2.0, high=3.0, device=device, dtype=dtype)
    b = init.randn(3, 2, mean=1.5, std=0.5, device=device, dtype=dtype)
    np.random.seed(3)
    want_a = np.random.rand(4, 5).astype(dtype) * 5.0 - 2.0
    want_b = np.random.randn(3, 2).astype(dtype) * 0.5 + 1.5
    for t, want in ((a, want_a), (b, want_b)):
        assert t.dtype == dtype and t.device == device and not t.requires_grad
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_constants_and_like(device):
    c = init.constant(2, 3, c=7.0, device=device, dtype="float64", requires_grad=True)
    assert c.requires_grad and c.dtype == "float64" and c.shape == (2, 3)
    np.testing.assert_array_equal(c.numpy(), np.full((2, 3), 7.0))
    np.testing.assert_array_equal(init.ones(4, device=device).numpy(), np.ones(4))
    np.testing.assert_array_equal(init.zeros(2, 2, device=device).numpy(), np.zeros((2, 2)))
    z = init.zeros_like(c)
    o = init.ones_like(c, requires_grad=True)
    assert z.shape == o.shape == (2, 3) and z.dtype == o.dtype == "float64"
    assert not z.requires_grad and o.requires_grad and z.device == device
    np.testing.assert_array_equal(o.numpy(), np.ones((2, 3)))
    assert init.ones(3, dtype="int32", device=device).dtype == "int32"


@pytest.mark.parametrize("device", DEVICES)
def test_randb_frequency_and_seeding(device):
    np.random.seed(1)
    b = init.randb(200, 100, p=0.3, device=device)
    assert b.dtype == "bool"
    assert abs(b.numpy().mean() - 0.3) < 0.02
    np.random.seed(1)
    np.testing.assert_array_equal(b.numpy(), np.random.rand(200, 100) <= 0.3)
    with pytest.raises(ValueError, match=r"randb: p 1.5 must be a finite number in \[0, 1\]"):
        init.randb(3, p=1.5)


@pytest.mark.parametrize("device", DEVICES)
def test_one_hot(device):
    idx = np.array([[0, 3], [2, 1]])
    oh = init.one_hot(4, ndl.Tensor(idx, dtype="int64", device=device), device=device)
    np.testing.assert_array_equal(oh.numpy(), np.eye(4)[idx])
    assert oh.shape == (2, 2, 4) and oh.dtype == "float32" and oh.device == device
    # float labels holding whole numbers are accepted, as the course passes float tensors
    np.testing.assert_array_equal(init.one_hot(3, ndl.Tensor([2.0, 0.0]), device=device).numpy(),
                                  np.eye(3)[[2, 0]])
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        init.one_hot(4, np.array([4]), device=device)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):  # labels already on the device
        init.one_hot(4, ndl.Tensor([1, 5], dtype="int64", device=device), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_device", [True, False])
def test_one_hot_costs_the_rows_not_the_identity(device, on_device):
    """A vocabulary of 300,000: an n x n identity would be 360 GB; the rows are 3.6 MB."""
    n, idx = 300_000, np.array([[299_999, 0, 7]])
    labels = ndl.Tensor(idx, dtype="int64", device=device) if on_device else idx
    oh = init.one_hot(n, labels, device=device).numpy()
    assert oh.shape == (1, 3, n) and oh.sum() == 3
    assert oh[0, 0, -1] == oh[0, 1, 0] == oh[0, 2, 7] == 1


def _sample_std(t):
    return float(np.std(t.numpy().astype(np.float64)))


@pytest.mark.parametrize("device", DEVICES)
def test_xavier(device):
    np.random.seed(0)
    u = init.xavier_uniform(300, 200, gain=2.0, device=device)
    a = 2.0 * math.sqrt(6 / 500)
    np.random.seed(0)
    np.testing.assert_allclose(u.numpy(), np.random.rand(300, 200).astype("float32") * 2 * a - a,
                               rtol=1e-5, atol=1e-6)
    assert u.shape == (300, 200) and abs(u.numpy()).max() <= a
    n = init.xavier_normal(300, 200, gain=0.5, device=device, dtype="float64")
    assert n.dtype == "float64"
    assert abs(_sample_std(n) - 0.5 * math.sqrt(2 / 500)) < 0.02 * 0.5 * math.sqrt(2 / 500) * 3


@pytest.mark.parametrize("device", DEVICES)
def test_kaiming_linear_and_conv_fans(device):
    u = init.kaiming_uniform(400, 50, device=device)
    bound = math.sqrt(2) * math.sqrt(3 / 400)
    assert u.shape == (400, 50)
    assert abs(u.numpy()).max() <= bound and abs(u.numpy()).max() > 0.99 * bound
    # conv kernel (K, K, C_in, C_out): fan_in = K*K*C_in, given explicitly or derived from shape
    shape = (3, 3, 16, 32)
    for k in (init.kaiming_uniform(3 * 3 * 16, 3 * 3 * 32, shape=shape, device=device),
              init.kaiming_uniform(None, None, shape=shape, device=device)):
        bound = math.sqrt(2) * math.sqrt(3 / (3 * 3 * 16))
        assert k.shape == shape
        assert abs(k.numpy()).max() <= bound and abs(k.numpy()).max() > 0.98 * bound
    n = init.kaiming_normal(None, None, shape=(5, 5, 8, 400), device=device)
    assert abs(_sample_std(n) - math.sqrt(2 / 200)) < 0.03 * math.sqrt(2 / 200)
    t = init.kaiming_uniform(10, 5, nonlinearity="tanh", device=device, requires_grad=True)
    assert t.requires_grad and abs(t.numpy()).max() <= 5 / 3 * math.sqrt(3 / 10)
    with pytest.raises(ValueError, match="unknown nonlinearity"):
        init.kaiming_uniform(3, 3, nonlinearity="swish")
