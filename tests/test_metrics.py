"""Language-model metrics."""
import math

import pytest

from needle import metrics


def test_unigram_entropy_of_uniform_and_constant_sequences():
    assert metrics.unigram_entropy([0, 1, 2, 3] * 5) == pytest.approx(math.log(4))
    assert metrics.unigram_entropy([7] * 9) == 0.0


def test_perplexity_is_exp_of_the_loss():
    assert metrics.perplexity(0.0) == 1.0
    assert metrics.perplexity(math.log(50)) == pytest.approx(50)
