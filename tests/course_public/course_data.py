"""Where the course's public tests find their data: the course's ``data/`` folder is
``../shared/data/mnist`` next to the repository (MNIST's test split; the train images are not
shipped, so tests that read them are left out)."""
import gzip
from pathlib import Path

import numpy as np
import pytest

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
