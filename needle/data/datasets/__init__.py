"""Datasets: in-memory arrays, MNIST, CIFAR-10, Penn Treebank, and built-in sets."""
from .builtin import (
    CharCorpus,
    blobs,
    digits_datasets,
    load_digits,
    sequence_task,
    spirals,
    stdlib_text,
)
from .cifar10_dataset import CIFAR10Dataset
from .mnist_dataset import MNISTDataset, parse_mnist, read_idx
from .ndarray_dataset import NDArrayDataset
from .ptb_dataset import Corpus, Dictionary, batchify, get_batch
from .restricted_pickle import RestrictedUnpickler, safe_unpickle
