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
    """exp(loss): the effective branching factor of a language model with this loss (a
    cross-entropy is >= 0; nan stays nan, a loss past exp's range is inf, not OverflowError)."""
    if isinstance(loss_nats, str) or not loss_nats >= 0 and not math.isnan(loss_nats):
        raise ValueError(f"perplexity: loss_nats must be a cross-entropy >= 0, got {loss_nats!r}")
    return math.exp(loss_nats) if loss_nats < 709.0 else math.inf
