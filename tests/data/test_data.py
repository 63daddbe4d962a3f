"""Tests for needle.data: DataLoader, transforms, and the MNIST/CIFAR-10/PTB/built-in readers."""
import gzip
import os
import pickle
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import needle as ndl
from needle import data, metrics

pytestmark = pytest.mark.hw2

MNIST_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"


def _concat(loader):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in loader])
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------------------- DataLoader
def test_dataloader_batches_in_order():
    X = np.arange(23 * 3, dtype=np.float64).reshape(23, 3)
    y = np.arange(23) % 4
    loader = data.DataLoader(data.NDArrayDataset(X, y), batch_size=5)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(5, 3)] * 4 + [(3, 3)]
    assert len(loader) == 5
    assert isinstance(batches[0][0], ndl.Tensor)
    assert batches[0][0].dtype == "float32" and batches[0][1].dtype == "int64"
    xs, ys = _concat(loader)
    np.testing.assert_array_equal(xs, X.astype(np.float32))
    np.testing.assert_array_equal(ys, y)


def test_dataloader_drop_last_and_dtype():
    X = np.random.randn(23, 2)
    loader = data.DataLoader(data.NDArrayDataset(X, np.zeros(23, np.int32)), batch_size=5,
                             drop_last=True, dtype="float64")
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    assert all(b[0].shape == (5, 2) and b[0].dtype == "float64" for b in batches)
    assert batches[0][1].dtype == "int32"
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), X[:20])


def test_dataloader_keeps_integer_and_bool_dtypes():
    ds = data.NDArrayDataset(np.zeros((3, 2)), np.array([True, False, True]),
                             np.array([1, 2, 3], dtype=np.uint8), np.array([4, 5, 6], np.uint16))
    x, m, u, w = next(iter(data.DataLoader(ds, batch_size=3)))
    assert (x.dtype, m.dtype, u.dtype, w.dtype) == ("float32", "bool", "uint8", "int64")
    assert not any(t.requires_grad for t in (x, m, u, w))
    np.testing.assert_array_equal(m.numpy(), [True, False, True])
    np.testing.assert_array_equal(w.numpy(), [4, 5, 6])


def test_dataloader_rejects_bad_batch_size():
    ds = data.NDArrayDataset(np.zeros((4, 1)))
    with pytest.raises(ValueError, match="batch_size"):
        data.DataLoader(ds, batch_size=0)


def test_shuffle_is_a_seeded_permutation_per_epoch():
    X = np.arange(50, dtype=np.float32).reshape(50, 1)
    ds = data.NDArrayDataset(X, np.arange(50))

    def epochs(loader, n=2):
        return [_concat(loader)[1] for _ in range(n)]

    a = epochs(data.DataLoader(ds, batch_size=8, shuffle=True, seed=3))
    b = epochs(data.DataLoader(ds, batch_size=8, shuffle=True,
                               generator=np.random.default_rng(3)))
    c = epochs(data.DataLoader(ds, batch_size=8, shuffle=True, seed=4))
    for e in a:
        np.testing.assert_array_equal(np.sort(e), np.arange(50))  # every sample exactly once
    assert not np.array_equal(a[0], np.arange(50))
    assert not np.array_equal(a[0], a[1])  # a fresh order each epoch
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    # the order is exactly the generator's permutation
    np.testing.assert_array_equal(a[0], np.random.default_rng(3).permutation(50))


def test_shuffle_without_generator_uses_global_rng_like_the_course():
    ds = data.NDArrayDataset(np.arange(30, dtype=np.float32), np.arange(30))
    np.random.seed(7)
    got = _concat(data.DataLoader(ds, batch_size=4, shuffle=True))[1]
    np.random.seed(7)
    np.testing.assert_array_equal(got, np.random.permutation(30))


def test_dataloader_state_dict_resumes_mid_epoch():
    ds = data.NDArrayDataset(np.arange(40, dtype=np.float32), np.arange(40))
    full = data.DataLoader(ds, batch_size=6, shuffle=True, seed=11)
    ref = [[y.numpy() for _, y in full] for _ in range(2)]

    loader = data.DataLoader(ds, batch_size=6, shuffle=True, seed=11)
    it = iter(loader)
    seen = [next(it)[1].numpy() for _ in range(3)]
    state = loader.state_dict()
    resumed = data.DataLoader(ds, batch_size=6, shuffle=True, seed=999)
    resumed.load_state_dict(state)
    rest = [y.numpy() for _, y in resumed]
    epoch2 = [y.numpy() for _, y in resumed]
    for a, b in zip(seen + rest, ref[0]):
        np.testing.assert_array_equal(a, b)
    assert len(seen + rest) == len(ref[0])
    for a, b in zip(epoch2, ref[1]):
        np.testing.assert_array_equal(a, b)


class _PerItem(data.Dataset):
    """A dataset that only supports integer indexing and returns (image, label)."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 2), float(i)), i


def test_dataloader_collates_per_item_datasets():
    x, y = next(iter(data.DataLoader(_PerItem(7), batch_size=3)))
    assert x.shape == (3, 2, 2)
    np.testing.assert_array_equal(y.numpy(), [0, 1, 2])
    np.testing.assert_array_equal(x.numpy()[:, 0, 0], [0.0, 1.0, 2.0])


# ------------------------------------------------------------------------- transforms
def test_random_flip_horizontal_matches_numpy():
    img = np.random.randn(5, 6, 3)
    np.testing.assert_array_equal(data.RandomFlipHorizontal(p=1.0)(img), img[:, ::-1, :])
    np.testing.assert_array_equal(data.RandomFlipHorizontal(p=0.0)(img), img)
    flips = []
    np.random.seed(1)
    for _ in range(40):
        out = data.RandomFlipHorizontal(p=0.5)(img)
        flips.append(np.array_equal(out, img[:, ::-1, :]))
    np.random.seed(1)
    expected = [np.random.rand() < 0.5 for _ in range(40)]
    assert flips == expected and 5 < sum(flips) < 35


@pytest.mark.parametrize("padding", [1, 3])
def test_random_crop_is_a_zero_filled_shift(padding):
    img = np.random.rand(7, 8, 2) + 1.0  # strictly positive so zero fill is visible
    for trial in range(10):
        np.random.seed(trial)
        out = data.RandomCrop(padding=padding)(img)
        np.random.seed(trial)
        sx, sy = np.random.randint(low=-padding, high=padding + 1, size=2)
        expected = np.zeros_like(img)
        for i in range(7):
            for j in range(8):
                if 0 <= i + sx < 7 and 0 <= j + sy < 8:
                    expected[i, j] = img[i + sx, j + sy]
        assert out.shape == img.shape
        np.testing.assert_array_equal(out, expected)


# ------------------------------------------------------------------------- MNIST
def _write_idx(path, arr, magic_type=0x08):
    header = bytes([0, 0, magic_type, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def _written_mnist(tmp_path):
    """Six random 28 x 28 images and their labels, written as MNIST files and read back."""
    images = np.random.randint(0, 256, size=(6, 28, 28)).astype(np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9], dtype=np.uint8)
    _write_idx(tmp_path / "img.gz", images)
    _write_idx(tmp_path / "lbl.gz", labels)
    return data.MNISTDataset(str(tmp_path / "img.gz"), str(tmp_path / "lbl.gz")), images, labels


def test_mnist_reader_on_written_files(tmp_path):
    ds, images, labels = _written_mnist(tmp_path)
    assert len(ds) == 6
    x, y = ds[2]
    assert x.dtype == np.float32 and x.shape == (784,)
    np.testing.assert_allclose(x, images[2].reshape(-1) / 255.0, rtol=1e-6)
    assert y == 4


def test_mnist_dataset_through_dataloader_and_transforms(tmp_path):
    """Not graded under parse_mnist: it needs hw2's DataLoader and transforms as well."""
    ds, images, labels = _written_mnist(tmp_path)
    xb, yb = next(iter(data.DataLoader(ds, batch_size=6)))
    np.testing.assert_allclose(xb.numpy(), images.reshape(6, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(yb.numpy(), labels)
    # transforms see 28 x 28 x 1 images
    flipped = data.MNISTDataset(str(tmp_path / "img.gz"), str(tmp_path / "lbl.gz"),
                                transforms=[data.RandomFlipHorizontal(p=1.0)])
    np.testing.assert_allclose(flipped[1][0], images[1][:, ::-1].reshape(-1) / 255.0, rtol=1e-6)
    np.testing.assert_allclose(flipped[[0, 1]][0][1], flipped[1][0])


def test_mnist_reader_errors_name_the_file(tmp_path):
    _write_idx(tmp_path / "lbl.gz", np.zeros(3, np.uint8))
    with pytest.raises(FileNotFoundError, match="nope.gz"):
        data.MNISTDataset(str(tmp_path / "nope.gz"), str(tmp_path / "lbl.gz"))
    with gzip.open(tmp_path / "bad.gz", "wb") as f:
        f.write(b"\x00\x00\x08\x03" + struct.pack(">3I", 5, 28, 28) + b"\x00" * 100)
    with pytest.raises(ValueError, match="bad.gz"):
        data.MNISTDataset(str(tmp_path / "bad.gz"), str(tmp_path / "lbl.gz"))
    (tmp_path / "junk.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="junk.gz"):
        data.parse_mnist(str(tmp_path / "junk.gz"), str(tmp_path / "lbl.gz"))


@pytest.mark.skipif(not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists(),
                    reason="MNIST test split not present in ../shared/data/mnist")
def test_mnist_t10k_split():
    X, y = data.parse_mnist(str(MNIST_DIR / "t10k-images-idx3-ubyte.gz"),
                            str(MNIST_DIR / "t10k-labels-idx1-ubyte.gz"))
    assert X.shape == (10000, 784) and X.dtype == np.float32 and y.dtype == np.uint8
    assert X.min() == 0.0 and X.max() == 1.0
    # the published class counts of the MNIST test set
    np.testing.assert_array_equal(np.bincount(y),
                                  [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])


# ------------------------------------------------------------------------- CIFAR-10
def _cifar_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 3072)).astype(np.uint8), rng.integers(0, 10, size=n)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_python_batches(tmp_path, protocol):
    parts = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        X, y = _cifar_arrays(3, i)
        parts[name] = (X, y)
        with open(tmp_path / name, "wb") as f:
            pickle.dump({b"data": X, b"labels": [int(v) for v in y],
                         b"batch_label": b"x", b"filenames": [b"a.png"] * 3}, f,
                        protocol=protocol)
    train = data.CIFAR10Dataset(str(tmp_path), train=True)
    test = data.CIFAR10Dataset(str(tmp_path), train=False)
    assert len(train) == 15 and len(test) == 3
    X1, y1 = parts["data_batch_2"]
    x, y = train[4]
    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    np.testing.assert_allclose(x, X1[1].reshape(3, 32, 32) / 255.0, rtol=1e-6)
    assert y == y1[1]
    np.testing.assert_array_equal(test[np.arange(3)][1], parts["test_batch"][1])
    flip = data.CIFAR10Dataset(str(tmp_path), train=False,
                               transforms=[data.RandomFlipHorizontal(p=1.0)])
    np.testing.assert_allclose(flip[0][0], test[0][0][:, :, ::-1])


def test_cifar_binary_batches(tmp_path):
    expected = {}
    for i, name in enumerate([f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]):
        X, y = _cifar_arrays(2, 10 + i)
        expected[name] = (X, y)
        rec = np.concatenate([y.astype(np.uint8)[:, None], X], axis=1)
        rec.tofile(tmp_path / name)
    test = data.CIFAR10Dataset(str(tmp_path), train=False)
    X, y = expected["test_batch.bin"]
    np.testing.assert_allclose(test.X.reshape(2, -1), X / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(test.y, y)
    (tmp_path / "data_batch_3.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(ValueError, match="data_batch_3.bin"):
        data.CIFAR10Dataset(str(tmp_path), train=True)


class _Evil:
    """Unpickling this runs ``os.system`` — the restricted unpickler must refuse it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar_refuses_malicious_pickle(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": _Evil(str(marker)), b"labels": [1]}, f)
    with pytest.raises(ValueError, match="test_batch.*(posix|os|nt)\\.system"):
        data.CIFAR10Dataset(str(tmp_path), train=False)
    assert not marker.exists()
    with open(tmp_path / "test_batch", "wb") as f:  # a class the allowlist does not know
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [Fraction(1, 2)]}, f)
    with pytest.raises(ValueError, match="refusing to unpickle fractions.Fraction"):
        data.CIFAR10Dataset(str(tmp_path), train=False)


def test_cifar_missing_folder_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        data.CIFAR10Dataset(str(tmp_path / "nowhere"), train=True)


# ------------------------------------------------------------------------- PTB
def test_ptb_corpus_batchify_get_batch(tmp_path):
    (tmp_path / "train.txt").write_text("the cat sat\nthe dog\nignored line here\n")
    (tmp_path / "test.txt").write_text("a cat\n")
    corpus = data.Corpus(str(tmp_path), max_lines=2)
    words = ["the", "cat", "sat", "<eos>", "the", "dog", "<eos>"]
    assert corpus.train == [corpus.dictionary.word2idx[w] for w in words]
    assert corpus.dictionary.idx2word[:5] == ["the", "cat", "sat", "<eos>", "dog"]
    assert corpus.test == [corpus.dictionary.word2idx[w] for w in ["a", "cat", "<eos>"]]
    assert len(corpus.dictionary) == 6

    stream = list(range(23))
    b = data.batchify(stream, batch_size=3, device=ndl.cpu(), dtype="float32")
    assert b.shape == (7, 3)
    np.testing.assert_array_equal(b[:, 1], np.arange(7, 14))  # column j = j-th chunk
    x, t = data.get_batch(b, 2, bptt=3, device=ndl.cpu(), dtype="float32")
    np.testing.assert_array_equal(x.numpy(), b[2:5])
    np.testing.assert_array_equal(t.numpy(), b[3:6].reshape(-1))
    x, t = data.get_batch(b, 4, bptt=10)  # clipped at the end
    assert x.shape == (2, 3) and t.shape == (6,)


def test_ptb_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.txt"):
        data.Corpus(str(tmp_path))


# ------------------------------------------------------------------------- built-in sets
def test_builtin_digits_split_is_fixed_and_disjoint():
    from sklearn.datasets import load_digits
    Xtr, ytr, Xte, yte = data.load_digits(test_fraction=0.2, seed=0)
    assert Xtr.shape == (1438, 64) and Xte.shape == (359, 64) and Xtr.dtype == np.float32
    assert 0.0 <= Xtr.min() and Xtr.max() <= 1.0
    ref = load_digits()
    # the union of both splits is the whole set, each row once
    both = np.concatenate([Xtr, Xte]) * 16.0
    order = np.lexsort(both.T)
    np.testing.assert_array_equal(both[order], ref.data[np.lexsort(ref.data.T)])
    np.testing.assert_array_equal(np.sort(np.concatenate([ytr, yte])), np.sort(ref.target))
    np.testing.assert_array_equal(data.load_digits(0.2, 0)[3], yte)
    train, test = data.digits_datasets()
    assert len(train) == 1438 and len(test) == 359


def test_stdlib_char_corpus():
    text = data.stdlib_text(20_000)
    assert len(text) == 20_000 and text == data.stdlib_text(20_000)
    assert set(text) <= set(map(chr, range(32, 127))) | {"\n"}
    assert "def " in text and "import" in text  # it really is Python source
    corpus = data.CharCorpus(20_000, test_fraction=0.1)
    assert len(corpus.train) == 18_000 and len(corpus.test) == 2_000
    assert corpus.decode(corpus.train) + corpus.decode(corpus.test) == text
    assert corpus.encode(text[:50]) == corpus.train[:50]
    counts = np.bincount(corpus.train)
    p = counts[counts > 0] / counts.sum()
    assert metrics.unigram_entropy(corpus.train) == pytest.approx(-(p * np.log(p)).sum())
    assert metrics.unigram_entropy([0, 1, 2, 3] * 5) == pytest.approx(np.log(4))


def test_synthetic_sets_are_seeded():
    X, y = data.spirals(50, 3, seed=1)
    assert X.shape == (150, 2) and y.shape == (150,) and np.bincount(y).tolist() == [50] * 3
    np.testing.assert_array_equal(X, data.spirals(50, 3, seed=1)[0])
    assert not np.array_equal(X, data.spirals(50, 3, seed=2)[0])
    Xb, yb = data.blobs(100, 4, dim=5, seed=0)
    assert Xb.shape == (100, 5) and set(np.unique(yb)) <= set(range(4))
    x, t = data.sequence_task(10, 6, vocab=7, reverse=True, seed=0)
    np.testing.assert_array_equal(t, x[:, ::-1])
    assert x.max() < 7 and len(np.unique(x)) > 1
