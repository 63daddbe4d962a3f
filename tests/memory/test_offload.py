"""OffloadOptimizer: the same trajectory as the wrapped optimizer; state off the device."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import MemoryTracker, OffloadOptimizer

DEVICES = [pytest.param(ndl.cpu(), id="cpu"),
           pytest.param(ndl.cuda(), id="cuda", marks=[
               pytest.mark.cuda, pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU")])]


@pytest.mark.parametrize("device", DEVICES)
def test_offloaded_adam_matches_adam(device):
    runs = []
    for offload in (False, True):
        np.random.seed(0)
        model = nn.Sequential(nn.Linear(8, 16, device=device), nn.ReLU(),
                              nn.Linear(16, 2, device=device))
        x = ndl.Tensor(np.random.randn(10, 8).astype(np.float32), device=device,
                       requires_grad=False)
        opt = (OffloadOptimizer(ndl.optim.Adam, model.parameters(), lr=0.01) if offload
               else ndl.optim.Adam(model.parameters(), lr=0.01))
        for _ in range(3):
            opt.reset_grad()
            (model(x) ** 2).sum().backward()
            opt.step()
        runs.append([p.numpy() for p in model.parameters()])
        if offload:
            assert all(s["m"].device == ndl.cpu() for s in opt.state.values())
            assert all(p.device == device for p in model.parameters())
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU")
def test_offload_keeps_optimizer_state_off_the_gpu():
    dev = ndl.cuda()
    model = nn.Linear(512, 512, device=dev)
    x = ndl.Tensor(np.random.randn(4, 512).astype(np.float32), device=dev, requires_grad=False)
    peaks = {}
    for offload in (False, True):
        opt = (OffloadOptimizer(ndl.optim.Adam, model.parameters(), lr=1e-3) if offload
               else ndl.optim.Adam(model.parameters(), lr=1e-3))
        with MemoryTracker(dev) as tr:
            for _ in range(2):
                opt.reset_grad()
                model(x).sum().backward()
                opt.step()
        peaks[offload] = tr.current_bytes
        del opt
    assert peaks[True] < peaks[False] - 512 * 512 * 4  # at least m or v less on the GPU
