"""Language-model metrics: the unigram entropy of a corpus and the perplexity of a loss."""
import math
from typing import Sequence

import numpy as np

__all__ = ["unigram_entropy", "perplexity"]


def unigram_entropy(ids: Sequence[int]) -> float:
    """Entropy (nats) of the empirical symbol distribution: the best context-free loss."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def perplexity(loss_nats: float) -> float:
    """exp(loss): the effective branching factor of a language model with this loss."""
    return math.exp(loss_nats)
