"""CUDA graphs on the emulator: stream capture records and ``Graph.launch`` replays, CUDA's
capture rules each broken once and named (an allocation, a synchronisation, a host copy, a
buffer freed after capture, a host value changed after capture), and
``needle.compile(mode="reduce-overhead")``: training steps replayed as one graph launch equal
plain replay bit for bit and eager mode to rounding, or fall back and say why."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_cuda.emulator import counts

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def cp():
    if not getattr(ndl.cuda().mod, "EMULATED", False):
        pytest.skip("the capture rules are the emulator's (a GPU enforces its own)")
    from needle.backend_cuda.emulator import fake_cupy
    return fake_cupy


def _scale_kernel(cp):
    code = r'''extern "C" __global__ void scale(float* x, float a, long n) {
        long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
        if (i < n) x[i] = x[i] * a + 1.0f;
    }'''
    return cp.RawModule(code=code, name_expressions=("scale",)).get_function("scale")


def test_a_captured_kernel_runs_at_each_launch_not_during_capture(cp):
    k = _scale_kernel(cp)
    x = cp.asarray(np.arange(4, dtype=np.float32))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        k((1,), (32,), (x, np.float32(2), np.int64(4)))
        g = s.end_capture()
    np.testing.assert_array_equal(x.get(), [0, 1, 2, 3])  # captured, not run
    with counts.counting() as c:
        g.launch()
        g.launch()
    np.testing.assert_array_equal(x.get(), [3, 7, 11, 15])  # (2x + 1) twice
    assert c.totals()["graph"] == 2 and c.totals()["launch"] == 0


@pytest.mark.parametrize("work, named", [
    (lambda cp, x: cp.empty(8, np.float32), "a device allocation of 32 bytes"),
    (lambda cp, x: x.get(), "ndarray.get"),
    (lambda cp, x: x.set(np.zeros(4, np.float32)), "ndarray.set"),
    (lambda cp, x: float(x[:1]), "float(ndarray)"),
    (lambda cp, x: cp.cuda.Device(0).synchronize(), "Device.synchronize"),
    (lambda cp, x: x * 2, "cupy.multiply (a new device array)"),
])
def test_each_capture_rule_is_an_error_naming_the_call(cp, work, named):
    from needle.backend_cuda.emulator.graph import CaptureError
    x = cp.asarray(np.arange(4, dtype=np.float32))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(CaptureError, match="during CUDA stream capture") as err:
                work(cp, x)
        finally:
            s.end_capture()
    assert named in str(err.value)


def test_capture_on_the_legacy_stream_and_a_freed_buffer_are_errors(cp):
    from needle.backend_cuda.emulator.graph import CaptureError
    with pytest.raises(CaptureError, match="legacy default stream"):
        cp.cuda.Stream.null.begin_capture()
    k = _scale_kernel(cp)
    x = cp.asarray(np.zeros(4, np.float32))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        k((1,), (32,), (x, np.float32(2), np.int64(4)))
        g = s.end_capture()
    del x  # the graph holds its address, not the buffer
    with pytest.raises(CaptureError, match=r"scale \(captured at .*freed after the capture"):
        g.launch()


def test_a_host_value_changed_after_capture_is_named_at_replay(cp):
    from needle.backend_cuda import graphs
    from needle.backend_ndarray import capture_hooks
    box = {"lr": 0.1}
    a = ndl.Tensor(np.ones(3, dtype=np.float32), device=ndl.cuda())
    with graphs.warm_up():  # needle's pool then holds the buffer the capture asks for
        a * box["lr"]
    g = graphs.CUDAGraph()
    with graphs.graph(g):
        capture_hooks.watch("opt.lr", lambda: box["lr"])
        b = a * box["lr"]
    g.replay()
    np.testing.assert_allclose(b.numpy(), 0.1)
    box["lr"] = 0.01
    with pytest.raises(graphs.GraphError, match=r"opt.lr changed after the CUDA graph was "
                                                r"captured \(0.1 -> 0.01\)"):
        g.replay()


def _language_model(dev):
    from apps.models import LanguageModel
    np.random.seed(0)
    return LanguageModel(16, 50, 32, 2, seq_model="transformer", seq_len=8, device=dev,
                         num_head=2, dim_head=8, dropout=0.0, causal=True)


def _resnet(dev):
    from apps.models import ResNet9
    np.random.seed(0)
    return ResNet9(device=dev)


def _batches(kind, n):
    rng = np.random.default_rng(1)
    for _ in range(n):
        if kind == "lm":
            ids = rng.integers(0, 50, (8, 2))
            yield ids, ids.reshape(-1)
        else:
            yield (rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                   rng.integers(0, 10, 2))


def _train(kind, mode, steps=5):
    """Losses and final weights of ``steps`` Adam steps, each batch different (a replay that
    read a stale input would differ from the first replay on)."""
    dev = ndl.cuda()
    model = _language_model(dev) if kind == "lm" else _resnet(dev)
    opt = ndl.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = ndl.nn.SoftmaxLoss()

    def step(x, y):
        out = model(x)
        loss = loss_fn(out[0] if isinstance(out, tuple) else out, y)
        loss.backward()
        return loss
    fn = step if mode == "eager" else ndl.compile(step, mode=mode)
    losses = []
    for xn, yn in _batches(kind, steps):
        x = ndl.Tensor(xn, device=dev, dtype="int64" if kind == "lm" else "float32",
                       requires_grad=False)
        losses.append(fn(x, ndl.Tensor(yn, device=dev, dtype="int64")).numpy())
        opt.step()
        opt.reset_grad()
    return np.array(losses), [p.numpy() for p in model.parameters()], fn


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lm", "resnet9"])
def test_graph_mode_trains_as_plain_replay_and_eager(cp, kind):
    eager, w_eager, _ = _train(kind, "eager")
    plain, w_plain, _ = _train(kind, "default")
    graph, w_graph, fn = _train(kind, "reduce-overhead")
    assert "one graph launch per call" in fn.explain()
    np.testing.assert_array_equal(graph, plain)  # the same kernels on the same buffers
    for a, b in zip(w_graph, w_plain):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(graph, eager, rtol=1e-4, atol=1e-5)
    assert len(set(np.round(graph, 6))) == len(graph)  # each step saw its own batch


def test_parameters_given_new_arrays_each_call_end_graph_mode_with_the_reason(cp):
    dev = ndl.cuda()
    np.random.seed(0)
    lin = ndl.nn.Linear(4, 3, device=dev)

    def step(x):
        loss = (lin(x) ** 2).sum()
        loss.backward()
        return loss
    fn = ndl.compile(step, mode="reduce-overhead")
    rng = np.random.default_rng(0)
    got, want = [], []
    for _ in range(6):
        xn = rng.standard_normal((2, 4)).astype(np.float32)
        got.append(fn(ndl.Tensor(xn, device=dev)).numpy())
        w, b = lin.weight.numpy(), lin.bias.numpy()
        want.append((((xn @ w + b)) ** 2).sum())
        for p in lin.parameters():  # an update that rebinds: a new array every call
            p.data = p.data - 0.1 * p.grad.data
            p.grad = None
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert "graph mode off (the function's parameters or state get new arrays" in \
        fn.explain()


def test_a_compiled_convolution_reads_each_calls_input(cp):
    """The fused convolution and batch norm kernels are recorded (they were once missing from
    the primitive table, so a replay reused the first recording's im2col of the input)."""
    dev = ndl.cuda()
    model = _resnet(dev)
    model.eval()
    loss_fn = ndl.nn.SoftmaxLoss()

    def f(x, y):
        return loss_fn(model(x), y)
    fn = ndl.compile(f)
    for xn, yn in _batches("resnet9", 4):
        x, y = ndl.Tensor(xn, device=dev), ndl.Tensor(yn, device=dev, dtype="int64")
        np.testing.assert_allclose(fn(x, y).numpy(), f(x, y).numpy(), rtol=1e-5)
    assert fn.replays == 2


def _mlp_steps(dev, graphed, steps=6, capture_at=3):
    """Adam on a small MLP: the compiled forward and backward in graph mode, then the optimizer
    step eager (``graphed=False``) or captured once after three steps and replayed."""
    from needle.backend_cuda import graphs
    np.random.seed(0)
    model = ndl.nn.Sequential(ndl.nn.Linear(6, 8, device=dev), ndl.nn.ReLU(),
                              ndl.nn.Linear(8, 3, device=dev))
    opt = ndl.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = ndl.nn.SoftmaxLoss()

    def fwd_bwd(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss
    fn = ndl.compile(fwd_bwd, mode="reduce-overhead")
    rng = np.random.default_rng(2)
    losses, g = [], graphs.CUDAGraph()
    for i in range(steps):
        x = ndl.Tensor(rng.standard_normal((4, 6)).astype(np.float32), device=dev)
        losses.append(fn(x, ndl.Tensor(rng.integers(0, 3, 4), device=dev, dtype="int64"))
                      .numpy())
        if graphed and i == capture_at:
            with graphs.graph(g):  # the gradients' buffers are the graph's from here on
                opt.step()
        if graphed and i >= capture_at:
            g.replay()
        else:
            opt.step()
    return np.array(losses), [p.numpy() for p in model.parameters()], opt, g


def test_an_optimizer_step_captured_trains_as_eager_and_names_a_changed_lr(cp):
    from needle.backend_cuda import graphs
    dev = ndl.cuda()
    eager, w_eager, opt_eager, _ = _mlp_steps(dev, graphed=False)
    graph, w_graph, opt, g = _mlp_steps(dev, graphed=True)
    np.testing.assert_array_equal(graph, eager)  # the same kernels: bit for bit
    for a, b in zip(w_graph, w_eager):
        np.testing.assert_array_equal(a, b)
    assert [s["step"] for s in opt.state.values()] == [6] * 4  # counted as eager counts
    assert [s["step"] for s in opt_eager.state.values()] == [6] * 4
    with counts.counting() as c:
        g.replay()
    assert c.totals()["graph"] == 1 and c.totals()["h2d"] == 0 and c.totals()["launch"] == 0
    opt.lr = 1e-3
    with pytest.raises(graphs.GraphError, match=r"Adam.lr changed after the CUDA graph was "
                                                r"captured \(0.01 -> 0.001\)"):
        g.replay()


def test_an_optimizer_captured_before_an_eager_step_on_its_buffers_is_refused(cp):
    """At the third call the compiled step is captured: its gradients move into the graph's
    buffers, which no eager optimizer step has seen (their pointer table is not on the device)."""
    with pytest.raises(RuntimeError, match="run one step eagerly on these buffers first"):
        _mlp_steps(ndl.cuda(), graphed=True, capture_at=2)
