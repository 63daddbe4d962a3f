"""RNN/LSTM cells and stacks and Embedding: against torch and float64 central differences."""
import numpy as np
import pytest
from helpers import DEVICES
from nn_helpers import assert_close, module_gradcheck

import needle as ndl
from needle import nn

pytestmark = pytest.mark.hw4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm"])
def test_stack_gradcheck(kind, device):
    np.random.seed(0)
    kw = dict(device=device, dtype="float64")
    if kind == "lstm":
        model = nn.LSTM(2, 3, num_layers=2, **kw)

        def fn(x, h0, c0):
            out, hc = model(x, (h0, c0))
            return out, hc[0], hc[1]

        inputs = [np.random.randn(3, 2, 2), np.random.randn(2, 2, 3), np.random.randn(2, 2, 3)]
    else:
        model = nn.RNN(2, 3, num_layers=2, nonlinearity=kind[4:], **kw)
        fn = model
        inputs = [np.random.randn(3, 2, 2), np.random.randn(2, 2, 3)]
    module_gradcheck(fn, model, inputs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_cells_gradcheck(device):
    np.random.seed(1)
    kw = dict(device=device, dtype="float64")
    cell = nn.LSTMCell(2, 3, **kw)
    module_gradcheck(lambda x, h, c: cell(x, (h, c)), cell,
                     [np.random.randn(2, 2), np.random.randn(2, 3), np.random.randn(2, 3)], device)
    rcell = nn.RNNCell(2, 3, bias=False, **kw)
    module_gradcheck(rcell, rcell, [np.random.randn(2, 2), np.random.randn(2, 3)], device)


def _copy_to_torch(cells, ref):
    import torch
    with torch.no_grad():
        for layer, cell in enumerate(cells):
            getattr(ref, f"weight_ih_l{layer}").copy_(torch.tensor(cell.W_ih.numpy().T))
            getattr(ref, f"weight_hh_l{layer}").copy_(torch.tensor(cell.W_hh.numpy().T))
            getattr(ref, f"bias_ih_l{layer}").copy_(torch.tensor(cell.bias_ih.numpy()))
            getattr(ref, f"bias_hh_l{layer}").copy_(torch.tensor(cell.bias_hh.numpy()))


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["rnn", "lstm"])
def test_stacks_match_torch(kind, device):
    torch = pytest.importorskip("torch")
    np.random.seed(2)
    seq, bs, n_in, hid, layers = 5, 3, 4, 6, 2
    x = np.random.randn(seq, bs, n_in).astype("float32")
    h0 = np.random.randn(layers, bs, hid).astype("float32")
    c0 = np.random.randn(layers, bs, hid).astype("float32")
    xt, ht, ct = (ndl.Tensor(a, device=device) for a in (x, h0, c0))
    xr, hr, cr = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    if kind == "rnn":
        model = nn.RNN(n_in, hid, layers, device=device)
        ref = torch.nn.RNN(n_in, hid, layers)
        _copy_to_torch(model.rnn_cells, ref)
        out, hn = model(xt, ht)
        outr, hnr = ref(xr, hr)
        outs, refs = [out, hn], [outr, hnr]
    else:
        model = nn.LSTM(n_in, hid, layers, device=device)
        ref = torch.nn.LSTM(n_in, hid, layers)
        _copy_to_torch(model.lstm_cells, ref)
        out, (hn, cn) = model(xt, (ht, ct))
        outr, (hnr, cnr) = ref(xr, (hr, cr))
        outs, refs = [out, hn, cn], [outr, hnr, cnr]
    ws = [np.random.randn(*o.shape).astype("float32") for o in outs]
    sum((o * ndl.Tensor(w, device=device)).sum() for o, w in zip(outs, ws)).backward()
    sum((o * torch.tensor(w)).sum() for o, w in zip(refs, ws)).backward()
    for o, r in zip(outs, refs):
        assert_close(o, r)
    assert_close(xt.grad, xr.grad)
    assert_close(ht.grad, hr.grad)
    cells = model.rnn_cells if kind == "rnn" else model.lstm_cells
    assert_close(cells[1].W_hh.grad, ref.weight_hh_l1.grad.T)
    assert_close(cells[0].W_ih.grad, ref.weight_ih_l0.grad.T)
    assert_close(cells[0].bias_ih.grad, ref.bias_ih_l0.grad)


def test_default_hidden_is_zeros():
    np.random.seed(3)
    x = ndl.Tensor(np.random.randn(4, 2, 3))
    lstm = nn.LSTM(3, 5)
    out, (h, c) = lstm(x)
    out0, (h0, c0) = lstm(x, (ndl.init.zeros(1, 2, 5), ndl.init.zeros(1, 2, 5)))
    np.testing.assert_array_equal(out.numpy(), out0.numpy())
    assert out.shape == (4, 2, 5) and h.shape == c.shape == (1, 2, 5)
    with pytest.raises(ValueError, match=r"\(seq_len, bs, 3\)"):
        lstm(ndl.Tensor(np.zeros((4, 3))))
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 5, nonlinearity="gelu")


@pytest.mark.parametrize("device", DEVICES)
def test_embedding(device):
    np.random.seed(4)
    emb = nn.Embedding(7, 3, device=device)
    idx = np.array([[1, 6], [1, 0], [5, 2]])
    out = emb(ndl.Tensor(idx, device=device, dtype="int64"))
    table = emb.weight.numpy()
    np.testing.assert_array_equal(out.numpy(), table[idx])
    w = np.random.randn(3, 2, 3)
    (out * ndl.Tensor(w, device=device)).sum().backward()
    want = np.zeros((7, 3))
    np.add.at(want, idx, w)  # repeated index 1 accumulates
    np.testing.assert_allclose(emb.weight.grad.numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        emb(ndl.Tensor(np.array([[7]]), device=device, dtype="int64"))
