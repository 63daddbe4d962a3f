"""Where the course's public tests find their data: the course's ``data/`` folder is
``../shared/data/mnist`` next to the repository (MNIST's test split; the train images are not
shipped, so tests that read them are left out)."""
import gzip
from pathlib import Path

import numpy as np
import pytest

import needle as ndl

MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"
T10K_IMAGES = str(MNIST / "t10k-images-idx3-ubyte.gz")
T10K_LABELS = str(MNIST / "t10k-labels-idx1-ubyte.gz")
needs_mnist = pytest.mark.skipif(not (MNIST / "t10k-images-idx3-ubyte.gz").exists(),
                                 reason="MNIST test split not in ../shared/data/mnist")


def raw_t10k():
    """The test split read straight from the IDX files (a reference independent of needle)."""
    with gzip.open(T10K_IMAGES) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(T10K_LABELS) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


def gradient_check(f, *args, tol=1e-6, backward=False, **kwargs):
    """The course's hw1 gradient checker, as it stands in the course's tests (central
    differences through ``realize_cached_data().flat``)."""
    eps = 1e-4
    numerical_grads = [np.zeros(a.shape) for a in args]
    for i in range(len(args)):
        for j in range(args[i].realize_cached_data().size):
            args[i].realize_cached_data().flat[j] += eps
            f1 = float(f(*args, **kwargs).numpy().sum())
            args[i].realize_cached_data().flat[j] -= 2 * eps
            f2 = float(f(*args, **kwargs).numpy().sum())
            args[i].realize_cached_data().flat[j] += eps
            numerical_grads[i].flat[j] = (f1 - f2) / (2 * eps)
    if not backward:
        out = f(*args, **kwargs)
        computed_grads = [x.numpy() for x in
                          out.op.gradient_as_tuple(ndl.Tensor(np.ones(out.shape)), out)]
    else:
        out = f(*args, **kwargs).sum()
        out.backward()
        computed_grads = [a.grad.numpy() for a in args]
    error = sum(np.linalg.norm(computed_grads[i] - numerical_grads[i])
                for i in range(len(args)))
    assert error < tol
    return computed_grads
