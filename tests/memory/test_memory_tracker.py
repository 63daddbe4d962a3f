"""MemoryTracker: exact byte counts of backend buffers on the CPU, views counted once."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import MemoryTracker, bytes_of
from needle.process_state import switches


def test_counts_new_buffers_exactly_and_their_release():
    with MemoryTracker() as tr:
        a = ndl.cpu().empty((100, 10))                   # 4000 bytes
        b = ndl.cpu().empty((50,), dtype="float64")      # 400 bytes
        assert tr.current_bytes == 4000 + 400
        del a
        assert tr.current_bytes == 400
        del b
    assert tr.current_bytes == 0
    assert tr.peak_bytes == 4400
    assert tr.num_allocs == 2


def test_views_share_their_buffer():
    x = ndl.cpu().full((64, 32), 1.0)
    with MemoryTracker() as tr:
        views = [x.permute((1, 0)), x.reshape((32, 64)), x[:10, ::2], x.broadcast_to((2, 64, 32))]
        assert tr.current_bytes == 0                     # no new storage
        y = x.permute((1, 0)).compact()                  # a real copy: 64*32*4 bytes
        assert tr.current_bytes == 64 * 32 * 4
    assert bytes_of(views + [x]) == 64 * 32 * 4          # one buffer behind all of them
    del y


def test_peak_of_a_matmul_chain_matches_hand_count():
    a = ndl.Tensor(np.random.randn(8, 16).astype(np.float32), requires_grad=False)
    w = ndl.Tensor(np.random.randn(16, 4).astype(np.float32), requires_grad=False)
    with MemoryTracker() as tr:
        out = (a @ w).sum()
    # (8, 4) product (128 B), then a scalar sum (4 B); the product is freed after the sum
    assert tr.peak_bytes == 8 * 4 * 4 + 4
    assert tr.current_bytes == 4
    del out


def test_inactive_tracker_sees_nothing_and_hook_is_cleared():
    tr = MemoryTracker()
    ndl.cpu().empty((10,))
    assert tr.num_allocs == 0
    with tr:
        with MemoryTracker() as inner:
            ndl.cpu().empty((10,))
        assert switches.alloc_cpu is not None          # outer still active
    assert switches.alloc_cpu is None
    assert tr.num_allocs == 1 and inner.num_allocs == 1


@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA (nor its emulator)")
def test_a_tracker_counts_only_its_own_devices_buffers():
    """A CPU and a CUDA tracker at once: each backend tells only its own listeners."""
    with MemoryTracker() as on_cpu, MemoryTracker(ndl.cuda()) as on_gpu:
        ndl.cpu().empty((10,))
        ndl.cuda().empty((3,))
        ndl.cuda().empty((5,))
        with MemoryTracker() as second_on_cpu:  # two listeners: the hook loops over both
            ndl.cpu().empty((7,))
    assert (on_cpu.num_allocs, second_on_cpu.num_allocs, on_gpu.num_allocs) == (2, 1, 2)
    assert switches.alloc_cpu is None and switches.alloc_cuda is None


def test_breakdown_parameters_gradients_optimizer_activations():
    np.random.seed(0)
    with MemoryTracker(timeline=True) as tr:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = ndl.optim.Adam(model.parameters(), lr=0.1)
        x = ndl.Tensor(np.random.randn(32, 8).astype(np.float32), requires_grad=False)
        loss = (model(x) ** 2).sum()
        loss.backward(create_graph=False)
        opt.step()
        tr.classify(parameters=model.parameters(), optimizer=opt)
        now = tr.current_by_category()
    n_params = 8 * 16 + 16 + 16 * 4 + 4
    assert now["parameters"] == 4 * n_params
    assert now["gradients"] == 4 * n_params
    assert now["optimizer_state"] == 8 * n_params      # Adam: m and v
    at_peak = tr.peak_by_category()
    assert sum(at_peak.values()) == tr.peak_bytes
    assert at_peak["activations"] > 0
    points = tr.timeline()
    assert max(b for _, b in points) == tr.peak_bytes
    del loss


def test_unknown_category_and_missing_timeline():
    tr = MemoryTracker()
    with pytest.raises(ValueError, match="unknown memory category"):
        with tr.tag("weights"):
            pass
    with pytest.raises(ValueError, match="timeline=True"):
        tr.timeline()
