"""The course's hw4 public tests (test_nd_backend.py, test_conv.py, test_sequence_models.py,
test_cifar_ptb_data.py) with needle: same calls, dtypes, checkers and tolerances.

References are PyTorch's (as in the course) or NumPy's. The PTB and CIFAR-10 files are not
shipped: the data tests run the course's calls on small files in the same formats.
"""
import pickle

import numpy as np
import pytest

import needle as ndl
from apps.models import LanguageModel, ResNet9
from needle import backend_ndarray as nd
from needle import nn

torch = pytest.importorskip("torch")

_DEVICES = [ndl.cpu(), pytest.param(ndl.cuda(), marks=pytest.mark.skipif(
    not ndl.cuda().enabled(), reason="No GPU"))]


def backward_check(f, *args, **kwargs):
    """test_conv.py's checker (a list argument is stacked; tolerance 1e-2)."""
    eps = 1e-3
    out = f(*args, **kwargs)
    c = np.random.randn(*out.shape)
    is_stacked = False
    if isinstance(args[0], list):
        args = args[0]
        is_stacked = True
    numerical_grad = [np.zeros(a.shape) for a in args]
    num_args = len(args)
    for i in range(num_args):
        for j in range(args[i].realize_cached_data().size):
            args[i].realize_cached_data().flat[j] += eps
            f1 = ((f(args, **kwargs) if is_stacked else f(*args, **kwargs)).numpy() * c).sum()
            args[i].realize_cached_data().flat[j] -= 2 * eps
            f2 = ((f(args, **kwargs) if is_stacked else f(*args, **kwargs)).numpy() * c).sum()
            args[i].realize_cached_data().flat[j] += eps
            numerical_grad[i].flat[j] = (f1 - f2) / (2 * eps)
    backward_grad = out.op.gradient_as_tuple(ndl.Tensor(c, device=args[0].device), out)
    if isinstance(backward_grad[0], ndl.TensorTuple):
        backward_grad = backward_grad[0].tuple()
    error = sum(np.linalg.norm(backward_grad[i].numpy() - numerical_grad[i])
                for i in range(len(args)))
    assert error < 1e-2
    return [g.numpy() for g in backward_grad]


# ------------------------------------------------------------------ test_nd_backend.py
@pytest.mark.parametrize("shape,axis,n", [((5, 5), 0, 1), ((5, 5), 0, 2), ((1, 5, 7), 2, 5)])
@pytest.mark.parametrize("device", _DEVICES)
def test_stack_and_backward_vs_torch(shape, axis, n, device):
    _A = [np.random.randn(*shape).astype(np.float32) for i in range(n)]
    A = [ndl.Tensor(nd.array(_A[i]), device=device) for i in range(n)]
    A_t = [torch.Tensor(_A[i]) for i in range(n)]
    for t in A_t:
        t.requires_grad = True
    out = ndl.stack(A, axis=axis)
    out_t = torch.stack(A_t, dim=axis)
    np.testing.assert_allclose(out_t.detach().numpy(), out.numpy(), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    out_t.sum().backward()
    for i in range(n):
        np.testing.assert_allclose(A_t[i].grad.numpy(), A[i].grad.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,axes", [((1, 1, 1), None), ((5, 3), 0), ((8, 3, 2), 1),
                                        ((8, 3, 2), 2)])
@pytest.mark.parametrize("device", _DEVICES)
def test_logsumexp_vs_torch(shape, axes, device):
    _A = np.random.randn(*shape).astype(np.float32)
    A = ndl.Tensor(nd.array(_A), device=device)
    A_t = torch.Tensor(_A)
    t_axes = tuple(range(len(shape))) if axes is None else axes
    np.testing.assert_allclose(torch.logsumexp(A_t, dim=t_axes).numpy(),
                               ndl.logsumexp(A, axes=axes).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", _DEVICES)
def test_tensor_ops_on_float32_ndarrays(device):
    _A = np.random.randn(4, 5).astype(np.float32)
    _B = np.random.randn(4, 5).astype(np.float32)
    A = ndl.Tensor(nd.array(_A), device=device)
    B = ndl.Tensor(nd.array(_B), device=device)
    for fn in (lambda a, b: a * b, lambda a, b: a / b, lambda a, b: a + b, lambda a, b: a - b):
        np.testing.assert_allclose(fn(_A, _B), fn(A, B).numpy(), atol=1e-5, rtol=1e-5)
        assert fn(A, B).dtype == "float32"
    np.testing.assert_allclose(np.tanh(_A), ndl.tanh(A).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(_A @ _B.T, (A @ ndl.transpose(B)).numpy(), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ test_conv.py
@pytest.mark.parametrize("params", [{"shape": (10, 3), "n": 4, "axis": 0},
                                    {"shape": (4, 5, 6), "n": 5, "axis": 0},
                                    {"shape": (4, 5, 6), "n": 3, "axis": 1},
                                    {"shape": (4, 5, 6), "n": 2, "axis": 2}])
@pytest.mark.parametrize("device", _DEVICES)
def test_stack_forward(params, device):
    np.random.seed(0)
    shape, n, axis = params["shape"], params["n"], params["axis"]
    to_stack_ndl, to_stack_npy = [], []
    for i in range(n):
        _A = np.random.randn(*shape)
        to_stack_ndl += [ndl.Tensor(_A, device=device)]
        to_stack_npy += [_A]
    lhs = np.stack(to_stack_npy, axis=axis)
    rhs = ndl.stack(to_stack_ndl, axis=axis)
    assert np.linalg.norm(rhs.numpy() - lhs) < 1e-4


@pytest.mark.parametrize("shape,n,axis", [((3, 4), 3, 0), ((3, 5), 3, 1), ((3, 5, 7), 2, 2)])
@pytest.mark.parametrize("device", _DEVICES)
def test_stack_backward(shape, n, axis, device):
    np.random.seed(0)
    get_tensor = lambda shape: ndl.Tensor(np.random.randn(*shape) * 5, device=device)  # noqa
    backward_check(ndl.stack, [get_tensor(shape) for _ in range(n)], axis=axis)


@pytest.mark.parametrize("shape,n,axis", [((3, 4), 3, 0), ((3, 5), 3, 1)])
@pytest.mark.parametrize("device", _DEVICES)
def test_split(shape, n, axis, device):
    np.random.seed(0)
    _A = np.random.randn(*shape[:axis], n, *shape[axis:])
    parts = ndl.split(ndl.Tensor(_A, device=device), axis=axis)
    for i in range(n):
        np.testing.assert_allclose(parts[i].numpy(), np.take(_A, i, axis=axis), atol=1e-6)


@pytest.mark.parametrize("padding", [((0, 0), (2, 2), (2, 2), (0, 0)),
                                     ((0, 0), (0, 0), (0, 0), (0, 0))])
@pytest.mark.parametrize("device", _DEVICES)
def test_pad_forward(padding, device):
    np.random.seed(0)
    _A = np.random.randn(10, 32, 32, 8)
    _B = np.pad(_A, padding)
    A = nd.NDArray(_A, device=device)
    B = A.pad(padding)
    assert np.linalg.norm(B.numpy() - _B) < 1e-4


flip_shapes = [((10, 5), (0,)), ((10, 5), (1,)), ((10, 5), (0, 1)), ((10, 32, 32, 8), (0, 1)),
               ((3, 3, 6, 8), (0, 1)), ((10, 32, 32, 8), (1, 2)), ((3, 3, 6, 8), (1, 2)),
               ((10, 32, 32, 8), (2, 3)), ((3, 3, 6, 8), (2, 3)), ((10, 32, 32, 8), (0, 1, 2, 3))]


@pytest.mark.parametrize("shape,axes", flip_shapes)
@pytest.mark.parametrize("device", _DEVICES)
def test_flip_forward(shape, axes, device):
    np.random.seed(0)
    _A = np.random.randn(*shape)
    _B = np.flip(_A, axes)
    A = ndl.Tensor(_A, device=device)
    B = ndl.flip(A, axes=axes)
    assert np.linalg.norm(B.numpy() - _B) < 1e-4


@pytest.mark.parametrize("shape,axes", [((10, 5), (0,)), ((10, 5), (1,)), ((10, 5), (0, 1)),
                                        ((2, 3, 3, 8), (0, 1)), ((3, 3, 6, 4), (0, 1)),
                                        ((2, 3, 3, 4), (1, 2)), ((3, 3, 6, 4), (2, 3)),
                                        ((2, 3, 3, 4), (0, 1, 2, 3))])
@pytest.mark.parametrize("device", _DEVICES)
def test_flip_backward(shape, axes, device):
    np.random.seed(0)
    backward_check(ndl.flip, ndl.Tensor(np.random.randn(*shape), device=device), axes=axes)


@pytest.mark.parametrize("device", _DEVICES)
def test_init_kaiming_uniform(device):
    _A = np.random.randn(3, 3, 16, 8)
    A = ndl.Tensor(_A, device=device)
    np.random.seed(0)
    A = ndl.init.kaiming_uniform(16 * 9, 8 * 9, shape=A.shape)
    np.random.seed(0)
    bound = np.sqrt(2) * np.sqrt(3 / (16 * 9))
    ref = np.random.rand(3, 3, 16, 8) * 2 * bound - bound
    assert abs(A.sum().numpy() - ref.sum()) < 1e-4
    assert A.dtype == "float32"


@pytest.mark.parametrize("device", _DEVICES)
def test_resnet9(device):
    def num_params(model):
        return np.sum([np.prod(x.shape) for x in model.parameters()])
    np.random.seed(0)
    model = ResNet9(device=device)
    assert num_params(model) == 431946
    _A = np.random.randn(2, 3, 32, 32)
    A = ndl.Tensor(_A, device=device)
    y = model(A)
    assert y.shape == (2, 10)


def test_dilate_forward():
    np.random.seed(0)
    device = ndl.cpu()
    _A = np.random.randint(1, 10, size=(2, 5))
    A = ndl.Tensor(_A, device=device)
    assert np.linalg.norm(ndl.dilate(A, dilation=0, axes=(0,)).numpy() - _A) < 1e-5
    _A = np.random.randint(1, 10, size=(2, 5))
    A = ndl.Tensor(_A, device=device)
    ref = np.zeros((4, 5))
    ref[::2] = _A
    assert np.linalg.norm(ndl.dilate(A, dilation=1, axes=(0,)).numpy() - ref) < 1e-5
    _A = np.random.randint(1, 10, size=(2, 5))
    A = ndl.Tensor(_A, device=device)
    ref = np.zeros((2, 15))
    ref[:, ::3] = _A
    assert np.linalg.norm(ndl.dilate(A, dilation=2, axes=(1,)).numpy() - ref) < 1e-5
    _A = np.random.randint(1, 10, size=(2, 2, 2, 2))
    A = ndl.Tensor(_A, device=device)
    ref = np.zeros((2, 2, 4, 4))
    ref[:, :, ::2, ::2] = _A
    assert np.linalg.norm(ndl.dilate(A, dilation=1, axes=(2, 3)).numpy() - ref) < 1e-5
    back = ndl.undilate(ndl.dilate(A, dilation=1, axes=(2, 3)), axes=(2, 3), dilation=1)
    assert np.linalg.norm(back.numpy() - _A) < 1e-5


@pytest.mark.parametrize("shape,d,axes", [((2, 5), 0, (0,)), ((2, 5), 1, (0,)),
                                          ((2, 5), 1, (1,)), ((2, 5), 1, (0, 1)),
                                          ((3, 3, 6, 4), 2, (1, 2)), ((2, 3, 3, 4), 1, (2, 3))])
@pytest.mark.parametrize("device", _DEVICES)
def test_dilate_backward(shape, d, axes, device):
    np.random.seed(0)
    backward_check(ndl.dilate, ndl.Tensor(np.random.randn(*shape), device=device),
                   dilation=d, axes=axes)


def test_stack_vs_pytorch():
    np.random.seed(0)
    A, B, C = (np.random.randn(5, 5) for _ in range(3))
    Atch, Btch, Ctch = (torch.Tensor(a).float() for a in (A, B, C))
    for t in (Atch, Btch, Ctch):
        t.requires_grad = True
    X, Y, Z = ndl.Tensor(A), ndl.Tensor(B), ndl.Tensor(C)
    Xtch = torch.stack([Atch, Btch], dim=0)
    Xndl = ndl.stack([X, Y], axis=0)
    assert np.linalg.norm(Xtch.detach().numpy() - Xndl.numpy()) < 1e-3
    Ytch = torch.stack([Atch, Btch, Ctch], dim=1)
    Yndl = ndl.stack([X, Y, Z], axis=1)
    assert np.linalg.norm(Ytch.detach().numpy() - Yndl.numpy()) < 1e-3
    Yndl.sum().backward()
    Ytch.sum().backward()
    for a, b in ((X, Atch), (Y, Btch), (Z, Ctch)):
        assert np.linalg.norm(a.grad.numpy() - b.grad.numpy()) < 1e-3


op_conv_shapes = [((3, 14, 14, 8), (3, 3, 8, 16), 1, 0), ((3, 14, 14, 8), (3, 3, 8, 16), 1, 1),
                  ((3, 16, 16, 8), (3, 3, 8, 16), 1, 2), ((3, 16, 16, 8), (3, 3, 8, 14), 1, 0),
                  ((3, 16, 16, 2), (3, 3, 2, 14), 1, 0), ((3, 14, 14, 8), (3, 3, 8, 16), 2, 0),
                  ((3, 14, 14, 8), (3, 3, 8, 16), 2, 1), ((3, 16, 16, 8), (3, 3, 8, 16), 2, 2),
                  ((3, 17, 17, 8), (5, 5, 8, 16), 2, 2), ((3, 17, 17, 1), (5, 5, 1, 16), 1, 0),
                  ((1, 14, 14, 2), (3, 3, 2, 2), 1, 0)]


@pytest.mark.parametrize("Z_shape,W_shape,stride,padding", op_conv_shapes)
@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("device", _DEVICES)
def test_op_conv(Z_shape, W_shape, stride, padding, backward, device):
    np.random.seed(0)
    _Z = (np.random.randn(*Z_shape) * 5).astype(np.float32)
    _W = (np.random.randn(*W_shape) * 5).astype(np.float32)
    Z = ndl.Tensor(_Z, device=device)
    W = ndl.Tensor(_W, device=device)
    y = ndl.conv(Z, W, padding=padding, stride=stride)
    y2 = y.sum()
    if backward:
        y2.backward()
    Ztch = torch.Tensor(_Z).float()
    Ztch.requires_grad = True
    Wtch = torch.Tensor(_W).float()
    Wtch.requires_grad = True
    out = torch.nn.functional.conv2d(Ztch.permute(0, 3, 1, 2), Wtch.permute(3, 2, 0, 1),
                                     padding=padding, stride=stride)
    out2 = out.sum()
    if backward:
        out2.backward()
        err1 = np.linalg.norm(Ztch.grad.numpy() - Z.grad.numpy())
        err2 = np.linalg.norm(Wtch.grad.numpy() - W.grad.numpy())
        assert err1 < 1e-2, "input grads match"
        assert err2 < 1e-2, "weight grads match"
    err3 = np.linalg.norm(out2.detach().numpy() - y2.numpy())
    assert err3 < 1e1, "outputs match %s, %s" % (y2, out2)


@pytest.mark.parametrize("s,cin,cout,k,stride", [(4, 8, 16, 3, 1), (32, 8, 16, 3, 2),
                                                  (32, 8, 8, 3, 2), (32, 16, 8, 3, 1),
                                                  (32, 16, 8, 3, 2)])
@pytest.mark.parametrize("device", _DEVICES)
def test_nn_conv_forward(s, cin, cout, k, stride, device):
    np.random.seed(0)
    f = ndl.nn.Conv(cin, cout, k, stride=stride, device=device)
    x = ndl.init.rand(10, cin, s, s, device=device)
    g = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)
    g.weight.data = torch.tensor(f.weight.cached_data.numpy().transpose(3, 2, 0, 1))
    g.bias.data = torch.tensor(f.bias.cached_data.numpy())
    z = torch.tensor(x.cached_data.numpy())
    assert np.linalg.norm(f(x).cached_data.numpy() - g(z).data.numpy()) < 1e-3


@pytest.mark.parametrize("s,cin,cout,k,stride", [(4, 1, 1, 3, 1), (14, 8, 16, 3, 1),
                                                  (14, 8, 16, 3, 2), (14, 8, 8, 3, 1),
                                                  (14, 8, 8, 3, 2), (14, 16, 8, 3, 1),
                                                  (14, 16, 8, 3, 2)])
@pytest.mark.parametrize("device", _DEVICES)
def test_nn_conv_backward(s, cin, cout, k, stride, device):
    np.random.seed(0)
    f = ndl.nn.Conv(cin, cout, k, stride=stride, device=device)
    x = ndl.init.rand(1, cin, s, s, device=device, requires_grad=True)
    g = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)
    g.weight.data = torch.tensor(f.weight.cached_data.numpy().transpose(3, 2, 0, 1))
    g.bias.data = torch.tensor(f.bias.cached_data.numpy())
    z = torch.tensor(x.cached_data.numpy(), requires_grad=True)
    z.requires_grad = True
    res1 = f(x)
    y1 = res1.sum()
    y2 = g(z).sum()
    y1.backward()
    y2.backward()
    assert np.linalg.norm(g.weight.grad.data.numpy()
                          - f.weight.grad.cached_data.numpy().transpose(3, 2, 0, 1)) < 1e-3, \
        "weight gradients match"
    assert np.linalg.norm(g.bias.grad.data.numpy() - f.bias.grad.cached_data.numpy()) < 1e-3, \
        "bias gradients match"
    assert np.linalg.norm(z.grad.data.numpy() - x.grad.cached_data.numpy()) < 1e-3, \
        "input gradients match"


# ------------------------------------------------------------------ test_sequence_models.py
@pytest.mark.parametrize("batch_size,input_size,hidden_size", [(1, 1, 1), (15, 11, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("init_hidden", [True, False])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("device", _DEVICES)
def test_rnn_cell(batch_size, input_size, hidden_size, bias, init_hidden, nonlinearity, device):
    x = np.random.randn(batch_size, input_size).astype(np.float32)
    h0 = np.random.randn(batch_size, hidden_size).astype(np.float32)
    model_ = torch.nn.RNNCell(input_size, hidden_size, nonlinearity=nonlinearity, bias=bias)
    h_ = model_(torch.tensor(x), torch.tensor(h0) if init_hidden else None)
    model = nn.RNNCell(input_size, hidden_size, device=device, bias=bias,
                       nonlinearity=nonlinearity)
    model.W_ih = ndl.Tensor(model_.weight_ih.detach().numpy().transpose(), device=device)
    model.W_hh = ndl.Tensor(model_.weight_hh.detach().numpy().transpose(), device=device)
    if bias:
        model.bias_ih = ndl.Tensor(model_.bias_ih.detach().numpy(), device=device)
        model.bias_hh = ndl.Tensor(model_.bias_hh.detach().numpy(), device=device)
    h = model(ndl.Tensor(x, device=device),
              ndl.Tensor(h0, device=device) if init_hidden else None)
    assert h.device == device
    np.testing.assert_allclose(h_.detach().numpy(), h.numpy(), atol=1e-5, rtol=1e-5)
    h.sum().backward()
    h_.sum().backward()
    np.testing.assert_allclose(model_.weight_ih.grad.detach().numpy().transpose(),
                               model.W_ih.grad.detach().numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_size,input_size,hidden_size", [(1, 1, 1), (15, 11, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("init_hidden", [True, False])
@pytest.mark.parametrize("device", _DEVICES)
def test_lstm_cell(batch_size, input_size, hidden_size, bias, init_hidden, device):
    x = np.random.randn(batch_size, input_size).astype(np.float32)
    h0 = np.random.randn(batch_size, hidden_size).astype(np.float32)
    c0 = np.random.randn(batch_size, hidden_size).astype(np.float32)
    model_ = torch.nn.LSTMCell(input_size, hidden_size, bias=bias)
    h_, c_ = model_(torch.tensor(x), (torch.tensor(h0), torch.tensor(c0))) if init_hidden \
        else model_(torch.tensor(x), None)
    model = nn.LSTMCell(input_size, hidden_size, device=device, bias=bias)
    model.W_ih = ndl.Tensor(model_.weight_ih.detach().numpy().transpose(), device=device)
    model.W_hh = ndl.Tensor(model_.weight_hh.detach().numpy().transpose(), device=device)
    if bias:
        model.bias_ih = ndl.Tensor(model_.bias_ih.detach().numpy(), device=device)
        model.bias_hh = ndl.Tensor(model_.bias_hh.detach().numpy(), device=device)
    if init_hidden:
        h, c = model(ndl.Tensor(x, device=device),
                     (ndl.Tensor(h0, device=device), ndl.Tensor(c0, device=device)))
    else:
        h, c = model(ndl.Tensor(x, device=device), None)
    np.testing.assert_allclose(h_.detach().numpy(), h.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(c_.detach().numpy(), c.numpy(), atol=1e-5, rtol=1e-5)
    h.sum().backward()
    h_.sum().backward()
    np.testing.assert_allclose(model_.weight_ih.grad.detach().numpy().transpose(),
                               model.W_ih.grad.detach().numpy(), atol=1e-5, rtol=1e-5)


def _copy_layers(cells, model_, num_layers, bias, device):
    for k in range(num_layers):
        cells[k].W_ih = ndl.Tensor(getattr(model_, f"weight_ih_l{k}").detach().numpy()
                                   .transpose(), device=device)
        cells[k].W_hh = ndl.Tensor(getattr(model_, f"weight_hh_l{k}").detach().numpy()
                                   .transpose(), device=device)
        if bias:
            cells[k].bias_ih = ndl.Tensor(getattr(model_, f"bias_ih_l{k}").detach().numpy(),
                                          device=device)
            cells[k].bias_hh = ndl.Tensor(getattr(model_, f"bias_hh_l{k}").detach().numpy(),
                                          device=device)


@pytest.mark.parametrize("seq_length,num_layers,batch_size,input_size,hidden_size",
                         [(1, 1, 1, 1, 1), (13, 2, 15, 11, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("init_hidden", [True, False])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("device", _DEVICES)
def test_rnn(seq_length, num_layers, batch_size, input_size, hidden_size, bias, init_hidden,
             nonlinearity, device):
    x = np.random.randn(seq_length, batch_size, input_size).astype(np.float32)
    h0 = np.random.randn(num_layers, batch_size, hidden_size).astype(np.float32)
    model_ = torch.nn.RNN(input_size, hidden_size, num_layers=num_layers, bias=bias,
                          nonlinearity=nonlinearity)
    output_, h_ = model_(torch.tensor(x), torch.tensor(h0)) if init_hidden \
        else model_(torch.tensor(x), None)
    model = nn.RNN(input_size, hidden_size, num_layers, bias, device=device,
                   nonlinearity=nonlinearity)
    _copy_layers(model.rnn_cells, model_, num_layers, bias, device)
    output, h = model(ndl.Tensor(x, device=device),
                      ndl.Tensor(h0, device=device) if init_hidden else None)
    np.testing.assert_allclose(h_.detach().numpy(), h.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(output_.detach().numpy(), output.numpy(), atol=1e-5, rtol=1e-5)
    output.sum().backward()
    output_.sum().backward()
    np.testing.assert_allclose(model_.weight_ih_l0.grad.detach().numpy().transpose(),
                               model.rnn_cells[0].W_ih.grad.detach().numpy(),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seq_length,num_layers,batch_size,input_size,hidden_size",
                         [(1, 1, 1, 1, 1), (13, 2, 15, 11, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("init_hidden", [True, False])
@pytest.mark.parametrize("device", _DEVICES)
def test_lstm(seq_length, num_layers, batch_size, input_size, hidden_size, bias, init_hidden,
              device):
    x = np.random.randn(seq_length, batch_size, input_size).astype(np.float32)
    h0 = np.random.randn(num_layers, batch_size, hidden_size).astype(np.float32)
    c0 = np.random.randn(num_layers, batch_size, hidden_size).astype(np.float32)
    model_ = torch.nn.LSTM(input_size, hidden_size, bias=bias, num_layers=num_layers)
    output_, (h_, c_) = model_(torch.tensor(x), (torch.tensor(h0), torch.tensor(c0))) \
        if init_hidden else model_(torch.tensor(x), None)
    model = nn.LSTM(input_size, hidden_size, num_layers, bias, device=device)
    _copy_layers(model.lstm_cells, model_, num_layers, bias, device)
    if init_hidden:
        output, (h, c) = model(ndl.Tensor(x, device=device),
                               (ndl.Tensor(h0, device=device), ndl.Tensor(c0, device=device)))
    else:
        output, (h, c) = model(ndl.Tensor(x, device=device), None)
    np.testing.assert_allclose(h_.detach().numpy(), h.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(c_.detach().numpy(), c.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(output_.detach().numpy(), output.numpy(), atol=1e-5, rtol=1e-5)
    output.sum().backward()
    output_.sum().backward()
    np.testing.assert_allclose(model_.weight_ih_l0.grad.detach().numpy().transpose(),
                               model.lstm_cells[0].W_ih.grad.detach().numpy(),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seq_model", ["rnn", "lstm"])
@pytest.mark.parametrize("init_hidden", [True, False])
@pytest.mark.parametrize("device", _DEVICES)
def test_language_model_implementation(seq_model, init_hidden, device):
    seq_length, num_layers, batch_size, embedding_size, hidden_size, output_size = \
        13, 2, 15, 34, 12, 1000
    x = np.random.randint(0, output_size, (seq_length, batch_size)).astype(np.float32)
    h0 = ndl.Tensor(np.random.randn(num_layers, batch_size, hidden_size).astype(np.float32),
                    device=device)
    c0 = ndl.Tensor(np.random.randn(num_layers, batch_size, hidden_size).astype(np.float32),
                    device=device)
    model = LanguageModel(embedding_size, output_size, hidden_size, num_layers, seq_model,
                          device=device)
    if init_hidden:
        h = (h0, c0) if seq_model == "lstm" else h0
        output, h_ = model(ndl.Tensor(x, device=device), h)
    else:
        output, h_ = model(ndl.Tensor(x, device=device), None)
    if seq_model == "lstm":
        assert isinstance(h_, tuple)
        h0_, c0_ = h_
        assert c0_.shape == (num_layers, batch_size, hidden_size)
    else:
        h0_ = h_
    assert h0_.shape == (num_layers, batch_size, hidden_size)
    assert output.shape == (batch_size * seq_length, output_size)
    output.backward()
    for p in model.parameters():
        assert p.grad is not None


@pytest.mark.parametrize("device", _DEVICES)
def test_embedding_vs_torch(device):
    x = np.random.randint(0, 10, (4, 3)).astype(np.float32)
    model_ = torch.nn.Embedding(10, 5)
    model = nn.Embedding(10, 5, device=device)
    model.weight = ndl.Tensor(model_.weight.detach().numpy(), device=device)
    out = model(ndl.Tensor(x, device=device))
    out_ = model_(torch.tensor(x.astype(np.int64)))
    np.testing.assert_allclose(out.numpy(), out_.detach().numpy(), atol=1e-6)
    out.sum().backward()
    out_.sum().backward()
    np.testing.assert_allclose(model.weight.grad.numpy(), model_.weight.grad.numpy(), atol=1e-6)


# ------------------------------------------------------------------ test_cifar_ptb_data.py
def _write_ptb(folder):
    folder.mkdir()
    words = [f"w{i}" for i in range(50)]
    rng = np.random.default_rng(0)
    for name, n in (("train.txt", 40), ("test.txt", 10), ("valid.txt", 10)):
        lines = [" ".join(rng.choice(words, 12)) for _ in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("batch_size,bptt", [(1, 1), (15, 3)])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("device", _DEVICES)
def test_ptb_dataset(tmp_path, batch_size, bptt, train, device):
    _write_ptb(tmp_path / "ptb")
    corpus = ndl.data.Corpus(str(tmp_path / "ptb"))
    source = corpus.train if train else corpus.test
    data = ndl.data.batchify(source, batch_size, device=device, dtype="float32")
    X, y = ndl.data.get_batch(data, np.random.randint(len(data) - 1), bptt, device=device)
    assert X.shape[1] == batch_size and X.shape[0] <= bptt
    assert y.shape == (X.shape[0] * batch_size,)
    assert isinstance(X, ndl.Tensor)
    assert X.dtype == "float32"
    assert X.device == device
    assert isinstance(X.cached_data, nd.NDArray)
    ntokens = len(corpus.dictionary)
    assert ntokens == 51  # 50 words and <eos>
    assert len(corpus.train) == 40 * 13


def _write_cifar(folder, n):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


@pytest.mark.parametrize("train", [True, False])
def test_cifar10_dataset(tmp_path, train):
    _write_cifar(tmp_path / "cifar-10-batches-py", 6)
    dataset = ndl.data.CIFAR10Dataset(str(tmp_path / "cifar-10-batches-py"), train=train)
    assert len(dataset) == (30 if train else 6)
    example = dataset[np.random.randint(len(dataset))]
    assert isinstance(example, tuple)
    X, y = example
    assert isinstance(X, np.ndarray)
    assert X.shape == (3, 32, 32)
    assert 0.0 <= X.min() and X.max() <= 1.0


@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize("device", _DEVICES)
def test_cifar10_loader(tmp_path, batch_size, device):
    _write_cifar(tmp_path / "cifar-10-batches-py", 6)
    cifar10_train_dataset = ndl.data.CIFAR10Dataset(str(tmp_path / "cifar-10-batches-py"), True)
    train_loader = ndl.data.DataLoader(cifar10_train_dataset, batch_size, device=device)
    for (X, y) in train_loader:
        break
    assert isinstance(X.cached_data, nd.NDArray)
    assert isinstance(X, ndl.Tensor)
    assert isinstance(y, ndl.Tensor)
    assert X.dtype == "float32"
    assert X.shape == (batch_size, 3, 32, 32)
