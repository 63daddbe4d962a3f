"""nn.Module: traversal, deduplication of tied weights, modes, state_dict, to(device)."""
import numpy as np
import pytest
from helpers import DEVICES

import needle as ndl
from needle import nn

pytestmark = pytest.mark.hw2


class Tied(nn.Module):
    """Two Linear layers sharing one weight, plus a frozen parameter in a dict."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.extra = {"scale": nn.Parameter(ndl.init.ones(4))}
        self.blocks = [nn.ReLU(), nn.Sequential(nn.Linear(4, 2))]

    def forward(self, x):
        return self.blocks[1](self.blocks[0](self.b(self.a(x)) * self.extra["scale"]))


def test_parameters_deduplicated_and_named():
    m = Tied()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["a.weight", "a.bias", "b.bias", "extra.scale", "blocks.1.modules.0.weight",
                     "blocks.1.modules.0.bias"]
    params = m.parameters()
    assert len(params) == 6 and len({id(p) for p in params}) == 6
    assert m.num_parameters() == 16 + 4 + 4 + 4 + 8 + 2
    assert all(isinstance(p, nn.Parameter) for p in params)
    assert [type(c).__name__ for c in m.children()] == ["Linear", "Linear", "ReLU", "Sequential"]
    assert len(list(m.named_modules())) == 6  # Tied, a, b, ReLU, Sequential, inner Linear


def test_train_eval_recursive():
    m = Tied()
    assert m.eval() is m
    assert all(not x.training for _, x in m.named_modules())
    m.train()
    assert all(x.training for _, x in m.named_modules())


def test_state_dict_round_trip_with_buffers():
    np.random.seed(0)
    m = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5))
    m(ndl.Tensor(np.random.randn(8, 3)))  # move running stats off their initial values
    sd = m.state_dict()
    assert set(sd) == {"modules.0.weight", "modules.0.bias", "modules.1.weight", "modules.1.bias",
                       "modules.1.running_mean", "modules.1.running_var"}
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    m2 = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5))
    assert not np.allclose(m2.state_dict()["modules.0.weight"], sd["modules.0.weight"])
    m2.load_state_dict(sd)
    for k, v in m2.state_dict().items():
        np.testing.assert_array_equal(v, sd[k], err_msg=k)
    x = ndl.Tensor(np.random.randn(4, 3))
    np.testing.assert_array_equal(m.eval()(x).numpy(), m2.eval()(x).numpy())
    # the state dict is a snapshot: later training does not change it
    sd["modules.0.weight"][...] = 0
    assert not np.allclose(m.state_dict()["modules.0.weight"], 0)


def test_load_state_dict_errors():
    m = nn.Linear(3, 2)
    sd = m.state_dict()
    with pytest.raises(ValueError, match=r"missing keys \['bias'\]"):
        m.load_state_dict({"weight": sd["weight"]})
    with pytest.raises(ValueError, match=r"unexpected keys \['extra'\]"):
        m.load_state_dict({**sd, "extra": np.zeros(1)})
    before = m.weight.numpy()
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 3\).*\(3, 2\)"):
        m.load_state_dict({"weight": sd["weight"].T, "bias": sd["bias"] + 1})
    np.testing.assert_array_equal(m.weight.numpy(), before)  # nothing was half-loaded
    np.testing.assert_array_equal(m.bias.numpy(), sd["bias"])
    res = m.load_state_dict({"weight": np.ones((3, 2)), "junk": 1}, strict=False)
    assert res.missing_keys == ["bias"] and res.unexpected_keys == ["junk"]
    np.testing.assert_array_equal(m.weight.numpy(), np.ones((3, 2)))


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_and_dtype_keeps_identity(device):
    m = Tied()
    params = m.parameters()
    m.to(device, dtype="float64")
    assert [id(p) for p in m.parameters()] == [id(p) for p in params]
    assert m.a.weight is m.b.weight
    assert all(p.device == device and p.dtype == "float64" for p in m.parameters())
    out = m(ndl.Tensor(np.ones((2, 4)), device=device, dtype="float64"))
    assert out.shape == (2, 2) and out.dtype == "float64"


def test_call_dispatches_to_forward():
    class Double(nn.Module):
        def forward(self, x, k=2):
            return x * k

    assert Double()(ndl.Tensor([1.0]), k=3).numpy()[0] == 3.0
    with pytest.raises(NotImplementedError):
        nn.Module()(1)
