"""Tests for apps/: the course's simple_ml functions, MLPResNet, ResNet9, LanguageModel, demo.

Run from the repository root (``python -m pytest``) so that ``apps`` is importable.
"""
from pathlib import Path

import numpy as np
import pytest

import needle as ndl
from apps import demo, mlp_resnet, models, simple_ml

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


def _softmax(Z):
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------------- hw0 / hw1
def test_softmax_loss_numpy_agrees_with_formula():
    Z = np.random.randn(7, 5).astype(np.float32) * 3
    y = np.random.randint(0, 5, size=7)
    expected = np.mean(-np.log(_softmax(Z.astype(np.float64))[np.arange(7), y]))
    assert simple_ml.softmax_loss_numpy(Z, y) == pytest.approx(expected, rel=1e-5)


def test_softmax_loss_needle_agrees_with_formula():
    Z = np.random.randn(7, 5).astype(np.float32) * 3
    y = np.random.randint(0, 5, size=7)
    expected = np.mean(-np.log(_softmax(Z.astype(np.float64))[np.arange(7), y]))
    one_hot = ndl.Tensor(np.eye(5)[y])
    got = simple_ml.softmax_loss(ndl.Tensor(Z), one_hot).numpy()
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_numpy_backprop_matches_needle_autodiff():
    """The hand-written hw0 gradients equal what needle's autodiff computes (hw1)."""
    X = np.random.randn(50, 6).astype(np.float32)
    y = np.random.randint(0, 3, size=50)
    W1 = np.random.randn(6, 8).astype(np.float32) / 3
    W2 = np.random.randn(8, 3).astype(np.float32) / 3
    W1n, W2n = simple_ml.nn_epoch(X, y, ndl.Tensor(W1), ndl.Tensor(W2), lr=0.2, batch=20)
    simple_ml.nn_epoch_numpy(X, y, W1, W2, lr=0.2, batch=20)  # in place, three minibatches
    np.testing.assert_allclose(W1n.numpy(), W1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(W2n.numpy(), W2, rtol=1e-4, atol=1e-5)

    theta = np.zeros((6, 3), dtype=np.float32)
    simple_ml.softmax_regression_epoch(X[:20], y[:20], theta, lr=1.0, batch=20)
    t = ndl.Tensor(np.zeros((6, 3)))
    simple_ml.softmax_loss(ndl.Tensor(X[:20]) @ t, ndl.Tensor(np.eye(3)[y[:20]])).backward()
    np.testing.assert_allclose(theta, -t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_softmax_regression_and_two_layer_net_learn_digits():
    Xtr, ytr, Xte, yte = ndl.data.load_digits(seed=0)
    loss, err = simple_ml.train_softmax(Xtr, ytr, Xte, yte, epochs=10, lr=0.5, batch=50)
    assert err < 0.10 and loss < 0.4
    loss, err = simple_ml.train_nn_numpy(Xtr, ytr, Xte, yte, hidden_dim=64, epochs=10, lr=0.2,
                                         batch=50)
    assert err < 0.08


# ------------------------------------------------------------------------- hw2: MLPResNet
def test_mlp_resnet_structure():
    model = mlp_resnet.MLPResNet(20, hidden_dim=16, num_blocks=2, num_classes=4)
    d, h, k = 20, 16, 4
    block = (h * (h // 2) + h // 2) + 2 * (h // 2) + ((h // 2) * h + h) + 2 * h
    expected = (d * h + h) + 2 * block + (h * k + k)
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == expected
    out = model(ndl.Tensor(np.random.randn(3, 20)))
    assert out.shape == (3, 4)
    block = mlp_resnet.ResidualBlock(8, 4, norm=ndl.nn.LayerNorm1d, drop_prob=0.0)
    x = np.random.randn(5, 8).astype(np.float32)
    assert (block(ndl.Tensor(x)).numpy() >= 0).all()  # the block ends with a ReLU


@pytest.mark.slow
def test_mlp_resnet_reaches_95_percent_on_builtin_digits():
    acc = demo.digits_demo(epochs=10, progress=False)
    assert acc >= 0.95


@pytest.mark.slow
@pytest.mark.skipif(not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists(),
                    reason="MNIST test split not present in ../shared/data/mnist")
def test_mlp_resnet_on_mnist_test_split():
    """Train on 8000 images of the MNIST test split, evaluate on the other 2000: >= 92%."""
    X, y = ndl.data.parse_mnist(str(MNIST_DIR / "t10k-images-idx3-ubyte.gz"),
                                str(MNIST_DIR / "t10k-labels-idx1-ubyte.gz"))
    np.random.seed(0)
    train = ndl.data.DataLoader(ndl.data.NDArrayDataset(X[:8000], y[:8000]), 100, shuffle=True,
                                seed=0)
    test = ndl.data.DataLoader(ndl.data.NDArrayDataset(X[8000:], y[8000:]), 500)
    model = mlp_resnet.MLPResNet(784, hidden_dim=100)
    opt = ndl.optim.Adam(model.parameters(), lr=0.002, weight_decay=0.001)
    for _ in range(2):
        train_err, _ = mlp_resnet.epoch(train, model, opt, progress=False)
    test_err, test_loss = mlp_resnet.epoch(test, model, None, progress=False)
    assert train_err < 0.15
    assert 1.0 - test_err >= 0.92, f"held-out accuracy {1 - test_err:.3f}"


def test_mlp_resnet_epoch_reports_error_rate_and_mean_loss():
    """Eval epoch: (error rate, mean loss) over uneven batches, as computed from the logits."""
    np.random.seed(0)
    X = np.random.randn(23, 6).astype(np.float32)
    y = np.random.randint(0, 3, size=23)
    model = mlp_resnet.MLPResNet(6, hidden_dim=8, num_blocks=1, num_classes=3)
    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=10)
    err, loss = mlp_resnet.epoch(loader, model, None, progress=False)
    model.eval()
    Z = model(ndl.Tensor(X)).numpy().astype(np.float64)
    lse = np.log(np.exp(Z - Z.max(1, keepdims=True)).sum(1)) + Z.max(1)
    assert err == pytest.approx(np.mean(Z.argmax(1) != y))
    assert loss == pytest.approx(np.mean(lse - Z[np.arange(23), y]), rel=1e-4)
    opt = ndl.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):  # training epochs step the optimizer: the eval loss falls
        mlp_resnet.epoch(loader, model, opt, progress=False)
    assert mlp_resnet.epoch(loader, model, None, progress=False)[1] < 0.8 * loss


def _write_idx(path, arr):
    import gzip
    import struct
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 0x08, arr.ndim))
        f.write(struct.pack(">" + "I" * arr.ndim, *arr.shape))
        f.write(arr.astype(np.uint8).tobytes())


def test_train_mnist_reads_the_four_files_and_trains(tmp_path):
    """train_mnist on tiny idx files: a learnable rule (label = brightest quarter) is learned."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 200), ("t10k", 100)):
        images = rng.integers(0, 60, size=(n, 28, 28))
        labels = rng.integers(0, 4, size=n)
        for i, lab in enumerate(labels):
            r, c = divmod(int(lab), 2)
            images[i, 14 * r:14 * r + 14, 14 * c:14 * c + 14] += 180
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images)
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels)
    train_err, train_loss, test_err, test_loss = mlp_resnet.train_mnist(
        batch_size=50, epochs=3, lr=0.01, hidden_dim=16, data_dir=str(tmp_path), progress=False)
    assert test_err < 0.1 and train_err < 0.3
    assert 0 < test_loss < np.log(10)


# ------------------------------------------------------------------------- hw4: CIFAR / PTB
def test_resnet9_overfits_a_small_batch_with_the_cifar_loop():
    np.random.seed(0)
    X = np.random.rand(8, 3, 32, 32).astype(np.float32)
    y = np.arange(8) % 10
    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=8)
    model = models.ResNet9()
    assert model(ndl.Tensor(X[:2])).shape == (2, 10)
    acc0, loss0 = simple_ml.evaluate_cifar10(model, loader, progress=False)
    acc, loss = simple_ml.train_cifar10(model, loader, n_epochs=5, lr=0.01, weight_decay=0.0,
                                        progress=False)
    assert loss < 0.5 * loss0 and acc == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("seq_model", ["rnn", "lstm", "transformer"])
def test_language_model_learns_a_periodic_sequence(seq_model):
    """Each next token is determined by the previous one: loss must fall far below log(5)."""
    np.random.seed(0)
    stream = [int(c) for c in "01234" * 80]
    data = ndl.data.batchify(stream, batch_size=4)
    extra = dict(num_head=2, dim_head=8) if seq_model == "transformer" else {}
    model = models.LanguageModel(8, 5, 16, num_layers=1, seq_model=seq_model, seq_len=10,
                                 **extra)
    x, _ = ndl.data.get_batch(data, 0, 10)
    logits, _ = model(x)
    assert logits.shape == (40, 5)
    _, loss0 = simple_ml.evaluate_ptb(model, data, seq_len=10, progress=False)
    simple_ml.train_ptb(model, data, seq_len=10, n_epochs=6, optimizer=ndl.optim.Adam, lr=0.03,
                        clip=1.0, progress=False)
    acc, loss = simple_ml.evaluate_ptb(model, data, seq_len=10, progress=False)
    assert loss0 > 1.0 and loss < 0.3 * np.log(5) and acc > 0.9


def test_language_model_rejects_unknown_seq_model():
    with pytest.raises(ValueError, match="gru"):
        models.LanguageModel(4, 5, 6, seq_model="gru")


# ------------------------------------------------------------------------- demo
@pytest.mark.slow
def test_demo_runs_end_to_end(capsys):
    demo.main(["--epochs", "1", "--budget", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert "test accuracy" in out and "unigram entropy" in out and "sample" in out


def test_progress_bar_needs_no_ipywidgets(monkeypatch):
    """Where ipywidgets is missing the bar is plain tqdm (hidden in Jupyter: its stderr is not a
    terminal), not tqdm.auto's widget bar, which warns "IProgress not found" in every training
    cell; with ipywidgets it is tqdm.auto's."""
    import importlib
    import importlib.util

    import tqdm.auto
    import tqdm.std

    from apps import progress
    real = importlib.util.find_spec
    try:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "ipywidgets" else real(name, *a))
        assert importlib.reload(progress).tqdm is tqdm.std.tqdm
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: object() if name == "ipywidgets" else real(name, *a))
        assert importlib.reload(progress).tqdm is tqdm.auto.tqdm
    finally:
        monkeypatch.undo()
        importlib.reload(progress)
