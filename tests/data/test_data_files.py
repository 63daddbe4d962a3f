"""Data readers check what they read: CIFAR-10 pixels are uint8 0..255 and labels 0..9 (or the
file is refused, named), a pickle cannot ask for more memory than it holds, and an MNIST gzip
bomb is refused after reading what its header declares."""
import gzip
import pickle
import struct
import tracemalloc

import numpy as np
import pytest

from needle import data


def _batch(tmp_path, pixels, labels, protocol=4, **more):
    path = tmp_path / "test_batch"
    with open(path, "wb") as f:
        pickle.dump({b"data": pixels, b"labels": labels, **more}, f, protocol=protocol)
    return path


def _load(tmp_path):
    return data.CIFAR10Dataset(str(tmp_path), train=False)


BAD_PIXELS = [  # (pixels, words of the error)
    (np.random.default_rng(0).random((2, 3072)), "pixels are float64 in [0.0"),
    (np.full((2, 3072), 300, np.int16), "pixels are int16 in [300, 300]"),
    (np.full((2, 3072), -1, np.int64), "pixels are int64 in [-1, -1]"),
    (np.zeros((2, 3071), np.uint8), "data is (2, 3071)"),
    (np.zeros((2, 3, 32, 32), np.uint8), "data is (2, 3, 32, 32)"),
]


@pytest.mark.parametrize("pixels,words", BAD_PIXELS, ids=lambda v: getattr(v, "dtype", v))
def test_cifar_pixels_other_than_uint8_are_refused_naming_the_file(tmp_path, pixels, words):
    path = _batch(tmp_path, pixels, [0, 1])
    with pytest.raises(ValueError, match="test_batch") as info:
        _load(tmp_path)
    assert str(path) in str(info.value) and words in str(info.value), str(info.value)


def test_cifar_integer_pixels_in_range_load_exactly(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (2, 3072))  # int64, 0..255
    _batch(tmp_path, pixels, [9, 0])
    ds = _load(tmp_path)
    np.testing.assert_array_equal(np.rint(ds.X.reshape(2, -1) * 255), pixels)
    np.testing.assert_array_equal(ds.y, [9, 0])


@pytest.mark.parametrize("labels,words", [
    ([0, 10], "labels in [0, 10], outside 0..9"), ([-1, 3], "labels in [-1, 3]"),
    ([0, True], "not all integers"), ([0, 1, 2], "2 images but 3 labels"),
    (np.zeros(2, np.float32), "list of ints")])
def test_cifar_labels_are_checked(tmp_path, labels, words):
    _batch(tmp_path, np.zeros((2, 3072), np.uint8), labels)
    with pytest.raises(ValueError, match="test_batch") as info:
        _load(tmp_path)
    assert words in str(info.value), str(info.value)


def test_cifar_binary_label_out_of_range_is_refused(tmp_path):
    rec = np.zeros((2, 3073), np.uint8)
    rec[1, 0] = 200
    rec.tofile(tmp_path / "test_batch.bin")
    with pytest.raises(ValueError, match=r"test_batch.bin: labels in \[0, 200\]"):
        _load(tmp_path)


def test_a_pickle_cannot_multiply_itself_with_memo_references(tmp_path):
    """One list referenced 2000 times: 16 MB as an array from a 10 kB file."""
    inner = list(range(1000))
    path = _batch(tmp_path, np.zeros((2, 3072), np.uint8), [inner] * 2000)
    assert path.stat().st_size < 20_000
    with pytest.raises(ValueError, match="test_batch: one list is referenced twice"):
        _load(tmp_path)


def test_object_arrays_are_refused(tmp_path):
    _batch(tmp_path, np.zeros((2, 3072), np.uint8), np.array([0, "x"], dtype=object))
    with pytest.raises(ValueError, match="refusing dtype object"):
        _load(tmp_path)


def _idx_header(shape):
    return bytes([0, 0, 8, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)


def test_an_mnist_gzip_bomb_is_read_only_as_far_as_its_header_says(tmp_path):
    bomb = tmp_path / "bomb.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(_idx_header((10,)))
        for _ in range(64):
            f.write(bytes(1 << 20))  # 64 MiB of zeros in a 64 kB file
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"bomb.gz: header says shape \(10,\) \(10 bytes\) "
                                             "more than that many"):
            data.read_idx(str(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak} bytes held to refuse a 64 MiB bomb"


def test_an_mnist_header_declaring_too_much_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_header((60000, 60000, 28)) + bytes(100))
    with pytest.raises(ValueError, match="huge.gz: header says shape .* more than the"):
        data.read_idx(str(path))


def _mnist(tmp_path, labels):
    images, label_file = tmp_path / "img.gz", tmp_path / "lab.gz"
    with gzip.open(images, "wb") as f:
        f.write(_idx_header((len(labels), 28, 28)) + bytes(len(labels) * 784))
    with gzip.open(label_file, "wb") as f:
        f.write(_idx_header((len(labels),)) + bytes(labels))
    return str(images), str(label_file)


def test_mnist_label_check_names_the_file_and_the_range():
    from needle.data.datasets.mnist_dataset import check_labels
    with pytest.raises(ValueError, match=r"lab.gz: labels in \[0, 10\], outside 0..9 "
                                         r"\(label 2 is 10\)"):
        check_labels(np.array([0, 9, 10], np.uint8), "lab.gz")
    assert list(check_labels(np.array([0, 9], np.uint8), "lab.gz")) == [0, 9]


@pytest.mark.hw2  # MNISTDataset reads through parse_mnist, a course exercise (as test_data.py)
def test_mnist_labels_are_range_checked_like_cifar(tmp_path):
    images, labels = _mnist(tmp_path, [3, 200, 1])
    with pytest.raises(ValueError, match=r"lab.gz: labels in \[1, 200\], outside 0..9 "
                                         r"\(label 1 is 200\)"):
        data.MNISTDataset(images, labels)
    images, labels = _mnist(tmp_path, [3, 9, 0])
    assert list(data.MNISTDataset(images, labels).labels) == [3, 9, 0]


@pytest.mark.parametrize("call,words", [
    (lambda b: data.batchify(list(range(20)), 0), "batchify: batch_size 0 must be a whole"),
    (lambda b: data.batchify(list(range(20)), -2), "batchify: batch_size -2 must be"),
    (lambda b: data.batchify(list(range(20)), 2.5), "batchify: batch_size 2.5 must be"),
    (lambda b: data.get_batch(b, -3, 2), "get_batch: i -3 must be a whole number >= 0"),
    (lambda b: data.get_batch(b, 0, 0), "get_batch: bptt 0 must be a whole number >= 1"),
], ids=["batchify-0", "batchify-negative", "batchify-fraction", "get_batch-negative-i",
        "get_batch-zero-bptt"])
def test_ptb_helpers_refuse_negative_indices_and_zero_counts(call, words):
    """Checked before the exercise's code (batchify, get_batch are hw4 exercises)."""
    with pytest.raises(ValueError, match=words):
        call(np.arange(20).reshape(10, 2))


def test_ptb_corpus_refuses_a_negative_line_limit(tmp_path):
    for name in ("train.txt", "test.txt"):
        (tmp_path / name).write_text("a b\nc d\n")
    with pytest.raises(ValueError, match="max_lines -1 must be a whole number >= 0"):
        data.Corpus(str(tmp_path), max_lines=-1)


def test_char_corpus_refuses_negative_sizes_and_fractions_outside_0_1():
    from needle.data.datasets.builtin import CharCorpus
    with pytest.raises(ValueError, match="n_chars -5 must be a whole number >= 1"):
        CharCorpus(n_chars=-5)
    with pytest.raises(ValueError, match="test_fraction nan must be a finite number in"):
        CharCorpus(n_chars=100, test_fraction=float("nan"))


@pytest.mark.parametrize("size", [2.5, -1, 0, True, "٣"])
def test_dataloader_refuses_counts_that_are_not_whole_and_positive(size):
    ds = data.NDArrayDataset(np.zeros((5, 2)))
    with pytest.raises(ValueError, match="DataLoader: batch_size .* must be a whole number >= 1"):
        data.DataLoader(ds, batch_size=size)
    assert len(data.DataLoader(ds, batch_size=2.0)) == 3


def test_transforms_refuse_probabilities_and_paddings_out_of_range():
    for p in (float("nan"), 1.5, -0.1):
        with pytest.raises(ValueError, match="RandomFlipHorizontal: p .* must be a finite number"
                                             r" in \[0, 1\]"):
            data.RandomFlipHorizontal(p)
    for padding in (-1, 2.5):
        with pytest.raises(ValueError, match="RandomCrop: padding .* must be a whole number"):
            data.RandomCrop(padding)
    assert data.RandomCrop(0).padding == 0 and data.RandomFlipHorizontal(1).p == 1.0
