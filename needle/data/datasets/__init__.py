"""Datasets: in-memory arrays, MNIST, CIFAR-10, Penn Treebank, and built-in sets."""
from .builtin import (CharCorpus, blobs, digits_datasets, load_digits, sequence_task,  # noqa: F401
                      spirals, stdlib_text, unigram_entropy)
from .cifar10_dataset import CIFAR10Dataset, RestrictedUnpickler, safe_unpickle  # noqa: F401
from .mnist_dataset import MNISTDataset, parse_mnist, read_idx  # noqa: F401
from .ndarray_dataset import NDArrayDataset  # noqa: F401
from .ptb_dataset import Corpus, Dictionary, batchify, get_batch  # noqa: F401
