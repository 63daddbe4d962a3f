"""Penn Treebank language-model data: a word dictionary, a token corpus and BPTT batches."""
import os
from typing import Any, List, Optional, Tuple

import numpy as np

from ... import numbers
from ...autograd import Tensor
from ...backend_ndarray.device import BackendDevice


class Dictionary:
    """A bijection between words and consecutive integer ids."""

    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word: str) -> int:
        """The id of ``word``, giving it the next free id when it is new."""
        ### BEGIN YOUR SOLUTION (hw4.data.ptb)
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]
        ### END YOUR SOLUTION

    def __len__(self) -> int:
        return len(self.idx2word)


class Corpus:
    """Token ids of ``train.txt`` and ``test.txt`` in ``base_dir`` over one shared dictionary."""

    def __init__(self, base_dir: str, max_lines: Optional[int] = None):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(base_dir, "train.txt"), max_lines)
        self.test = self.tokenize(os.path.join(base_dir, "test.txt"), max_lines)

    def tokenize(self, path: str, max_lines: Optional[int] = None) -> List[int]:
        """Ids of the words of the first ``max_lines`` lines, each line ending with ``<eos>``."""
        if max_lines is not None:  # -1 once read nothing, silently
            max_lines = numbers.count(max_lines, "Corpus: max_lines", lo=0)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"PTB file not found: {path}")
        ids = []
        try:
            with open(path, encoding="utf-8") as f:
                ### BEGIN YOUR SOLUTION (hw4.data.ptb)
                for i, line in enumerate(f):
                    if max_lines is not None and i >= max_lines:
                        break
                    for word in line.split() + ["<eos>"]:
                        ids.append(self.dictionary.add_word(word))
                ### END YOUR SOLUTION
        except UnicodeDecodeError as e:
            raise ValueError(f"malformed PTB file {path}: not UTF-8 text ({e})") from None
        return ids


def batchify(data: Any, batch_size: int, device: Optional[BackendDevice] = None,
             dtype: Optional[str] = None) -> np.ndarray:
    """Cut a token stream into ``batch_size`` columns: shape (len(data) // batch_size, batch_size).

    Column j holds the j-th contiguous chunk of the stream; leftover tokens are dropped.
    ``batch_size`` is a whole number >= 1 (0 once ended in ZeroDivisionError).
    """
    batch_size = numbers.count(batch_size, "batchify: batch_size", lo=1)
    ### BEGIN YOUR SOLUTION (hw4.data.ptb)
    nbatch = len(data) // batch_size
    if nbatch == 0:
        raise ValueError(f"batchify: {len(data)} tokens cannot fill batch_size {batch_size}")
    arr = np.asarray(data[:nbatch * batch_size], dtype=np.int64)
    return arr.reshape(batch_size, nbatch).T.copy()
    ### END YOUR SOLUTION


def get_batch(batches: np.ndarray, i: int, bptt: int, device: Optional[BackendDevice] = None,
              dtype: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """Inputs rows ``[i, i+L)`` (L, B) and targets rows ``[i+1, i+1+L)`` flattened (L*B,).

    Token ids come back as float32 Tensors unless ``dtype`` says otherwise, as the course's
    (float32-only) hw4 needle gives them; exact for ids below 2**24. ``i`` is a row index
    >= 0 (a negative one once counted from the end into an empty batch) and ``bptt`` >= 1.
    """
    i = numbers.count(i, "get_batch: i", lo=0)
    bptt = numbers.count(bptt, "get_batch: bptt", lo=1)
    ### BEGIN YOUR SOLUTION (hw4.data.ptb)
    seq_len = min(bptt, len(batches) - 1 - i)
    if seq_len <= 0:
        raise ValueError(f"get_batch: position {i} leaves no targets in {len(batches)} rows")
    data = batches[i:i + seq_len]
    target = batches[i + 1:i + 1 + seq_len].reshape(-1)
    ### END YOUR SOLUTION
    dtype = dtype if dtype is not None else "float32"
    return (Tensor(data, device=device, dtype=dtype, requires_grad=False),
            Tensor(target, device=device, dtype=dtype, requires_grad=False))
