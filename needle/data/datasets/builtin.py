"""Data that needs no download: scikit-learn's 8x8 digits, Python's own stdlib sources as a
character corpus, and seeded synthetic sets (spirals, blobs, copy/reverse sequences)."""
import os
import sysconfig
from typing import List, Sequence, Tuple

import numpy as np

from ... import numbers
from .ndarray_dataset import NDArrayDataset
from .ptb_dataset import Dictionary

Split = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _split(X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> Split:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(len(X))
    n_test = int(round(len(X) * test_fraction))
    te, tr = perm[:n_test], perm[n_test:]
    return X[tr], y[tr], X[te], y[te]


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 8x8 digits: ``(X_train, y_train, X_test, y_test)``, X float32 (N, 64)
    in [0, 1], split by ``seed``."""
    _split(np.zeros((0, 1)), np.zeros(0), test_fraction, seed)  # checked before the import
    from sklearn.datasets import load_digits as _sk_load_digits  # ships inside the wheel
    d = _sk_load_digits()
    X = (d.data / 16.0).astype(np.float32)
    return _split(X, d.target.astype(np.int64), test_fraction, seed)


def digits_datasets(test_fraction: float = 0.2,
                    seed: int = 0) -> Tuple[NDArrayDataset, NDArrayDataset]:
    """The built-in digits as (train, test) datasets."""
    Xtr, ytr, Xte, yte = load_digits(test_fraction, seed)
    return NDArrayDataset(Xtr, ytr), NDArrayDataset(Xte, yte)


def stdlib_text(n_chars: int = 500_000) -> str:
    """The first ``n_chars`` printable-ASCII characters (and newlines) of the stdlib sources,
    read in sorted order: at most 96 symbols, deterministic for a given Python installation."""
    n_chars = numbers.count(n_chars, "stdlib_text: n_chars", lo=1)  # -5 once read text[:-5]
    keep = set(map(chr, range(32, 127))) | {"\n"}
    root = sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__)
    parts, total = [], 0
    for name in sorted(os.listdir(root)):  # the top-level modules, by name
        if not name.endswith(".py") or name.startswith("_"):
            continue
        with open(os.path.join(root, name), encoding="utf-8", errors="ignore") as f:
            text = "".join(ch for ch in f.read() if ch in keep)
        parts.append(text[:n_chars - total])
        total += len(parts[-1])
        if total >= n_chars:
            break
    if total < n_chars:
        raise ValueError(f"stdlib_text: the standard library has only {total} characters, "
                         f"asked for {n_chars}")
    return "".join(parts)


class CharCorpus:
    """Character ids of the stdlib text, split into ``train``/``test`` like the PTB ``Corpus``."""

    def __init__(self, n_chars: int = 500_000, test_fraction: float = 0.1):
        test_fraction = numbers.fraction(test_fraction, "CharCorpus: test_fraction")
        text = stdlib_text(n_chars)
        self.dictionary = Dictionary()
        for ch in sorted(set(text)):
            self.dictionary.add_word(ch)
        ids = [self.dictionary.word2idx[ch] for ch in text]
        cut = int(len(ids) * (1.0 - test_fraction))
        self.train, self.test = ids[:cut], ids[cut:]

    def decode(self, ids: Sequence[int]) -> str:
        """The text spelled by a sequence of ids."""
        return "".join(self.dictionary.idx2word[int(i)] for i in ids)

    def encode(self, text: str) -> List[int]:
        """The ids of ``text`` (every character must be in the vocabulary)."""
        missing = sorted(set(text) - set(self.dictionary.word2idx))
        if missing:
            raise ValueError(f"CharCorpus.encode: characters {missing!r} are not in the vocabulary")
        return [self.dictionary.word2idx[ch] for ch in text]


def spirals(n_per_class: int = 100, n_classes: int = 3, noise: float = 0.2,
            seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Interleaved 2-D spirals (cs231n's toy set): X float32 (N, 2), y int64 (N,)."""
    n_per_class = numbers.count_arg(n_per_class, "spirals: n_per_class", lo=1)
    n_classes = numbers.count_arg(n_classes, "spirals: n_classes", lo=1)
    noise = numbers.real_arg(noise, "spirals: noise", lo=0)
    rng = np.random.default_rng(seed)
    X, y = [], []
    for c in range(n_classes):
        r = np.linspace(0.0, 1.0, n_per_class)
        t = (np.linspace(c * 4.0, (c + 1) * 4.0, n_per_class)
             + rng.standard_normal(n_per_class) * noise)
        X.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        y.append(np.full(n_per_class, c))
    return np.concatenate(X).astype(np.float32), np.concatenate(y).astype(np.int64)


def blobs(n: int = 300, n_classes: int = 3, dim: int = 2, spread: float = 0.5,
          seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around random unit-scale centres: X float32 (n, dim), y int64 (n,)."""
    n = numbers.count_arg(n, "blobs: n", lo=1)
    n_classes = numbers.count_arg(n_classes, "blobs: n_classes", lo=1)
    dim = numbers.count_arg(dim, "blobs: dim", lo=1)
    spread = numbers.real_arg(spread, "blobs: spread", lo=0)
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_classes, dim)) * 2.0
    y = rng.integers(0, n_classes, size=n)
    X = centers[y] + rng.standard_normal((n, dim)) * spread
    return X.astype(np.float32), y.astype(np.int64)


def sequence_task(n: int = 256, seq_len: int = 8, vocab: int = 10, reverse: bool = False,
                  seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Random token sequences (n, seq_len) and their copies (or reversals) as int64 targets."""
    n = numbers.count_arg(n, "sequence_task: n", lo=1)
    vocab = numbers.count_arg(vocab, "sequence_task: vocab", lo=2)
    seq_len = numbers.count_arg(seq_len, "sequence_task: seq_len", lo=1)
    x = np.random.default_rng(seed).integers(0, vocab, size=(n, seq_len)).astype(np.int64)
    return x, (x[:, ::-1] if reverse else x).copy()
