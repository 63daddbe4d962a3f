"""The course's hw0 public tests (tests/test_simple_ml.py), run against needle's apps/simple_ml.

Same calls, dtypes and tolerances as the course's file; the train-split checks (train images are
not shipped) run on the test split with references computed here from the raw IDX bytes.
"""
import numdifftools as nd
import numpy as np
from course_data import T10K_IMAGES, T10K_LABELS, needs_mnist, raw_t10k

from apps.simple_ml import add, nn_epoch, parse_mnist, softmax_loss, softmax_regression_epoch


def test_add():
    assert add(5, 6) == 11
    assert add(3.2, 1.0) == 4.2
    assert type(add(4., 4)) is float
    np.testing.assert_allclose(add(np.array([1, 2]), np.array([3, 4])), np.array([4, 6]))


@needs_mnist
def test_parse_mnist():
    X, y = parse_mnist(T10K_IMAGES, T10K_LABELS)
    assert X.dtype == np.float32
    assert y.dtype == np.uint8
    assert X.shape == (10000, 784)
    assert y.shape == (10000,)
    images, labels = raw_t10k()
    ref = images.astype(np.float64) / 255.0  # min 0 -> 0.0, max 255 -> 1.0 over the dataset
    np.testing.assert_allclose(np.linalg.norm(X[:10]), np.linalg.norm(ref[:10]), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(X[:1000]), np.linalg.norm(ref[:1000]), rtol=1e-6)
    np.testing.assert_equal(y[:10], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9])


@needs_mnist
def test_softmax_loss():
    X, y = parse_mnist(T10K_IMAGES, T10K_LABELS)
    np.random.seed(0)
    Z = np.zeros((y.shape[0], 10))
    np.testing.assert_allclose(softmax_loss(Z, y), 2.3025850)
    Z = np.random.randn(y.shape[0], 10)
    # the course's 2.7291998 is for the train labels; on the test split, the textbook formula
    np.testing.assert_allclose(softmax_loss(Z, y), naive_cross_entropy(Z, y))


def naive_cross_entropy(Z, y):
    """mean(log(sum(exp(Z))) - Z[y]) evaluated directly (an independent reference)."""
    return np.mean(np.log(np.exp(Z).sum(axis=1)) - Z[np.arange(len(y)), y])


def test_softmax_regression_epoch():
    # test numerical gradient
    np.random.seed(0)
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=(50,)).astype(np.uint8)
    Theta = np.zeros((5, 3), dtype=np.float32)
    dTheta = -nd.Gradient(lambda Th: softmax_loss(X @ Th.reshape(5, 3), y))(Theta)
    softmax_regression_epoch(X, y, Theta, lr=1.0, batch=50)
    np.testing.assert_allclose(dTheta.reshape(5, 3), Theta, rtol=1e-4, atol=1e-4)


def test_nn_epoch():
    # test nn gradients
    np.random.seed(0)
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=(50,)).astype(np.uint8)
    W1 = np.random.randn(5, 10).astype(np.float32) / np.sqrt(10)
    W2 = np.random.randn(10, 3).astype(np.float32) / np.sqrt(3)
    dW1 = nd.Gradient(lambda W1_: softmax_loss(np.maximum(X @ W1_.reshape(5, 10), 0) @ W2, y))(W1)
    dW2 = nd.Gradient(lambda W2_: softmax_loss(np.maximum(X @ W1, 0) @ W2_.reshape(10, 3), y))(W2)
    W1_0, W2_0 = W1.copy(), W2.copy()
    nn_epoch(X, y, W1, W2, lr=1.0, batch=50)
    np.testing.assert_allclose(dW1.reshape(5, 10), W1_0 - W1, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dW2.reshape(10, 3), W2_0 - W2, rtol=1e-4, atol=1e-4)
